"""What llama.cpp's RPC backend costs SeKV: ``full`` and ``sekv`` with the layers local vs on a loopback RPC server.

One process, one model load per placement, policies side by side:
- ``local``: this process's CPU, llama.cpp's default (quantized weights repacked for its faster kernels);
- ``local-plain``: the same without repacking — the kernels an RPC server's CPU runs, so ``rpc`` vs this is the
  network's cost alone (their logits are bit-identical);
- ``rpc``: every layer and its KV cache on a ``ggml-rpc-server`` child on 127.0.0.1.
Compute is one CPU thread in every placement (the server's, or this process's), so the two cores are not shared
by two busy computations. Also times the hook's row traffic (SeKV's zoom rebuilds and reads) per placement.

Writes bench/rpc.json (machine, commit, parameters, raw numbers) and bench/rpc.png.

    .venv/bin/python scripts/bench_rpc.py                  # Gemma 3 270M, 4K and 8K, 10% budget
    .venv/bin/python scripts/bench_rpc.py --lengths 2048 --n-predict 16
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

from sekv_gguf.config import BudgetConfig, ContextConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.rpc import RpcServer
from sekv_gguf.ruler_tasks import needle_prompt
from sekv_gguf.session import Session, load_model

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("full", "sekv")
PLACEMENTS = ("local", "local-plain", "rpc")
ROW_CELLS = 256  # cells per row-traffic call (a zoom rebuild writes a few spans of ~48 tokens per layer)
ROW_REPEATS = 20


def placement_config(name: str, endpoint: str) -> ContextConfig:
    return {"local": ContextConfig(n_threads=1),
            "local-plain": ContextConfig(n_threads=1, repack_weights=False),
            "rpc": ContextConfig(n_threads=1, rpc_servers=(endpoint,))}[name]


def row_traffic(model, ctx_config: ContextConfig) -> dict:
    """Seconds per ``set_rows`` / ``get_rows`` call of ROW_CELLS cells over every hooked layer."""
    with Session(model, ctx_config.sized(1024, 256)) as s:
        s.decode(list(range(1, 512)), logits="none")
        cells = np.arange(ROW_CELLS, dtype=np.int32)
        layers = range(s.hook.info.n_layer_kv)
        rows = [s.hook.get_rows(ikv, cells) for ikv in layers]
        t0 = time.perf_counter()
        for _ in range(ROW_REPEATS):
            for ikv in layers:
                s.hook.set_rows(ikv, cells, *rows[ikv])
        t_set = (time.perf_counter() - t0) / ROW_REPEATS
        t0 = time.perf_counter()
        for _ in range(ROW_REPEATS):
            for ikv in layers:
                s.hook.get_rows(ikv, cells)
        t_get = (time.perf_counter() - t0) / ROW_REPEATS
        nbytes = sum(k.nbytes + v.nbytes for k, v in rows)
    return {"cells": ROW_CELLS, "layers": len(layers), "bytes": nbytes, "set_s": t_set, "get_s": t_get,
            "set_MBps": nbytes / t_set / 1e6, "get_MBps": nbytes / t_get / 1e6}


def run_case(model, placement: str, n_tokens: int, n_predict: int, budget: float, seed: int,
             ctx_config: ContextConfig) -> list[dict]:
    count = lambda text: len(model.tokenize(text.encode(), add_bos=True, special=False))  # noqa: E731
    needle = needle_prompt(count, n_tokens, 0.5, seed)
    tokens = model.tokenize(needle.prompt.encode(), add_bos=True, special=False)
    cells = int(budget * (len(tokens) + n_predict))
    out = []
    for name in POLICIES:
        policy = make_policy(name, model, len(tokens) + n_predict, ctx_config, BudgetConfig(kv_budget=cells))
        t0 = time.perf_counter()
        r = generate(policy, tokens, n_predict, model_name="gemma-3-270m", stop_at_eos=False)
        wall = time.perf_counter() - t0
        policy.close()
        row = r.to_json()
        row.update({"placement": placement, "n_tokens": n_tokens, "answer": needle.answer,
                    "correct": needle.answer in r.text, "wall_s": wall})
        if r.sekv:
            row["zoom_ms_per_step"] = 1e3 * r.sekv.zoom_s / max(r.generated_tokens, 1)
        out.append(row)
        print(f"{placement:>11} {n_tokens:>6} {name:>5}: prefill {row['prefill_tok_s']:7.1f} tok/s decode "
              f"{row['decode_tok_s']:6.1f} tok/s" + (f" zoom {row['zoom_ms_per_step']:6.1f} ms/step" if r.sekv else "")
              + f" correct {row['correct']}", flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    lengths = sorted({c["n_tokens"] for c in cases})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.8 / (len(PLACEMENTS) * len(POLICIES))
    for i, (pl, pol) in enumerate((pl, pol) for pl in PLACEMENTS for pol in POLICIES):
        for ax, key in zip(axes[:2], ("prefill_tok_s", "decode_tok_s")):
            ys = [next((c[key] for c in cases if c["placement"] == pl and c["policy"] == pol and c["n_tokens"] == n),
                       0) for n in lengths]
            ax.bar(np.arange(len(lengths)) + i * width, ys, width, label=f"{pol} {pl}")
    for ax, title in zip(axes[:2], ("prefill tokens/s", "decode tokens/s")):
        ax.set_xticks(np.arange(len(lengths)) + 0.4 - width / 2, [f"{n // 1024}K" for n in lengths])
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    rows = result["row_traffic"]
    names = list(rows)
    axes[2].bar(np.arange(len(names)) - 0.2, [rows[n]["set_MBps"] for n in names], 0.4, label="set_rows")
    axes[2].bar(np.arange(len(names)) + 0.2, [rows[n]["get_MBps"] for n in names], 0.4, label="get_rows")
    axes[2].set_xticks(np.arange(len(names)), names)
    axes[2].set_yscale("log")
    axes[2].set_title(f"hook row traffic, MB/s ({ROW_CELLS} cells x all layers)")
    axes[2].legend()
    fig.suptitle("Gemma 3 270M: layers local vs on a loopback RPC server (one compute thread each)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192])
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench"))
    args = ap.parse_args()
    path = default_model_path()
    result: dict = {**envelope(), "model": path.name,
                    "params": {"lengths": args.lengths, "n_predict": args.n_predict, "budget": args.budget,
                               "seed": args.seed, "threads": 1, "row_cells": ROW_CELLS},
                    "cases": [], "row_traffic": {}}
    with RpcServer(threads=1) as server:
        for placement in PLACEMENTS:
            cfg = placement_config(placement, server.endpoint)
            model = load_model(path, cfg)
            result["row_traffic"][placement] = row_traffic(model, cfg)
            print(f"{placement:>11} rows: set {result['row_traffic'][placement]['set_MBps']:8.1f} MB/s get "
                  f"{result['row_traffic'][placement]['get_MBps']:8.1f} MB/s", flush=True)
            for n in args.lengths:
                result["cases"].extend(run_case(model, placement, n, args.n_predict, args.budget, args.seed, cfg))
            del model  # frees its connection: the server serves one client at a time
            gc.collect()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rpc.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "rpc.png")
    print(f"wrote {out / 'rpc.json'} and {out / 'rpc.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
