"""StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024): the first
``n_sink`` tokens (attention sinks) and the most recent tokens; everything between is evicted, oldest first.

Parameters: ``BudgetConfig.kv_budget`` (cells), ``n_sink``; the window is the rest of the budget;
``EvictionConfig.evict_batch`` tokens go at once while generating."""

from __future__ import annotations

from .eviction import EvictionPolicy


class StreamingPolicy(EvictionPolicy):
    name = "streaming"
