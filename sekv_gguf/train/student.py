"""The trained router's student model and its loss, in numpy with hand-written gradients.

Per (hooked layer, query head) the router has a projection ``W`` [P, d], a bias ``b`` and a threshold ``tau``:

    a = W q                       [P]       the query, projected
    c_s = W k̄_s,  ĉ_s = c_s/|c_s| [S, P]    each span's summary key, projected and normalised
    z_s = a·ĉ_s / sqrt(P) + log|S_s| + b     [S]
    alpha_s = sigmoid(z_s)                   zoom when alpha_s > tau

Training data for one (layer, head) and one document (``Batch``): queries q [N, d]; span summary keys k̄ [S, d] and
lengths [S]; and from full attention the log-masses of each span's tokens ``l_true`` [N, S] (logsumexp of the span's
token logits), of its summary row ``l_sum`` [N, S] (q·k̄ + log|S|: what the span gets when not zoomed) and of the
always-exact rest of the cache ``l_rest`` [N]; zoom labels ``y`` [N, S] (the spans covering 90% of the mass).

Loss (mean over queries) = KL(full ‖ mixed) + bce_weight · BCE(alpha, y) (positives weighted ``pos_weight``) +
budget_weight · (share of span tokens zoomed), where the mixed-resolution attention gives span s the mass
``alpha_s e^{l_true} + (1 - alpha_s) e^{l_sum}`` (soft zoom) and the rest ``e^{l_rest}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Batch:
    q: np.ndarray        # f64 [N, d]
    keys: np.ndarray     # f64 [S, d] span summary keys (the head's KV head)
    lengths: np.ndarray  # f64 [S]
    l_true: np.ndarray   # f64 [N, S]
    l_sum: np.ndarray    # f64 [N, S]
    l_rest: np.ndarray   # f64 [N]
    y: np.ndarray        # f64 [N, S] in {0, 1}


@dataclass
class LossWeights:
    bce: float = 0.1
    pos_weight: float = 10.0
    budget: float = 0.05


def alphas(w: np.ndarray, b: float, q: np.ndarray, keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """alpha [N, S] for queries q [N, d] and span keys [S, d] (see the module docstring)."""
    p = w.shape[0]
    a = q @ w.T                                                   # [N, P]
    c = keys @ w.T                                                # [S, P]
    chat = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    z = a @ chat.T / np.sqrt(p) + np.log(lengths)[None, :] + b   # [N, S]
    return 1.0 / (1.0 + np.exp(-z))


def loss_and_grad(w: np.ndarray, b: float, batch: Batch, lw: LossWeights) -> tuple[float, np.ndarray, float, dict]:
    """Loss of one batch and its gradients with respect to W [P, d] and b; parts of the loss in a dict."""
    p = w.shape[0]
    q, keys, n_q = batch.q, batch.keys, batch.q.shape[0]
    a = q @ w.T                                                   # [N, P]
    c = keys @ w.T                                                # [S, P]
    nc = np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)  # [S, 1]
    chat = c / nc                                                 # [S, P]
    z = a @ chat.T / np.sqrt(p) + np.log(batch.lengths)[None, :] + b  # [N, S]
    alpha = 1.0 / (1.0 + np.exp(-z))
    alpha = np.clip(alpha, 1e-12, 1 - 1e-12)

    # mixed-resolution attention over (rest, spans), in a shifted exponent space per query
    m = np.maximum(np.maximum(batch.l_true.max(axis=1), batch.l_sum.max(axis=1)), batch.l_rest)[:, None]  # [N, 1]
    et, es = np.exp(batch.l_true - m), np.exp(batch.l_sum - m)  # [N, S]
    e0 = np.exp(batch.l_rest[:, None] - m)                      # [N, 1]
    e = alpha * et + (1 - alpha) * es                           # [N, S]
    z_mix = e0 + e.sum(axis=1, keepdims=True)                   # [N, 1]
    z_full = e0 + et.sum(axis=1, keepdims=True)
    t, t0 = et / z_full, e0 / z_full                            # teacher shares [N, S], [N, 1]
    kl = (np.sum(t * (np.log(np.maximum(t, 1e-300)) - np.log(e / z_mix)), axis=1)
          + (t0 * (np.log(np.maximum(t0, 1e-300)) - np.log(e0 / z_mix)))[:, 0])  # [N]
    d_alpha = (et - es) * (1.0 / z_mix - t / e)                # dKL/dalpha [N, S]

    y, wpos = batch.y, lw.pos_weight
    bce = -(wpos * y * np.log(alpha) + (1 - y) * np.log(1 - alpha))  # [N, S]
    d_z_bce = -wpos * y * (1 - alpha) + (1 - y) * alpha             # dBCE/dz [N, S]
    share = batch.lengths / batch.lengths.sum()                     # [S]
    budget = alpha @ share                                          # [N] share of span tokens zoomed
    d_alpha = d_alpha + lw.budget * share[None, :]

    s = keys.shape[0]
    loss = float(kl.mean() + lw.bce * bce.mean() + lw.budget * budget.mean())
    dz = (d_alpha * alpha * (1 - alpha)) / n_q + lw.bce * d_z_bce / (n_q * s)  # [N, S]
    dg = dz / np.sqrt(p)                                        # d loss / d (a·ĉ) [N, S]
    db = float(dz.sum())
    da = dg @ chat                                              # [N, P]
    dchat = dg.T @ a                                            # [S, P]
    dc = (dchat - chat * np.sum(dchat * chat, axis=1, keepdims=True)) / nc  # through the normalisation [S, P]
    dw = da.T @ q + dc.T @ keys                                 # [P, d]
    parts = {"kl": float(kl.mean()), "bce": float(bce.mean()), "zoomed_share": float(budget.mean())}
    return loss, dw, db, parts


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
