"""Router recall offline: how much of what exact attention mass would zoom does each router's choice keep?

Capture under full KV on Gemma 3 270M (RULER needle prompts, prose haystacks): every hooked layer's K rows, the
queries of the last prompt token (the engine's first, decisive routing), of the token before it (the same with the
engine's one-step lag) and of each greedy answer token; SeKV's segmentation of the prompt, cut as the engine's exact
prefill cuts it for a ``--budget`` plan (``policies.prompt_cut``: sinks, anchors and the window stay out of the spans) and the needle sentence's token range. Per (query,
layer), every router ranks every span (the engine's code: ``sekv_gguf.router``); the reference is exact span mass
(``mass`` over raw host rows). Metrics at M spans (the zoom capacity of the plan, and ``--m-share`` of the spans):

  mass@M     span attention mass (per query head, softmax over spans, mean over heads) of the router's top M,
             relative to that of exact mass's top M (ranked, as the engine ranks, by the max over heads: another
             ranking can hold more mean mass, so this can exceed 1)
  needle@M   over (answer step, layer) where exact mass's top M holds a needle span: share where the router's does
  first@M    needle@M for the last prompt token only
  *-lag      ranked with the previous token's query (what the engine does between routings)
  stage1@M+K needle@M of a two-stage router's proposal alone, at M + ``verify_candidates`` (the set it verifies)

Two-stage rows ("+verify") verify as the engine does in steady state: the router's own best M are taken as
resident (judged from their rows), ``verify_candidates`` more are read from the host. Writes bench/router-recall.json
and .png.

    .venv/bin/python scripts/router_recall.py --lengths 4096 8192 16384 --samples 4 4 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sekv_gguf import native
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig, round_cells
from sekv_gguf.decode import decode_loop
from sekv_gguf.eval import make_case
from sekv_gguf.ruler_tasks import inserted_spans, token_range
from sekv_gguf.models import default_model_path
from sekv_gguf.policies.budget import BudgetPlan
from sekv_gguf.policies.prompt_cut import cut_prompt
from sekv_gguf.provenance import envelope
from sekv_gguf.router import (HeldSpans, IndexRouter, LowRankMassRouter, Router, SummaryRouter, TrainedRouter,
                              verify)
from sekv_gguf.segment import Segmenter, span_ends
from sekv_gguf.session import Session, load_model
from sekv_gguf.span_store import SpanStore, single_threaded_blas


def capture(model, tokens: list[int], n_answer: int, threads: int) -> dict:
    """Full-KV prefill and greedy answer: surprisal, K/V rows access, queries per step (lag query first)."""
    session = Session(model, ContextConfig(n_ctx=round_cells(len(tokens) + n_answer + 1), n_batch=512, n_ubatch=512,
                                           n_threads=threads))
    hook = session.hook
    hook.enable_query_capture()
    n_layer = hook.info.n_layer_kv
    surp, prev = np.zeros(len(tokens), dtype=np.float32), None
    for c0 in range(0, len(tokens) - 1, 512):
        chunk = tokens[c0:min(c0 + 512, len(tokens) - 1)]
        surp[c0:c0 + len(chunk)], prev = session.decode_scored(chunk, prev)
    queries = [[hook.query(i).copy() for i in range(n_layer)]]          # the token before the last: lag of first
    surp[-1:], prev = session.decode_scored(tokens[-1:], prev)
    queries.append([hook.query(i).copy() for i in range(n_layer)])        # the last prompt token: first decision
    decode_loop(lambda tok: session.decode([tok]), prev, n_answer,
                after_step=lambda k, logits: queries.append([hook.query(i).copy() for i in range(n_layer)]))
    return {"session": session, "surprisal": surp, "queries": queries[:-1] if n_answer else queries}


@single_threaded_blas
def study(model, case, tokens: list[int], args, adapter_router: Router | None) -> dict:
    cap = capture(model, tokens, args.answer_tokens, args.threads)
    session, surp, queries = cap["session"], cap["surprisal"], cap["queries"]
    try:
        cfg = SekvConfig(energy=1.0)  # raw host rows: the reference is exact
        n = len(tokens)
        plan = BudgetPlan.of(BudgetConfig(kv_budget=args.budget), n + args.answer_tokens, cfg.zoom_share,
                             cfg.anchor_share)
        groups = cut_prompt(Segmenter(cfg, plan.anchor_cap), surp, plan, cfg, span_ends(cfg, session.piece, tokens)).spans
        hook = session.hook
        layer = hook.layers[0]
        store = SpanStore(hook.info.n_layer_kv, layer.n_head_kv, layer.head_dim_k, cfg,
                          adapter_router.sketch if adapter_router is not None else None)
        cells = np.concatenate([hook.cells_of(n)[g] for g in groups])
        store.add(groups, [surp[g] for g in groups], lambda ikv: hook.get_rows(ikv, cells))
    finally:
        session.close()
    # the needle sentences' tokens -> the spans that hold them
    count = lambda text: len(model.tokenize(text.encode(), add_bos=True, special=False))  # noqa: E731
    needle_pos = [np.arange(*token_range(count, case.prompt, span))
                  for ins, span in zip(case.meta["inserted"], inserted_spans(case)) if ins["answer"]]
    needle_pos = np.concatenate(needle_pos) if needle_pos else np.zeros(0, dtype=np.int64)
    needle = np.array([np.isin(s.positions, needle_pos).any() for s in store.spans])  # [S]
    S = len(store)
    m_engine = max(1, int(plan.n_zoom / max(store.lengths.mean(), 1)))
    ms = {"engine": m_engine, "share": max(1, int(round(args.m_share * S)))}
    K = args.verify_candidates
    index, summary, mass = IndexRouter(K), SummaryRouter(), LowRankMassRouter()
    proposers: dict[str, Router] = {"summary": summary, "index": index}
    if adapter_router is not None:
        proposers["trained"] = adapter_router
    acc: dict = {}

    def add(key: str, value: float) -> None:
        acc.setdefault(key, []).append(value)

    for t in range(1, len(queries)):
        q, q_prev = queries[t], queries[t - 1]
        for ikv in range(store.n_layer):
            per_head = native.span_mass(q[ikv], store.tables[ikv])     # [S, H] log mass per head
            p = np.exp(per_head - per_head.max(axis=0))                  # [S, H] softmax over spans, per head
            p /= p.sum(axis=0)
            exact = per_head.max(axis=1)                                  # [S] the engine's exact score
            exact_order = np.argsort(-exact, kind="stable")

            def ranked(query: np.ndarray) -> dict[str, np.ndarray]:
                out = {"mass": np.argsort(-mass.score(ikv, query, store), kind="stable")}
                for name, r in proposers.items():
                    prop = r.propose(ikv, query, store) if hasattr(r, "propose") else r.score(ikv, query, store)
                    out[name] = np.argsort(-prop, kind="stable")
                return out

            for lag, query in (("", q[ikv]), ("-lag", q_prev[ikv])):
                orders = ranked(query)
                for mk, m in ms.items():
                    ref_mass = p[exact_order[:m]].sum(axis=0).mean()
                    event = bool(needle[exact_order[:m]].any())
                    rows = dict(orders)
                    for name in proposers:
                        held = HeldSpans(store, orders[name][:m])  # its best m, held as in steady state
                        v = verify(ikv, query, store, np.zeros(S) - np.argsort(orders[name]), K, held)
                        rows[f"{name}+verify"] = np.argsort(-v.scores, kind="stable")
                    for name, order in rows.items():
                        top = order[:m]
                        add(f"{name}{lag}|mass@{mk}", float(p[top].sum(axis=0).mean() / ref_mass))
                        if event:
                            add(f"{name}{lag}|needle@{mk}", float(needle[top].any()))
                            if t == 1:
                                add(f"{name}{lag}|first@{mk}", float(needle[top].any()))
                    if event and not lag:
                        for name in proposers:
                            add(f"{name}|stage1@{mk}+K", float(needle[orders[name][:m + K]].any()))
    return {"spans": S, "m": ms, "needle_spans": int(needle.sum()), "metrics": acc}


def summarise(cases: list[dict]) -> dict:
    pooled: dict[str, list[float]] = {}
    for c in cases:
        for k, v in c["metrics"].items():
            pooled.setdefault(k, []).extend(v)
    out: dict[str, dict[str, float]] = {}
    for k, v in sorted(pooled.items()):
        router, metric = k.split("|")
        out.setdefault(router, {})[metric] = float(np.mean(v))
        out[router][metric + "_n"] = len(v)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(result["lengths"])
    routers = ["mass-lag", "summary", "index", "summary+verify", "index+verify", "index+verify-lag"]
    routers += [r for r in ("trained", "trained+verify") if r in result["lengths"][lengths[0]]["summary"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for ax, metric in zip(axes, ("mass@share", "needle@share")):
        width = 0.8 / len(routers)
        for j, r in enumerate(routers):
            vals = [result["lengths"][n]["summary"].get(r, {}).get(metric, np.nan) for n in lengths]
            ax.bar(np.arange(len(lengths)) + j * width, vals, width, label=r)
        ax.set_xticks(np.arange(len(lengths)) + 0.4 - width / 2, [f"{int(n) // 1024}K" for n in lengths])
        ax.set_title(f"{metric} (M = {result['params']['m_share']:.0%} of spans), relative to exact mass")
        ax.set_ylim(0, 1.05)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--samples", type=int, nargs="+", default=[4, 4, 2])
    ap.add_argument("--tasks", nargs="+", default=["niah_number", "niah_multikey"])
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--m-share", type=float, default=0.1)
    ap.add_argument("--verify-candidates", type=int, default=SekvConfig.verify_candidates)
    ap.add_argument("--answer-tokens", type=int, default=8)
    ap.add_argument("--adapter", default=None, help="also rank with a trained router adapter's proposals")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/router-recall")
    args = ap.parse_args()
    model_path = args.model or str(default_model_path())
    model = load_model(model_path)
    trained = TrainedRouter.from_file(args.adapter, model_path, args.verify_candidates) if args.adapter else None
    count = lambda text: len(model.tokenize(text.encode(), add_bos=True, special=False))  # noqa: E731
    samples = (args.samples * len(args.lengths))[:len(args.lengths)] if len(args.samples) == 1 else args.samples
    result = {"name": "router-recall", **envelope(),
              "params": {k: v for k, v in vars(args).items() if k != "out"} | {"model": Path(model_path).name},
              "lengths": {}}
    for length, n_samples in zip(args.lengths, samples):
        cases = []
        for task in args.tasks:
            for s in range(n_samples):
                case = make_case(task, count, length, 100 + s, "prose")
                tokens = model.tokenize(case.prompt.encode(), add_bos=True, special=False)
                r = study(model, case, tokens, args, trained)
                r.update({"task": task, "seed": case.seed, "tokens": len(tokens)})
                cases.append(r)
                print(json.dumps({"length": length, "task": task, "seed": case.seed, "spans": r["spans"],
                                  "m": r["m"], "needle_spans": r["needle_spans"]}), flush=True)
        result["lengths"][length] = {"cases": [{k: v for k, v in c.items() if k != "metrics"} for c in cases],
                                     "summary": summarise(cases)}
        Path(args.out + ".json").write_text(json.dumps(result, indent=1))
    plot(result, Path(args.out + ".png"))
    for length, r in result["lengths"].items():
        print(length)
        for router, m in r["summary"].items():
            print(f"  {router:<22}", " ".join(f"{k} {v:.2f}" for k, v in m.items() if not k.endswith("_n")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
