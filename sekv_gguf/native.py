"""The one owner of the compiled native module (``sekv_gguf._native``): numpy in and out, exceptions for errors.

Host-side hot paths: f32 -> f16 narrowing of rows written back into the KV cache, per-token surprisal, and the
attention-mass scorers (``span_mass`` over a ``SpanTable`` of span K rows, ``attn_mass`` over cache rows).
"""

from __future__ import annotations

import numpy as np

from ._native import ffi, lib
from .errors import NativeError

RANK_Q8 = lib.SEKV_RANK_Q8  # SpanTable rank of int8 rows
RANK_Q4 = lib.SEKV_RANK_Q4  # SpanTable rank of packed 4-bit rows
MAX_HEADS = lib.SEKV_MAX_HEADS  # query heads span_mass scores at once (query probes count as heads)
MAX_QV = lib.SEKV_MAX_QV  # (query heads per KV head) * rank of a factored span span_mass scores at once

_MESSAGES = {
    lib.SEKV_N_ERR_NULL: "a required buffer is missing",
    lib.SEKV_N_ERR_SIZE: "a count or row size is out of range",
    lib.SEKV_N_ERR_INDEX: "an index is out of range",
}


def _check(function: str, rc: int, detail: str = "") -> None:
    if rc != lib.SEKV_N_OK:
        raise NativeError(f"{function}: {_MESSAGES.get(rc, f'error {rc}')}{': ' + detail if detail else ''}")


def _ptr(ctype: str, arr: np.ndarray):
    return ffi.cast(ctype, arr.ctypes.data)


def _index(idx: object, n_rows: int, name: str) -> np.ndarray:
    i = np.ascontiguousarray(np.asarray(idx).reshape(-1))
    if i.size and not np.issubdtype(i.dtype, np.integer):
        raise NativeError(f"{name} must be integers, got {i.dtype}")
    bad = np.flatnonzero((i < 0) | (i >= n_rows))
    if bad.size:
        raise NativeError(f"{name}[{bad[0]}] = {i[bad[0]]} out of range [0, {n_rows})")
    return i.astype(np.int32)


def f32_to_f16(a: np.ndarray) -> np.ndarray:
    """float16 copy of a float32 array (round to nearest even, overflow to inf)."""
    src = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(src.shape, dtype=np.float16)
    _check("f32_to_f16", lib.sekv_f32_to_f16(_ptr("float *", src), _ptr("uint16_t *", out), src.size))
    return out


def surprisal(logits: np.ndarray, next_tokens: object) -> np.ndarray:
    """float32 [n]: -log p(next_tokens[i] | row i) of float32 logits [n, n_vocab], in nats."""
    lg = np.ascontiguousarray(logits, dtype=np.float32)
    if lg.ndim != 2:
        raise NativeError(f"logits must be 2-D [n, n_vocab], got shape {lg.shape}")
    nxt = _index(next_tokens, lg.shape[1], "next_tokens")
    if nxt.size != lg.shape[0]:
        raise NativeError(f"next_tokens has {nxt.size} entries for {lg.shape[0]} logit rows")
    out = np.empty(nxt.size, dtype=np.float32)
    if out.size:
        _check("surprisal", lib.sekv_surprisal(_ptr("float *", lg), lg.shape[0], lg.shape[1],
                                               _ptr("int32_t *", nxt), _ptr("float *", out)))
    return out


def surprisal_at(address: int, n_rows: int, n_vocab: int, next_tokens: object) -> np.ndarray:
    """Like ``surprisal`` for logits [n_rows, n_vocab] float32 that live at ``address`` (llama.cpp's own logits
    buffer, read in place instead of copied). The caller vouches for the buffer's extent."""
    if not address:
        raise NativeError("surprisal_at: the logits buffer is NULL")
    if n_rows < 0 or n_vocab <= 0:
        raise NativeError(f"surprisal_at: bad shape [{n_rows}, {n_vocab}]")
    nxt = _index(next_tokens, n_vocab, "next_tokens")
    if nxt.size != n_rows:
        raise NativeError(f"next_tokens has {nxt.size} entries for {n_rows} logit rows")
    out = np.empty(n_rows, dtype=np.float32)
    if n_rows:
        _check("surprisal", lib.sekv_surprisal(ffi.cast("float *", address), n_rows, n_vocab,
                                               _ptr("int32_t *", nxt), _ptr("float *", out)))
    return out


class SpanTable:
    """The host K rows of every span of one layer, as the pointer table ``span_mass`` reads: per span its length,
    rank (0: raw f16 rows, ``RANK_Q8``: int8 codes with per-channel scales, ``RANK_Q4``: packed 4-bit codes with
    per-channel scale and zero) and its arrays (kept referenced here,
    so the pointers stay valid)."""

    def __init__(self, n_head_kv: int, head_dim: int):
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        self._arrays: list[np.ndarray] = []
        self.len = np.zeros(0, dtype=np.int32)
        self.rank = np.zeros(0, dtype=np.int32)
        self.a = np.zeros(0, dtype=np.uintp)
        self.b = np.zeros(0, dtype=np.uintp)

    def __len__(self) -> int:
        return int(self.len.size)

    @property
    def arrays(self) -> list[np.ndarray]:
        """The f16 arrays the table points into (kept alive by it)."""
        return list(self._arrays)

    def head(self, k: int) -> "SpanTable":
        """A table of the first ``k`` spans (sharing their arrays)."""
        out = SpanTable(self.n_head_kv, self.head_dim)
        keep = 2 * k  # two arrays per span
        out._arrays = self._arrays[:keep]
        out.len, out.rank, out.a, out.b = self.len[:k].copy(), self.rank[:k].copy(), self.a[:k].copy(), self.b[:k].copy()
        return out

    @classmethod
    def of_rows(cls, rows: list[np.ndarray], n_head_kv: int, head_dim: int) -> "SpanTable":
        """A table of spans given as raw f16 rows [L_i, Hkv, d] each (built in one pass: the resident spans a
        two-stage router judges on every routing call)."""
        out = cls(n_head_kv, head_dim)
        arrays = [np.ascontiguousarray(r, dtype=np.float16) for r in rows]
        if any(a.ndim != 3 or a.shape[1:] != (n_head_kv, head_dim) or not a.shape[0] for a in arrays):
            raise NativeError(f"raw span rows must be [L > 0, {n_head_kv}, {head_dim}]")
        out._arrays = [a for a in arrays for _ in (0, 1)]  # two per span, as append keeps them
        out.len = np.array([a.shape[0] for a in arrays], dtype=np.int32)
        out.rank = np.zeros(len(arrays), dtype=np.int32)
        out.a = np.array([a.ctypes.data for a in arrays], dtype=np.uintp)
        out.b = out.a.copy()
        return out

    def append(self, length: int, raw: np.ndarray | None, us: np.ndarray | None, vt: np.ndarray | None,
               q8: np.ndarray | None = None, scale: np.ndarray | None = None, q4: np.ndarray | None = None) -> None:
        """raw f16 [L, Hkv, d], or us f16 [Hkv, L, r] with vt f16 [Hkv, r, d], or q8 int8 [L, Hkv, d] with its
        per-channel scale f32 [Hkv, d] (or any shape of those values), or q4 uint8 [L, Hkv, d/2] (two 4-bit codes
        per byte) with ``scale`` f16 [2, Hkv, d]: per-channel scale, then zero."""
        hkv, d = self.n_head_kv, self.head_dim
        if q4 is not None:
            a = np.ascontiguousarray(q4)
            b = np.ascontiguousarray(scale).reshape(-1)
            if (a.dtype != np.uint8 or d % 2 or a.shape != (length, hkv, d // 2) or b.dtype != np.float16
                    or b.size != 2 * hkv * d):
                raise NativeError(f"4-bit span rows {a.dtype} {a.shape} with {b.dtype} {b.size} parameters, expected "
                                  f"uint8 {(length, hkv, d // 2)} with float16 {2 * hkv * d}")
            rank = RANK_Q4
        elif q8 is not None:
            a = np.ascontiguousarray(q8)
            b = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
            if a.dtype != np.int8 or a.shape != (length, hkv, d) or b.size != hkv * d:
                raise NativeError(f"int8 span rows {a.dtype} {a.shape} with {b.size} scales, expected int8 "
                                  f"{(length, hkv, d)} with {hkv * d}")
            rank = RANK_Q8
        elif raw is not None:
            a = np.ascontiguousarray(raw, dtype=np.float16)
            if a.shape != (length, hkv, d):
                raise NativeError(f"raw span rows have shape {a.shape}, expected {(length, hkv, d)}")
            b, rank = a, 0
        else:
            a = np.ascontiguousarray(us, dtype=np.float16)
            b = np.ascontiguousarray(vt, dtype=np.float16)
            rank = a.shape[-1]
            if a.shape != (hkv, length, rank) or b.shape != (hkv, rank, d) or not 0 < rank <= min(length, d):
                raise NativeError(f"span factors have shapes {a.shape}, {b.shape} for L={length}, Hkv={hkv}, d={d}")
        self._arrays += [a, b]
        self.len = np.append(self.len, np.int32(length))
        self.rank = np.append(self.rank, np.int32(rank))
        self.a = np.append(self.a, np.uintp(a.ctypes.data))
        self.b = np.append(self.b, np.uintp(b.ctypes.data))


def span_mass(query: np.ndarray, table: SpanTable, subset: np.ndarray | None = None) -> np.ndarray:
    """float32 [n_spans, n_head]: logsumexp_t q_h · k_t over each span's host K rows, per query head (see
    SpanTable); with ``subset`` (span indices) only those spans' rows, [len(subset), n_head]."""
    q = np.ascontiguousarray(query, dtype=np.float32)
    if q.ndim != 2 or q.shape[1] != table.head_dim or q.shape[0] % table.n_head_kv:
        raise NativeError(f"query must be [n_head, {table.head_dim}] with n_head a multiple of {table.n_head_kv}, "
                          f"got {q.shape}")
    lens, ranks, a, b = table.len, table.rank, table.a, table.b
    if subset is not None:
        idx = np.asarray(subset, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(table))):
            raise NativeError(f"span subset must index the {len(table)} spans of the table")
        lens, ranks, a, b = lens[idx], ranks[idx], a[idx], b[idx]  # copies, contiguous
    out = np.empty((lens.size, q.shape[0]), dtype=np.float32)
    if out.size:
        _check("span_mass", lib.sekv_span_mass(
            _ptr("float *", q), q.shape[0], table.n_head_kv, table.head_dim, lens.size,
            _ptr("int32_t *", lens), _ptr("int32_t *", ranks), ffi.cast("void **", a.ctypes.data),
            ffi.cast("void **", b.ctypes.data), _ptr("float *", out)))
    return out


def index_score(query: np.ndarray, codes: np.ndarray, scale: np.ndarray, logn: np.ndarray) -> np.ndarray:
    """float32 [n_spans]: the index router's stage-1 score, ``max_h logsumexp_b (scale * q_h · codes + logn)``, from
    a q8 block index read as held: ``codes`` int8 [Hkv, S, B, d], ``scale`` f16 [Hkv, S, B], ``logn`` f32 [S, B]
    (-inf: padding; each span's first block real); query f32 [n_head, d]."""
    q = np.ascontiguousarray(query, dtype=np.float32)
    c, sc, ln = (np.ascontiguousarray(a) for a in (codes, scale, logn))
    if c.dtype != np.int8 or c.ndim != 4:
        raise NativeError(f"index codes must be int8 [n_head_kv, n_spans, n_blocks, d], got {c.dtype} {c.shape}")
    hkv, n_spans, n_blocks, d = c.shape
    if sc.dtype != np.float16 or sc.shape != (hkv, n_spans, n_blocks):
        raise NativeError(f"index scales must be float16 {(hkv, n_spans, n_blocks)}, got {sc.dtype} {sc.shape}")
    if ln.dtype != np.float32 or ln.shape != (n_spans, n_blocks):
        raise NativeError(f"block log sizes must be float32 {(n_spans, n_blocks)}, got {ln.dtype} {ln.shape}")
    if q.ndim != 2 or q.shape[1] != d or q.shape[0] % hkv:
        raise NativeError(f"query must be [n_head, {d}] with n_head a multiple of {hkv}, got {q.shape}")
    out = np.empty(n_spans, dtype=np.float32)
    if n_spans:
        _check("index_score", lib.sekv_index_score(
            _ptr("float *", q), q.shape[0], hkv, d, n_spans, n_blocks, ffi.cast("int8_t *", c.ctypes.data),
            _ptr("uint16_t *", sc), _ptr("float *", ln), _ptr("float *", out)),
            "each span needs a real first block")
    return out


def q8_to_f16(codes: np.ndarray, scale: np.ndarray, per_token: bool) -> np.ndarray:
    """f16 [n, Hkv, d] rows of int8 ``codes`` [n, Hkv, d] times ``scale``: f32 [Hkv, d] per channel, or [n, Hkv]
    per token (``per_token``)."""
    c = np.ascontiguousarray(codes)
    if c.dtype != np.int8 or c.ndim != 3:
        raise NativeError(f"codes must be int8 [n, n_head_kv, d], got {c.dtype} {c.shape}")
    n, hkv, d = c.shape
    s = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    if s.size != (n * hkv if per_token else hkv * d):
        raise NativeError(f"{s.size} scales for int8 rows {c.shape} ({'per token' if per_token else 'per channel'})")
    out = np.empty(c.shape, dtype=np.float16)
    if c.size:
        _check("q8_to_f16", lib.sekv_q8_to_f16(ffi.cast("int8_t *", c.ctypes.data), _ptr("float *", s), n, hkv, d,
                                                int(per_token), _ptr("uint16_t *", out)))
    return out


def q4_to_f16(codes: np.ndarray, params: np.ndarray, group: int) -> np.ndarray:
    """f16 [n, Hkv, d] rows zero + code * scale of 4-bit ``codes`` uint8 [n, Hkv, d/2] (channel 2i in the low
    nibble): ``params`` f16 [2, Hkv, d] (scale, zero) per channel when ``group`` is 0, or [2, n, Hkv, d/group] per
    token and run of ``group`` channels."""
    c = np.ascontiguousarray(codes)
    if c.dtype != np.uint8 or c.ndim != 3:
        raise NativeError(f"codes must be uint8 [n, n_head_kv, d/2], got {c.dtype} {c.shape}")
    n, hkv, d = c.shape[0], c.shape[1], 2 * c.shape[2]
    if group < 0 or (group and d % group):
        raise NativeError(f"group {group} does not divide the head size {d}")
    p = np.ascontiguousarray(params)
    want = 2 * (n * hkv * (d // group) if group else hkv * d)
    if p.dtype != np.float16 or p.size != want:
        raise NativeError(f"{p.dtype} {p.size} parameters for 4-bit rows {c.shape} (group {group}), expected "
                          f"float16 {want}")
    out = np.empty((n, hkv, d), dtype=np.float16)
    if c.size:
        _check("q4_to_f16", lib.sekv_q4_to_f16(_ptr("uint8_t *", c), _ptr("uint16_t *", p), n, hkv, d, group,
                                                _ptr("uint16_t *", out)))
    return out


def attn_mass(query: np.ndarray, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [n]: sum over query heads of softmax_i(q_h · k_i) for query f32 [n_head, d] and cache rows
    keys f16 [n, n_head_kv, d]; added to ``out`` when given."""
    q = np.ascontiguousarray(query, dtype=np.float32)
    k = np.ascontiguousarray(keys)
    if k.dtype != np.float16 or k.ndim != 3:
        raise NativeError(f"keys must be float16 [n, n_head_kv, d], got {k.dtype} {k.shape}")
    if q.ndim != 2 or q.shape[1] != k.shape[2] or q.shape[0] % k.shape[1]:
        raise NativeError(f"query must be [n_head, {k.shape[2]}] with n_head a multiple of {k.shape[1]}, got {q.shape}")
    if out is None:
        out = np.zeros(k.shape[0], dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != (k.shape[0],) or not out.flags.c_contiguous:
        raise NativeError(f"out must be float32 [{k.shape[0]}], got {out.dtype} {out.shape}")
    scratch = np.empty(k.shape[0], dtype=np.float32)
    if k.shape[0]:
        _check("attn_mass", lib.sekv_attn_mass(_ptr("float *", q), q.shape[0], k.shape[1], k.shape[2],
                                               _ptr("uint16_t *", k), k.shape[0], _ptr("float *", scratch),
                                               scratch.size, _ptr("float *", out)))
    return out


lib.sekv_init()  # the f16 table span_mass and attn_mass read
