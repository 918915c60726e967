"""A conversation that outlives the process: a long document with three needles (SCBench's shared context: RULER's
``niah_multiturn``, standard-library prose) prefilled by ``SekvLlama`` (Gemma 3 270M by default), saved as a memory
file (lossless and compact), then resumed in a new process that asks the three questions one turn after another;
measured: the files' bytes against the document's full KV, the time to the first answer when resumed against
prefilling the document again, whether the resumed answers are the saving process's (greedy, token for token) and
how many needles they hold, and how many such conversations fit in 8 GiB of host memory against llama.cpp's host
prompt cache (full KV per conversation). Writes bench/<out>.json and .png.

    .venv/bin/python scripts/bench_persist.py --tokens 28000 --budget 0.1 --out bench/persist
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
WARM_HOST_BYTES = 8 * GIB  # the host memory the warm conversations are counted in
N_ANSWER = 16
MODES = ("lossless", "compact", "compact3")


def _llm(model: str, n_ctx: int, budget: float, threads: int):
    from sekv_gguf import SekvLlama

    return SekvLlama(model, n_ctx=n_ctx, kv_budget=budget, n_threads=threads, verbose=False)


def _conversation(llm, doc: str, turns: list[dict]) -> tuple[list[str], float]:
    """Greedy ``N_ANSWER`` tokens after each question in turn (the conversation grows by question and answer); the
    answers and the seconds to the first answer's first token."""
    prompt, texts, first = doc, [], None
    t0 = time.perf_counter()
    for turn in turns:
        prompt += turn["text"]
        text = ""
        for chunk in llm.create_completion(prompt, max_tokens=N_ANSWER, temperature=0.0, stream=True):
            first = first or time.perf_counter() - t0
            text += chunk["choices"][0]["text"]
        texts.append(text)
        prompt += text
    return texts, first or 0.0


def _held(turns: list[dict], texts: list[str]) -> int:
    return sum(t["answer"] in text for t, text in zip(turns, texts))


def resume(args: argparse.Namespace) -> int:
    """The new process: load the memory file, hold the conversation; one JSON line on stdout."""
    from sekv_gguf import SekvState

    t0 = time.perf_counter()
    llm = _llm(args.model, args.n_ctx, args.budget, args.threads)
    t_model = time.perf_counter() - t0
    case = json.loads(Path(args.doc).read_text())
    t1 = time.perf_counter()
    llm.load_state(SekvState.load(args.resume))
    t_load = time.perf_counter() - t1
    cached = llm.counters.cached_tokens
    texts, first = _conversation(llm, case["doc"], case["turns"])
    print(json.dumps({"load_s": t_load, "model_s": t_model, "first_answer_s": t_load + first, "texts": texts,
                      "needles": _held(case["turns"], texts), "cached_tokens": llm.counters.cached_tokens - cached}))
    llm.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=28000)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="GGUF model (default: Gemma 3 270M)")
    ap.add_argument("--seed", type=int, default=0, help="the conversation's seed (needles, depths, keys)")
    ap.add_argument("--out", default="bench/persist")
    ap.add_argument("--resume", help=argparse.SUPPRESS)  # the child process: a memory file to resume
    ap.add_argument("--doc", help=argparse.SUPPRESS)  # the child process: the conversation (JSON)
    ap.add_argument("--n-ctx", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.resume:
        return resume(args)

    from sekv_gguf.models import default_model_path
    from sekv_gguf.provenance import envelope
    from sekv_gguf.ruler_tasks import niah_multiturn
    from sekv_gguf.session import full_kv_bytes, load_model

    model = args.model or str(default_model_path())
    count_model = load_model(model)
    case = niah_multiturn(lambda text: len(count_model.tokenize(text.encode(), add_bos=True, special=False)),
                          args.tokens, args.seed)
    doc, turns = case.prompt, case.meta["turns"]
    with tempfile.TemporaryDirectory() as tmp:
        doc_path = Path(tmp) / "case.json"
        doc_path.write_text(json.dumps({"doc": doc, "turns": turns}))
        n_ctx = args.tokens + 512
        llm = _llm(model, n_ctx, args.budget, args.threads)
        t0 = time.perf_counter()
        llm.create_completion(doc, max_tokens=1, temperature=0.0)
        prefill_s = time.perf_counter() - t0
        live = llm.memories.live
        n_tokens = len(live.tokens)
        full = full_kv_bytes(live.session, n_tokens, live.full_kv_ubatch)
        files = {}
        for mode in MODES:
            t1 = time.perf_counter()
            state = llm.save_state(mode)
            path = state.save(Path(tmp) / f"{mode}.gguf")
            files[mode] = {"bytes": path.stat().st_size, "save_s": time.perf_counter() - t1, "path": str(path)}
        want, _ = _conversation(llm, doc, turns)
        llm.close()
        rows = []
        for mode in MODES:
            run = subprocess.run([sys.executable, __file__, "--resume", files[mode]["path"], "--doc", str(doc_path),
                                  "--n-ctx", str(n_ctx), "--budget", str(args.budget), "--threads", str(args.threads),
                                  "--model", model], capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"resume ({mode}) failed: {run.stderr.strip()[-400:]}")
            got = json.loads(run.stdout.strip().splitlines()[-1])
            size = files[mode]["bytes"]
            rows.append({"mode": mode, "file_bytes": size, "file_over_full_kv": size / full,
                         "save_s": files[mode]["save_s"], **got,
                         "same_answers": got["texts"] == want,
                         "first_answer_speedup_vs_prefill": prefill_s / max(got["first_answer_s"], 1e-9),
                         "warm_in_8gib": WARM_HOST_BYTES // size})
            print(f"{mode:>9}: file {size / 2**20:7.1f} MiB ({size / full:.2f} of full KV), load {got['load_s']:.2f} s,"
                  f" first answer after {got['first_answer_s']:.2f} s (prefill {prefill_s:.1f} s), same answers "
                  f"{got['texts'] == want}, needles {got['needles']}/{len(turns)}", file=sys.stderr)
    out = {**envelope(), "params": vars(args) | {"model": model}, "prompt_tokens": n_tokens, "full_kv_bytes": full,
           "task": "niah_multiturn", "haystack": "prose (standard-library docstrings)", "prefill_s": prefill_s,
           "answers": want, "expected": [t["answer"] for t in turns], "needles": _held(turns, want),
           "warm_in_8gib_full_kv": WARM_HOST_BYTES // full, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(out, indent=1))
    plot(out, Path(args.out + ".png"))
    return 0


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = ["full KV"] + [r["mode"] for r in out["rows"]]
    a.bar(names, [out["full_kv_bytes"] / 2**20] + [r["file_bytes"] / 2**20 for r in out["rows"]])
    a.set_ylabel("MiB")
    a.set_title(f"{out['prompt_tokens']} tokens: full KV vs memory file")
    b.bar(["prefill again"] + [f"resume {r['mode']}" for r in out["rows"]],
          [out["prefill_s"]] + [r["first_answer_s"] for r in out["rows"]])
    b.set_ylabel("s to the next answer")
    b.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
