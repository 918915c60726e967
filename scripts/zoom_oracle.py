"""Is a lost answer the routing's? The zoom oracle: a streamed SeKV memory whose prompt routing is forced to zoom the
needle's spans (every span holding a token of an inserted text) in chosen hooked layers, the rest of each layer's
slots by the usual exact-mass ranking; the tail refreshed and the answer generated as usual. If the forced zoom
brings the answer back, the router did not find what the question needs; if not, something else is lost (the rows,
the summaries of the other spans, the refresh). Writes JSON: per variant the answer, the needle's rank among the
spans in each layer at the last prompt routing, and the layers that hold it after the prompt and after the answer.

    .venv/bin/python scripts/zoom_oracle.py --model QWEN.gguf --task table_lookup --tokens 8192 --seed 1 \
        --depth 0.7 --variants none all --out bench/zoom-oracle-table-qwen-8k-s1.json

Variants: ``none`` (the router alone), ``all`` (every layer), or comma-separated layer numbers; ``--sekv KEY=VALUE``
overrides the memory's configuration (e.g. ``host_format=f16 energy=1`` for an exact host tier).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from sekv_gguf.cli import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.decode import decode_loop, greedy
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.tasks import score
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.router import LowRankMassRouter
from sekv_gguf.ruler_tasks import PINNED_DEPTH_TASKS, TASKS, inserted_spans, make_case, token_range
from sekv_gguf.session import load_model
from sekv_gguf.span_store import SpanStore

FORCED = 1e9  # the score a forced span gets: above any attention log-mass


class ForcedRouter(LowRankMassRouter):
    """Exact mass over every span (the prompt routing's scan), with the needle's spans scored first in ``layers``
    (None: none); records the needle's rank per layer before forcing."""

    def __init__(self, needle: list[tuple[int, int]], layers: set[int] | None):
        super().__init__()
        self.needle, self.layers = needle, layers
        self.ranks: dict[int, list[int]] = {}

    def needle_spans(self, store: SpanStore) -> list[int]:
        return [i for i, sp in enumerate(store.spans)
                if any(bool(np.any((sp.positions >= a) & (sp.positions < b))) for a, b in self.needle)]

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        s = super().score(ikv, query, store)          # [n_spans]
        sids = self.needle_spans(store)
        rank = np.empty(s.size, dtype=np.int64)
        rank[np.argsort(-s, kind="stable")] = np.arange(s.size)
        self.ranks[ikv] = [int(rank[i]) for i in sids]
        if self.layers is not None and ikv in self.layers:
            s = s.copy()
            s[sids] = FORCED
        return s


def layers_of(variant: str, n_layer: int) -> set[int] | None:
    if variant == "none":
        return None
    if variant == "all":
        return set(range(n_layer))
    return {int(x) for x in variant.split(",")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF model (default: the embedded Gemma 3 270M)")
    ap.add_argument("--task", default="table_lookup", choices=list(TASKS))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=float, default=0.7)
    ap.add_argument("--haystack", default="code")
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["none", "all"])
    ap.add_argument("--sekv", action="append", default=[], metavar="KEY=VALUE", help="a SekvConfig override")
    ap.add_argument("-n", "--n-predict", type=int, default=12)
    ap.add_argument("--out", default="bench/zoom-oracle.json")
    args = ap.parse_args()
    model = load_model(args.model or str(default_model_path()))
    count = lambda s: len(model.tokenize(s.encode(), add_bos=True, special=False))  # noqa: E731
    case = make_case(args.task, count, args.tokens, args.seed, args.haystack,
                     args.depth if args.task in PINNED_DEPTH_TASKS else None)
    tokens = model.tokenize(case.prompt.encode(), add_bos=True, special=False)
    needle = [token_range(count, case.prompt, span) for span in inserted_spans(case)]
    rows = []
    for v in args.variants:
        policy = make_policy("sekv", model, len(tokens) + args.n_predict, ContextConfig(n_threads=args.threads),
                             BudgetConfig(kv_budget=args.budget), SekvConfig(**sekv_overrides(args.sekv)))
        try:
            mem = policy.memory
            router = ForcedRouter(needle, layers_of(v, policy.session.hook.info.n_layer_kv))
            policy.routing.scan_router = router
            t0 = time.perf_counter()
            logits = policy.prefill(tokens)
            sids = set(router.needle_spans(mem.store))
            held = lambda: [i for i, r in enumerate(mem.zoom.resident) if sids & set(r)]  # noqa: E731
            after_prompt = held()
            done = decode_loop(policy.step, logits, args.n_predict, greedy)
            text = policy.session.text(done.tokens)
            row = {"variant": v, "text": text, "score": score(case, text), "needle_spans": sorted(sids),
                   "needle_lengths": [int(mem.store.lengths[i]) for i in sorted(sids)], "spans": len(mem.store),
                   "zoom_rows_per_layer": mem.zoom.capacity, "needle_rank_per_layer": router.ranks,
                   "layers_holding_needle_after_prompt": after_prompt, "after_answer": held(),
                   "prompt_routes": mem.counters.prompt.routes, "seconds": round(time.perf_counter() - t0, 1)}
        finally:
            policy.close()
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {**envelope(), "params": vars(args), "answers": list(case.answers), "needle_tokens": [list(r) for r in needle],
           "prompt_tokens": len(tokens), "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
