"""Quest / InfLLM-like untrained routing (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
Inference", ICML 2024; Xiao et al., "InfLLM", 2024): the context is cut into fixed blocks whose rows live in host
memory; per layer, the blocks whose channel-wise key min/max bound the query's best logit highest are rebuilt into
the device cache. It is SeKV's engine composed with a block segmenter, the bound router, raw host rows and no
summary rows in attention (no surprisal spans, no anchors, no low-rank factors, no trained router), so the
comparison isolates those choices.

Parameters: ``BudgetConfig.kv_budget``, ``n_sink``, ``window``; ``QuestConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..config import BudgetConfig, ContextConfig, SekvConfig
from ..router import BoundRouter
from ..segment import BlockSegmenter
from .base import Policy
from .sekv import SekvPolicy


@dataclass
class QuestConfig:
    """block: page size in tokens (the routing unit); zoom_share: the routed part of the budget; route_every,
    max_new_zooms: as ``SekvConfig``."""

    block: int = 32
    zoom_share: float = SekvConfig.zoom_share
    route_every: int = SekvConfig.route_every
    max_new_zooms: int = SekvConfig.max_new_zooms

    def __post_init__(self) -> None:
        if self.block < 1:
            raise ValueError(f"block must be >= 1, got {self.block}")
        self.engine()  # validates the rest

    def engine(self) -> SekvConfig:
        """The SeKV engine's parameters: raw rows (energy 1), no anchors, spans of one block."""
        return SekvConfig(zoom_share=self.zoom_share, route_every=self.route_every, max_new_zooms=self.max_new_zooms,
                          energy=1.0, anchor_share=0.0, span_min=self.block, span_max=self.block)


class QuestPolicy(SekvPolicy):
    name = "quest"
    Config = QuestConfig
    takes_router = False  # its router is part of what it is
    stats_key = "baseline"  # reported as a baseline, not as SeKV

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: QuestConfig | None = None, observer: Callable[[Policy], None] | None = None):
        params = params or QuestConfig()
        super().__init__(model, n_context, ctx_config, budget, params.engine(), BoundRouter(), observer,
                         segmenter=BlockSegmenter(params.block), summary_rows=False)
