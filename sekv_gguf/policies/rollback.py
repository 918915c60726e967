"""Truncating a SeKV memory to its first ``n`` tokens (``SekvPolicy.truncate``): what a conversation needs when a
client regenerates a reply, edits one or trims a stop string. ``truncate`` changes the memory object; the policy
then removes the positions it names from the context and decodes again what lies between."""

from __future__ import annotations

import numpy as np

from .sekv_memory import SekvMemory
from .window import Window


def truncate(memory: SekvMemory, n: int) -> int | None:
    """Forget what ``memory`` holds from position ``n`` on (it holds more); the position ``b <= n`` from which
    the caller removes every position and decodes tokens ``[b, n)`` again (the tokens of a compressed span cut
    in its middle), or None (nothing changed) when the divergence is in the sinks or the first span, when no
    cell would hold the position before the cut (llama.cpp decodes after the largest position) or when the
    sliding-window cache no longer reaches back. Inside the window: cut it. Inside compressed spans: drop the spans
    (and anchors) from the first one that reaches position ``n``."""
    w, spans = memory.window, memory.store.spans
    if memory.plan.fits or (len(w) and n >= w.pos[0]) or (not len(w) and not spans and not memory.anchors):
        return _cut_window(memory, n)
    j = next((i for i, s in enumerate(spans) if s.positions[-1] >= n), len(spans))
    b = min(n, int(spans[j].positions[0])) if j < len(spans) else n
    if j == 0 or b <= len(memory.sinks) or not _resumable(memory, b):
        return None
    carry = float(memory.signal_log[b])
    dropped = [s.summary_cell for s in spans[j:] if s.summary_cell >= 0]
    if dropped:
        memory.hook.set_bias_cells(-1, dropped, 0.0)  # freed cells start unbiased
    memory.zoom.forget(j)
    memory.store.truncate(j)
    memory.anchors = [p for p in memory.anchors if p < b]
    memory.window = Window()
    _rewind(memory, b)
    memory.carry_signal = carry
    return b


def _resumable(memory: SekvMemory, n: int) -> bool:
    """Whether decoding can go on at position ``n`` once positions >= ``n`` are gone: a cell holds ``n - 1`` and
    the sliding-window cache (iSWA) reaches back far enough."""
    return bool(np.any(memory.hook.cells_pos() == n - 1)) and memory.session.swa_covers(n)


def _cut_window(memory: SekvMemory, n: int) -> int | None:
    if not _resumable(memory, n):
        return None
    memory.window.keep(np.flatnonzero(memory.window.pos < n))
    memory.sinks = [p for p in memory.sinks if p < n]
    _rewind(memory, n)
    return n


def _rewind(memory: SekvMemory, n: int) -> None:
    """Segmentation statistics and signal as they were after ``n`` tokens; the next token's logits are gone."""
    memory.signal_log = memory.signal_log[:n]
    memory.sentence_end = memory.sentence_end[:n]
    memory.segmenter.rewind(memory.signal_log[len(memory.sinks):n], len(memory.anchors))
    memory.prev_logits = None
