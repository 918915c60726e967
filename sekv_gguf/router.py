"""Routers: score spans for zoom-in from a hooked layer's captured query.

The query comes from the hook: the query of the last decoded token (the previous step's query when the next token is
decoded), scaled so that q · k is the attention logit. The trained router (a later adapter) implements the same
interface. ``ROUTERS`` maps names to classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

from . import native
from .spans import Span


class Router(ABC):
    """Scores [n_spans] for one hooked layer: higher = zoom first."""

    name: str = "router"  # what the run's JSON reports as "router"
    score_kind: str = "router"  # key in ROUTERS

    @abstractmethod
    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """query f32 [n_head, d]; keys f32 [n_spans, n_head_kv, d] summary keys; lengths [n_spans]; bounds: the
        channel-wise (min, max) of each span's keys, [n_spans, n_head_kv, d] each -> scores [n_spans]."""


def _grouped(query: np.ndarray, n_head_kv: int) -> np.ndarray:
    """[n_head, d] -> [n_head_kv, group, d]: the query heads that share each KV head."""
    return query.reshape(n_head_kv, query.shape[0] // n_head_kv, -1)


class SummaryRouter(Router):
    """``max over the query heads of a KV group of q·k̄ + log|S|``: the summary row's own attention logit."""

    name = "training-free"
    score_kind = "summary"

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        q = _grouped(query, keys.shape[1])
        logits = np.einsum("shd,hgd->shg", keys, q)  # [n_spans, Hkv, group]
        return logits.reshape(keys.shape[0], -1).max(axis=1) + np.log(lengths)


class CentroidRouter(Router):
    """``max over the query heads of a KV group of q·k̄``: similarity of the query to the span's mean key, with no
    length term (SentenceKV's sentence-vector retrieval)."""

    name = "training-free"
    score_kind = "centroid"

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        q = _grouped(query, keys.shape[1])
        logits = np.einsum("shd,hgd->shg", keys, q)  # [n_spans, Hkv, group]
        return logits.reshape(keys.shape[0], -1).max(axis=1)


class LowRankMassRouter(Router):
    """The attention mass the span's tokens would get: ``max over query heads of logsumexp_t q·k_t`` with k_t rebuilt
    from the span's host factors (U·S·Vᵀ) — exact up to the stored rank, no training. Computed in native code from
    a per-layer pointer table of the spans' f16 host rows (``native.SpanTable``), which grows as spans are added."""

    name = "training-free"
    score_kind = "mass"

    def __init__(self) -> None:
        self._tables: dict[int, native.SpanTable] = {}

    def _table(self, ikv: int, spans: Sequence[Span], n_head_kv: int, d: int) -> native.SpanTable:
        table = self._tables.get(ikv)
        if table is None or len(table) > len(spans):  # spans only grow: a shorter list is another policy's
            table = self._tables[ikv] = native.SpanTable(n_head_kv, d)
        for span in spans[len(table):]:
            f = span.k[ikv]
            table.append(span.length, f.raw, f.us, f.vt)
        return table

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        table = self._table(ikv, spans, keys.shape[1], keys.shape[2])
        return native.span_mass(query, table)  # [n_spans]


class BoundRouter(Router):
    """Quest-style upper bound of the best token logit in a span: ``sum_d max(q_d kmin_d, q_d kmax_d)`` from the
    channel-wise min/max of its keys, max over the query heads of a KV group. O(n_spans * d) per layer."""

    name = "training-free"
    score_kind = "bound"

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        lo, hi = bounds
        q = _grouped(query, keys.shape[1])  # [Hkv, group, d]
        # [n_spans, Hkv, 1, d] * [Hkv, group, d] -> max of the two products, summed over d: [n_spans, Hkv, group]
        ub = np.maximum(lo[:, :, None, :] * q, hi[:, :, None, :] * q).sum(axis=-1)
        return ub.reshape(ub.shape[0], -1).max(axis=1)


ROUTERS: dict[str, type[Router]] = {
    cls.score_kind: cls for cls in (SummaryRouter, CentroidRouter, LowRankMassRouter, BoundRouter)}
