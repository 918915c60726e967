"""PyramidKV (Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling",
2024): SnapKV selection per layer, with budgets that shrink linearly with depth (lower layers attend broadly, upper
layers focus). Cells are shared by the layers, so the union of the layers' selections is resident and each layer
masks the tokens it did not select with the per-layer attention bias; the per-layer budgets are scaled so that the
union fits the device budget.

Parameters: ``BudgetConfig.kv_budget``, ``n_sink``; ``PyramidKVConfig``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .snapkv import SnapKVConfig, SnapKVPolicy


@dataclass
class PyramidKVConfig(SnapKVConfig):
    """pyramid_beta: the top layer keeps 1/beta of the mean per-layer budget, the bottom layer 2 - 1/beta of it (as
    the paper); the rest: ``SnapKVConfig``."""

    pyramid_beta: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pyramid_beta < 1:
            raise ValueError(f"pyramid_beta must be >= 1, got {self.pyramid_beta}")


class PyramidKVPolicy(SnapKVPolicy):
    name = "pyramidkv"
    Config = PyramidKVConfig

    def select(self, votes: np.ndarray, n_keep: int) -> list[np.ndarray]:
        n_layer, n_prefix = votes.shape
        low = 1.0 / self.params.pyramid_beta
        shape = np.linspace(2.0 - low, low, n_layer) if n_layer > 1 else np.ones(1)  # [n_layer], mean 1
        order = [np.argsort(-self.pooled(votes[i]), kind="stable") for i in range(n_layer)]

        def sets(scale: float) -> list[np.ndarray]:
            sizes = np.clip(np.round(scale * shape).astype(np.int64), min(self.n_sink, n_prefix), n_prefix)
            return [np.sort(order[i][: sizes[i]]) for i in range(n_layer)]

        lo, hi = 0.0, float(n_keep)  # the union of the layers' sets grows with the scale: bisect the largest fit
        for _ in range(40):
            mid = (lo + hi) / 2
            if np.unique(np.concatenate(sets(mid))).size <= n_keep:
                lo = mid
            else:
                hi = mid
        return sets(lo)
