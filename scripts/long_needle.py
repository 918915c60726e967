"""A needle in a long natural document, with the engine's decisions traced: where the needle's tokens went (anchor,
span, window), whether its span is zoomed in each hooked layer after the first routing and at every later step,
and whether the answer holds the value — for full KV and sekv at a few budgets and routers. Writes JSON.

The case a new user tries: ~28K tokens of Python documentation prose, one plain sentence holding a 7-digit value at
depth 0.3 (``--value word``: a one-word password; ``--depth``), the question at the end.

    .venv/bin/python scripts/long_needle.py --tokens 28000 --budgets 0.1 0.2 --routers index mass

``--task niah_word`` (or another single-needle RULER task of ``sekv_gguf.ruler_tasks``) traces the evaluation's own
prompt instead: its needle sentence at ``--depth``, seed by seed (``--haystack code`` for ``code_function``;
``table_lookup`` is its own table). Each sekv row also says how the spans fall on the text's lines
(``structure``: spans that end a line, lines cut across spans, the anchors' digits).

    .venv/bin/python scripts/long_needle.py --model QWEN.gguf --task table_lookup --tokens 8192 --seeds 0 1 \
        --budgets 0.1 --routers index --out bench/trace-table-8k.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from sekv_gguf.cli import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.decode import decode_loop, greedy
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.trace import needle_placement, sekv_memory, span_structure, zoomed
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.ruler_tasks import HAYSTACKS, PINNED_DEPTH_TASKS, access_code_needle, answer_span, make_case, token_range
from sekv_gguf.session import full_kv_bytes, load_model


def build(model, task: str | None, n_tokens: int, depth: float, seed: int,
          haystack: str = "prose", value: str = "code") -> tuple[list[int], str, tuple[int, int]]:
    """Prompt tokens, the value and the needle sentence's token range (one token of margin each side): the access
    code (or password: ``value="word"``) case, or the evaluation's prompt for ``task`` (as ``eval --depths`` makes
    it)."""
    tok = lambda s: model.tokenize(s.encode(), add_bos=True, special=False)  # noqa: E731
    count = lambda s: len(tok(s))  # noqa: E731
    if task is None:
        needle = access_code_needle(count, n_tokens, depth, seed, value)
        return tok(needle.prompt), needle.answer, token_range(count, needle.prompt, needle.span)
    case = make_case(task, count, n_tokens, seed, haystack, depth)
    value = case.answers[0]
    return tok(case.prompt), value, token_range(count, case.prompt, answer_span(case, value))


def trace(model, tokens: list[int], value: str, needle: tuple[int, int], name: str, budget: float | None,
          params: SekvConfig | None, n_predict: int, threads: int) -> dict:
    n_ctx = len(tokens) + n_predict
    policy = make_policy(name, model, n_ctx, ContextConfig(n_threads=threads), BudgetConfig(kv_budget=budget or 1.0),
                         params)
    t0 = time.perf_counter()
    row: dict = {"policy": name, "budget": budget, "router": params.router if params else None,
                 "params": vars(params) if params else None}
    try:
        logits = policy.prefill(tokens)
        row["prefill_s"] = time.perf_counter() - t0
        row["needle_tokens"], ids = needle_placement(policy, needle)
        row["structure"] = span_structure(policy)
        memory = sekv_memory(policy)
        if memory is not None and memory.anchors:  # where the anchors lie, as depths (quartiles)
            depths = np.array(memory.anchors) / len(tokens)
            row["anchor_depths"] = np.percentile(depths, [0, 25, 50, 75, 100]).round(3).tolist()
        row["zoomed_after_prefill"] = zoomed(memory, ids) if memory is not None else None
        steps: list = []
        done = decode_loop(policy.step, logits, n_predict, greedy,
                           after_step=lambda k, logits: steps.append(zoomed(memory, ids)) if memory else None)
        row["zoomed_per_step"] = steps
        row["text"] = policy.session.text(done.tokens)
        row["found"] = value in row["text"]
        stats = policy.stats()
        row["sekv"] = asdict(stats.sekv) if stats.sekv else None
        row["host_kv_bytes"] = stats.host_kv_bytes
        row["device_kv_bytes"] = stats.device_kv_bytes
        row["full_kv_bytes"] = full_kv_bytes(policy.session, n_ctx, policy.session.config.n_ubatch)
    finally:
        policy.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=28000)
    ap.add_argument("--depth", type=float, default=0.3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.2])
    ap.add_argument("--routers", nargs="+", default=["index", "mass"])
    ap.add_argument("--no-full", action="store_true")
    ap.add_argument("--value", default="code", choices=("code", "word"),
                    help="the plain sentence's value: a 7-digit access code or a one-word password")
    ap.add_argument("--task", choices=PINNED_DEPTH_TASKS, help="trace this RULER task's prompt instead")
    ap.add_argument("--haystack", default="prose", choices=HAYSTACKS, help="the task's haystack (code: source)")
    ap.add_argument("--model", help="GGUF model (default: Gemma 3 270M)")
    ap.add_argument("--sekv", action="append", metavar="KEY=VALUE", help="a SekvConfig override (repeatable)")
    ap.add_argument("-n", "--n-predict", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/long-needle.json")
    args = ap.parse_args()
    model = load_model(args.model or str(default_model_path()))
    rows = []
    for seed in args.seeds:
        tokens, value, needle = build(model, args.task, args.tokens, args.depth, seed, args.haystack, args.value)
        runs = [] if args.no_full else [("full", None, None)]
        extra = sekv_overrides(args.sekv or [])
        runs += [("sekv", b, SekvConfig(router=r, **extra)) for b in args.budgets for r in args.routers]
        for name, budget, params in runs:
            row = trace(model, tokens, value, needle, name, budget, params, args.n_predict, args.threads)
            row.update({"seed": seed, "tokens": len(tokens), "value": value, "needle": list(needle)})
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("seed", "policy", "budget", "router", "found", "text",
                                                      "needle_tokens", "anchor_depths", "zoomed_after_prefill",
                                                      "structure", "prefill_s")}),
                  flush=True)
            Path(args.out).write_text(json.dumps({**envelope(), "params": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
