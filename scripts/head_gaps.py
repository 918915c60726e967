"""How much the fitted summary bias differs between query heads: a prose document's first half streamed through a
SeKV memory with the bias fitted per head (``summary_calibration="prefill"``, ``summary_bias_heads``), then, per
span and layer, each head's gap over ``log|S|`` (``SpanStore.summary_bias`` + ``head_offset`` - log|S|) described:
its spread over heads, and how much of its variance one number per span and layer (today's shared bias), one
constant per layer and head, and both together leave. Writes bench/<out>.json.

    .venv/bin/python scripts/head_gaps.py --model QWEN.gguf --out bench/head-gaps-qwen-8k
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.corpora import CORPORA
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.session import load_model


def spread(excess: list[np.ndarray]) -> dict[str, float]:
    """``excess[ikv]`` f32 [S, H] (each head's fitted bias less log|S|) -> the statistics the module names."""
    x = np.concatenate(excess)                                                         # [layers * S, H]
    layer_of = np.repeat(np.arange(len(excess)), [e.shape[0] for e in excess])        # [layers * S]
    per_layer_head = np.stack([excess[ikv].mean(axis=0) for ikv in range(len(excess))])[layer_of]  # [layers * S, H]
    shared = x.mean(axis=1, keepdims=True)                                             # the one bias per span, layer
    total = float(x.var())
    both = x - shared - (per_layer_head - per_layer_head.mean(axis=1, keepdims=True))
    rng = x.max(axis=1) - x.min(axis=1)
    return {"rows": int(x.shape[0]), "heads": int(x.shape[1]), "mean_excess": float(x.mean()),
            "range_over_heads_p10_p50_p90": [float(v) for v in np.percentile(rng, [10, 50, 90])],
            "std_over_heads_p50": float(np.median(x.std(axis=1))),
            "variance": total,
            "left_by_shared_bias": float((x - shared).var()) / total,
            "left_by_layer_head_constant": float((x - per_layer_head).var()) / total,
            "left_by_both": float(both.var()) / total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded default model)")
    ap.add_argument("--tokens", type=int, default=8192, help="document length (the first half is streamed)")
    ap.add_argument("--budget", type=float, default=0.2, help="share of the document's tokens held as cells")
    ap.add_argument("--corpus", default="prose", choices=sorted(CORPORA))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/head-gaps")
    args = ap.parse_args()

    path = args.model or str(default_model_path())
    model = load_model(path, ContextConfig(n_threads=args.threads))
    text = CORPORA[args.corpus]()
    offset = len(text) // 3  # the fidelity evaluation's first document
    tokens = model.tokenize((text[offset:] + text[:offset]).encode()[: 16 * args.tokens], add_bos=True,
                            special=False)[: args.tokens // 2]
    params = SekvConfig(summary_calibration="prefill", summary_bias_heads=True)
    policy = make_policy("sekv", model, len(tokens) + 16, ContextConfig(n_threads=args.threads),
                         BudgetConfig(kv_budget=int(args.budget * args.tokens)), params)
    try:
        policy.prefill(tokens)
        store = policy.memory.store
        log_len = np.log(store.lengths)[:, None]                                     # [S, 1]
        excess = [b[:, None] + o - log_len for b, o in zip(store.summary_bias, store.head_offset) if o.shape[1]]
        result = {"model": Path(path).name, "tokens": len(tokens), "budget_cells": int(args.budget * args.tokens),
                  "corpus": args.corpus, "spans": len(store), **spread(excess)}
    finally:
        policy.close()
    out = Path(args.out).with_suffix(".json")
    out.write_text(json.dumps({**envelope(), **result}, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
