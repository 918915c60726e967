"""SentenceKV-like (Zhu et al., "SentenceKV: Efficient LLM Inference via Sentence-Level Semantic KV Caching",
2025): the context is grouped into sentences; each sentence keeps a semantic vector (its mean key, per layer and KV
head) for retrieval while its token K/V move to host memory; at decode the sentences whose vectors best match the
current query are brought back to the device at token level, within the budget. A re-implementation from the
paper's description as a composition of SeKV's engine: sentence spans, centroid routing (``q·k̄``), raw host rows,
no summary rows in attention, the newest tokens resident.

Parameters: ``BudgetConfig.kv_budget``, ``n_sink``, ``window``; ``SentenceKVConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..config import BudgetConfig, ContextConfig, SekvConfig
from ..router import CentroidRouter
from ..segment import SentenceSegmenter
from .base import Policy
from .sekv import SekvPolicy


@dataclass
class SentenceKVConfig:
    """span_max: longest sentence piece (longer sentences are split); zoom_share: the retrieved part of the
    budget; route_every, max_new_zooms: as ``SekvConfig``."""

    span_max: int = SekvConfig.span_max
    zoom_share: float = SekvConfig.zoom_share
    route_every: int = SekvConfig.route_every
    max_new_zooms: int = SekvConfig.max_new_zooms

    def __post_init__(self) -> None:
        self.engine()  # validates

    def engine(self) -> SekvConfig:
        """The SeKV engine's parameters: raw rows (energy 1), no anchors, streamed prefill."""
        return SekvConfig(zoom_share=self.zoom_share, route_every=self.route_every, max_new_zooms=self.max_new_zooms,
                          energy=1.0, anchor_share=0.0, span_min=1, span_max=self.span_max, prefill="streaming")


class SentenceKVPolicy(SekvPolicy):
    name = "sentencekv"
    Config = SentenceKVConfig
    takes_router = False  # its router is part of what it is
    stats_key = "baseline"  # reported as a baseline, not as SeKV

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: SentenceKVConfig | None = None, observer: Callable[[Policy], None] | None = None):
        params = params or SentenceKVConfig()
        super().__init__(model, n_context, ctx_config, budget, params.engine(), CentroidRouter(), observer,
                         segmenter=SentenceSegmenter(params.span_max), summary_rows=False)
