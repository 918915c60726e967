"""Cost of one routing call per hooked layer, side by side in one process: ``mass`` (native code over every span's
host K rows) against the two-stage default ``index`` (stage 1 over the block index; stage 2: exact mass of the
resident spans and of ``verify_candidates`` others from their host rows), and the trained router
(Gemma's shape only: its adapter), at 8K / 32K / 128K compressed span tokens (48-token spans), for Gemma 3 270M's
layer shape (4 query heads, 1 KV head × 256) and an 8B shape (32 query heads, 8 KV heads × 128). Resident spans: as
many as the zoom slots of a 20% budget hold (5% of the span tokens). One BLAS thread. Also the host K rows each
call reads. Writes bench/router-cost.json and .png.

    .venv/bin/python scripts/bench_router.py [--adapter bench/gemma3-270m-router.gguf] [--tokens 8192 32768 131072]
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
from sekv_gguf.provenance import envelope
from sekv_gguf.router import HeldSpans, IndexRouter, LowRankMassRouter, Router, TrainedRouter
from sekv_gguf.span_store import SpanStore

SHAPES = {"gemma3-270m": (4, 1, 256), "8b": (32, 8, 128)}  # query heads, KV heads, head dim


def make_store(rng: np.random.Generator, n: int, length: int, n_head_kv: int, d: int, sketch) -> SpanStore:
    """n spans of correlated random keys [length, n_head_kv, d], factorised (and sketched) as the engine does."""
    mats = [(0.5 * rng.standard_normal((length, n_head_kv, d)) + rng.standard_normal((1, n_head_kv, d)))
            .astype(np.float32) for _ in range(n)]
    rows = np.concatenate(mats)                                                 # [n * length, Hkv, d]
    store = SpanStore(1, n_head_kv, d, SekvConfig(), sketch)
    store.add([np.arange(length)] * n, [np.ones(length)] * n, lambda ikv: (rows, rows))
    return store


def per_call(router: Router, query: np.ndarray, store: SpanStore, resident, repeat: int) -> tuple[float, int]:
    r = router.rank(0, query, store, resident)  # warm
    t0 = time.perf_counter()
    for _ in range(repeat):
        router.rank(0, query, store, resident)
    return (time.perf_counter() - t0) / repeat * 1e3, r.host_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", default="bench/gemma3-270m-router.gguf")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--span-len", type=int, default=48)
    ap.add_argument("--zoom-share", type=float, default=0.05, help="resident span tokens, share of the context")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default="bench/router-cost")
    args = ap.parse_args()
    a = read_adapter(args.adapter)
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1):
        for shape, (n_head, n_head_kv, d) in SHAPES.items():
            for tokens in args.tokens:
                n = tokens // args.span_len
                gemma = (n_head, n_head_kv, d) == (a.n_head, a.n_head_kv, a.head_dim)
                store = make_store(rng, n, args.span_len, n_head_kv, d,
                                   (a.spread_rank, a.n_centroids, a.kmeans_iters) if gemma else None)
                query = (0.1 * rng.standard_normal((n_head, d))).astype(np.float32)
                capacity = int(args.zoom_share * tokens)
                index = IndexRouter()
                held = np.argsort(-index.propose(0, query, store))[:capacity // args.span_len]
                resident = HeldSpans(store, held, capacity)
                routers = {"mass": LowRankMassRouter(), "index": index}
                if gemma:
                    routers["trained+verify"] = TrainedRouter(a)
                row = {"shape": shape, "spans": n, "span_tokens": n * args.span_len, "resident_spans": int(held.size),
                       "index_bytes": store.index_bytes}
                for name, r in routers.items():
                    ms, host = per_call(r, query, store, resident, args.repeat)
                    row[name] = {"ms": ms, "host_rows": host}
                row["index_vs_mass"] = row["index"]["ms"] / row["mass"]["ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(
        {**envelope(), "adapter": args.adapter,
         "unit": "ms per routing call per layer (one thread); K rows read per call per layer",
         "verify_candidates": SekvConfig.verify_candidates, "block_tokens": SekvConfig.block_tokens,
         "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, shape in zip(axes, SHAPES):
        sub = [r for r in rows if r["shape"] == shape]
        for name in ("mass", "index", "trained+verify"):
            if name in sub[0]:
                ax.plot([r["span_tokens"] for r in sub], [r[name]["ms"] for r in sub], "o-", label=name)
        ax.set(xscale="log", yscale="log", xlabel="compressed span tokens", ylabel="ms per routing call per layer",
               title=f"router cost, {shape} layer shape (1 thread)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
