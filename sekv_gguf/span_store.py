"""The one owner of a policy's compressed spans (SeKV's host tier).

Spans arrive in batches (``SpanStore.add``): their K/V rows are factorised (``spans.factorize``) and, per hooked
layer, the store appends what routing reads — the summary keys, channel-wise key bounds, lengths, the native
pointer table of the host K rows (``native.SpanTable``) and, when a router asks for them, the key sketches. Nothing
else keeps span data: routers are functions of ``(layer, query, store)``, so one router serves any number of
stores. Spans only ever grow (a store belongs to one policy and one context). The rows come as the cache holds
them (``kv_types``): numbers, or blocks of a quantized cache, compressed from their dequantized values
(``kv_codec``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType
from threadpoolctl import ThreadpoolController

from . import kv_codec, native
from .config import INDEX_Q8_MAX, SekvConfig
from .spans import SKETCH_FIELDS, Factors, Span, calibrated_summaries, factorize, sketches, weighted_mean

_BLAS = ThreadpoolController()


def single_threaded_blas(fn: Callable) -> Callable:
    """Run ``fn`` with one BLAS/LAPACK thread: its calls are small, and more BLAS threads only contend with
    llama.cpp's spinning workers."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _BLAS.limit(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


def _f16_outwards(x: np.ndarray, down: bool) -> np.ndarray:
    """f16 of f32 ``x`` rounded towards -inf (``down``) or +inf, so that a rounded bound still bounds."""
    h = x.astype(np.float16)
    off = (h.astype(np.float32) > x) if down else (h.astype(np.float32) < x)
    return np.where(off, np.nextafter(h, np.float16(-np.inf if down else np.inf)), h)


def _index_codes(blocks: np.ndarray, q8: bool) -> tuple[np.ndarray, np.ndarray]:
    """Block keys f32 [Hkv, n, B, d] as kept: int8 codes and f16 scales [Hkv, n, B] (symmetric, per block and KV
    head; a zero block keeps scale 1), or f16 keys and no scales."""
    if not q8:
        return blocks.astype(np.float16), np.zeros(blocks.shape[:3], dtype=np.float16)[:, :0]
    amax = np.abs(blocks).max(axis=-1)                                    # [Hkv, n, B]
    scale = (amax / INDEX_Q8_MAX).astype(np.float16)
    scale[scale == 0] = 1.0  # a zero block (or one below f16's range once scaled): codes 0
    codes = np.rint(blocks / scale[..., None].astype(np.float32))         # [Hkv, n, B, d]
    return np.clip(codes, -INDEX_Q8_MAX, INDEX_Q8_MAX).astype(np.int8), scale


def _append_rows(old: np.ndarray, new: np.ndarray | None, n_new: int) -> np.ndarray:
    """f32 [S, H] ``old`` with ``n_new`` rows more: ``new`` [n_new, H], or zeros where None; an ``old`` of no
    columns ([S, 0]: nothing fitted per head yet) takes ``new``'s width as zeros."""
    if new is None:
        return np.concatenate([old, np.zeros((n_new, old.shape[1]), dtype=np.float32)])
    if old.shape[1] != new.shape[1]:
        if old.shape[1]:
            raise ValueError(f"per-head offsets of {new.shape[1]} heads after {old.shape[1]}")
        old = np.zeros((old.shape[0], new.shape[1]), dtype=np.float32)
    return np.concatenate([old, new.astype(np.float32)])


def _table_append(table: native.SpanTable, length: int, k: Factors) -> None:
    """A span's host K rows (factors, f16, int8 or 4-bit rows) onto a layer's pointer table."""
    table.append(length, k.raw, k.us, k.vt, k.q8, k.scale, k.q4)


# the routing index's plain-data fields: a compact memory file leaves them out, ``SpanStore.rebuild_index`` makes them
INDEX_FIELDS = ("blocks", "block_scale", "block_logn")
# (spread rank, centroids, k-means steps) of the key sketches a router reads (``spans.sketches``)
SketchShape = tuple[int, int, int]
# the stacked routing arrays a store can keep per layer; a router names those it reads (``Router.reads``)
ROUTING_FIELDS = frozenset({"keys", "bounds", "blocks"})
F16_CACHE = (int(GGMLQuantizationType.F16), int(GGMLQuantizationType.F16))  # (type_k, type_v) of an f16 cache


class SpanStore:
    """Compressed spans and, per hooked layer ``ikv``, their routing data stacked in span order:

    keys[ikv]      f16 [S, Hkv, d]   summary keys (weighted mean of the span's keys)
    kmin/kmax[ikv] f16 [S, Hkv, d]   channel-wise min / max of the span's keys (rounded outwards: still bounds)
    tables[ikv]    native.SpanTable  pointers to the host K rows (factors or raw) of every span
    blocks[ikv]    i8|f16 [Hkv, S, B, d] the routing index: mean key of each block of ~``block_tokens`` tokens
                                     (per KV head contiguous: one matmul per head scores every block); int8
                                     codes with ``index_format="q8"`` (the default), read through ``block_keys``
    block_scale[ikv] f16 [Hkv, S, B] their scales (q8 only; empty with f16)
    block_logn     f32 [S, B]        log tokens per block (-inf: padding past a span's blocks)
    sketch[ikv]    {field: f64 [S, Hkv, ...]}  key sketches (``SKETCH_FIELDS``), when ``sketch_shape`` is set
    lengths        f32 [S]           tokens per span
    summary_bias[ikv] f32 [S]        the bias of each span's summary row in layer ``ikv`` (log|S|, or fitted to
                                     queries: ``summary_calibration``)
    head_offset[ikv] f32 [S, H]      each query head's fitted bias less ``summary_bias`` (``summary_bias_heads``;
                                     [S, 0] until a batch is fitted per head, 0 for spans fitted otherwise)

    The stacked routing data is f16 (the precision of the device's K rows; routers widen it to f32 per call): it
    grows with the context like the spans' rows, and in f32 it was a third of a 4-bit host tier.

    ``kv_types``: the ggml (type_k, type_v) of the cache the rows come from (``KVInfo.type_k``, ``type_v``).
    """

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, config: SekvConfig,
                 sketch_shape: SketchShape | None = None, fields: frozenset[str] = ROUTING_FIELDS,
                 kv_types: tuple[int, int] = F16_CACHE):
        if not fields <= ROUTING_FIELDS:
            raise ValueError(f"unknown routing fields {sorted(fields - ROUTING_FIELDS)}: known {sorted(ROUTING_FIELDS)}")
        self.config = config
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        self.kv_types = (int(kv_types[0]), int(kv_types[1]))
        self.sketch_shape = sketch_shape
        self.fields = fields  # which of keys / bounds / blocks are kept (the others stay empty: no router reads them)
        self.spans: list[Span] = []
        self.lengths = np.zeros(0, dtype=np.float32)
        empty = lambda: np.zeros((0, n_head_kv, head_dim), dtype=np.float16)  # noqa: E731
        self.keys = [empty() for _ in range(n_layer)]
        self.kmin = [empty() for _ in range(n_layer)]
        self.kmax = [empty() for _ in range(n_layer)]
        self.tables = [native.SpanTable(n_head_kv, head_dim) for _ in range(n_layer)]
        self.n_blocks = -(-config.span_max // config.block_tokens)  # B: blocks per span (longer spans: longer blocks)
        self.q8_index = config.index_format == "q8"
        code = np.int8 if self.q8_index else np.float16
        self.blocks = [np.zeros((n_head_kv, 0, self.n_blocks, head_dim), dtype=code) for _ in range(n_layer)]
        self.block_scale = [np.zeros((n_head_kv, 0, self.n_blocks), dtype=np.float16) for _ in range(n_layer)]
        self.block_logn = np.zeros((0, self.n_blocks), dtype=np.float32)
        self.sketch: list[dict[str, np.ndarray]] = [{} for _ in range(n_layer)]
        self.summary_bias = [np.zeros(0, dtype=np.float32) for _ in range(n_layer)]
        self.head_offset = [np.zeros((0, 0), dtype=np.float32) for _ in range(n_layer)]

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def n_layer(self) -> int:
        return len(self.keys)

    def bounds(self, ikv: int) -> tuple[np.ndarray, np.ndarray]:
        return self.kmin[ikv], self.kmax[ikv]

    @single_threaded_blas
    def add(self, positions: list[np.ndarray], weights: list[np.ndarray],
            rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
            queries: Callable[[int], np.ndarray] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Compress new spans: ``positions[i]`` int [L_i] of span i, ``weights[i]`` [L_i] its summary weights,
        ``rows(ikv)`` the K and V rows of all new spans' tokens in layer ``ikv`` (span after span) as
        ``KVHook.get_rows`` returns them: numbers [sum L_i, Hkv, d], or a quantized cache's blocks [sum L_i,
        row_bytes]. ``queries(ikv)`` f32 [m, H, d] (``summary_calibration``; m may be 0): the summary rows' bias and
        value fitted to them (``calibrated_summaries``), else log|S| and the weighted mean value. Returns per layer the
        new spans' summary rows (k̄, v̄) f16 [n_new, Hkv*d] for the device (their biases: ``summary_bias``)."""
        n_new = len(positions)
        cut = np.cumsum([0] + [p.size for p in positions])
        new = [Span(id=len(self.spans) + i, positions=np.asarray(p, dtype=np.int32)) for i, p in enumerate(positions)]
        summaries = []
        splits = [self._blocks(p.size) for p in positions]               # per span: B' arrays of token indices
        for ikv in range(self.n_layer):
            k_rows, v_rows = rows(ikv)
            (k, k_blocks), (v, v_blocks) = (self._numbers(r, t) for r, t in zip((k_rows, v_rows), self.kv_types))
            k_parts = [k[cut[i]:cut[i + 1]].astype(np.float32) for i in range(n_new)]  # [L_i, Hkv, d]
            v_parts = [v[cut[i]:cut[i + 1]].astype(np.float32) for i in range(n_new)]
            split = lambda b: None if b is None else [b[cut[i]:cut[i + 1]] for i in range(n_new)]  # noqa: E731
            for span, kf, vf in zip(new, factorize(k_parts, self.config, blocks=split(k_blocks),
                                                   block_type=self.kv_types[0]),
                                    factorize(v_parts, self.config, values=True, blocks=split(v_blocks),
                                              block_type=self.kv_types[1])):
                span.k.append(kf)
                span.v.append(vf)
                _table_append(self.tables[ikv], span.length, kf)
            k_mean = np.stack([weighted_mean(p, w) for p, w in zip(k_parts, weights)])  # [n_new, Hkv, d]
            v_mean = np.stack([weighted_mean(p, w) for p, w in zip(v_parts, weights)])
            bias = np.log([p.size for p in positions]).astype(np.float32)           # [n_new] log|S|
            offset = None                                                            # [n_new, H] per head
            q = queries(ikv) if queries is not None else None                        # [m, H, d]
            if q is not None and q.shape[0]:
                cfg = self.config
                fit_bias, fit_value = calibrated_summaries(k_parts, v_parts, k_mean, q, cfg.summary_bias_quantile,
                                                           cfg.summary_bias_share, per_head=cfg.summary_bias_heads)
                if cfg.summary_bias_heads:                                           # [n_new, H]: mean + offsets
                    fit_bias, offset = fit_bias.mean(axis=1), fit_bias - fit_bias.mean(axis=1, keepdims=True)
                parts = cfg.summary_calibration_parts
                bias = fit_bias if parts != "value" else bias
                v_mean = fit_value if parts != "bias" else v_mean
            self.summary_bias[ikv] = np.concatenate([self.summary_bias[ikv], bias])
            self.head_offset[ikv] = _append_rows(self.head_offset[ikv], offset, n_new)
            if "keys" in self.fields:
                self.keys[ikv] = np.concatenate([self.keys[ikv], k_mean.astype(np.float16)])
            if "bounds" in self.fields:
                lo = _f16_outwards(np.stack([p.min(axis=0) for p in k_parts]), down=True)   # [n_new, Hkv, d]
                hi = _f16_outwards(np.stack([p.max(axis=0) for p in k_parts]), down=False)
                self.kmin[ikv] = np.concatenate([self.kmin[ikv], lo])
                self.kmax[ikv] = np.concatenate([self.kmax[ikv], hi])
            if "blocks" in self.fields:
                codes, scale = self._block_index(k_parts, splits)
                self.blocks[ikv] = np.concatenate([self.blocks[ikv], codes], axis=1)
                self.block_scale[ikv] = np.concatenate([self.block_scale[ikv], scale], axis=1)
            if self.sketch_shape is not None:
                add = {f: x.astype(np.float64) for f, x in sketches(k_parts, *self.sketch_shape).items()}
                have = self.sketch[ikv]
                self.sketch[ikv] = add if not have else {f: np.concatenate([have[f], add[f]]) for f in SKETCH_FIELDS}
            summaries.append((k_mean.reshape(n_new, -1).astype(np.float16),   # [n_new, Hkv*d]
                              v_mean.reshape(n_new, -1).astype(np.float16)))
        self.block_logn = np.concatenate([self.block_logn, self._block_logn(splits)])
        self.spans.extend(new)
        self.lengths = np.concatenate([self.lengths, [s.length for s in new]]).astype(np.float32)
        return summaries

    def _numbers(self, rows: np.ndarray, type_id: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows of cache type ``type_id`` as numbers [n, Hkv, d], and a quantized cache's blocks uint8
        [n, Hkv, head_bytes] (None for f16 / f32)."""
        values = kv_codec.decode(rows, type_id, self.n_head_kv, self.head_dim)
        if not kv_codec.is_block(type_id):
            return values, None
        return values, np.ascontiguousarray(rows, dtype=np.uint8).reshape(rows.shape[0], self.n_head_kv, -1)

    def _block_index(self, k_parts: list[np.ndarray], splits: list[list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """The routing index of spans with keys ``k_parts[i]`` f32 [L_i, Hkv, d] cut into blocks ``splits[i]``: the
        mean key of each block as kept (``_index_codes``: codes [Hkv, n, B, d], scales [Hkv, n, B])."""
        blocks = np.zeros((self.n_head_kv, len(k_parts), self.n_blocks, self.head_dim), dtype=np.float32)
        for i, (p, split) in enumerate(zip(k_parts, splits)):
            for b, idx in enumerate(split):
                blocks[:, i, b] = p[idx].mean(axis=0)                    # [Hkv, d]
        return _index_codes(blocks, self.q8_index)

    def _block_logn(self, splits: list[list[np.ndarray]]) -> np.ndarray:
        """f32 [n, B]: log tokens per block of spans cut into ``splits`` (-inf past a span's blocks)."""
        logn = np.full((len(splits), self.n_blocks), -np.inf, dtype=np.float32)
        for i, split in enumerate(splits):
            logn[i, : len(split)] = np.log([idx.size for idx in split])
        return logn

    @single_threaded_blas
    def rebuild_index(self) -> None:
        """The routing index (``blocks``, ``block_scale``, ``block_logn``) computed again from the spans' host K rows,
        as ``add`` computes it from the cache's rows: a compact memory file leaves it out. From rows kept exactly it
        is the index ``add`` made; from 4-bit rows, the index of those rows (block means of 16 tokens: the rows'
        rounding mostly averages out)."""
        splits = [self._blocks(sp.length) for sp in self.spans]
        self.block_logn = self._block_logn(splits)
        for ikv in range(self.n_layer):
            if "blocks" in self.fields and self.spans:
                self.blocks[ikv], self.block_scale[ikv] = self._block_index([sp.k[ikv].rebuild() for sp in self.spans],
                                                                            splits)
            else:
                self.blocks[ikv] = self.blocks[ikv][:, :0]
                self.block_scale[ikv] = self.block_scale[ikv][:, :0]

    def _blocks(self, length: int) -> list[np.ndarray]:
        """A span's token indices cut into ceil(length / block_tokens) near-equal blocks (at most ``n_blocks``)."""
        n = min(self.n_blocks, -(-length // self.config.block_tokens))
        return np.array_split(np.arange(length), n)

    def truncate(self, k: int) -> None:
        """Keep the first ``k`` spans (a rollback): every per-layer array and table shortened."""
        self.spans = self.spans[:k]
        self.lengths = self.lengths[:k]
        self.block_logn = self.block_logn[:k]
        self.summary_bias = [b[:k] for b in self.summary_bias]
        self.head_offset = [o[:k] for o in self.head_offset]
        for ikv in range(self.n_layer):
            self.keys[ikv], self.kmin[ikv], self.kmax[ikv] = self.keys[ikv][:k], self.kmin[ikv][:k], self.kmax[ikv][:k]
            self.blocks[ikv], self.block_scale[ikv] = self.blocks[ikv][:, :k], self.block_scale[ikv][:, :k]
            self.tables[ikv] = self.tables[ikv].head(k)
            if self.sketch[ikv]:
                self.sketch[ikv] = {f: x[:k] for f, x in self.sketch[ikv].items()}

    def shared_objects(self) -> list[object]:
        """What a snapshot of the store may share with it: the spans (immutable once placed), their host arrays
        and the stacked per-layer arrays (replaced, never written in place)."""
        out: list[object] = [*self.spans, self.lengths, self.block_logn, *self.keys, *self.kmin, *self.kmax,
                             *self.blocks, *self.block_scale, *self.summary_bias, *self.head_offset]
        for s in self.spans:
            out += [s.positions, *s.k, *s.v]
            out += [a for f in s.k + s.v for a in (f.us, f.vt, f.raw, f.q8, f.scale, f.q4, f.blocks) if a is not None]
        for t in self.tables:
            out += t.arrays
        for sk in self.sketch:
            out += list(sk.values())
        return out

    # -- plain data (a saved memory) -------------------------------------------------------------------------------

    _STACKED = ("keys", "kmin", "kmax", "blocks", "block_scale", "sketch")  # per-layer lists

    def to_plain(self) -> dict[str, Any]:
        """The spans (positions, summary cell, per layer K/V factors or rows) and the routing data stacked from them,
        as plain data; the native pointer tables are rebuilt from the spans by ``load_plain``."""
        factors = lambda f: {k: getattr(f, k) for k in Factors.__dataclass_fields__}  # noqa: E731
        return {"spans": [{"id": sp.id, "positions": sp.positions, "summary_cell": sp.summary_cell,
                           "k": [factors(f) for f in sp.k], "v": [factors(f) for f in sp.v]} for sp in self.spans],
                "lengths": self.lengths, "block_logn": self.block_logn, "summary_bias": list(self.summary_bias),
                **({"head_offset": list(self.head_offset)} if any(o.size for o in self.head_offset) else {}),
                **{name: list(getattr(self, name)) for name in self._STACKED}}

    def load_plain(self, data: dict[str, Any]) -> None:
        """Replace the contents with ``data`` (from ``to_plain`` of a store of the same shape)."""
        self.spans = [Span(id=int(d["id"]), positions=np.asarray(d["positions"], dtype=np.int32),
                           summary_cell=int(d["summary_cell"]), k=[Factors(**f) for f in d["k"]],
                           v=[Factors(**f) for f in d["v"]]) for d in data["spans"]]
        if any(len(sp.k) != self.n_layer or len(sp.v) != self.n_layer for sp in self.spans):
            raise ValueError(f"a saved span store must hold factors for {self.n_layer} layers")
        self.lengths = np.asarray(data["lengths"], dtype=np.float32)
        bias = data.get("summary_bias")  # absent from files written before it: log|S| everywhere
        self.summary_bias = ([np.asarray(b, dtype=np.float32) for b in bias] if bias is not None
                             else [np.log(self.lengths) for _ in range(self.n_layer)])
        if len(self.summary_bias) != self.n_layer or any(b.shape != self.lengths.shape for b in self.summary_bias):
            raise ValueError(f"a saved span store's summary biases must be {self.n_layer} layers of "
                             f"{self.lengths.size} spans")
        offset = data.get("head_offset")  # absent where none was fitted (and from files written before it)
        self.head_offset = ([np.asarray(o, dtype=np.float32) for o in offset] if offset is not None
                            else [np.zeros((self.lengths.size, 0), dtype=np.float32) for _ in range(self.n_layer)])
        if len(self.head_offset) != self.n_layer or any(o.ndim != 2 or o.shape[0] != self.lengths.size
                                                        for o in self.head_offset):
            raise ValueError(f"a saved span store's per-head bias offsets must be {self.n_layer} layers of "
                             f"{self.lengths.size} spans")
        rebuild = any(data.get(name) is None for name in INDEX_FIELDS)  # left out: computed from the host K rows
        if not rebuild:
            self.block_logn = np.asarray(data["block_logn"], dtype=np.float32)
        for name in self._STACKED:
            if not (rebuild and name in INDEX_FIELDS):
                setattr(self, name, list(data[name]))
        self.tables = [native.SpanTable(self.n_head_kv, self.head_dim) for _ in range(self.n_layer)]
        for ikv, table in enumerate(self.tables):
            for sp in self.spans:
                _table_append(table, sp.length, sp.k[ikv])
        if rebuild:
            self.rebuild_index()

    def place_summaries(self, first: int, cells: np.ndarray) -> None:
        """Record the device cells that hold the summary rows of spans ``first, first+1, ...``."""
        for span, cell in zip(self.spans[first:], cells):
            span.summary_cell = int(cell)

    # -- what the run reports ----------------------------------------------------------------------------------

    @property
    def host_bytes(self) -> int:
        """Bytes the store holds in host memory: the spans' rows or factors and positions, and the routing data."""
        return int(sum(s.nbytes for s in self.spans)) + self.routing_bytes

    @property
    def routing_bytes(self) -> int:
        """Bytes of the routing data stacked from the spans: summary keys, key bounds, block index, sketches,
        lengths (as held)."""
        routing = [self.lengths, self.block_logn, *self.keys, *self.kmin, *self.kmax, *self.blocks, *self.block_scale]
        routing += [x for sk in self.sketch for x in sk.values()]
        return int(sum(a.nbytes for a in routing))

    @property
    def index_bytes(self) -> int:
        """Bytes of what the two-stage routers scan per routing (block index with its scales and log sizes, as
        held; on a GPU it sits beside the summary rows)."""
        return int(sum(b.nbytes for b in self.blocks + self.block_scale) + self.block_logn.nbytes)

    def block_keys(self, ikv: int) -> np.ndarray:
        """Layer ``ikv``'s block keys f32 [Hkv, S, B, d] (q8 codes widened by their scales)."""
        keys = self.blocks[ikv].astype(np.float32)
        return keys * self.block_scale[ikv][..., None].astype(np.float32) if self.q8_index else keys

    @property
    def span_tokens(self) -> int:
        return int(self.lengths.sum())

    def rank_stats(self) -> tuple[float, float]:
        """(mean rank, share of matrices kept raw) over every span, layer and K|V."""
        factors = [f for s in self.spans for f in s.k + s.v]
        if not factors:
            return 0.0, 0.0
        return float(np.mean([f.rank for f in factors])), float(np.mean([f.rows_kept for f in factors]))
