"""Where a needle went in a policy's memory, for the trace scripts (``scripts/long_needle.py``,
``scripts/trace_multiturn.py``): which of its tokens are anchors, in the window or in spans (and which spans), and
which of those spans each hooked layer holds zoomed."""

from __future__ import annotations

from typing import Any

from ..policies import Policy
from ..policies.sekv_memory import SekvMemory


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
