"""SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024): after prefill, the
queries of the last ``obs_window`` prompt tokens vote for prompt tokens; votes are pooled over neighbouring
positions and the top tokens (plus the observation window) are kept. Selection happens once, at the end of prefill.

The prompt is prefilled with full attention in a temporary full-size context (as SnapKV does; a ``VotePass``, which
an evaluation's SnapKV and ChunkKV runs at every budget share); the observation window is decoded one token at a
time there so that the hook captures each of its queries, and the votes
(attention probabilities from native code, summed over query heads and hooked layers: cells are shared by the
layers, so one selection serves all — the paper selects per head) pick the prompt tokens copied into the budget
context. Generated tokens are appended; if generation overflows the budget the oldest non-sink tokens go.

Parameters: ``BudgetConfig.kv_budget``, ``n_sink`` (always kept), ``chunk``; ``SnapKVConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.ndimage import uniform_filter1d

from .. import native
from ..config import ContextConfig, round_cells
from ..decode import decode_loop, forced
from ..session import Session
from ..transfer import copy_tokens
from .eviction import EvictionConfig, EvictionPolicy
from .shared_passes import FullPass


@dataclass
class SnapKVConfig(EvictionConfig):
    """obs_window: the last prompt tokens whose queries vote; pool_kernel: average pooling of the votes over
    neighbouring positions (odd); evict_batch, chunk_share: ``EvictionConfig``."""

    obs_window: int = 32
    pool_kernel: int = 7

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.obs_window < 1:
            raise ValueError(f"obs_window must be >= 1, got {self.obs_window}")
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be a positive odd number, got {self.pool_kernel}")


@dataclass
class VotePass(FullPass):
    """A prompt's prefix decoded with full attention in a temporary full-size context, then its last ``w`` tokens
    one at a time, each one's captured query voting on the prefix (attention probabilities summed over query
    heads): what SnapKV and ChunkKV select from at any budget (``SharedPasses``; ``key``: ``vote_key``)."""

    votes: np.ndarray   # f32 [n_layer, n_prefix]
    logits: np.ndarray  # f32 [n_vocab] the next token's logits


def vote_key(tokens: list[int], w: int, config: ContextConfig) -> tuple:
    """What a ``VotePass`` is made from (``SharedPasses``' key)."""
    return ("vote", tuple(tokens), w, config)


def vote_pass(model: Any, config: ContextConfig, tokens: list[int], w: int,
              on_chunk: Callable[[int], None]) -> VotePass:
    """Decode ``tokens`` into a new context of ``config`` (full-size), the last ``w`` one at a time, their queries
    voting; ``on_chunk(n_done)`` after each prefix chunk."""
    full = Session(model, config)
    try:
        full.hook.enable_query_capture()
        n_prefix, n_layer = len(tokens) - w, full.hook.info.n_layer_kv
        for c0 in range(0, n_prefix, full.n_batch):
            full.decode(tokens[c0:min(c0 + full.n_batch, n_prefix)], logits="none")
            on_chunk(min(c0 + full.n_batch, n_prefix))
        prefix_cells = full.hook.cells_of(n_prefix)
        votes = np.zeros((n_layer, n_prefix), dtype=np.float32)  # [n_layer, n_prefix]
        keys = [full.hook.get_values(ikv, prefix_cells)[0].astype(np.float16, copy=False)
                for ikv in range(n_layer)]  # f16 [n, Hkv, d]

        def vote(k: int, logits: np.ndarray) -> None:  # the observation window's queries vote on the prefix
            for ikv in range(n_layer):
                native.attn_mass(full.hook.query(ikv), keys[ikv], votes[ikv])

        window = tokens[n_prefix:]
        logits = decode_loop(lambda t: full.decode([t]), np.zeros(0, dtype=np.float32), len(window),
                             forced(window), after_step=vote).logits
    except BaseException:
        full.close()
        raise
    return VotePass(vote_key(tokens, w, config), full, votes, np.array(logits, dtype=np.float32))


class SnapKVPolicy(EvictionPolicy):
    name = "snapkv"
    Config = SnapKVConfig

    def pooled(self, votes: np.ndarray) -> np.ndarray:
        """Average-pooled votes [n_prefix] (float64) with the sinks forced in."""
        out = uniform_filter1d(votes.astype(np.float64), size=self.params.pool_kernel, mode="constant")
        out[: self.n_sink] = np.inf
        return out

    def select(self, votes: np.ndarray, n_keep: int) -> list[np.ndarray]:
        """Positions (ascending) of the prefix tokens each hooked layer keeps, from per-layer votes
        [n_layer, n_prefix]; their union must not exceed ``n_keep``. SnapKV: one set from the summed votes."""
        keep = np.sort(np.argsort(-self.pooled(votes.sum(axis=0)), kind="stable")[:n_keep])
        return [keep] * votes.shape[0]

    def _append(self, tokens: list[int]) -> np.ndarray:
        """The first append (the prompt) selects what stays; later ones stream as StreamingLLM does."""
        n_gen = self.n_context - len(tokens)
        w = min(self.params.obs_window, len(tokens) - 1)
        n_keep = self.budget - w - max(n_gen, 0) - 1
        if self.tokens or self.fits or len(tokens) <= self.budget - max(n_gen, 0) or n_keep < self.n_sink or w < 1:
            return super()._append(tokens)
        config = self.session.config.sized(round_cells(len(tokens)), self.plan.config.chunk)

        def on_chunk(n_done: int) -> None:
            self.n_prefilled = n_done
            self.notify()

        make = lambda: vote_pass(self.session.model, config, tokens, w, on_chunk)  # noqa: E731
        shared = self.shared_passes
        done = make() if shared is None else shared.get(vote_key(tokens, w, config), self.session.model, make)
        try:
            n_prefix = len(tokens) - w
            self.n_prefilled = len(tokens)
            per_layer = self.select(done.votes, n_keep)
            union = np.unique(np.concatenate(per_layer))
            if union.size > n_keep:
                raise AssertionError(f"{self.name}: selected {union.size} prefix tokens for {n_keep} cells")
            keep = np.concatenate([union, np.arange(n_prefix, len(tokens))])
            self.memory.cell = copy_tokens(done.session, self.session, keep)
            self.memory.pos = keep.astype(np.int64)
            self.memory.score = np.zeros(keep.size)
            self.memory.evicted = len(tokens) - keep.size
            self._mask_layers(union, per_layer)
        finally:
            if shared is None:
                done.close()
        self.notify()
        return done.logits.copy()

    def _mask_layers(self, union: np.ndarray, per_layer: list[np.ndarray]) -> None:
        """Layers that keep fewer tokens than the union mask the others out with the per-layer bias."""
        masks = [np.flatnonzero(~np.isin(union, sel)) for sel in per_layer]  # indices into union (= cells)
        if not any(m.size for m in masks):
            return
        self.hook.enable_bias()
        for ikv, m in enumerate(masks):
            if m.size:
                self.hook.set_bias_cells(ikv, self.memory.cell[m], float("-inf"))
