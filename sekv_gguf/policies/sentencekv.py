"""SentenceKV-like (Zhu et al., "SentenceKV: Efficient LLM Inference via Sentence-Level Semantic KV Caching",
2025): the context is grouped into sentences; each sentence keeps a semantic vector (its mean key, per layer and KV
head) for retrieval while its token K/V move to host memory; at decode the sentences whose vectors best match the
current query are brought back to the device at token level, within the budget. A re-implementation from the
paper's description on SeKV's engine: sentence spans, centroid routing (``q·k̄``), raw host rows, no summary rows in
attention, the newest tokens resident.

Parameters: ``SekvConfig.kv_budget``, ``n_sink``, ``window``/``window_max``, ``zoom_share`` (the retrieved part of
the budget), ``route_every``, ``max_new_zooms``, ``span_max`` (longest sentence piece). Fixed:
``segmentation="sentences"``, ``summary_rows=False``, ``router="centroid"``, ``energy=1``, ``prefill="streaming"``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ..config import ContextConfig, SekvConfig
from .base import Policy
from .sekv import SekvPolicy


class SentenceKVPolicy(SekvPolicy):
    name = "sentencekv"

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, config: SekvConfig | None = None,
                 observer: Callable[[Policy], None] | None = None, **_: Any):
        cfg = config or SekvConfig()
        sentences = replace(cfg, segmentation="sentences", summary_rows=False, router="centroid", energy=1.0,
                            anchor_share=0.0, span_min=1, prefill="streaming")
        super().__init__(model, n_context, ctx_config, sentences, observer=observer)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["baseline"] = out.pop("sekv")
        return out
