"""Routers: score spans for zoom-in from a hooked layer's captured query.

The query comes from the hook: the query of the last decoded token (the previous step's query when the next token is
decoded), scaled so that q · k is the attention logit. The trained router (a later adapter) implements the same
interface. ``ROUTERS`` maps names to classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import native
from .spans import Span

if TYPE_CHECKING:
    from .adapter import RouterAdapter


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


class SummaryRouter(CentroidRouter):
    """``max over the query heads of a KV group of q·k̄ + log|S|``: the summary row's own attention logit."""

    score_kind = "summary"

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        return super().score(ikv, query, keys, lengths, spans, bounds) + np.log(lengths)


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


class TrainedRouter(Router):
    """The distilled router of a GGUF adapter (``sekv_gguf.adapter``): per query head
    ``alpha = sigmoid(<W q, normalize(W k̄)>/sqrt(P) + log|S| + b)``; a span's score is the best margin
    ``alpha - tau`` over the query heads (a KV group is rebuilt if any of its heads zooms)."""

    score_kind = "trained"

    def __init__(self, adapter: "RouterAdapter", path: str = ""):
        self.adapter = adapter
        self.name = f"trained:{path}" if path else "trained"

    def check(self, model_layers: list[int], n_head: int, n_head_kv: int, head_dim: int) -> None:
        a = self.adapter
        if (list(a.layers), a.n_head, a.n_head_kv, a.head_dim) != (list(model_layers), n_head, n_head_kv, head_dim):
            from .errors import AdapterError

            raise AdapterError(f"router adapter is for layers {a.layers} x {a.n_head} heads ({a.n_head_kv} KV) of "
                               f"dim {a.head_dim}; the model's hooked cache has layers {model_layers} x {n_head} heads "
                               f"({n_head_kv} KV) of dim {head_dim}")

    def alphas(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """alpha [n_spans, n_head] for query [n_head, d] and summary keys [n_spans, n_head_kv, d]."""
        a = self.adapter
        w, b = a.w[ikv].astype(np.float64), a.b[ikv].astype(np.float64)  # [H, P, d], [H]
        group = a.n_head // a.n_head_kv
        proj_q = np.einsum("hpd,hd->hp", w, query.astype(np.float64))  # [H, P]
        k = keys.astype(np.float64)[:, np.arange(a.n_head) // group, :]  # [S, H, d] each head's KV head
        proj_k = np.einsum("hpd,shd->shp", w, k)  # [S, H, P]
        proj_k /= np.maximum(np.linalg.norm(proj_k, axis=2, keepdims=True), 1e-12)
        z = np.einsum("hp,shp->sh", proj_q, proj_k) / np.sqrt(a.proj_dim) + np.log(lengths)[:, None] + b[None, :]
        return 1.0 / (1.0 + np.exp(-z))

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        tau = self.adapter.tau[ikv].astype(np.float64)  # [H]
        return (self.alphas(ikv, query, keys, lengths) - tau[None, :]).max(axis=1)  # [n_spans]
