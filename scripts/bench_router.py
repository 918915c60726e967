"""Cost of one routing call per hooked layer, side by side in one process: the training-free ``mass`` score (native
code over every span's host K rows) and the trained router (numpy features from the key sketches, alone and with
``verify_candidates`` spans checked by the mass kernel), for Gemma 3 270M's layer shape (4 query heads, 1 KV head,
head_dim 256), spans of 48 tokens, and a span count per context length (~1 span per 50 tokens). One BLAS thread.
Writes bench/router-cost.json and .png.

    .venv/bin/python scripts/bench_router.py [--adapter bench/gemma3-270m-router.gguf] [--spans 160 640 2560]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from sekv_gguf.adapter import read_adapter
from sekv_gguf.config import SekvConfig
from sekv_gguf.provenance import commit, machine
from sekv_gguf.router import LowRankMassRouter, Router, TrainedRouter
from sekv_gguf.span_store import SpanStore


def spans_like_gemma(rng: np.random.Generator, n: int, length: int, n_head_kv: int, d: int, a) -> SpanStore:
    """n spans of correlated random keys [length, n_head_kv, d], factorised and sketched as the engine does."""
    mats = [(0.5 * rng.standard_normal((length, n_head_kv, d)) + rng.standard_normal((1, n_head_kv, d)))
            .astype(np.float32) for _ in range(n)]
    rows = np.concatenate(mats)                                                 # [n * length, Hkv, d]
    store = SpanStore(1, n_head_kv, d, SekvConfig(), (a.spread_rank, a.n_centroids, a.kmeans_iters))
    store.add([np.arange(length)] * n, [np.ones(length)] * n, lambda ikv: (rows, rows))
    return store


def per_call_ms(router: Router, args: tuple, repeat: int) -> float:
    router.score(*args)  # warm
    t0 = time.perf_counter()
    for _ in range(repeat):
        router.score(*args)
    return (time.perf_counter() - t0) / repeat * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", default="bench/gemma3-270m-router.gguf")
    ap.add_argument("--spans", type=int, nargs="+", default=[160, 640, 2560])
    ap.add_argument("--span-len", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default="bench/router-cost")
    args = ap.parse_args()
    a = read_adapter(args.adapter)
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1):
        for n in args.spans:
            store = spans_like_gemma(rng, n, args.span_len, a.n_head_kv, a.head_dim, a)
            query = (0.1 * rng.standard_normal((a.n_head, a.head_dim))).astype(np.float32)
            call = (0, query, store)
            routers = {"mass": LowRankMassRouter(), "trained": TrainedRouter(a, candidates=0),
                       "trained+verify": TrainedRouter(a)}
            row = {"spans": n, "span_tokens": n * args.span_len}
            row.update({name: per_call_ms(r, call, args.repeat) for name, r in routers.items()})
            rows.append(row)
            print(json.dumps(row))
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(
        {"machine": machine(), "commit": commit(), "adapter": args.adapter, "unit": "ms per routing call per layer",
         "verify_candidates": SekvConfig.verify_candidates, "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("mass", "trained", "trained+verify"):
        ax.plot([r["span_tokens"] for r in rows], [r[name] for r in rows], "o-", label=name)
    ax.set(xscale="log", yscale="log", xlabel="compressed span tokens", ylabel="ms per routing call per layer",
           title="router cost (Gemma 3 270M layer shape, 1 thread)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
