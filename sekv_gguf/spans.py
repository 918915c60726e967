"""Host tier of SeKV: per span and hooked layer, fp16 low-rank factors (or the raw rows) of K and V, and the summary
row that stays on the device.

Rank per (span, layer, K|V): the smallest r keeping ``energy`` of the squared Frobenius norm for every KV head; if
r > r_max or the fp16 factors (U·S [L, r] and Vᵀ [r, d] per head) would not be smaller than the raw rows, the raw
rows are stored. The SVDs of a batch are one LAPACK call over zero-padded spans (see ``factorize``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import SekvConfig


@dataclass
class Factors:
    """One matrix set [L, n_head_kv, d] of a span in one layer: factors when ``raw`` is None."""

    us: np.ndarray | None   # f16 [n_head_kv, L, r]  U·diag(S)
    vt: np.ndarray | None   # f16 [n_head_kv, r, d]
    raw: np.ndarray | None  # f16 [L, n_head_kv, d]

    @property
    def rank(self) -> int:
        return int(self.raw.shape[0]) if self.raw is not None else int(self.us.shape[2])

    @property
    def nbytes(self) -> int:
        if self.raw is not None:
            return self.raw.nbytes
        return self.us.nbytes + self.vt.nbytes

    def rebuild(self) -> np.ndarray:
        """float32 [L, n_head_kv, d]."""
        if self.raw is not None:
            return self.raw.astype(np.float32)
        # [Hkv, L, r] @ [Hkv, r, d] -> [Hkv, L, d] -> [L, Hkv, d]
        return np.matmul(self.us.astype(np.float32), self.vt.astype(np.float32)).transpose(1, 0, 2)


@dataclass
class Span:
    """A compressed run of tokens: positions, device summary cell, host factors per hooked layer."""

    id: int
    positions: np.ndarray          # int32 [L]
    summary_cell: int
    k: list[Factors] = field(default_factory=list)      # [n_layer_kv]
    v: list[Factors] = field(default_factory=list)      # [n_layer_kv]
    k_mean: list[np.ndarray] = field(default_factory=list)  # f32 [n_head_kv, d] per layer (routing keys)
    k_min: list[np.ndarray] = field(default_factory=list)   # f32 [n_head_kv, d] per layer: channel-wise min of K
    k_max: list[np.ndarray] = field(default_factory=list)   # f32 [n_head_kv, d] per layer: channel-wise max of K

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


def factorize(mats: list[np.ndarray], config: SekvConfig) -> list[Factors]:
    """Factors of each span's rows mats[i] f32 [L_i, n_head_kv, d], all from one batched LAPACK call.

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
    ranks = energy_rank(s, config.energy).max(axis=1)  # [B] one rank for all heads of a span
    out: list[Factors] = []
    for i, m in enumerate(mats):
        length, r = m.shape[0], int(ranks[i])
        if r > config.r_max or r * (length + d) >= length * d:
            out.append(Factors(us=None, vt=None, raw=m.astype(np.float16)))
            continue
        ui = u[i, :, :length, :r]  # [Hkv, L, r]
        si = np.maximum(s[i, :, :r], 1e-30)  # [Hkv, r]
        vt = np.swapaxes(ui, 1, 2) @ batch[i, :, :length] / si[:, :, None]  # [Hkv, r, d]
        out.append(Factors(us=(ui * si[:, None, :]).astype(np.float16), vt=vt.astype(np.float16), raw=None))
    return out


def weighted_mean(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """f32 [n_head_kv, d]: sum_t w_t rows[t] / sum_t w_t for rows [L, n_head_kv, d] (uniform if all w are 0)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(w.size, 1.0 / w.size)
    return np.tensordot(w, rows.astype(np.float64), axes=(0, 0)).astype(np.float32)
