"""The multi-turn evaluation's document (``eval --tasks niah_multiturn``) with sekv's decisions traced per turn: where
each needle's tokens went (anchors, spans), which hooked layers hold each needle's spans after the turn's question,
how the router ranked them, and the first answer token's top probabilities — beside full KV's. ``--force`` runs the
oracle variants too: the asked needle's spans forced into every layer's choice, and also the other needles'
spans kept out. Writes JSON.

    .venv/bin/python scripts/trace_multiturn.py --tokens 8192 --seeds 1 2 --force
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sekv_gguf.cli import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.decode import decode_loop, greedy
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.trace import multiturn_conversation, sekv_memory, spans_holding
from sekv_gguf.models import default_model_path
from sekv_gguf.policies import Policy
from sekv_gguf.provenance import envelope
from sekv_gguf.session import load_model

N_TOP = 5  # first-answer-token candidates reported
FORCED = 1e30  # the score that puts a span first in the forced oracle


def top(policy: Policy, logits: np.ndarray) -> list[tuple[str, float]]:
    p = np.exp(logits - logits.max())
    p /= p.sum()                                                      # [n_vocab]
    best = np.argsort(-p)[:N_TOP]
    return [(policy.session.text([int(t)]), round(float(p[t]), 3)) for t in best]


def run(model, doc: list[int], turns: list[tuple[list[int], str]], spans_of: list[tuple[int, int]], name: str,
        budget: float | None, params: SekvConfig | None, mode: str, threads: int, n_predict: int) -> dict:
    """One conversation; ``mode``: "" (as the policy decides), "force" (the asked needle's spans first in every
    layer's choice), "isolate" (also the other needles' spans never chosen)."""
    n_ctx = len(doc) + sum(len(q) for q, _ in turns) + len(turns) * n_predict
    policy = make_policy(name, model, n_ctx, ContextConfig(n_threads=threads), BudgetConfig(kv_budget=budget or 1.0),
                         params)
    row: dict = {"policy": name, "budget": budget, "mode": mode, "turns": []}
    try:
        policy.prefill(doc)
        memory = sekv_memory(policy)
        ids = [spans_holding(memory, range(a, b)) for a, b in spans_of] if memory else []  # per needle: its spans
        if memory is not None:
            row["needle_spans"] = ids
            row["needle_anchor_text"] = [policy.session.text([policy.tokens[p] for p in sorted(set(range(a, b))
                                                                                                  & set(memory.anchors))])
                                         for a, b in spans_of]
        for question, answer in turns:
            asked = next(i for i, (a, b) in enumerate(spans_of)
                         if answer in policy.session.text(doc[a:b]))
            ranks: dict[int, list[int]] = {}
            if memory is not None:
                zoom = memory.zoom
                choose = zoom.choose.__func__

                def chooser(scores, lengths, pins=(), share=0.0, _self=zoom, _asked=asked):
                    scores = np.asarray(scores, dtype=np.float64).copy()  # [n_spans]
                    order = list(np.argsort(-scores, kind="stable"))
                    ikv = len(ranks)
                    ranks[ikv] = [[order.index(s) for s in sp] for sp in ids]
                    if mode:  # ahead of every other span (finite: a choice keeps finite scores only)
                        scores[ids[_asked]] = FORCED
                    if mode == "isolate":
                        for j, sp in enumerate(ids):
                            if j != _asked:
                                scores[sp] = -np.inf
                                pins = [p for p in pins if p not in sp]  # the lexical pins keep them out too
                    return choose(_self, scores, lengths, pins, share)

                zoom.choose = chooser
            logits = policy.append(question)
            first = top(policy, logits)
            out = decode_loop(policy.step, logits, n_predict, greedy).tokens
            if memory is not None:
                zoom.choose = choose.__get__(zoom)
            text = policy.session.text(out)
            turn = {"asked": asked, "answer": answer, "text": text, "hit": answer in text, "first": first}
            if memory is not None:
                turn["ranks_at_question"] = [ranks[k] for k in sorted(ranks)][: memory.store.n_layer]
                turn["resident_after"] = [[sorted(set(sp) & set(r)) for sp in ids] for r in memory.zoom.resident]
            row["turns"].append(turn)
    finally:
        policy.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--force", action="store_true", help="also the oracle runs (forced / isolated needle spans)")
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("--sekv", action="append", metavar="KEY=VALUE", help="a SekvConfig override (repeatable)")
    ap.add_argument("-n", "--n-predict", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/trace-multiturn.json")
    args = ap.parse_args()
    model = load_model(str(default_model_path()))
    params = SekvConfig(**sekv_overrides(args.sekv or []))
    rows = []
    for seed in args.seeds:
        conv = multiturn_conversation(model, args.tokens, seed)
        case, doc, turns = conv.case, conv.doc, conv.turns
        spans_of = [conv.needles[v] for v in case.answers]
        runs = [] if args.no_full else [("full", None, None, "")]
        runs += [("sekv", args.budget, params, m) for m in ([""] + (["force", "isolate"] if args.force else []))]
        for name, budget, p, mode in runs:
            row = run(model, doc, turns, spans_of, name, budget, p, mode, args.threads, args.n_predict)
            row.update({"seed": seed, "values": list(case.answers), "needles": spans_of,
                        "depths": [t["depth"] for t in case.meta["turns"]]})
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("seed", "policy", "mode")}),
                  *[json.dumps(t) for t in row["turns"]], sep="\n  ", flush=True)
            Path(args.out).write_text(json.dumps({**envelope(), "params": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
