"""The trained router's loss and its hand-written gradients, in numpy (the scoring function itself, ``Params`` and
``alphas``, lives in ``sekv_gguf.features``, which decoding uses too).

Per (hooked layer, query head) the router has a projection ``W`` [P, d], a bias ``b``, feature weights ``theta``
[F] and a threshold ``tau``. For a query q [d] and span s (summary key k̄_s, length |S_s|, features phi_fs from
``sekv_gguf.features``: the summary logit and what a sketch of the span's keys adds to it):

    g_s = <W q, normalize(W k̄_s)> / sqrt(P)           the reference router's learned match
    e_s = g_s + sum_f theta_f phi_fs + log|S_s|        estimated log attention mass of the span's tokens
    z_s = e_s - logsumexp_s' e_s' + b                  (estimated log share among the spans) + bias
    alpha_s = sigmoid(z_s)                             zoom when alpha_s > tau

It starts (W ~ 0, theta = ``features.INITIAL_WEIGHTS``) as the centroid-mixture estimate of
``log sum_t exp(q·k_t)``; the summary logit alone (``q·k̄ + log|S|``, the training-free ``summary`` router)
underestimates it by the Jensen gap. Training fits how much of each feature a head needs.

Training data for one (layer, head) and one document (``Batch``): queries q [N, d]; the span features; and from full
attention the log-masses of each span's tokens ``l_true`` [N, S] (logsumexp of the span's token logits), of its
summary row ``l_sum`` [N, S] (q·k̄ + log|S|: what the span gets when not zoomed) and of the always-exact rest of the
cache ``l_rest`` [N]; zoom labels ``y`` [N, S] (the spans covering 90% of the mass).

Loss (mean over queries) = KL(full ‖ mixed) + bce_weight · BCE(alpha, y) (positives weighted ``pos_weight``) +
budget_weight · (share of span tokens zoomed), where the mixed-resolution attention gives span s the mass
``alpha_s e^{l_true} + (1 - alpha_s) e^{l_sum}`` (soft zoom) and the rest ``e^{l_rest}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..features import Params, SpanFeatures, alphas, features, forward


@dataclass
class Batch:
    q: np.ndarray        # f64 [N, d]
    spans: SpanFeatures  # the spans as the router sees them (the head's KV head)
    phi: np.ndarray      # f64 [F, N, S] features(q, spans): fixed, so computed once
    l_true: np.ndarray   # f64 [N, S]
    l_sum: np.ndarray    # f64 [N, S]
    l_rest: np.ndarray   # f64 [N]
    y: np.ndarray        # f64 [N, S] in {0, 1}


def make_batch(q: np.ndarray, spans: SpanFeatures, l_true: np.ndarray, l_sum: np.ndarray, l_rest: np.ndarray,
               y: np.ndarray) -> Batch:
    return Batch(q=q, spans=spans, phi=features(q, spans), l_true=l_true, l_sum=l_sum, l_rest=l_rest, y=y)


@dataclass
class LossWeights:
    bce: float = 0.1
    pos_weight: float = 10.0
    budget: float = 0.05


def loss_and_grad(p: Params, batch: Batch, lw: LossWeights) -> tuple[float, Params, dict]:
    """Loss of one batch, its gradients (a ``Params`` of the same shapes) and the parts of the loss."""
    n_p = p.w.shape[0]
    q, keys, lengths, n_q = batch.q, batch.spans.keys, batch.spans.lengths, batch.q.shape[0]
    f = forward(p, q, keys, batch.phi, lengths)
    alpha = np.clip(f.alpha, 1e-12, 1 - 1e-12)

    # mixed-resolution attention over (rest, spans), in a shifted exponent space per query
    mx = np.maximum(np.maximum(batch.l_true.max(axis=1), batch.l_sum.max(axis=1)), batch.l_rest)[:, None]  # [N, 1]
    et, es = np.exp(batch.l_true - mx), np.exp(batch.l_sum - mx)  # [N, S]
    e0 = np.exp(batch.l_rest[:, None] - mx)                       # [N, 1]
    e = alpha * et + (1 - alpha) * es                             # [N, S]
    z_mix = e0 + e.sum(axis=1, keepdims=True)                     # [N, 1]
    z_full = e0 + et.sum(axis=1, keepdims=True)
    t, t0 = et / z_full, e0 / z_full                              # teacher shares [N, S], [N, 1]
    kl = (np.sum(t * (np.log(np.maximum(t, 1e-300)) - np.log(e / z_mix)), axis=1)
          + (t0 * (np.log(np.maximum(t0, 1e-300)) - np.log(e0 / z_mix)))[:, 0])  # [N]
    d_alpha = (et - es) * (1.0 / z_mix - t / e)                  # dKL/dalpha [N, S]

    y, wpos = batch.y, lw.pos_weight
    bce = -(wpos * y * np.log(alpha) + (1 - y) * np.log(1 - alpha))  # [N, S]
    d_z_bce = -wpos * y * (1 - alpha) + (1 - y) * alpha             # dBCE/dz [N, S]
    share = lengths / lengths.sum()                     # [S]
    budget = alpha @ share                                          # [N] share of span tokens zoomed
    d_alpha = d_alpha + lw.budget * share[None, :]

    n_s = keys.shape[0]
    loss = float(kl.mean() + lw.bce * bce.mean() + lw.budget * budget.mean())
    dz = (d_alpha * alpha * (1 - alpha)) / n_q + lw.bce * d_z_bce / (n_q * n_s)  # [N, S]
    de = dz - f.soft * dz.sum(axis=1, keepdims=True)               # through the logsumexp [N, S]
    dg = de / np.sqrt(n_p)                                          # d loss / d (a·ĉ) [N, S]
    da = dg @ f.chat                                                # [N, P]
    dchat = dg.T @ f.a                                              # [S, P]
    dc = (dchat - f.chat * np.sum(dchat * f.chat, axis=1, keepdims=True)) / f.nc  # through the normalisation
    grads = Params(w=da.T @ q + dc.T @ keys,                        # [P, d]
                   b=np.array([dz.sum()]), theta=np.tensordot(batch.phi, de, axes=([1, 2], [0, 1])))  # [F]
    parts = {"kl": float(kl.mean()), "bce": float(bce.mean()), "zoomed_share": float(budget.mean())}
    return loss, grads, parts


class Adam:
    """Adam (Kingma & Ba) over a list of numpy arrays, updated in place."""

    def __init__(self, params: list[np.ndarray], lr: float = 1e-2, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = [np.zeros_like(x) for x in params]
        self.v = [np.zeros_like(x) for x in params]
        self.t = 0

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for x, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            x -= self.lr * (m / (1 - b1 ** self.t)) / (np.sqrt(v / (1 - b2 ** self.t)) + self.eps)
