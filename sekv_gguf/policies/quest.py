"""Quest / InfLLM-like untrained routing (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
Inference", ICML 2024; Xiao et al., "InfLLM", 2024): the context is cut into fixed blocks whose rows live in host
memory; per layer, the blocks whose channel-wise key min/max bound the query's best logit highest are rebuilt into
the device cache. It is SeKV without surprisal spans, without anchors, without summary rows in attention, without
low-rank factors and without a trained router — the same engine, so the comparison isolates those choices.

Parameters: ``SekvConfig.kv_budget``, ``n_sink``, ``window``/``window_max``, ``zoom_share`` (the routed part of the
budget), ``route_every``, ``max_new_zooms``; ``BaselineConfig.block`` (page size). Fixed: ``segmentation="blocks"``,
``summary_rows=False``, ``router="bound"``, ``energy=1`` (raw rows), ``anchor_share=0``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ..config import BaselineConfig, ContextConfig, SekvConfig
from .base import Policy
from .sekv import SekvPolicy


class QuestPolicy(SekvPolicy):
    name = "quest"

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, config: SekvConfig | None = None,
                 baseline: BaselineConfig | None = None, observer: Callable[[Policy], None] | None = None, **_: Any):
        block = (baseline or BaselineConfig()).block
        quest = replace(config or SekvConfig(), segmentation="blocks", summary_rows=False, router="bound",
                        energy=1.0, anchor_share=0.0, span_min=block, span_max=block)
        super().__init__(model, n_context, ctx_config, quest, observer=observer)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["baseline"] = out.pop("sekv")
        return out
