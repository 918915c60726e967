"""Time to first token of a conversation's plain turns, side by side in one process: a stock ``llama_cpp.Llama``
(prefix reuse, full KV), ``SekvLlama`` routing each turn inside its one decode (``turn_routing="layer"``; ``probes``:
by a query probe on each of the turn's tokens, ``turn_probes``) and ``SekvLlama`` with the two-pass turn
(``refresh``), asked the same questions in turn over a ~6K-token document.
Writes bench/turn.json and bench/turn.png.

    .venv/bin/python scripts/bench_turn.py [--models gemma smollm2] [--turns 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import llama_cpp

from sekv_gguf.config import SekvConfig
from sekv_gguf.eval.conversation import MODELS, SYSTEM, document, question  # the server benchmark's conversation
from sekv_gguf.llm import SekvLlama
from sekv_gguf.provenance import envelope

# the SeKV engines: name -> the settings that differ from the defaults
SEKV_ENGINES = {"layer": {"turn_routing": "layer"},
                "probes": {"turn_routing": "layer", "turn_probes": True},
                "refresh": {"turn_routing": "refresh"}}
ENGINES = ("stock", *SEKV_ENGINES)


def sekv_llama(path: str, fmt: str | None, settings: dict, args: argparse.Namespace) -> SekvLlama:
    return SekvLlama(path, kv_budget=args.kv_budget, n_ctx=args.n_ctx, n_threads=args.threads, chat_format=fmt,
                     sekv=SekvConfig(**settings))


def ask(engine: llama_cpp.Llama, messages: list[dict], content: str, max_tokens: int) -> tuple[float, str]:
    """Append a user message, stream the greedy reply into ``messages``; time to its first content token."""
    messages.append({"role": "user", "content": content})
    t0, ttft, parts = time.perf_counter(), None, []
    for chunk in engine.create_chat_completion(messages, stream=True, max_tokens=max_tokens, temperature=0):
        piece = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
        if piece:
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            parts.append(piece)
    messages.append({"role": "assistant", "content": "".join(parts)})
    return ttft if ttft is not None else time.perf_counter() - t0, "".join(parts)


def run_model(path: str, fmt: str | None, doc: str, args: argparse.Namespace) -> dict:
    engines = {"stock": llama_cpp.Llama(path, n_ctx=args.n_ctx, flash_attn=True, n_threads=args.threads,
                                        n_threads_batch=args.threads, chat_format=fmt, verbose=False),
               **{name: sekv_llama(path, fmt, settings, args) for name, settings in SEKV_ENGINES.items()}}
    messages = {name: [{"role": "system", "content": SYSTEM}] for name in engines}
    out: dict = {name: {"first_turn_s": None, "ttft_s": [], "replies": []} for name in engines}
    for name, engine in engines.items():
        out[name]["first_turn_s"], _ = ask(engine, messages[name], f"{doc}\n\n{question(0)}", args.max_tokens)
    for i in range(1, args.turns):
        for name, engine in engines.items():  # in turn: every engine sees the same machine state
            ttft, reply = ask(engine, messages[name], question(i), args.max_tokens)
            out[name]["ttft_s"].append(ttft)
            out[name]["replies"].append(reply)
            print(json.dumps({"engine": name, "turn": i + 1, "ttft_s": round(ttft, 4)}), flush=True)
    for name, engine in engines.items():
        if isinstance(engine, SekvLlama):
            active = engine.memories.active
            sekv = active.stats().sekv
            memory = active.memory
            out[name]["layer_routed_turns"] = memory.counters.layer_routed_turns if sekv else 0
            out[name]["spans"] = sekv.spans if sekv else None
        engine.close()
    stock = statistics.median(out["stock"]["ttft_s"])
    for name in engines:
        out[name]["median_ttft_s"] = statistics.median(out[name]["ttft_s"])
        out[name]["ratio_to_stock"] = out[name]["median_ttft_s"] / stock
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, name in zip(axes[0], models):
        for engine in ENGINES:
            runs = result["models"][name][engine]["ttft_s"]
            ax.plot(range(2, len(runs) + 2), runs, marker="o", label=f"{engine} "
                    f"({result['models'][name][engine]['ratio_to_stock']:.2f}x)")
        ax.set_title(name)
        ax.set_xlabel("turn")
        ax.set_ylabel("time to first token (s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("plain turns, one process, engines in turn (median ratio to stock)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["gemma", "smollm2"], choices=["gemma", "smollm2"])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--doc-chars", type=int, default=26000, help="document characters (~6K tokens)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--kv-budget", type=float, default=0.25)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/turn")
    args = ap.parse_args()
    doc = document(args.doc_chars)
    result: dict = {"name": "turn", **envelope(), "params": vars(args), "models": {}}
    for name in args.models:
        path, fmt = MODELS[name]
        result["models"][name] = run_model(str(path()), fmt, doc, args)
        print(json.dumps({name: {e: round(result["models"][name][e]["ratio_to_stock"], 3) for e in ENGINES}}))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
