"""Host tier of SeKV: per span and hooked layer, fp16 low-rank factors (or the raw rows) of K and V, and the summary
row that stays on the device.

Rank per (span, layer, K|V): the smallest r keeping ``energy`` (``energy_v`` for V) of the squared Frobenius norm
for every KV head; if r > r_max or the fp16 factors (U·S [L, r] and Vᵀ [r, d] per head) would not be smaller than
the rows as stored, the rows are stored: fp16; with ``host_format="q8"`` int8 codes with one f32 scale per
channel for K (keys' outlier channels, as KIVI quantizes them) and per token for V; with ``host_format="q4"``
4-bit codes (two per byte) with an f16 scale and zero (the minimum) per channel for K and per token and run of
``Q4_GROUP`` channels for V (KIVI's asymmetric layout). The SVDs of a batch are one
LAPACK call over zero-padded spans (see ``factorize``).

On a block-quantized cache (q8_0, q4_0: ``kv_codec``) the rows come in as blocks and are compressed from their
dequantized values (``host_format="auto"``, the default: 4-bit rows, int8 on a q8_0 cache); ``host_format="f16"``
("as the device holds them") keeps the blocks themselves, so that a span rebuilt at full rank goes back byte for
byte (keys with an f16 widening beside them: the native scorers read f16, int8 or 4-bit rows, not ggml blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType
from scipy.special import logsumexp

from . import kv_codec, native
from .config import SekvConfig

Q4_GROUP = 32   # channels per (scale, zero) pair of a 4-bit value row (or the largest divisor of d below it)
Q4_LEVELS = 15  # the largest 4-bit code


@dataclass
class Factors:
    """One matrix set [L, n_head_kv, d] of a span in one layer: factors when ``raw`` is None."""

    us: np.ndarray | None   # f16 [n_head_kv, L, r]  U·diag(S)
    vt: np.ndarray | None   # f16 [n_head_kv, r, d]
    raw: np.ndarray | None  # f16 [L, n_head_kv, d]
    q8: np.ndarray | None = None     # int8 [L, n_head_kv, d] codes (rows stored as int8)
    scale: np.ndarray | None = None  # q8: f32 [n_head_kv, d] per channel (K) or [L, n_head_kv] per token (V);
                                     # q4: f16 (scale, zero) [2, n_head_kv, d] (K) or [2, L, n_head_kv, d/group] (V)
    per_token: bool = False          # which of the two ``scale`` is
    q4: np.ndarray | None = None     # uint8 [L, n_head_kv, d/2] 4-bit codes, channel 2i in the low nibble
    group: int = 0                   # q4 values: channels per (scale, zero) pair (0: per channel, as K)
    blocks: np.ndarray | None = None  # uint8 [L, n_head_kv, head_bytes] the rows as a block-quantized cache holds
                                      # them (``raw``: keys' f16 widening for the scorers, None for values)
    block_type: int = 0              # blocks: their ggml type

    @property
    def rows_kept(self) -> bool:
        """The rows themselves are stored (f16, int8, 4-bit or a quantized cache's blocks), not factors."""
        return self.raw is not None or self.q8 is not None or self.q4 is not None or self.blocks is not None

    @property
    def rank(self) -> int:
        if self.blocks is not None:
            return int(self.blocks.shape[0])
        if self.q8 is not None or self.q4 is not None:
            return int((self.q8 if self.q8 is not None else self.q4).shape[0])
        return int(self.raw.shape[0]) if self.raw is not None else int(self.us.shape[2])

    @property
    def nbytes(self) -> int:
        if self.blocks is not None:
            return self.blocks.nbytes + (self.raw.nbytes if self.raw is not None else 0)
        if self.q8 is not None or self.q4 is not None:
            return (self.q8 if self.q8 is not None else self.q4).nbytes + self.scale.nbytes
        if self.raw is not None:
            return self.raw.nbytes
        return self.us.nbytes + self.vt.nbytes

    def rebuild(self) -> np.ndarray:
        """float32 [L, n_head_kv, d]."""
        if self.blocks is not None:  # [L, Hkv, head_bytes] -> [L, Hkv, d]
            return kv_codec.decode(self.blocks, self.block_type, self.blocks.shape[1],
                                   kv_codec.head_dim(self.block_type, self.blocks.shape[2]))
        if self.q4 is not None:  # zero + code * scale, per channel [Hkv, d] or per token and run of channels
            n, hkv, half = self.q4.shape
            codes = np.empty((n, hkv, 2 * half), dtype=np.float32)
            codes[..., 0::2], codes[..., 1::2] = self.q4 & 0x0F, self.q4 >> 4
            scale, zero = (np.repeat(x, self.group, axis=-1) if self.group else x[None] for x in
                           self.scale.astype(np.float32))  # [L, Hkv, d] | [1, Hkv, d]
            return zero + codes * scale
        if self.q8 is not None:  # [L, Hkv, d] * ([L, Hkv, 1] per token | [1, Hkv, d] per channel)
            return self.q8.astype(np.float32) * (self.scale[:, :, None] if self.per_token else self.scale[None])
        if self.raw is not None:
            return self.raw.astype(np.float32)
        # [Hkv, L, r] @ [Hkv, r, d] -> [Hkv, L, d] -> [L, Hkv, d]
        return np.matmul(self.us.astype(np.float32), self.vt.astype(np.float32)).transpose(1, 0, 2)

    def rebuild_f16(self) -> np.ndarray:
        """float16 [L, n_head_kv, d]: the rows as the device cache holds them (int8 and 4-bit rows widened
        natively; blocks kept for a quantized cache dequantized)."""
        if self.blocks is not None:
            return self.raw if self.raw is not None else self.rebuild().astype(np.float16)
        if self.q4 is not None:
            return native.q4_to_f16(self.q4, self.scale, self.group)
        if self.q8 is not None:
            return native.q8_to_f16(self.q8, self.scale, self.per_token)
        if self.raw is not None:
            return self.raw
        return native.f32_to_f16(self.rebuild())

    def device_rows(self, cache_type: int) -> np.ndarray:
        """The rows as a cache of ggml element type ``cache_type`` takes them (``KVHook.set_rows``): the kept blocks
        when they are of that type (byte for byte), else rebuilt: quantized into the type's blocks, or f16 (an f16
        or f32 cache; widened natively)."""
        if self.blocks is not None and self.block_type == cache_type:
            return self.blocks
        if kv_codec.is_block(cache_type):
            rows = self.rebuild()                                          # f32 [L, Hkv, d]
            return kv_codec.encode(rows, cache_type, rows.shape[1], rows.shape[2])
        return self.rebuild_f16()


@dataclass
class Span:
    """A compressed run of tokens: positions, device summary cell, host factors per hooked layer (owned by a
    ``SpanStore``)."""

    id: int
    positions: np.ndarray          # int32 [L]
    summary_cell: int = -1         # device cell of the summary row (-1: none)
    k: list[Factors] = field(default_factory=list)      # [n_layer_kv]
    v: list[Factors] = field(default_factory=list)      # [n_layer_kv]

    @property
    def length(self) -> int:
        return int(self.positions.size)

    @property
    def nbytes(self) -> int:
        return self.positions.nbytes + sum(f.nbytes for f in self.k + self.v)


def energy_rank(s: np.ndarray, energy: float) -> np.ndarray:
    """Smallest r per row of singular values s [..., m] with sum(s[:r]^2) >= energy * sum(s^2)."""
    e = np.cumsum(s.astype(np.float64) ** 2, axis=-1)  # [..., m]
    total = e[..., -1:]
    need = energy * total * (1 - 1e-12)
    return np.maximum(1, (e < need).sum(axis=-1) + 1)


def quantize(m: np.ndarray, per_token: bool) -> Factors:
    """int8 codes of rows m f32 [L, Hkv, d], symmetric, with one f32 scale per channel (over the span's tokens:
    [Hkv, d]) or per token (over its channels: [L, Hkv])."""
    amax = np.abs(m).max(axis=2) if per_token else np.abs(m).max(axis=0)  # [L, Hkv] | [Hkv, d]
    scale = (np.where(amax > 0, amax, 1.0) / 127.0).astype(np.float32)
    codes = np.rint(m / (scale[:, :, None] if per_token else scale[None])).clip(-127, 127).astype(np.int8)
    return Factors(us=None, vt=None, raw=None, q8=codes, scale=scale, per_token=per_token)


def quantize4(m: np.ndarray, group: int) -> Factors:
    """4-bit codes of rows m f32 [L, Hkv, d] (d even), asymmetric: code = round((x - zero) / scale) in
    0..``Q4_LEVELS`` with zero the minimum and scale the range / ``Q4_LEVELS`` (both f16), per channel over the span's
    tokens (``group`` 0: keys) or per token and run of ``group`` channels (values)."""
    n, hkv, d = m.shape
    x = m.reshape(n, hkv, d // group, group) if group else m      # [L, Hkv, G, g] | [L, Hkv, d]
    axis = 3 if group else 0
    lo, hi = x.min(axis=axis), x.max(axis=axis)                   # [L, Hkv, G] | [Hkv, d]
    zero = lo.astype(np.float16)
    scale = ((hi - zero.astype(np.float32)) / Q4_LEVELS).astype(np.float16)
    z, sc = zero.astype(np.float32), scale.astype(np.float32)
    if group:
        z, sc = z[..., None], sc[..., None]
    codes = np.rint((x - z) / np.where(sc > 0, sc, 1.0)).clip(0, Q4_LEVELS).astype(np.uint8).reshape(n, hkv, d)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)            # [L, Hkv, d/2]
    return Factors(us=None, vt=None, raw=None, scale=np.stack([scale, zero]), per_token=bool(group),
                   q4=np.ascontiguousarray(packed), group=group)


def q4_group(d: int) -> int:
    """Channels per (scale, zero) pair of 4-bit value rows of head size d: the largest divisor of d up to
    ``Q4_GROUP``."""
    return max(g for g in range(1, min(Q4_GROUP, d) + 1) if d % g == 0)


def stored_rows(m: np.ndarray, host_format: str, values: bool, blocks: np.ndarray | None = None,
                block_type: int = 0) -> Factors:
    """Rows m f32 [L, Hkv, d] as ``host_format`` keeps them (4-bit needs an even head size; int8 otherwise);
    ``blocks`` uint8 [L, Hkv, head_bytes]: the same rows as a cache of ggml type ``block_type`` holds them, which
    "f16" keeps (keys with their f16 widening for the scorers)."""
    if host_format == "f16" and blocks is not None:
        return Factors(us=None, vt=None, raw=None if values else m.astype(np.float16), blocks=blocks,
                       block_type=block_type)
    if host_format == "q4" and m.shape[2] % 2 == 0:
        return quantize4(m, q4_group(m.shape[2]) if values else 0)
    if host_format in ("q4", "q8"):
        return quantize(m, per_token=values)
    return Factors(us=None, vt=None, raw=m.astype(np.float16))


def rows_nbytes(length: int, d: int, host_format: str, values: bool, block_type: int | None = None) -> int:
    """Bytes per KV head of ``length`` rows of head size d as ``stored_rows`` keeps them (``block_type``: they come
    as blocks of that ggml type)."""
    if host_format == "f16" and block_type is not None:
        return length * kv_codec.head_bytes(block_type, d) + (0 if values else 2 * length * d)
    if host_format == "q4" and d % 2 == 0:
        return length * d // 2 + 4 * (length * (d // q4_group(d)) if values else d)
    if host_format in ("q4", "q8"):
        return length * d + 4 * (length if values else d)
    return 2 * length * d


def host_format_of(host_format: str, block_type: int | None) -> str:
    """The host format span rows take (``SekvConfig.host_format``): ``auto`` is 4-bit, or int8 where the cache
    itself holds 8-bit blocks (``block_type`` q8_0): requantising its rows to 4 bits is one rounding too many for
    a needle at a small budget (measured: docs/quantized-kv.md)."""
    if host_format != "auto":
        return host_format
    return "q8" if block_type == GGMLQuantizationType.Q8_0 else "q4"


def factorize(mats: list[np.ndarray], config: SekvConfig, values: bool = False,
              blocks: list[np.ndarray] | None = None, block_type: int = 0) -> list[Factors]:
    """Factors of each span's rows mats[i] f32 [L_i, n_head_kv, d] (keys, or ``values``), all from one batched
    LAPACK call; the rows themselves (``config.host_format``, ``stored_rows``) where factors would not be smaller.
    ``blocks[i]`` uint8 [L_i, n_head_kv, head_bytes]: span i's rows as a quantized cache of ggml type
    ``block_type`` holds them (mats[i] their dequantized values).

    The SVD A = U S Vᵀ of a span (L <= span_max rows, d columns, L << d) comes from the symmetric eigenproblem of its
    Gram matrix A Aᵀ = U S² Uᵀ (numpy's stacked ``eigh``, LAPACK syevd, in float64), which is ~100x faster here than
    a stacked gesdd on the wide matrices; Vᵀ = S⁻¹ Uᵀ A for the kept components.
    """
    n_head_kv, d = mats[0].shape[1], mats[0].shape[2]
    lmax = max(m.shape[0] for m in mats)
    batch = np.zeros((len(mats), n_head_kv, lmax, d), dtype=np.float64)  # [B, Hkv, Lmax, d]
    for i, m in enumerate(mats):
        batch[i, :, : m.shape[0]] = m.transpose(1, 0, 2)
    gram = batch @ batch.transpose(0, 1, 3, 2)  # [B, Hkv, Lmax, Lmax]
    w, u = np.linalg.eigh(gram)  # ascending eigenvalues
    s = np.sqrt(np.maximum(w[..., ::-1], 0.0))  # [B, Hkv, Lmax] singular values, descending
    u = u[..., ::-1]  # [B, Hkv, Lmax, Lmax] matching left singular vectors
    energy = config.energy_v if values and config.energy_v is not None else config.energy
    ranks = energy_rank(s, energy).max(axis=1)  # [B] one rank for all heads of a span
    out: list[Factors] = []
    cache_blocks = None if blocks is None else block_type  # the cache's block type where its rows are blocks
    fmt = host_format_of(config.host_format, cache_blocks)
    for i, m in enumerate(mats):
        length, r = m.shape[0], int(ranks[i])
        # bytes per head: fp16 factors 2r(L + d) against the rows as stored (``rows_nbytes``)
        kept = rows_nbytes(length, d, fmt, values, cache_blocks)
        if r > config.r_max or 2 * r * (length + d) >= kept:
            out.append(stored_rows(m, fmt, values, None if blocks is None else blocks[i], block_type))
            continue
        ui = u[i, :, :length, :r]  # [Hkv, L, r]
        si = np.maximum(s[i, :, :r], 1e-30)  # [Hkv, r]
        vt = np.swapaxes(ui, 1, 2) @ batch[i, :, :length] / si[:, :, None]  # [Hkv, r, d]
        out.append(Factors(us=(ui * si[:, None, :]).astype(np.float16), vt=vt.astype(np.float16), raw=None))
    return out


def spread(mats: list[np.ndarray], rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The main directions in which each span's keys spread about their mean, for the trained router. Per span
    mats[i] f32 [L_i, n_head_kv, d]: the top ``rank`` principal directions ``dirs`` f32 [B, n_head_kv, rank, d], the
    keys' variance along each ``var`` f32 [B, n_head_kv, rank] (zero where a span has fewer components), and the
    smallest / largest coordinate of a key along each ``lo``, ``hi`` f32 [B, n_head_kv, rank]. So
    ``sum_j var_j (q·dir_j)^2`` approximates the variance of the logit q·k_t over the span's tokens, and
    ``sum_j max(lo_j q·dir_j, hi_j q·dir_j)`` bounds how far above q·mean the best token's logit can reach in that
    subspace. One stacked ``eigh`` of the centred Gram matrices, as in ``factorize``."""
    n_head_kv, d = mats[0].shape[1], mats[0].shape[2]
    lmax = max(m.shape[0] for m in mats)
    batch = np.zeros((len(mats), n_head_kv, lmax, d), dtype=np.float64)  # [B, Hkv, Lmax, d] centred, zero-padded
    lengths = np.array([m.shape[0] for m in mats], dtype=np.float64)     # [B]
    for i, m in enumerate(mats):
        x = m.astype(np.float64).transpose(1, 0, 2)                       # [Hkv, L, d]
        batch[i, :, : m.shape[0]] = x - x.mean(axis=1, keepdims=True)
    w, u = np.linalg.eigh(batch @ batch.transpose(0, 1, 3, 2))            # [B, Hkv, Lmax], [B, Hkv, Lmax, Lmax]
    k = min(rank, lmax)
    w, u = np.maximum(w[..., ::-1][..., :k], 0.0), u[..., ::-1][..., :k]  # top k: [B, Hkv, k], [B, Hkv, Lmax, k]
    s = np.sqrt(w)
    dirs = np.swapaxes(u, 2, 3) @ batch / np.maximum(s, 1e-30)[..., None]  # [B, Hkv, k, d] unit rows
    dirs[s < 1e-12] = 0.0
    coef = u * s[:, :, None, :]                                           # [B, Hkv, Lmax, k] keys' coordinates
    out_d = np.zeros((len(mats), n_head_kv, rank, d), dtype=np.float32)
    out_v, out_lo, out_hi = (np.zeros((len(mats), n_head_kv, rank), dtype=np.float32) for _ in range(3))
    out_d[:, :, :k], out_v[:, :, :k] = dirs, w / lengths[:, None, None]
    for i, m in enumerate(mats):  # padding rows are not keys: bounds over the span's own rows only
        c = coef[i, :, : m.shape[0]]                                      # [Hkv, L, k]
        out_lo[i, :, :k], out_hi[i, :, :k] = c.min(axis=1), c.max(axis=1)
    return out_d, out_v, out_lo, out_hi


def centroids(mats: list[np.ndarray], k: int, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """k-means of each span's keys, per KV head, for the trained router: per span mats[i] f32 [L_i, n_head_kv, d],
    centroids ``mu`` f32 [B, n_head_kv, k, d] and the log share of the span's tokens in each ``logw`` f32
    [B, n_head_kv, k] (-inf for an empty cluster), so ``logsumexp_j (q·mu_j + logw_j) + log|S|`` estimates the
    span's log attention mass from k rows instead of one. Deterministic: farthest-point seeding from the mean, then
    ``iters`` Lloyd steps."""
    n_head_kv, d = mats[0].shape[1], mats[0].shape[2]
    mu = np.zeros((len(mats), n_head_kv, k, d), dtype=np.float32)
    logw = np.full((len(mats), n_head_kv, k), -np.inf, dtype=np.float32)
    for i, m in enumerate(mats):
        x = m.astype(np.float64).transpose(1, 0, 2)                      # [Hkv, L, d]
        length = x.shape[1]
        c = np.empty((n_head_kv, min(k, length), d))                       # [Hkv, k', d]
        dist = np.sum((x - x.mean(axis=1, keepdims=True)) ** 2, axis=2)   # [Hkv, L]
        for j in range(c.shape[1]):
            far = np.argmax(dist, axis=1)                                  # [Hkv]
            c[:, j] = x[np.arange(n_head_kv), far]
            to_new = np.sum((x - c[:, j:j + 1]) ** 2, axis=2)            # [Hkv, L]
            dist = to_new if j == 0 else np.minimum(dist, to_new)         # to the nearest centroid so far
        for _ in range(iters + 1):
            # [Hkv, L, k'] squared distances -> nearest centroid per token
            near = np.argmin(np.sum(x * x, 2)[:, :, None] - 2 * x @ c.transpose(0, 2, 1)
                             + np.sum(c * c, 2)[:, None, :], axis=2)       # [Hkv, L]
            onehot = near[:, :, None] == np.arange(c.shape[1])[None, None, :]  # [Hkv, L, k']
            count = onehot.sum(axis=1)                                     # [Hkv, k']
            means = np.einsum("hlk,hld->hkd", onehot, x) / np.maximum(count, 1)[:, :, None]  # [Hkv, k', d]
            c = np.where(count[:, :, None] > 0, means, c)                  # an empty cluster keeps its centroid
        mu[i, :, : c.shape[1]] = c
        with np.errstate(divide="ignore"):
            logw[i, :, : c.shape[1]] = np.log(count / length)
    return mu, logw


# what the trained router knows of a span's keys in one layer beyond the summary key (``spread``, ``centroids``):
# dirs [n_head_kv, r, d]; var, lo, hi [n_head_kv, r]; mu [n_head_kv, c, d]; logw [n_head_kv, c]
SKETCH_FIELDS = ("dirs", "var", "lo", "hi", "mu", "logw")


def sketches(mats: list[np.ndarray], rank: int, n_centroids: int, iters: int) -> dict[str, np.ndarray]:
    """The key sketches of a batch of spans, stacked: {field: [B, n_head_kv, ...]} (``SKETCH_FIELDS``)."""
    dirs, var, lo, hi = spread(mats, rank)
    mu, logw = centroids(mats, n_centroids, iters)
    return {"dirs": dirs, "var": var, "lo": lo, "hi": hi, "mu": mu, "logw": logw}


def weighted_mean(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """f32 [n_head_kv, d]: sum_t w_t rows[t] / sum_t w_t for rows [L, n_head_kv, d] (uniform if all w are 0)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(w.size, 1.0 / w.size)
    return np.tensordot(w, rows.astype(np.float64), axes=(0, 0)).astype(np.float32)


def calibrated_summaries(k: list[np.ndarray], v: list[np.ndarray], k_sum: np.ndarray,
                         q: np.ndarray, quantile: float | None = None,
                         share: float = 1.0, per_head: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Summary rows fitted to queries (``SekvConfig.summary_calibration``): for spans of keys ``k[i]`` and values
    ``v[i]`` f32 [L_i, Hkv, d], their summary keys ``k_sum`` [n, Hkv, d] and queries ``q`` f32 [m, H, d] (times
    kq_scale, H a multiple of Hkv), the bias each row needs, f32 [n]: the mean over queries and heads of
    ``logsumexp_t q.k_t - q.k_sum`` (``log L`` where every key equals ``k_sum``), and each row's value f32 [n, Hkv, d]:
    the attention-weighted value ``sum_t softmax_t(q.k_t) v_t`` averaged over the queries and each KV head's query
    heads. ``quantile``: the bias that quantile of the gaps over queries and heads instead of their mean. ``share``:
    the fitted bias only on the ceil(share * n) spans the queries read most (each span's best share, over queries and
    heads, of the attention the n spans get together), ``log L`` on the rest. ``per_head``: the bias f32 [n, H], each
    query head's mean (or quantile) over the queries alone. All spans in one pass, padded to the longest."""
    n, n_kv, d = len(k), k_sum.shape[1], k_sum.shape[2]
    m, group = q.shape[0], q.shape[1] // n_kv
    longest = max(x.shape[0] for x in k)
    k_pad = np.zeros((n, longest, n_kv, d), dtype=np.float32)
    v_pad = np.zeros((n, longest, n_kv, d), dtype=np.float32)
    pad = np.ones((n, longest), dtype=bool)                                   # [n, Lmax] past a span's end
    for i, (ki, vi) in enumerate(zip(k, v)):
        k_pad[i, :ki.shape[0]], v_pad[i, :vi.shape[0]], pad[i, :ki.shape[0]] = ki, vi, False
    q4 = q.reshape(m, n_kv, group, d)                                          # [m, Hkv, g, d]
    s = np.einsum("mkgd,nlkd->nmkgl", q4, k_pad, optimize=True)               # [n, m, Hkv, g, Lmax] logits
    s[np.broadcast_to(pad[:, None, None, None, :], s.shape)] = -np.inf
    lse = logsumexp(s, axis=-1)                                                # [n, m, Hkv, g]
    s_sum = np.einsum("mkgd,nkd->nmkg", q4, k_sum, optimize=True)             # [n, m, Hkv, g] the summary key's
    p = np.exp(s - lse[..., None])                                             # softmax within each span
    value = np.einsum("nmkgl,nlkd->nkd", p, v_pad, optimize=True) / (m * group)  # [n, Hkv, d]
    gap = (lse - s_sum).reshape(n, m, -1)                                      # [n, m, H] (head h = kv*g + j)
    pool = gap if per_head else gap.reshape(n, -1, 1)                          # [n, m, H] or [n, m*H, 1]
    bias = pool.mean(axis=1) if quantile is None else np.quantile(pool, quantile, axis=1)  # [n, H] or [n, 1]
    if share < 1:
        best = (lse - logsumexp(lse, axis=0)).reshape(n, -1).max(axis=1)      # [n] log of the best share of mass
        keep = np.argsort(-best, kind="stable")[:int(np.ceil(share * n))]     # the spans read most
        fitted = bias
        bias = np.repeat(np.log([x.shape[0] for x in k])[:, None], bias.shape[1], axis=1)  # log|S| on the rest
        bias[keep] = fitted[keep]
    bias = bias if per_head else bias[:, 0]
    return bias.astype(np.float32), value.astype(np.float32)
