"""The one owner of the compiled native module (``sekv_gguf._native``): numpy in and out, exceptions for errors.

Host-side row work around the KV hook (gather/scatter of cache rows, f16 <-> f32) and per-token surprisal.
"""

from __future__ import annotations

import numpy as np

from ._native import ffi, lib
from .errors import NativeError

_MESSAGES = {
    lib.SEKV_N_ERR_NULL: "a required buffer is missing",
    lib.SEKV_N_ERR_SIZE: "a count or row size is out of range",
    lib.SEKV_N_ERR_INDEX: "a row index is out of range",
}


def _check(function: str, rc: int, detail: str = "") -> None:
    if rc != lib.SEKV_N_OK:
        raise NativeError(f"{function}: {_MESSAGES.get(rc, f'error {rc}')}{': ' + detail if detail else ''}")


def _ptr(ctype: str, arr: np.ndarray):
    return ffi.cast(ctype, arr.ctypes.data)


def _rows(a: np.ndarray, name: str, dtype: np.dtype) -> np.ndarray:
    if a.dtype != dtype:
        raise NativeError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    if a.ndim != 2 or not a.flags.c_contiguous:
        raise NativeError(f"{name} must be a C-contiguous 2-D array [rows, row_len], got shape {a.shape}")
    return a


def _index(idx: object, n_rows: int, name: str) -> np.ndarray:
    i = np.ascontiguousarray(np.asarray(idx).reshape(-1))
    if i.size and not np.issubdtype(i.dtype, np.integer):
        raise NativeError(f"{name} must be integers, got {i.dtype}")
    bad = np.flatnonzero((i < 0) | (i >= n_rows))
    if bad.size:
        raise NativeError(f"{name}[{bad[0]}] = {i[bad[0]]} out of range [0, {n_rows})")
    return i.astype(np.int32)


def f16_to_f32(a: np.ndarray) -> np.ndarray:
    """float32 copy of a float16 array (exact)."""
    src = np.ascontiguousarray(a, dtype=np.float16)
    out = np.empty(src.shape, dtype=np.float32)
    _check("f16_to_f32", lib.sekv_f16_to_f32(_ptr("uint16_t *", src), _ptr("float *", out), src.size))
    return out


def f32_to_f16(a: np.ndarray) -> np.ndarray:
    """float16 copy of a float32 array (round to nearest even, overflow to inf)."""
    src = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(src.shape, dtype=np.float16)
    _check("f32_to_f16", lib.sekv_f32_to_f16(_ptr("float *", src), _ptr("uint16_t *", out), src.size))
    return out


def gather_rows(src: np.ndarray, idx: object) -> np.ndarray:
    """``src[idx]`` for a C-contiguous 2-D array of any dtype."""
    if src.ndim != 2 or not src.flags.c_contiguous:
        raise NativeError(f"src must be a C-contiguous 2-D array, got shape {src.shape}")
    i = _index(idx, src.shape[0], "idx")
    out = np.empty((i.size, src.shape[1]), dtype=src.dtype)
    if out.size:
        _check("gather_rows", lib.sekv_gather_rows(_ptr("void *", src), src.shape[0], src.strides[0],
                                                   _ptr("int32_t *", i), i.size, _ptr("void *", out), out.shape[0]))
    return out


def scatter_rows(src: np.ndarray, idx: object, dst: np.ndarray) -> None:
    """``dst[idx] = src`` in place; both C-contiguous 2-D arrays of one dtype and row length."""
    if src.dtype != dst.dtype or src.ndim != 2 or dst.ndim != 2 or src.shape[1] != dst.shape[1]:
        raise NativeError(f"src {src.shape} {src.dtype} and dst {dst.shape} {dst.dtype} must be 2-D with the same "
                          "row length and dtype")
    if not (src.flags.c_contiguous and dst.flags.c_contiguous):
        raise NativeError("src and dst must be C-contiguous")
    i = _index(idx, dst.shape[0], "idx")
    if i.size != src.shape[0]:
        raise NativeError(f"idx has {i.size} entries for {src.shape[0]} source rows")
    if i.size and src.shape[1]:
        _check("scatter_rows", lib.sekv_scatter_rows(_ptr("void *", src), src.shape[0], src.strides[0],
                                                     _ptr("int32_t *", i), i.size, _ptr("void *", dst), dst.shape[0]))


def gather_rows_f16_f32(src: np.ndarray, idx: object) -> np.ndarray:
    """float32 ``src[idx]`` of a float16 [rows, row_len] array, widened in one pass."""
    _rows(src, "src", np.dtype(np.float16))
    i = _index(idx, src.shape[0], "idx")
    out = np.empty((i.size, src.shape[1]), dtype=np.float32)
    if out.size:
        _check("gather_rows_f16_f32", lib.sekv_gather_rows_f16_f32(
            _ptr("uint16_t *", src), src.shape[0], src.shape[1], _ptr("int32_t *", i), i.size,
            _ptr("float *", out), out.shape[0]))
    return out


def scatter_rows_f32_f16(src: np.ndarray, idx: object, dst: np.ndarray) -> None:
    """``dst[idx] = float16(src)`` in place: float32 rows narrowed into a float16 [rows, row_len] array."""
    _rows(src, "src", np.dtype(np.float32))
    _rows(dst, "dst", np.dtype(np.float16))
    if src.shape[1] != dst.shape[1]:
        raise NativeError(f"row length of src ({src.shape[1]}) and dst ({dst.shape[1]}) differ")
    i = _index(idx, dst.shape[0], "idx")
    if i.size != src.shape[0]:
        raise NativeError(f"idx has {i.size} entries for {src.shape[0]} source rows")
    if i.size and src.shape[1]:
        _check("scatter_rows_f32_f16", lib.sekv_scatter_rows_f32_f16(
            _ptr("float *", src), src.shape[0], src.shape[1], _ptr("int32_t *", i), i.size,
            _ptr("uint16_t *", dst), dst.shape[0]))


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
    rank (0: raw rows) and the f16 arrays (kept referenced here, so the pointers stay valid)."""

    def __init__(self, n_head_kv: int, head_dim: int):
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        self._arrays: list[np.ndarray] = []
        self.len = np.zeros(0, dtype=np.int32)
        self.rank = np.zeros(0, dtype=np.int32)
        self.a = np.zeros(0, dtype=np.uintp)
        self.b = np.zeros(0, dtype=np.uintp)

    def __len__(self) -> int:
        return int(self.len.size)

    def append(self, length: int, raw: np.ndarray | None, us: np.ndarray | None, vt: np.ndarray | None) -> None:
        """raw f16 [L, Hkv, d], or us f16 [Hkv, L, r] with vt f16 [Hkv, r, d]."""
        hkv, d = self.n_head_kv, self.head_dim
        if raw is not None:
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
            _ptr("int32_t *", lens), _ptr("int32_t *", ranks), ffi.cast("uint16_t **", a.ctypes.data),
            ffi.cast("uint16_t **", b.ctypes.data), _ptr("float *", out)))
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
