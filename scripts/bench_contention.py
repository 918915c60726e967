"""Decode speed on a busy machine: full KV and sekv (Gemma 3 270M, a ~2K-token prompt) decoding alone and beside a
CPU-bound process on every core (what a browser or an IDE does to a desktop user's model), for ggml's default
thread-pool polling (its workers spin between graph nodes) and for ``poll=0`` (they sleep), with a thread per core
and with one thread fewer. Everything in one process, the competitors started and stopped around each measurement;
writes the ``contention`` object of bench/reliability.json and bench/contention.png. Run it alone.

    .venv/bin/python scripts/bench_contention.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from sekv_gguf.config import BudgetConfig, ContextConfig
from sekv_gguf.decode import decode_loop, greedy
from sekv_gguf.documents import stdlib_prose
from sekv_gguf.engine import make_policy
from sekv_gguf.models import default_model_path
from sekv_gguf.policies import Policy
from sekv_gguf.provenance import record
from sekv_gguf.session import load_model

SPIN = "while True: pass"


def decode_rate(policy: Policy, logits: np.ndarray, steps: int) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    done = decode_loop(policy.step, logits, steps, greedy)
    return steps / (time.perf_counter() - t0), done.logits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--out", default="bench/reliability.json")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    path = default_model_path()
    model = load_model(path)
    tokens = model.tokenize(stdlib_prose().encode(), add_bos=True, special=False)[:args.prompt_tokens]
    rows = []
    for threads in sorted({cores, max(1, cores - 1)}, reverse=True):
        for poll in (None, 0):
            for name in ("full", "sekv"):
                ctx = ContextConfig(n_threads=threads, poll=poll)
                policy = make_policy(name, model, len(tokens) + 3 * args.steps + 8, ctx,
                                     BudgetConfig(kv_budget=args.budget))
                try:
                    logits = policy.prefill(tokens)
                    decode_rate(policy, logits, 4)  # warm-up
                    alone, logits = decode_rate(policy, logits, args.steps)
                    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]
                    try:
                        time.sleep(0.5)
                        busy, logits = decode_rate(policy, logits, args.steps)
                    finally:
                        for p in spinners:
                            p.kill()
                            p.wait()
                finally:
                    policy.close()
                row = {"policy": name, "threads": threads, "poll": 50 if poll is None else poll,
                       "alone_tok_s": round(alone, 2), "busy_tok_s": round(busy, 2),
                       "busy_over_alone": round(busy / alone, 3)}
                rows.append(row)
                print(row, flush=True)
    out = {"model": Path(path).name, "cores": cores, "competitors": f"{cores} x `python -c '{SPIN}'`",
           "prompt_tokens": len(tokens), "steps": args.steps, "budget": args.budget, "rows": rows}
    record(args.out, "contention", out)
    plot(rows, Path(args.out).with_name("contention.png"))
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{r['policy']}\n{r['threads']}t poll {r['poll']}" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["alone_tok_s"] for r in rows], 0.4, label="alone")
    ax.bar(x + 0.2, [r["busy_tok_s"] for r in rows], 0.4, label="a busy loop on every core")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("decode tok/s")
    ax.legend(fontsize=8)
    ax.set_title("Gemma 3 270M decode beside CPU-bound processes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
