"""How a whole prompt is cut when its every token's signal is known at once (an exact prefill, the router's teacher
capture, offline studies): sinks first, the window at the end, and between them anchors and spans by the
segmenter. One function, so that what the trained router learns from is cut exactly as the engine cuts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import SekvConfig
from ..segment import Segmenter
from .budget import BudgetPlan


@dataclass
class PromptCut:
    """Positions of a prompt of ``n`` tokens: sinks ``[0, n_sink)``, ``anchors`` int64 [A], ``spans`` (each int64
    [L], in order), the window ``[window_start, n)``."""

    n_sink: int
    anchors: np.ndarray
    spans: list[np.ndarray]
    window_start: int


def exact_window(plan: BudgetPlan, config: SekvConfig, n: int) -> int:
    """The window a prompt of ``n`` tokens cut at once keeps: the budget's fixed one, or as much of the rest of the
    budget as the summaries of the spans (at most one per ``span_min`` tokens), the anchors' cap, the zoom slots and
    a chunk's room leave (what ``SekvMemory.window_room`` allows with the most it could hold)."""
    if not config.elastic_window:
        return plan.window
    max_spans = -(-max(n - plan.config.n_sink - plan.window, 0) // config.span_min)
    held = plan.config.n_sink + plan.anchor_cap + max_spans + plan.n_zoom
    return max(plan.window, plan.cells - held - plan.chunk - config.span_min - config.span_max)


def cut_prompt(segmenter: Segmenter, signal: np.ndarray, plan: BudgetPlan, config: SekvConfig,
               ends: np.ndarray | None) -> PromptCut:
    """Cut a prompt whose segmentation signal is ``signal`` f32 [n] (``ends``: bool [n], the tokens that end a
    sentence, or None); the segmenter's statistics take every non-sink token first (the anchor threshold is the
    whole prompt's)."""
    n = signal.size
    n_sink = min(plan.config.n_sink, n)
    window_start = max(n_sink, n - exact_window(plan, config, n))
    segmenter.track(signal[n_sink:])
    seg = segmenter.cut(signal[n_sink:window_start], final=True,
                        ends=None if ends is None else np.asarray(ends, dtype=bool)[n_sink:window_start])
    return PromptCut(n_sink=n_sink, anchors=n_sink + seg.anchors, spans=[n_sink + g for g in seg.spans],
                     window_start=window_start)
