"""The span features and the trained router's scoring function (``Params``, ``alphas``), shared by training
(``train.student``) and decoding (``router.TrainedRouter``) so that both compute the same numbers.

For one query q [d] of one head and span s (of that head's KV head):

    m_s     = q·k̄_s                                   the summary row's logit
    v_s     = sum_j var_sj (q·u_sj)^2 / 2               half the variance of the span's token logits in its
                                                        top-r principal subspace (``spans.spread``): the
                                                        second-order (Gaussian) term of log mean_t exp(q·k_t) - q·k̄
    box_s   = sum_j max(lo_sj q·u_sj, hi_sj q·u_sj)     how far above q·k̄ a token's logit can reach in that subspace
    quest_s = sum_c max(q_c kmin_sc, q_c kmax_sc) - m_s how far above q·k̄ it can reach by the channel-wise bounds
                                                        (Quest's bound)
    mix_s   = logsumexp_j (q·mu_sj + logw_sj) - m_s     log mean exp of the logits over the span's k-means centroids
                                                        (``spans.centroids``), above the summary logit

``m + spread`` is the Gaussian estimate of a span's log mass less log|S|, ``m + mix`` the centroid-mixture one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NAMES = ("summary", "spread", "box", "quest", "mix")
N_FEATURES = len(NAMES)
INITIAL_WEIGHTS = (1.0, 0.0, 0.0, 0.0, 1.0)  # the centroid-mixture estimate of the log mass


@dataclass
class SpanFeatures:
    """What the router knows of every span, for one KV head (f64): summary keys k̄ [S, d]; principal directions
    dirs [S, r, d], variances var [S, r] and coordinate bounds lo, hi [S, r] (``spans.spread``); channel-wise key
    bounds kmin, kmax [S, d]; k-means centroids mu [S, c, d] and their log token shares logw [S, c]
    (``spans.centroids``); lengths [S]."""

    keys: np.ndarray
    dirs: np.ndarray
    var: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    kmin: np.ndarray
    kmax: np.ndarray
    mu: np.ndarray
    logw: np.ndarray
    lengths: np.ndarray


def features(q: np.ndarray, sf: SpanFeatures) -> np.ndarray:
    """f64 [N_FEATURES, N, S] for queries q [N, d] (see the module docstring)."""
    m = q @ sf.keys.T                                               # [N, S]
    along = np.einsum("nd,srd->nsr", q, sf.dirs)                    # [N, S, r]
    v = 0.5 * np.einsum("nsr,sr->ns", along * along, sf.var)        # [N, S]
    box = np.maximum(along * sf.lo[None], along * sf.hi[None]).sum(axis=2)  # [N, S]
    quest = np.maximum(q[:, None, :] * sf.kmin[None], q[:, None, :] * sf.kmax[None]).sum(axis=2) - m  # [N, S]
    lc = np.einsum("nd,scd->nsc", q, sf.mu) + sf.logw[None]        # [N, S, c]
    top = lc.max(axis=2)
    mix = top + np.log(np.exp(lc - top[..., None]).sum(axis=2)) - m  # [N, S]
    return np.stack([m, v, box, quest, mix])


@dataclass
class Params:
    """One (layer, head)'s trainable router: W [P, d], b [1] and theta [F] (arrays, so Adam updates them in place)."""

    w: np.ndarray
    b: np.ndarray
    theta: np.ndarray

    @classmethod
    def initial(cls, w: np.ndarray) -> "Params":
        """The Gaussian mass estimate plus the learned match term from ``w``."""
        return cls(w=w.copy(), b=np.zeros(1), theta=np.array(INITIAL_WEIGHTS, dtype=np.float64))

    def arrays(self) -> list[np.ndarray]:
        return [self.w, self.b, self.theta]


@dataclass
class Forward:
    a: np.ndarray      # [N, P]  W q
    chat: np.ndarray   # [S, P]  normalize(W k̄)
    nc: np.ndarray     # [S, 1]  |W k̄|
    soft: np.ndarray   # [N, S]  softmax_s e_s
    alpha: np.ndarray  # [N, S]


def forward(p: Params, q: np.ndarray, keys: np.ndarray, phi: np.ndarray, lengths: np.ndarray) -> Forward:
    n_p = p.w.shape[0]
    a = q @ p.w.T                                                   # [N, P]
    c = keys @ p.w.T                                                # [S, P]
    nc = np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)  # [S, 1]
    chat = c / nc                                                   # [S, P]
    e = a @ chat.T / np.sqrt(n_p) + np.tensordot(p.theta, phi, axes=1) + np.log(lengths)[None, :]  # [N, S]
    top = e.max(axis=1, keepdims=True)
    soft = np.exp(e - top)
    total = soft.sum(axis=1, keepdims=True)
    z = e - (top + np.log(total)) + p.b[0]                          # [N, S]
    return Forward(a=a, chat=chat, nc=nc, soft=soft / total, alpha=1.0 / (1.0 + np.exp(-z)))


def alphas(p: Params, q: np.ndarray, spans: SpanFeatures, phi: np.ndarray | None = None) -> np.ndarray:
    """alpha [N, S] for queries q [N, d] (see the module docstring); ``phi``: features(q, spans) if known."""
    phi = features(q, spans) if phi is None else phi
    return forward(p, q, spans.keys, phi, spans.lengths).alpha
