"""Does recomputing the sliding window after routing rescue a streamed prefill? The oracle
(``scripts/prefill_oracle.py``) found the error of a streamed 28K prefill in Gemma 3's sliding-window cache; the
tail refresh can re-decode at most one ubatch (the SWA cache holds n_swa + n_ubatch positions). Here the streamed
prefill runs with larger chunks (``BudgetConfig.chunk``) and a tail refresh of a whole chunk — which rebuilds the
n_swa window and the question from global layers that read the zoomed spans — on the RULER word cases, beside the
default chunk and refresh. Writes bench/<out>.json.

    .venv/bin/python scripts/refresh_probe.py --budget 3072 --out bench/refresh-probe-28k
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.ruler_tasks import make_case
from sekv_gguf.session import load_model

# (chunk, refresh_tokens, chunk_routing, seeds): the default beside a chunk-long refresh
SETTINGS = [(256, 32, "none", (0,)), (768, 768, "none", (0, 1, 2)), (768, 768, "layer", (0,))]
DEPTHS = {0: 0.1, 1: 0.5, 2: 0.9}  # the evaluation's pinned depths, seed s at DEPTHS[s]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="niah_word", choices=["niah_word", "niah_number"])
    ap.add_argument("--settings", choices=["compare", "chunk"], default="compare",
                    help="compare: the default beside the chunk-long refresh; chunk: the chunk-long refresh only, "
                         "every seed")
    ap.add_argument("--tokens", type=int, default=28000)
    ap.add_argument("--budget", type=float, default=3072, help="cells (a 768-token chunk needs more than 10%% at 28K)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/refresh-probe-28k")
    args = ap.parse_args()
    model = load_model(str(default_model_path()))
    count = lambda s: len(model.tokenize(s.encode(), add_bos=True, special=False))  # noqa: E731
    rows = []
    settings = SETTINGS if args.settings == "compare" else [(768, 768, "none", (0, 1, 2))]
    for chunk, refresh, routing, seeds in settings:
        for seed in seeds:
            case = make_case(args.task, count, args.tokens, seed, "prose", DEPTHS[seed])
            tokens = model.tokenize(case.prompt.encode(), add_bos=True, special=False)
            budget = BudgetConfig(kv_budget=args.budget, chunk=chunk, chunk_share=0.4)
            cfg = SekvConfig(prefill="streaming", refresh_tokens=refresh, chunk_routing=routing)
            policy = make_policy("sekv", model, len(tokens) + 8, ContextConfig(n_threads=args.threads), budget, cfg)
            t0 = time.perf_counter()
            try:
                r = generate(policy, tokens, 8)
                row = {"chunk": policy.plan.chunk, "refresh_tokens": refresh, "chunk_routing": routing, "seed": seed,
                       "depth": DEPTHS[seed], "value": case.answers[0], "text": r.text,
                       "found": case.answers[0].lower() in r.text.lower(), "prefill_s": r.prefill_s,
                       "wall_s": time.perf_counter() - t0, "budget_cells": policy.plan.cells,
                       "device_kv_bytes": r.device_kv_bytes}
            finally:
                policy.close()
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {**envelope(), "params": vars(args), "prompt_tokens": args.tokens, "rows": rows}
    Path(args.out).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, Path(args.out).with_suffix(".png"))
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"chunk {r['chunk']}\nrefresh {r['refresh_tokens']}\n{r['chunk_routing']} d{r['depth']}" for r in rows]
    ax.bar(range(len(rows)), [1 if r["found"] else 0.05 for r in rows],
           color=["tab:green" if r["found"] else "tab:red" for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_yticks([0, 1], ["missed", "found"])
    ax.set_title("streamed 28K prefill: RULER needles with a chunk-long tail refresh")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
