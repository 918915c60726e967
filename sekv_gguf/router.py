"""Routers: score spans for zoom-in from a hooked layer's captured query and the spans' summary keys.

The trained router (a later adapter) implements the same interface. Queries come from the hook: the query of the
last decoded token (the previous step's query when the next token is decoded), scaled so that q · k is the
attention logit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Router(ABC):
    """Scores [n_spans] for one hooked layer: higher = zoom first."""

    name: str = "router"

    @abstractmethod
    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """query f32 [n_head, d]; keys f32 [n_spans, n_head_kv, d] summary keys; lengths [n_spans] -> [n_spans]."""


class TrainingFreeRouter(Router):
    """``max over the query heads of a KV group of q·k̄ + log|S|`` (the summary's own attention logit)."""

    name = "training-free"

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        n_head, n_head_kv = query.shape[0], keys.shape[1]
        group = n_head // n_head_kv
        # [n_spans, Hkv, d] x [Hkv, group, d] -> [n_spans, Hkv, group]
        q = query.reshape(n_head_kv, group, -1)
        logits = np.einsum("shd,hgd->shg", keys, q)
        return logits.reshape(keys.shape[0], -1).max(axis=1) + np.log(lengths)
