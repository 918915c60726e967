"""Which rows does a streamed prefill get wrong? The 2×2 oracle on a long needle case: a streamed SeKV memory (f16 rows
at full rank, so the host tier holds the streamed rows exactly) whose rows are swapped for the rows of a full-attention
pass of the same prompt — the needle's spans (needle rows), the other spans, and the resident rows (sinks, anchors,
window and the sliding-window cache) — then routed with the prompt's last query, its last token decoded again and the
answer generated. If exact needle rows alone bring the answer back, the needle's own rows are at fault (recompute
the most deviant spans); if only exact other rows do, the rows after it carry the error (route every chunk).

    .venv/bin/python scripts/prefill_oracle.py --task niah_word --tokens 28000 --depth 0.1 --seed 0

Tasks with several inserted texts (variable tracking's chain, multi-key needles) count every inserted text as the
needle; a multi-turn case (``--task niah_multiturn``) is
asked its questions as later turns, each appended and answered as the evaluation does (``eval.suite``), and scored
turn by turn; ``--model`` takes any GGUF (default: the embedded Gemma 3 270M), ``--sekv KEY=VALUE`` overrides the memory's
configuration (e.g. ``step_routing=layer`` for a chain followed hop by hop while generating); ``--force`` zooms the
needle's spans in every layer at the prompt's routing, so a loss the routing causes is set aside.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sekv_gguf.cli.flags import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.decode import decode_loop, greedy
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.tasks import score
from sekv_gguf.models import default_model_path
from sekv_gguf.policies.prefill import exact_pass, refresh_tail
from sekv_gguf.policies.snapshot import DeviceState
from sekv_gguf.provenance import envelope
from sekv_gguf.ruler_tasks import PINNED_DEPTH_TASKS, TASKS, inserted_spans, make_case, token_range
from sekv_gguf.session import load_model
from sekv_gguf.span_store import SpanStore
from sekv_gguf.transfer import copy_swa_state
from zoom_oracle import ForcedRouter

TOP = 5
# (needle rows, other spans' rows, resident rows, sliding-window cache) exact? The 2x2 of needle x rest, the rest split
# into spans and resident rows (with the SWA cache), then the resident rows and the SWA cache apart
VARIANTS = {"2x2": [(False, False, False, False), (False, True, True, True), (True, False, False, False),
                    (True, True, True, True), (False, True, False, False), (False, False, True, True)],
            "resident": [(False, False, True, False), (False, False, False, True), (False, False, True, True)]}


def variant(model, streamed, full, tokens: list[int], needle: list[tuple[int, int]], cfg: SekvConfig,
            budget: BudgetConfig, ctx: ContextConfig, queries: list[np.ndarray], needle_exact: bool,
            spans_exact: bool, resident_exact: bool, swa_exact: bool, n_predict: int, force: bool = False,
            turns: list[tuple[list[int], str]] | None = None) -> dict:
    """The streamed memory with the chosen rows taken from the full pass (the needle's, the other spans', the
    resident tokens' and the sliding-window cache's); its answer, or with ``turns`` (each question's tokens and
    value) each turn's answer."""
    n_ctx = len(tokens) + (sum(len(q) + n_predict for q, _ in turns) if turns else n_predict)
    policy = make_policy("sekv", model, n_ctx, ctx, budget, cfg)
    try:
        DeviceState.take(streamed.session).put(policy.session)
        mem = policy.memory
        mem.load_plain(streamed.memory.to_plain())
        policy.tokens = list(streamed.tokens)
        hook, full_cells = policy.session.hook, full.hook.cells_of(len(tokens))
        in_needle = lambda pos: any(bool(np.any((pos >= a) & (pos < b))) for a, b in needle)  # noqa: E731
        old = mem.store
        spans = list(old.spans)
        exact = [needle_exact if in_needle(s.positions) else spans_exact for s in spans]
        cells = np.concatenate([full_cells[s.positions] for s in spans])

        def rows(ikv: int) -> tuple[np.ndarray, np.ndarray]:  # every span's K, V [sum L, Hkv, d], span after span
            fk, fv = full.hook.get_rows(ikv, cells)
            k, v, o = [], [], 0
            for s, e in zip(spans, exact):
                k.append(fk[o:o + s.length] if e else s.k[ikv].rebuild_f16())
                v.append(fv[o:o + s.length] if e else s.v[ikv].rebuild_f16())
                o += s.length
            return np.concatenate(k), np.concatenate(v)

        store = SpanStore(old.n_layer, old.n_head_kv, old.head_dim, cfg, policy.router.sketch)
        summaries = store.add([s.positions for s in spans], [mem.signal_log[s.positions] for s in spans], rows)
        summary_cells = np.array([s.summary_cell for s in spans], dtype=np.int32)
        store.place_summaries(0, summary_cells)
        for ikv, (k_sum, v_sum) in enumerate(summaries):
            hook.set_rows(ikv, summary_cells, k_sum, v_sum)
        mem.store = store
        mem.zoom.forget(0)  # the slots held the old rows: routing zooms again from the new store
        hook.set_bias_cells(-1, summary_cells, np.log(store.lengths))  # every summary back in every layer
        resident = [p for p in [*mem.sinks, *mem.anchors, *mem.window.pos.tolist()]
                    if (needle_exact if in_needle(np.array([p])) else resident_exact)]
        if resident:
            pos = np.array(sorted(resident), dtype=np.int64)
            where = hook.cells_pos()
            own = np.array([np.flatnonzero(where == p)[0] for p in pos], dtype=np.int32)
            for ikv in range(store.n_layer):
                k, v = full.hook.get_rows(ikv, full_cells[pos])
                hook.set_rows(ikv, own, k, v)
        if swa_exact and hook.info.is_iswa:
            copy_swa_state(full, policy.session)
        mem.swa_transferred = True  # a cache moved by the state API: only the last token is decoded again
        if force:  # the needle's spans zoomed in every layer whatever the ranking (scripts/zoom_oracle.py)
            policy.routing.scan_router = ForcedRouter(needle, set(range(store.n_layer)))
        policy.routing.route(mem, queries, kind="prompt")
        logits = refresh_tail(mem, tokens)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = [(policy.session.text([int(t)]), round(float(p[t]), 3)) for t in np.argsort(-p)[:TOP]]
        kind = lambda e: "exact" if e else "streamed"  # noqa: E731
        flags = {"needle_rows": kind(needle_exact), "other_spans": kind(spans_exact), "resident": kind(resident_exact),
                 "swa_cache": kind(swa_exact)}
        if turns:  # each question a turn after the document, answered before the next (eval.suite._converse)
            texts = [policy.session.text(decode_loop(policy.step, policy.append(q), n_predict, greedy).tokens)
                     for q, _ in turns]
            hits = [value.strip().lower() in text.lower() for text, (_, value) in zip(texts, turns)]
            return {**flags, "turn_outputs": texts, "turn_hits": hits, "text": " | ".join(texts)}
        done = decode_loop(policy.step, logits, n_predict, greedy)
        zoomed = [sorted(set(r) & {i for i, s in enumerate(spans) if in_needle(s.positions)})
                  for r in mem.zoom.resident]
        return {**flags, "text": policy.session.text(done.tokens), "first_top": top, "needle_spans_zoomed": zoomed}
    finally:
        policy.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="niah_word", choices=list(TASKS))
    ap.add_argument("--model", default=None, help="a GGUF model (default: the embedded Gemma 3 270M)")
    ap.add_argument("--sekv", action="append", default=[], metavar="KEY=VALUE", help="a SekvConfig override")
    ap.add_argument("--tokens", type=int, default=28000)
    ap.add_argument("--depth", type=lambda s: None if s == "seed" else float(s), default=0.1,
                    help="the asked needle's depth, pinned (tasks that pin one; the evaluation pins none unless "
                         "told: 'seed' draws it from the seed, as eval does)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=8)
    ap.add_argument("--variants", choices=list(VARIANTS), default="2x2",
                    help="2x2: needle x rest (and the rest split); resident: the resident rows and the SWA cache apart")
    ap.add_argument("--force", action="store_true",
                    help="zoom the needle's spans in every layer at the prompt's routing (a routing loss set aside)")
    ap.add_argument("--out", default="bench/prefill-oracle-28k.json")
    args = ap.parse_args()
    model = load_model(args.model or str(default_model_path()))
    count = lambda s: len(model.tokenize(s.encode(), add_bos=True, special=False))  # noqa: E731
    case = make_case(args.task, count, args.tokens, args.seed, "prose",
                     args.depth if args.task in PINNED_DEPTH_TASKS else None)  # None: the seed's own depth
    value = case.answers[0]
    tokens = model.tokenize(case.prompt.encode(), add_bos=True, special=False)
    turns = [(model.tokenize(t["text"].encode(), add_bos=False, special=False), t["answer"])
             for t in case.meta.get("turns", [])]  # a multi-turn case's questions, in the order asked
    # every inserted text is the needle (a chain's every link)
    needle = [token_range(count, case.prompt, span) for span in inserted_spans(case)]
    ctx, budget = ContextConfig(n_threads=args.threads), BudgetConfig(kv_budget=args.budget)
    cfg = SekvConfig(**{**sekv_overrides(args.sekv), "prefill": "streaming", "energy": 1.0, "host_format": "f16"})
    n_ctx = len(tokens) + (sum(len(q) + args.n_predict for q, _ in turns) if turns else args.n_predict)
    streamed = make_policy("sekv", model, n_ctx, ctx, budget, cfg)
    rows = []
    try:
        streamed.prefill(tokens)
        queries = [np.array(streamed.session.hook.query(ikv)) for ikv in range(streamed.memory.store.n_layer)]
        full = exact_pass(model, ctx, budget.chunk, tokens)
        try:
            for flags in VARIANTS[args.variants]:
                row = variant(model, streamed, full.session, tokens, needle, cfg, budget, ctx, queries, *flags,
                              args.n_predict, args.force, turns)
                row["score"] = sum(row["turn_hits"]) / len(turns) if turns else score(case, row["text"])
                row["found"] = row["score"] > 0
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            full.close()
    finally:
        streamed.close()
    doc = {**envelope(), "params": vars(args), "value": value, "answers": list(case.answers),
           "needle_tokens": [list(r) for r in needle],
           "prompt_tokens": len(tokens), "rows": rows}
    Path(args.out).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, Path(args.out).with_suffix(".png"))
    return 0


def plot(doc: dict, path: Path) -> None:
    """The answer's first-token probability per variant (needle / other spans / resident rows, e = exact)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prob = [r["score"] if "turn_hits" in r else dict(r["first_top"]).get(" " + doc["value"][:4], 0.0)
            for r in doc["rows"]]
    labels = ["/".join("e" if r.get(k, r["resident"]) == "exact" else "s"
                       for k in ("needle_rows", "other_spans", "resident", "swa_cache")) for r in doc["rows"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(labels, prob, color=["tab:green" if r["found"] else "tab:red" for r in doc["rows"]])
    ax.set_ylabel("turns answered" if "turn_hits" in doc["rows"][0] else f"p(first token of {doc['value']!r})")
    ax.set_xlabel("needle / other spans / resident rows / SWA cache (e: exact, s: streamed); green: answered")
    ax.set_title(f"streamed prefill oracle, {doc['prompt_tokens']} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
