"""Routers: score the compressed spans of a ``SpanStore`` for zoom-in, from a hooked layer's captured query.

A router is a stateless function of ``(layer, query, store)``: it may hold fixed parameters (a trained adapter's
weights, a candidate count) but never span data, so one instance can serve any number of policies. The query
comes from the hook (the last decoded token's, scaled so that q · k is the attention logit). ``ROUTERS`` maps the
training-free scores' names to their classes; ``TrainedRouter`` scores with a GGUF adapter.

Reads. ``rank`` also says how many host K rows (the host tier) a routing call read. ``mass`` reads every host row
of the context; the two-stage routers (``index``, ``trained``) scan the store's compact per-span index (O(spans),
never O(tokens)) and verify a bounded candidate set by exact mass from its host rows: the resident spans (at most
the zoom slots' rows) and at most ``candidates`` others (``verify``). Nothing is read back from the device: a
resident span's device rows were rebuilt from the same host rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from . import native
from .config import SekvConfig
from .features import Params, SpanFeatures, alphas, features
from .span_store import ROUTING_FIELDS, SketchShape, SpanStore
from .spans import SKETCH_FIELDS

if TYPE_CHECKING:
    from .adapter import RouterAdapter


@dataclass
class Ranking:
    """What one routing call of one layer decided and read."""

    scores: np.ndarray    # [n_spans] higher = zoom first
    host_rows: int = 0    # host K rows read (token rows of the host tier)


class Resident(Protocol):
    """The spans a layer holds rebuilt on the device (``ZoomSlots``)."""

    capacity: int  # token rows the zoom slots hold per layer

    def held(self, ikv: int) -> list[int]:
        """The span ids layer ``ikv`` holds rebuilt."""
        ...


class Router(ABC):
    """Scores [n_spans] for one hooked layer: higher = zoom first."""

    name: str = "router"  # the score's name (key in ``ROUTERS``)
    label: str = "training-free"  # what a run reports as its router
    sketch: SketchShape | None = None  # the key sketches the router reads (None: it reads none)
    reads: frozenset[str] = ROUTING_FIELDS  # the store's stacked routing arrays it reads (the store keeps only those)
    reads_all_host_rows = False  # the score reads every host K row of the store
    takes_probes = True  # scores a query of more heads than the model's (``probe_heads``) as their best
    two_stage = False  # proposes and verifies a bounded candidate set (``verify``)

    @abstractmethod
    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        """query f32 [n_head, d] -> scores [n_spans] of the store's spans in layer ``ikv``."""

    def rank(self, ikv: int, query: np.ndarray, store: SpanStore, resident: Resident | None = None,
             hold: float = 0.0) -> Ranking:
        """``score`` with what it read; two-stage routers also judge the ``resident`` spans, their exact log mass
        raised by ``hold`` nats (``verify``)."""
        return Ranking(self.score(ikv, query, store), host_rows=store.span_tokens if self.reads_all_host_rows else 0)


def probe_heads(queries: np.ndarray, n_head_kv: int) -> np.ndarray:
    """[p, n_head, d] -> [n_head * p, d]: the probes' queries as more query heads of each KV group (KV head-major:
    group g's heads of probe 0, of probe 1, …). Every router scores a span by its best query head, so this scores it
    by its best probe too."""
    p, n_head, d = queries.shape
    return queries.reshape(p, n_head_kv, n_head // n_head_kv, d).transpose(1, 0, 2, 3).reshape(-1, d)


def probes_that_fit(n_probes: int, n_head: int, n_head_kv: int, head_dim: int) -> int:
    """``n_probes``, or fewer where the probes' query heads would exceed what the native scorer takes at once:
    n_head * p heads, and (n_head / n_head_kv) * p * rank for factored spans (rank <= head_dim); at least 1."""
    fits = min(native.MAX_HEADS // n_head, native.MAX_QV // ((n_head // n_head_kv) * head_dim))
    return max(1, min(n_probes, fits))


def _grouped(query: np.ndarray, n_head_kv: int) -> np.ndarray:
    """[n_head, d] -> [n_head_kv, group, d]: the query heads that share each KV head."""
    return query.reshape(n_head_kv, query.shape[0] // n_head_kv, -1)


class CentroidRouter(Router):
    """``max over the query heads of a KV group of q·k̄``: similarity of the query to the span's mean key, with no
    length term (SentenceKV's sentence-vector retrieval)."""

    name = "centroid"
    reads = frozenset({"keys"})

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        keys = store.keys[ikv].astype(np.float32)                         # [S, Hkv, d]
        logits = np.einsum("shd,hgd->shg", keys, _grouped(query, keys.shape[1]))  # [S, Hkv, group]
        return logits.reshape(keys.shape[0], -1).max(axis=1)


class SummaryRouter(CentroidRouter):
    """``max over the query heads of a KV group of q·k̄ + log|S|``: the summary row's own attention logit."""

    name = "summary"

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        return super().score(ikv, query, store) + np.log(store.lengths)


class LowRankMassRouter(Router):
    """The attention mass the span's tokens would get: ``max over query heads of logsumexp_t q·k_t`` with k_t rebuilt
    from the span's host factors (U·S·Vᵀ) — exact up to the stored rank, no training. Native code reads the store's
    pointer table of the spans' f16 host rows (``native.SpanTable``)."""

    name = "mass"
    reads = frozenset()
    reads_all_host_rows = True

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        return native.span_mass(query, store.tables[ikv]).max(axis=1)  # [S, n_head] -> [S]


def verify(ikv: int, query: np.ndarray, store: SpanStore, proposed: np.ndarray, candidates: int,
           resident: Resident | None = None, hold: float = 0.0) -> Ranking:
    """Stage 2 of a two-stage router: the spans a layer holds on the device (their exact log mass raised by
    ``hold`` nats) and the ``candidates`` best others of the proposal ``proposed`` [n_spans] come first, ordered by
    exact mass from their host rows (``LowRankMassRouter``'s kernel on that subset, one call: the resident spans'
    device rows were rebuilt from these rows, so nothing is read back from the device); then the rest in proposed
    order. When the layer holds nothing yet (the first routing), as many more proposals as fill the zoom slots are
    verified too, since they are about to be read for the zoom anyway. ``proposed`` itself when ``candidates`` is 0
    or nothing is left to verify."""
    n = len(store)
    if candidates <= 0 or n == 0:
        return Ranking(proposed)
    held = np.asarray(resident.held(ikv) if resident is not None else [], dtype=np.int64)  # [n_held] span ids
    order = np.argsort(-proposed, kind="stable")                       # [n] span ids, best proposal first
    n_host = candidates
    if not held.size and resident is not None:
        n_host += int((np.cumsum(store.lengths[order]) <= resident.capacity).sum())
    is_held = np.zeros(n, dtype=bool)
    is_held[held] = True
    ids = np.concatenate([held, order[~is_held[order]][:n_host]])      # [n_held + <= n_host] verified span ids
    mass = native.span_mass(query, store.tables[ikv], ids).max(axis=1).astype(np.float64)  # [len(ids)]
    mass[:held.size] += hold
    first = ids[np.argsort(-mass, kind="stable")]
    verified = np.zeros(n, dtype=bool)
    verified[ids] = True
    ranked = np.concatenate([first, order[~verified[order]]])
    out = np.empty(n)
    out[ranked] = -np.arange(n, dtype=np.float64)  # [n_spans] rank as score
    return Ranking(out, host_rows=int(store.lengths[ids].sum()))


class TwoStageRouter(Router):
    """A router that proposes (``propose``: scores [n_spans] from what it reads cheaply) and lets ``verify`` order
    the resident spans and its ``candidates`` best others by exact mass."""

    two_stage = True

    def __init__(self, candidates: int = SekvConfig.verify_candidates):
        if candidates < 0:
            raise ValueError(f"candidates must be >= 0, got {candidates}")
        self.candidates = candidates

    @abstractmethod
    def propose(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        """Stage-1 scores [n_spans]."""

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        return self.rank(ikv, query, store).scores

    def rank(self, ikv: int, query: np.ndarray, store: SpanStore, resident: Resident | None = None,
             hold: float = 0.0) -> Ranking:
        return verify(ikv, query, store, self.propose(ikv, query, store), self.candidates, resident, hold)


class HeldSpans:
    """A ``Resident`` without a device: the spans ``ids`` taken as held in every layer (offline recall studies,
    benchmarks and tests of ``verify``)."""

    def __init__(self, store: SpanStore, ids: object, capacity: int = 0):
        self.store, self.ids, self.capacity = store, [int(i) for i in ids], capacity

    def held(self, ikv: int) -> list[int]:
        return list(self.ids)


class IndexRouter(TwoStageRouter):
    """Two-stage routing with bounded reads (the default). Stage 1 scans the store's index — per span, layer and
    KV head the mean key of each ~``block_tokens`` block — and estimates the span's log attention mass as
    ``max over query heads of logsumexp_b (q·k̄_b + log n_b)`` (the summary row's estimator at block resolution):
    O(spans × blocks), no host read. Stage 2 (``verify``) orders the resident spans and the ``candidates`` best
    others by exact mass."""

    name = "index"
    reads = frozenset({"blocks"})

    def propose(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        """Stage-1 scores [n_spans] from the block index (a q8 index is scored as held, in native code)."""
        if store.q8_index:
            return native.index_score(query, store.blocks[ikv], store.block_scale[ikv], store.block_logn)
        return self.propose_widened(ikv, query, store)

    @staticmethod
    def propose_widened(ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        """``propose`` in numpy over the index widened to f32 (an f16 index; the reference of the native kernel)."""
        blocks = store.block_keys(ikv)                                    # [Hkv, S, B, d] f32
        n_head_kv, n_spans, n_blocks, d = blocks.shape
        q = _grouped(query, n_head_kv)                                    # [Hkv, G, d]
        # per KV head: [S*B, d] @ [d, G] -> [Hkv, S*B, G] -> [Hkv, S, B, G], + log n_b (-inf: padding)
        logits = np.matmul(blocks.reshape(n_head_kv, n_spans * n_blocks, d), q.transpose(0, 2, 1))
        logits = logits.reshape(n_head_kv, n_spans, n_blocks, -1) + store.block_logn[None, :, :, None]
        top = logits.max(axis=2, keepdims=True)                           # [Hkv, S, 1, G] finite: block 0 is real
        lse = top[:, :, 0] + np.log(np.exp(logits - top).sum(axis=2))     # [Hkv, S, G]
        return lse.transpose(1, 0, 2).reshape(n_spans, -1).max(axis=1)    # [S]


class BoundRouter(Router):
    """Quest-style upper bound of the best token logit in a span: ``sum_d max(q_d kmin_d, q_d kmax_d)`` from the
    channel-wise min/max of its keys, max over the query heads of a KV group. O(n_spans * d) per layer."""

    name = "bound"
    reads = frozenset({"bounds"})

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        lo, hi = (b.astype(np.float32) for b in store.bounds(ikv))        # [S, Hkv, d] each
        q = _grouped(query, lo.shape[1])                                  # [Hkv, group, d]
        # [S, Hkv, 1, d] * [Hkv, group, d] -> max of the two products, summed over d: [S, Hkv, group]
        ub = np.maximum(lo[:, :, None, :] * q, hi[:, :, None, :] * q).sum(axis=-1)
        return ub.reshape(ub.shape[0], -1).max(axis=1)


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (IndexRouter, SummaryRouter, CentroidRouter, LowRankMassRouter, BoundRouter)}


def training_free(config: SekvConfig) -> Router:
    """The training-free router ``config.router`` names (two-stage ones verify ``config.verify_candidates``)."""
    if config.router == IndexRouter.name:
        return IndexRouter(config.verify_candidates)
    return ROUTERS[config.router]()


class TrainedRouter(TwoStageRouter):
    """The distilled router of a GGUF adapter (``sekv_gguf.adapter``; the scoring function is
    ``sekv_gguf.features.alphas``): per query head h and span s, ``alpha = sigmoid(e_s - logsumexp_s' e_s' + b)``
    with the estimated log mass ``e_s = <W q, normalize(W k̄_s)>/sqrt(P) + theta · features_s + log|S_s|``; a
    span's score is its best margin ``alpha - tau`` over the query heads (a KV group is rebuilt if any of its heads
    zooms). With ``candidates`` > 0 the spans it ranks first are then ordered by their exact attention mass from
    the host factors (``verify``), ahead of all others."""

    name = "trained"
    reads = frozenset({"keys", "bounds"})
    takes_probes = False  # weights per query head of the model

    def __init__(self, adapter: "RouterAdapter", path: str = "",
                 candidates: int = SekvConfig.verify_candidates):
        super().__init__(candidates)
        self.adapter = adapter
        self.label = f"trained:{path}" if path else "trained"
        self.sketch = (adapter.spread_rank, adapter.n_centroids, adapter.kmeans_iters)

    @classmethod
    def from_file(cls, path: str | Path, model_path: str | Path,
                  candidates: int = SekvConfig.verify_candidates) -> "TrainedRouter":
        """The router of the adapter file ``path``, refused (``AdapterError``) unless it was trained for the model
        at ``model_path``."""
        from .adapter import model_identity, read_adapter

        a = read_adapter(path)
        a.check_model(model_identity(model_path), str(path))
        return cls(a, Path(path).name, candidates)

    @classmethod
    def of_model(cls, adapter_path: str | Path | None, model_path: str | Path, metadata: dict[str, str],
                 candidates: int = SekvConfig.verify_candidates) -> "TrainedRouter | None":
        """The router of the adapter file ``adapter_path``; without one, the router the model carries in its
        metadata (``adapter.embed``); else None. Either is refused unless trained for this model."""
        if adapter_path:
            return cls.from_file(adapter_path, model_path, candidates)
        from .adapter.embed import carries_router, read_embedded

        if not carries_router(metadata):
            return None
        return cls(read_embedded(model_path), Path(model_path).name, candidates)

    def check(self, model_layers: list[int], n_head: int, n_head_kv: int, head_dim: int) -> None:
        """Refuse a hooked cache of other layers or head shapes than the adapter's."""
        a = self.adapter
        if (list(a.layers), a.n_head, a.n_head_kv, a.head_dim) != (list(model_layers), n_head, n_head_kv, head_dim):
            from .errors import AdapterError

            raise AdapterError(f"router adapter is for layers {a.layers} x {a.n_head} heads ({a.n_head_kv} KV) of "
                               f"dim {a.head_dim}; the model's hooked cache has layers {model_layers} x {n_head} heads "
                               f"({n_head_kv} KV) of dim {head_dim}")

    def alphas(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        """alpha [n_spans, n_head] of the store's spans in layer ``ikv`` for query [n_head, d]."""
        a = self.adapter
        group = a.n_head // a.n_head_kv
        q = query.astype(np.float64)                                      # [H, d]
        keys, (lo, hi), sketch = store.keys[ikv], store.bounds(ikv), store.sketch[ikv]
        lengths = store.lengths.astype(np.float64)                        # [S]
        out = np.empty((keys.shape[0], a.n_head))
        for kv in range(a.n_head_kv):  # the spans and features of a KV head serve all its query heads
            f64 = lambda x: np.asarray(x[:, kv], dtype=np.float64)  # noqa: E731  [S, ...] of this KV head
            sf = SpanFeatures(keys=f64(keys), kmin=f64(lo), kmax=f64(hi), lengths=lengths,
                              **{f: sketch[f][:, kv] for f in SKETCH_FIELDS})
            heads = range(kv * group, (kv + 1) * group)
            phi = features(q[heads.start:heads.stop], sf)                 # [F, group, S]
            for j, h in enumerate(heads):
                p = Params(w=a.w[ikv][h].astype(np.float64), b=a.b[ikv][h:h + 1].astype(np.float64),
                           theta=a.theta[ikv][h].astype(np.float64))
                out[:, h] = alphas(p, q[h:h + 1], sf, phi[:, j:j + 1])[0]  # [S]
        return out

    def propose(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        tau = self.adapter.tau[ikv].astype(np.float64)                   # [H]
        return (self.alphas(ikv, query, store) - tau[None, :]).max(axis=1)  # [S]
