"""Truncating a SeKV memory to its first ``n`` tokens (``SekvPolicy.truncate``): what a conversation needs when a
client regenerates a reply, edits one or trims a stop string. Called from ``SekvPolicy._truncate``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .window import Window


def truncate(policy: Any, n: int) -> bool:
    """Keep the first ``n`` tokens of ``policy`` (a ``SekvPolicy`` holding more). Inside the window: cut it. Inside
    compressed spans: drop the spans (and anchors) from the first one that reaches position ``n``, then decode the
    tokens from its start up to ``n`` again. False (nothing changed) when the divergence is in the sinks or the
    first span, when no cell would hold the position before the cut (llama.cpp decodes after the largest position)
    or when the sliding-window cache no longer reaches back."""
    w, spans = policy.window, policy.store.spans
    if policy.plan.fits or (len(w) and n >= w.pos[0]) or (not len(w) and not spans and not policy.anchors):
        return _cut_window(policy, n)
    j = next((i for i, s in enumerate(spans) if s.positions[-1] >= n), len(spans))
    b = min(n, int(spans[j].positions[0])) if j < len(spans) else n
    if j == 0 or b <= len(policy.sinks) or not _resumable(policy, b):
        return False
    redo, carry = policy.tokens[b:n], float(policy.signal_log[b])
    dropped = [s.summary_cell for s in spans[j:] if s.summary_cell >= 0]
    policy.cut(b)  # window, anchors and summary cells at positions >= b
    if dropped:
        policy.session.hook.set_bias_cells(-1, dropped, 0.0)  # freed cells start unbiased
    policy.zoom.forget(j)
    policy.store.truncate(j)
    policy.anchors = [p for p in policy.anchors if p < b]
    policy.window = Window()
    _rewind(policy, b)
    policy.carry_signal = carry
    if redo:
        policy.append(redo)
    return True



def _resumable(policy: Any, n: int) -> bool:
    """Whether decoding can go on at position ``n`` once positions >= ``n`` are gone: a cell holds ``n - 1`` and
    the sliding-window cache (iSWA) reaches back far enough."""
    return bool(np.any(policy.session.hook.cells_pos() == n - 1)) and policy.swa_covers(n)


def _cut_window(policy: Any, n: int) -> bool:
    if not _resumable(policy, n):
        return False
    policy.cut(n)
    policy.window.keep(np.flatnonzero(policy.window.pos < n))
    policy.sinks = [p for p in policy.sinks if p < n]
    _rewind(policy, n)
    return True


def _rewind(policy: Any, n: int) -> None:
    """Segmentation statistics and signal as they were after ``n`` tokens; the next token's logits are gone."""
    policy.signal_log = policy.signal_log[:n]
    policy.sentence_end = policy.sentence_end[:n]
    policy.segmenter.rewind(policy.signal_log[len(policy.sinks):n], len(policy.anchors))
    policy.prev_logits = None
