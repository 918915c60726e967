"""Typed statistics: what a policy's memory holds and what its routing did (``PolicyStats``, with SeKV's own
``SekvStats`` or a baseline's), and what a ``SekvLlama`` reports about its conversations (``LlmStats``). Read by
attribute everywhere; ``to_json`` gives the field names of the CLI's JSON and ``/sekv/stats`` (docs/design.md §4).

One name per quantity: ``host_kv_bytes`` is the live memory's span store (its host tier); ``memories_host_bytes``
is what a ``SekvLlama`` keeps in host memory for all its conversations (saved ones with their device copies);
``device_kv_bytes`` is the KV llama.cpp allocated for the live context (the SWA cache included).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Union


@dataclass
class SekvStats:
    """SeKV's engine: its router, budget, what its memory holds and what routing read and cost (also reported by
    the baselines built on the same engine, ``quest`` and ``sentencekv``)."""

    router: str                     # "trained:<adapter file>" or "training-free"
    router_score: str               # the router's score name (index, mass, ...)
    budget_cells: int
    prefill: str                    # how the last prompt was prefilled: "exact" or "streaming"
    transient_kv_bytes: int         # full KV of the temporary context of the last exact prefill (0: streamed)
    window: int                     # the budget's recent window (cells)
    window_tokens: int              # tokens in the window now
    zoom_slots: int
    spans: int
    span_tokens: int
    anchors: int
    mean_rank: float
    raw_share: float                # share of span matrices kept as rows, not factors
    zooms_per_step: float           # spans rebuilt per routing call (every kind: prompt, chunk, step)
    rebuilt_rows_per_step: float
    compress_s: float
    zoom_s: float
    index_bytes: int                # the routing index a two-stage router scans
    host_rows_read_per_route: float        # per layer and decode-step routing
    host_rows_read_per_prompt_route: float  # per layer and prompt routing
    route_ms_per_step: float
    chunk_routes: int = 0                       # routings inside streamed prompt chunks (chunk_routing)
    refreshed_tokens: int = 0                   # prompt tokens decoded again by tail refreshes (refresh_window)
    host_rows_read_per_chunk_route: float = 0.0  # per layer and chunk routing
    layer_routed_steps: int = 0                 # decode steps routed inside their own decode (step_routing="layer")
    layer_routed_turns: int = 0                 # turns routed inside their own decode (turn_routing="layer")
    pinned_spans: int = 0                       # spans the last prompt's or turn's lexical pins name (lexical_share)
    # the hook's own transfers between host and device memory per decode step (rows, bias, query capture; 0 where
    # the cache is in host memory): bytes and calls host->device, device->host
    h2d_bytes_per_step: float = 0.0
    h2d_calls_per_step: float = 0.0
    d2h_bytes_per_step: float = 0.0
    d2h_calls_per_step: float = 0.0


@dataclass
class EvictionStats:
    """An eviction baseline: tokens resident and evicted."""

    budget_cells: int
    resident: int
    evicted: int


@dataclass
class MergeStats:
    """SemantiCache: merged cores."""

    budget_cells: int
    cores: int
    merged_tokens: int
    merge_ratio: float


BaselineStats = Union[SekvStats, EvictionStats, MergeStats]


@dataclass
class PolicyStats:
    """What a policy's memory holds: ``sekv`` for SeKV, ``baseline`` for the others (None for full KV)."""

    device_kv_bytes: int
    host_kv_bytes: int = 0
    sekv: SekvStats | None = None
    baseline: BaselineStats | None = None

    @property
    def own(self) -> BaselineStats | None:
        """The policy's own statistics, whichever kind (SeKV's or a baseline's)."""
        return self.sekv if self.sekv is not None else self.baseline

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device_kv_bytes": self.device_kv_bytes, "host_kv_bytes": self.host_kv_bytes}
        for name in ("sekv", "baseline"):
            part = getattr(self, name)
            if part is not None:
                out[name] = asdict(part)
        return out


@dataclass
class RequestCounts:
    """Requests a ``SekvLlama`` served, and what the last one reused and evaluated."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0     # prompt tokens found in a memory (not evaluated again)
    evaluated_tokens: int = 0  # prompt tokens evaluated


@dataclass
class MemoryCounts:
    """What a ``SekvLlama``'s conversation memories (``memory.Memories``) did."""

    switches: int = 0             # a request continued another saved conversation
    scratch_requests: int = 0     # a request that matched none and was not kept
    checkpoint_restores: int = 0  # a truncation the live memory could not do, served from its prompt checkpoint
    evicted: int = 0              # saved conversations dropped for the host limit
    disk_restores: int = 0        # a request continued a conversation restored from the memory directory
    disk_saves: int = 0           # conversations queued for (or written to) the memory directory


@dataclass
class LlmStats:
    """What a ``SekvLlama`` reports (``/sekv/stats``, ``chat``'s /stats)."""

    policy: str
    n_ctx: int                  # the logical context in tokens (not the device cells)
    device_cells: int
    tokens: int                 # tokens in the live memory
    memories_host_bytes: int    # host bytes of every conversation memory: the live one's span store, the saved ones
                                # (device copies, bookkeeping, spans) and the prompt checkpoint
    saved_memories: int
    request: RequestCounts
    memories: MemoryCounts
    live: PolicyStats           # the live memory's policy statistics

    def to_json(self) -> dict[str, Any]:
        head = {"policy": self.policy, "n_ctx": self.n_ctx, "device_cells": self.device_cells, "tokens": self.tokens,
                "memories_host_bytes": self.memories_host_bytes,
                "host_bytes": self.memories_host_bytes,  # its name before 0.2 (kept for readers of older output)
                "saved_memories": self.saved_memories}
        return merge_json(head, asdict(self.request), asdict(self.memories), self.live.to_json())


def merge_json(*parts: dict[str, Any]) -> dict[str, Any]:
    """One JSON object from parts with disjoint keys (a key in two parts is a bug: raised, never overwritten)."""
    out: dict[str, Any] = {}
    for part in parts:
        clash = out.keys() & part.keys()
        if clash:
            raise KeyError(f"statistics name {sorted(clash)[0]!r} twice")
        out.update(part)
    return out


