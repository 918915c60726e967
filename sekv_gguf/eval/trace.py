"""Where a needle went in a policy's memory, for the trace scripts (``scripts/long_needle.py``,
``scripts/trace_multiturn.py``): which of its tokens are anchors, in the window or in spans (and which spans), and
which of those spans each hooked layer holds zoomed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..policies import Policy
from ..policies.sekv_memory import SekvMemory
from ..ruler_tasks import Case, answer_span, make_case, token_range


@dataclass
class Conversation:
    """The multi-turn evaluation's case (``eval --tasks niah_multiturn``, prose haystack) in a model's tokens."""

    case: Case
    doc: list[int]                           # the document, with BOS
    turns: list[tuple[list[int], str]]       # each question's tokens and its answer, in the order asked
    needles: dict[str, tuple[int, int]]      # each needle's value -> its sentence's token positions in ``doc``


def multiturn_conversation(model, n_tokens: int, seed: int) -> Conversation:
    """Seed ``seed``'s multi-turn case of ``n_tokens`` tokens, sized and tokenized by ``model`` (a llama_cpp.Llama)."""
    count = lambda s: len(model.tokenize(s.encode(), add_bos=True, special=False))  # noqa: E731
    case = make_case("niah_multiturn", count, n_tokens, seed, "prose")
    doc = model.tokenize(case.prompt.encode(), add_bos=True, special=False)
    turns = [(model.tokenize(t["text"].encode(), add_bos=False, special=False), t["answer"])
             for t in case.meta["turns"]]
    needles = {v: token_range(count, case.prompt, answer_span(case, v)) for v in case.answers}
    return Conversation(case, doc, turns, needles)


def sekv_memory(policy: Policy) -> SekvMemory | None:
    """The policy's memory when it is SeKV's engine (sekv, quest, sentencekv), else None."""
    return policy.memory if isinstance(policy.memory, SekvMemory) else None


def spans_holding(memory: SekvMemory, positions: range) -> list[int]:
    """Ids of the spans that hold any of ``positions``."""
    pos = set(positions)
    return [s.id for s in memory.store.spans if pos & set(s.positions.tolist())]


def zoomed(memory: SekvMemory, ids: list[int]) -> list[list[int]]:
    """Per hooked layer: which of the spans ``ids`` are zoomed."""
    return [sorted(set(ids) & set(r)) for r in memory.zoom.resident] if ids else []


def needle_placement(policy: Policy, needle: tuple[int, int]) -> tuple[dict[str, Any], list[int]]:
    """How many tokens of ``needle`` (a position range) are anchors, in the window or in spans, their text, and the
    ids of those spans (a policy without SeKV's memory: every token counted resident)."""
    pos = set(range(*needle))
    memory = sekv_memory(policy)
    if memory is None:
        return {"resident": len(pos)}, []
    ids = spans_holding(memory, range(*needle))
    spans = memory.store.spans
    text = lambda ps: policy.session.text([policy.tokens[p] for p in sorted(ps)])  # noqa: E731
    return {"anchors": len(pos & set(memory.anchors)), "window": len(pos & set(memory.window.pos.tolist())),
            "spans": sum(len(pos & set(s.positions.tolist())) for s in spans), "span_ids": ids,
            "span_text": {str(s.id): text(pos & set(s.positions.tolist())) for s in spans if s.id in ids},
            "anchor_text": text(pos & set(memory.anchors))}, ids


def span_structure(policy: Policy) -> dict[str, Any] | None:
    """How the spans fall on the text's lines (code, tables): spans, their mean length, the share that end a line
    (their last token holds a line break), line breaks per span, the share of the document's lines whose tokens
    lie in more than one span (a table row cut in two), and the anchors' share of digit tokens with a few of their
    texts (None for a policy without SeKV's memory)."""
    memory = sekv_memory(policy)
    if memory is None or not memory.store.spans:
        return None
    piece = lambda p: policy.session.text([policy.tokens[p]])  # noqa: E731
    breaks_at = np.array([b"\n" in policy.session.piece(t) for t in policy.tokens])   # bool [n_tokens]
    line_of = np.concatenate([[0], np.cumsum(breaks_at)[:-1]])                       # [n_tokens] line numbers
    spans = [s.positions.tolist() for s in memory.store.spans]
    breaks = [int(breaks_at[s].sum()) for s in spans]
    lines_spans: dict[int, set[int]] = {}
    for i, s in enumerate(spans):
        for p in s:
            lines_spans.setdefault(int(line_of[p]), set()).add(i)
    anchors = sorted(memory.anchors)
    anchor_text = [piece(p) for p in anchors]
    return {"spans": len(spans), "mean_len": round(float(np.mean([len(s) for s in spans])), 1),
            "end_a_line": round(float(np.mean([breaks_at[s[-1]] for s in spans])), 3),
            "breaks_per_span": round(float(np.mean(breaks)), 2),
            "lines_split": round(float(np.mean([len(v) > 1 for v in lines_spans.values()])), 3),
            "anchors": len(anchors),
            "anchor_digits": round(float(np.mean([t.strip().isdigit() for t in anchor_text])), 3) if anchors else 0.0,
            "anchor_sample": anchor_text[:: max(1, len(anchor_text) // 12)][:12]}
