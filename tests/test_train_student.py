"""The router student: hand-written gradients against finite differences; training on a synthetic task whose
relevant span is known lowers the loss and picks that span more often than the training-free score."""

from __future__ import annotations

import numpy as np

from sekv_gguf.train.student import Adam, Batch, LossWeights, alphas, loss_and_grad


def _batch(rng: np.random.Generator, n: int = 12, s: int = 7, d: int = 16) -> Batch:
    keys = rng.standard_normal((s, d))
    q = rng.standard_normal((n, d))
    lengths = rng.integers(8, 40, s).astype(np.float64)
    l_true = rng.standard_normal((n, s)) * 2 + np.log(lengths)
    l_sum = q @ keys.T * 0.3 + np.log(lengths)
    l_rest = rng.standard_normal(n) + 3
    y = (rng.random((n, s)) < 0.3).astype(np.float64)
    return Batch(q=q, keys=keys, lengths=lengths, l_true=l_true, l_sum=l_sum, l_rest=l_rest, y=y)


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    w = rng.standard_normal((5, 16)) * 0.3
    b = 0.2
    lw = LossWeights(bce=0.7, pos_weight=4.0, budget=0.3)
    _, dw, db, _ = loss_and_grad(w, b, batch, lw)
    eps = 1e-6
    num = np.zeros_like(w)
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            wp, wm = w.copy(), w.copy()
            wp[i, j] += eps
            wm[i, j] -= eps
            num[i, j] = (loss_and_grad(wp, b, batch, lw)[0] - loss_and_grad(wm, b, batch, lw)[0]) / (2 * eps)
    np.testing.assert_allclose(dw, num, rtol=1e-5, atol=1e-8)
    num_b = (loss_and_grad(w, b + eps, batch, lw)[0] - loss_and_grad(w, b - eps, batch, lw)[0]) / (2 * eps)
    assert abs(db - num_b) < 1e-6 * max(1.0, abs(num_b))


def test_full_zoom_makes_kl_vanish():
    rng = np.random.default_rng(1)
    batch = _batch(rng)
    w = np.zeros((4, 16))
    w[0, 0] = 1.0
    _, _, _, parts = loss_and_grad(w, 60.0, batch, LossWeights(bce=0.0, budget=0.0))  # alpha -> 1 everywhere
    assert parts["kl"] < 1e-9 and parts["zoomed_share"] > 0.999


def test_training_learns_the_relevant_span_better_than_training_free():
    """Synthetic task: in each document one span is relevant (it holds the attention mass); its summary key carries
    a direction u that every query shares in three channels, while the other channels are noise large enough to
    swamp the training-free summary score q·k̄. Training must find u."""
    rng = np.random.default_rng(2)
    d, s, n = 24, 10, 64
    data = []
    for _ in range(12):
        keys = rng.standard_normal((s, d))
        keys[:, :3] = 0.0
        rel = int(rng.integers(0, s))
        keys[rel, :3] = 2.0                                    # the relevant span's key carries u
        q = rng.standard_normal((n, d)) * 5.0
        q[:, :3] = 3.0                                         # every query carries u
        l_sum = q @ keys.T * 0.05 + np.log(16)                 # [n, s]
        l_true = l_sum.copy()
        l_true[:, rel] += 6.0                                  # the relevant span's tokens hold the mass
        y = np.zeros((n, s))
        y[:, rel] = 1.0
        data.append(Batch(q=q, keys=keys, lengths=np.full(s, 16.0), l_true=l_true, l_sum=l_sum,
                          l_rest=np.full(n, 2.0), y=y))
    w = rng.standard_normal((8, d)) * 0.1
    b = np.zeros(1)
    lw = LossWeights()
    opt = Adam([w, b], lr=0.05)
    train, held_out = data[:8], data[8:]
    first = np.mean([loss_and_grad(w, float(b[0]), x, lw)[0] for x in train])
    for _ in range(150):
        for x in train:
            _, dw, db, _ = loss_and_grad(w, float(b[0]), x, lw)
            opt.step([dw, np.array([db])])
    last = np.mean([loss_and_grad(w, float(b[0]), x, lw)[0] for x in train])
    assert last < 0.5 * first
    trained = np.mean([np.mean(np.argmax(alphas(w, float(b[0]), x.q, x.keys, x.lengths), axis=1)
                               == np.argmax(x.y, axis=1)) for x in held_out])
    free = np.mean([np.mean(np.argmax(x.q @ x.keys.T, axis=1) == np.argmax(x.y, axis=1)) for x in held_out])
    assert trained > free + 0.3, (trained, free)  # measured: 1.00 vs 0.39
