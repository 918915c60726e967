"""Where a multi-turn answer is decided: the evaluation's document (``eval --tasks niah_multiturn``), its first
question, and the right answer teacher-forced token by token under full KV and sekv; per answer token the
probability of the right token and the most probable one. A question answered with another needle's value shows
the one token where the values part (a shared first digit moves it to the second). Writes JSON.

    .venv/bin/python scripts/answer_digits.py --model qwen-coder --seeds 1 4 --out bench/answer-digits-qwen-8k.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sekv_gguf.cli import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.fidelity import log_softmax
from sekv_gguf.eval.trace import multiturn_conversation
from sekv_gguf.models import model_by_name
from sekv_gguf.provenance import envelope
from sekv_gguf.session import load_model


def forced(model, doc: list[int], question: list[int], answer: str, name: str, budget: float | None,
           params: SekvConfig | None, threads: int) -> list[dict]:
    """The right answer's tokens fed one by one after ``question``: per token, p(it) and the argmax with its p."""
    target = model.tokenize((" " + answer).encode(), add_bos=False, special=False)
    policy = make_policy(name, model, len(doc) + len(question) + len(target) + 1, ContextConfig(n_threads=threads),
                         BudgetConfig(kv_budget=budget or 1.0), params)
    rows = []
    try:
        policy.prefill(doc)
        logits = policy.append(question)
        for token in target:
            p = np.exp(log_softmax(np.asarray(logits)))  # [n_vocab]
            best = int(np.argmax(p))
            rows.append({"token": policy.session.text([token]), "p": round(float(p[token]), 3),
                         "top": policy.session.text([best]), "p_top": round(float(p[best]), 3)})
            logits = policy.step(token)
    finally:
        policy.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma", help='"gemma" (the default model), "qwen-coder", or a GGUF path')
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--sekv", action="append", metavar="KEY=VALUE", help="a SekvConfig override (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/answer-digits.json")
    args = ap.parse_args()
    path = model_by_name(args.model)
    model = load_model(str(path))
    params = SekvConfig(**sekv_overrides(args.sekv or []))
    rows = []
    for seed in args.seeds:
        conv = multiturn_conversation(model, args.tokens, seed)
        question, answer = conv.turns[0]
        for name, budget, p in (("full", None, None), ("sekv", args.budget, params)):
            row = {"seed": seed, "policy": name, "budget": budget, "answer": answer,
                   "other_values": [v for v in conv.case.answers if v != answer],
                   "tokens": forced(model, conv.doc, question, answer, name, budget, p, args.threads)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps({**envelope(), "model": path.name, "params": vars(args),
                                                  "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
