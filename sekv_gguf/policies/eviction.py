"""Base of the eviction baselines: one budget-sized context whose resident tokens a rule picks; what is evicted is
gone for good (unlike SeKV, which keeps everything at two resolutions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..config import BudgetConfig, ContextConfig
from ..errors import BudgetError
from ..session import Session
from ..stats import EvictionStats, PolicyStats
from .base import Policy, StreamedPolicy
from .budget import BudgetPlan
from .memory_state import PolicyMemory


@dataclass
class EvictionConfig:
    """evict_batch: tokens evicted at once when the cache is full during decode (1 = the papers' per-step eviction;
    larger batches cut the per-step host work, the kept set differs only in the last few choices).
    chunk_share: largest prompt chunk as a share of the budget (an eviction cache reserves nothing else, so it
    streams in larger chunks than SeKV)."""

    evict_batch: int = 16
    chunk_share: float = 0.25

    def __post_init__(self) -> None:
        if self.evict_batch < 1:
            raise ValueError(f"evict_batch must be >= 1, got {self.evict_batch}")
        if not 0 < self.chunk_share <= 1:
            raise ValueError(f"chunk_share must be in (0, 1], got {self.chunk_share}")


@dataclass
class ResidentTokens(PolicyMemory):
    """An eviction cache's memory: the resident tokens' positions (ascending), cells and per-token scores, and how
    many tokens were evicted."""

    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))     # [n_resident]
    cell: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))    # [n_resident]
    score: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))  # [n_resident]
    evicted: int = 0


class EvictionPolicy(StreamedPolicy):
    """Tokens are decoded into a cache of ``budget`` cells; when new tokens do not fit, ``victims`` names resident
    tokens to release (never the ``n_sink`` first tokens, never the newest one). ``update_scores`` runs after every
    decode (prompt chunk or generated token) to update the policy's scores. What it remembers is ``memory``
    (``ResidentTokens``)."""

    Config: type = EvictionConfig
    needs_queries = False  # enable the hook's query capture

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: EvictionConfig | None = None, observer: Callable[[Policy], None] | None = None):
        self.params = params or self.Config()
        plan = BudgetPlan.of(budget or BudgetConfig(), n_context, chunk_share=self.params.chunk_share)
        self.plan = plan
        self.n_context, self.budget, self.fits, self.chunk = n_context, plan.cells, plan.fits, plan.chunk
        self.n_sink = min(plan.config.n_sink, self.budget)
        if not self.fits and self.budget < self.n_sink + self.chunk + self.params.evict_batch + 1:
            raise BudgetError(f"kv_budget of {self.budget} cells cannot hold {self.n_sink} sinks, a prompt chunk of "
                              f"{self.chunk} and an eviction batch of {self.params.evict_batch}")
        super().__init__(Session(model, ctx_config.sized(self.budget, self.chunk)), observer)
        self.hook = self.session.hook
        self.n_layer = self.hook.info.n_layer_kv
        if self.needs_queries and not self.fits:
            self.hook.enable_query_capture()
        self.memory = ResidentTokens()
        self._init_done()

    # -- the rule ----------------------------------------------------------------------------------------------

    def victims(self, k: int, candidates: np.ndarray) -> np.ndarray:
        """Indices (into the resident arrays) of ``k`` tokens to evict, chosen among ``candidates`` (ascending
        indices of evictable tokens, oldest first). Default: the oldest (StreamingLLM)."""
        return candidates[:k]

    def update_scores(self, new: np.ndarray) -> None:
        """Called after each decode with the indices of the tokens just decoded."""

    # -- mechanics ---------------------------------------------------------------------------------------------

    def _room(self, n: int) -> None:
        """Evict until ``n`` more tokens fit (in batches of ``evict_batch`` while generating)."""
        free = self.budget - self.memory.pos.size
        if self.fits or free >= n:
            return
        k = max(n - free, min(self.params.evict_batch, self.memory.pos.size - self.n_sink - 1))
        candidates = np.arange(self.n_sink, self.memory.pos.size - 1)  # not the sinks, not the newest token
        if candidates.size < k:
            raise BudgetError(f"cannot free {k} cells of {self.budget}: only {candidates.size} are evictable")
        self.irreversible()  # evicted tokens are gone for good
        out = np.sort(np.asarray(self.victims(k, candidates), dtype=np.int64))
        if out.size != k or np.setdiff1d(out, candidates).size:
            raise AssertionError(f"{self.name}: victims {out[:8]} are not {k} evictable tokens")
        self.hook.release(self.memory.cell[out])
        keep = np.ones(self.memory.pos.size, dtype=bool)
        keep[out] = False
        self.memory.pos, self.memory.cell, self.memory.score = self.memory.pos[keep], self.memory.cell[keep], self.memory.score[keep]
        self.memory.evicted += k

    def _decode(self, tokens: list[int]) -> np.ndarray:
        self._room(len(tokens))
        p0 = self.session.pos_max() + 1
        logits = self.session.decode(tokens)
        cells = self.hook.cells_from(p0)  # [n] the new tokens' cells, in position order
        n0 = self.memory.pos.size
        self.memory.pos = np.concatenate([self.memory.pos, np.arange(p0, p0 + len(tokens))])
        self.memory.cell = np.concatenate([self.memory.cell, cells])
        self.memory.score = np.concatenate([self.memory.score, np.zeros(len(tokens))])
        if not self.fits:
            self.update_scores(np.arange(n0, self.memory.pos.size))
        return logits

    def _truncate(self, n: int) -> bool:
        """Drop the resident tokens at positions >= ``n`` (those evicted before stay evicted)."""
        if not self.swa_covers(n):
            return False
        self.discard_from(n)
        keep = self.memory.pos < n
        self.memory.pos, self.memory.cell, self.memory.score = self.memory.pos[keep], self.memory.cell[keep], self.memory.score[keep]
        return True

    def stats(self) -> PolicyStats:
        return PolicyStats(device_kv_bytes=self.device_kv_bytes, baseline=EvictionStats(
            budget_cells=self.budget, resident=int(self.memory.pos.size), evicted=int(self.memory.evicted)))
