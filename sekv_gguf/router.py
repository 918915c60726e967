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
from .features import SpanFeatures, features
from .spans import KeySketch, Span
from .train.student import Params, alphas as student_alphas

if TYPE_CHECKING:
    from .adapter import RouterAdapter
    from .config import SekvConfig


class Router(ABC):
    """Scores [n_spans] for one hooked layer: higher = zoom first."""

    name: str = "router"  # what the run's JSON reports as "router"
    score_kind: str = "router"  # key in ROUTERS
    # (spread rank, centroids, k-means steps): the router reads each span's ``Span.sketch`` made so (None: it does not)
    sketch: tuple[int, int, int] | None = None

    def configure(self, config: "SekvConfig") -> None:
        """Take what the policy's config says about routing (nothing, for the training-free scores)."""

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

    def table(self, ikv: int, spans: Sequence[Span], n_head_kv: int, d: int) -> native.SpanTable:
        """Layer ``ikv``'s pointer table of the spans' host K rows, grown as spans are added."""
        table = self._tables.get(ikv)
        if table is None or len(table) > len(spans):  # spans only grow: a shorter list is another policy's
            table = self._tables[ikv] = native.SpanTable(n_head_kv, d)
        for span in spans[len(table):]:
            f = span.k[ikv]
            table.append(span.length, f.raw, f.us, f.vt)
        return table

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        table = self.table(ikv, spans, keys.shape[1], keys.shape[2])
        return native.span_mass(query, table).max(axis=1)  # [n_spans, n_head] -> [n_spans]

    def verify(self, ikv: int, query: np.ndarray, keys: np.ndarray, spans: Sequence[Span], proposed: np.ndarray,
               candidates: int) -> np.ndarray:
        """Scores [n_spans] that put the ``candidates`` best spans of another score ``proposed`` first, ordered by
        their mass (computed for those spans only), then the rest in proposed order; ``proposed`` itself when
        ``candidates`` is 0 or covers every span."""
        if not 0 < candidates < len(spans):
            return proposed
        order = np.argsort(-proposed, kind="stable")
        cand = order[:candidates]
        mass = native.span_mass(query, self.table(ikv, spans, keys.shape[1], keys.shape[2]), cand).max(axis=1)
        ranked = np.concatenate([cand[np.argsort(-mass, kind="stable")], order[candidates:]])
        out = np.empty(len(spans))
        out[ranked] = -np.arange(len(spans), dtype=np.float64)  # [n_spans] rank as score
        return out


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
    """The distilled router of a GGUF adapter (``sekv_gguf.adapter``; the model is ``sekv_gguf.train.student``): per
    query head h and span s, ``alpha = sigmoid(e_s - logsumexp_s' e_s' + b)`` with the estimated log mass
    ``e_s = <W q, normalize(W k̄_s)>/sqrt(P) + theta · features_s + log|S_s|`` (``sekv_gguf.features``); a span's
    score is its best margin ``alpha - tau`` over the query heads (a KV group is rebuilt if any of its heads
    zooms). With ``candidates`` > 0 (``SekvConfig.verify_candidates``) the spans it ranks first are then ordered
    by their exact attention mass from the host factors (``LowRankMassRouter``), ahead of all others."""

    score_kind = "trained"

    def __init__(self, adapter: "RouterAdapter", path: str = ""):
        self.adapter = adapter
        self.name = f"trained:{path}" if path else "trained"
        self.sketch = (adapter.spread_rank, adapter.n_centroids, adapter.kmeans_iters)
        # per layer: the spans' sketches stacked in f64 (what the features compute in), {field: [S, Hkv, ...]}
        self._sketch: dict[int, dict[str, np.ndarray]] = {}
        self.candidates = 0
        self._verify = LowRankMassRouter()

    def configure(self, config: "SekvConfig") -> None:
        self.candidates = config.verify_candidates

    def check(self, model_layers: list[int], n_head: int, n_head_kv: int, head_dim: int) -> None:
        a = self.adapter
        if (list(a.layers), a.n_head, a.n_head_kv, a.head_dim) != (list(model_layers), n_head, n_head_kv, head_dim):
            from .errors import AdapterError

            raise AdapterError(f"router adapter is for layers {a.layers} x {a.n_head} heads ({a.n_head_kv} KV) of "
                               f"dim {a.head_dim}; the model's hooked cache has layers {model_layers} x {n_head} heads "
                               f"({n_head_kv} KV) of dim {head_dim}")

    def sketches_of(self, ikv: int, spans: Sequence[Span]) -> dict[str, np.ndarray]:
        """The spans' key sketches in layer ``ikv`` stacked, {field: [S, Hkv, ...]}, grown as spans are added."""
        have = self._sketch.get(ikv)
        n = 0 if have is None or have["var"].shape[0] > len(spans) else have["var"].shape[0]  # longer: another's
        if n < len(spans):
            add = {f: np.stack([getattr(s.sketch[ikv], f) for s in spans[n:]]).astype(np.float64)
                   for f in KeySketch.FIELDS}
            self._sketch[ikv] = add if n == 0 else {f: np.concatenate([have[f], add[f]]) for f in KeySketch.FIELDS}
        return self._sketch[ikv]

    def alphas(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
               sketch: dict[str, np.ndarray], bounds: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """alpha [n_spans, n_head] for query [n_head, d], summary keys [n_spans, n_head_kv, d], the spans' key
        sketches (``sketches_of``) and channel-wise key bounds (min, max) [n_spans, n_head_kv, d] each."""
        a = self.adapter
        group = a.n_head // a.n_head_kv
        q = query.astype(np.float64)                                      # [H, d]
        out = np.empty((keys.shape[0], a.n_head))
        for kv in range(a.n_head_kv):  # the spans and features of a KV head serve all its query heads
            f64 = lambda x: np.asarray(x[:, kv], dtype=np.float64)  # noqa: E731  [S, ...] of this KV head
            sf = SpanFeatures(keys=f64(keys), kmin=f64(bounds[0]), kmax=f64(bounds[1]),
                              lengths=lengths.astype(np.float64), **{f: sketch[f][:, kv] for f in KeySketch.FIELDS})
            heads = range(kv * group, (kv + 1) * group)
            phi = features(q[heads.start:heads.stop], sf)                 # [F, group, S]
            for j, h in enumerate(heads):
                p = Params(w=a.w[ikv][h].astype(np.float64), b=a.b[ikv][h:h + 1].astype(np.float64),
                           theta=a.theta[ikv][h].astype(np.float64))
                out[:, h] = student_alphas(p, q[h:h + 1], sf, phi[:, j:j + 1])[0]  # [S]
        return out

    def score(self, ikv: int, query: np.ndarray, keys: np.ndarray, lengths: np.ndarray,
              spans: Sequence[Span], bounds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        tau = self.adapter.tau[ikv].astype(np.float64)  # [H]
        alpha = self.alphas(ikv, query, keys, lengths, self.sketches_of(ikv, spans), bounds)
        trained = (alpha - tau[None, :]).max(axis=1)  # [n_spans]
        return self._verify.verify(ikv, query, keys, spans, trained, self.candidates)
