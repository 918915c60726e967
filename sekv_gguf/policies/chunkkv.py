"""ChunkKV (Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM
Inference", 2025): SnapKV's observation-window votes summed over fixed chunks of ``chunk_size`` tokens; whole
chunks are kept or dropped, so a kept fact keeps its neighbours. The paper reuses one layer's indices for adjacent
layers; here every hooked layer shares one index set (cells are shared by the layers), its extreme form.

Parameters: ``BudgetConfig.kv_budget``, ``n_sink`` (always kept); ``ChunkKVConfig``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .snapkv import SnapKVConfig, SnapKVPolicy


@dataclass
class ChunkKVConfig(SnapKVConfig):
    """chunk_size: chunk length in tokens (kept or dropped whole); the rest: ``SnapKVConfig``."""

    chunk_size: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")


class ChunkKVPolicy(SnapKVPolicy):
    name = "chunkkv"
    Config = ChunkKVConfig

    def select(self, votes: np.ndarray, n_keep: int) -> list[np.ndarray]:
        size = self.params.chunk_size
        v = votes.sum(axis=0).astype(np.float64)  # [n_prefix]
        n_prefix = v.size
        n_chunks = -(-n_prefix // size)
        per_chunk = np.bincount(np.arange(n_prefix) // size, weights=v, minlength=n_chunks)  # [n_chunks]
        sinks = np.arange(min(self.n_sink, n_prefix))
        per_chunk[sinks // size] = np.inf  # the sinks' chunk stays
        keep: list[int] = []
        for c in np.argsort(-per_chunk, kind="stable"):
            members = range(int(c) * size, min((int(c) + 1) * size, n_prefix))
            if len(keep) + len(members) > n_keep:
                break
            keep.extend(members)
        keep_arr = np.union1d(np.asarray(keep, dtype=np.int64), sinks)[:n_keep]
        return [np.sort(keep_arr)] * votes.shape[0]
