"""H2O (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs", NeurIPS 2023):
keep the tokens with the largest accumulated attention (heavy hitters) plus a recent window; evict the lightest.

Attention comes from the hook: after every decode the captured query of each hooked layer is scored against the
resident cache rows in native code (flash attention exposes no probabilities) and the probabilities, summed over
query heads and layers, are added to each token's score. Cells are shared by all layers, so one eviction set
serves every layer and head (the paper evicts per head). During a streamed prompt the chunk's last query votes.

Parameters: ``BudgetConfig.kv_budget``, ``n_sink``; ``H2OConfig``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import native
from .eviction import EvictionConfig, EvictionPolicy


@dataclass
class H2OConfig(EvictionConfig):
    """recent_share: share of the budget kept as the protected recent window, the rest holds heavy hitters;
    evict_batch, chunk_share: ``EvictionConfig``."""

    recent_share: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.recent_share < 1:
            raise ValueError(f"recent_share must be in (0, 1), got {self.recent_share}")


class H2OPolicy(EvictionPolicy):
    name = "h2o"
    Config = H2OConfig
    needs_queries = True

    def update_scores(self, new: np.ndarray) -> None:
        mass = np.zeros(self.memory.pos.size, dtype=np.float32)  # [n_resident]
        for ikv in range(self.n_layer):
            k, _ = self.hook.get_values(ikv, self.memory.cell)  # [n_resident, Hkv, d] numbers
            native.attn_mass(self.hook.query(ikv), k.astype(np.float16, copy=False), mass)
        self.memory.score += mass

    def victims(self, k: int, candidates: np.ndarray) -> np.ndarray:
        recent = int(self.params.recent_share * self.budget)
        heavy = candidates[candidates < self.memory.pos.size - recent]  # outside the protected recent window
        if heavy.size < k:  # the window must give up its oldest tokens
            return np.concatenate([heavy, np.setdiff1d(candidates, heavy)[: k - heavy.size]])
        return heavy[np.argsort(self.memory.score[heavy], kind="stable")[:k]]
