"""Key sketches the trained router reads (``spans.spread``, ``spans.centroids``), against numpy."""

from __future__ import annotations

import numpy as np

from sekv_gguf.spans import centroids, spread


def test_spread_is_the_principal_variance_and_bounds_of_the_logits():
    """With rank >= L - 1 the sketch holds every direction: sum_j var_j (q·u_j)^2 is the variance of q·k_t over the
    span's tokens, and lo/hi bound the best and worst token logit about q·k̄ (tight in a single direction)."""
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((n, 2, 16)).astype(np.float32) for n in (5, 3, 9)]
    dirs, var, lo, hi = spread(mats, 8)
    assert dirs.shape == (3, 2, 8, 16) and var.shape == lo.shape == hi.shape == (3, 2, 8)
    q = rng.standard_normal(16)
    for i, m in enumerate(mats):
        for h in range(2):
            logits = m[:, h].astype(np.float64) @ q                     # [L]
            along = dirs[i, h] @ q                                       # [8]
            if m.shape[0] - 1 <= 8:
                np.testing.assert_allclose((var[i, h] * along ** 2).sum(), logits.var(), rtol=1e-4)
            dev = logits - logits.mean()
            assert dev.max() <= np.maximum(lo[i, h] * along, hi[i, h] * along).sum() + 1e-4
            assert (var[i, h, m.shape[0] - 1:] < 1e-6).all()                # no more components than L - 1
    # lo/hi are each token's extreme coordinates along the first direction
    x = mats[0][:, 0].astype(np.float64)
    coord = (x - x.mean(0)) @ dirs[0, 0, 0]
    np.testing.assert_allclose([lo[0, 0, 0], hi[0, 0, 0]], [coord.min(), coord.max()], rtol=1e-4, atol=1e-5)


def test_centroids_partition_the_tokens_and_recover_clusters():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((3, 1, 16)) * 10
    labels = np.array([0] * 6 + [1] * 3 + [2] * 1)
    m = (centres[labels] + 0.01 * rng.standard_normal((10, 1, 16))).astype(np.float32)
    mu, logw = centroids([m, m[:2]], 4, 5)
    assert mu.shape == (2, 1, 4, 16) and logw.shape == (2, 1, 4)
    np.testing.assert_allclose(np.exp(logw[0, 0]).sum(), 1.0, rtol=1e-6)
    # the shares refine the true 0.6 / 0.3 / 0.1 partition (4 centroids for 3 clusters: one is split)
    shares = np.exp(logw[0, 0][np.isfinite(logw[0, 0])]) * 10
    np.testing.assert_allclose(shares, shares.round(), atol=1e-4)
    for c in range(3):  # every true cluster centre has a centroid next to it
        assert np.min(np.linalg.norm(mu[0, 0] - centres[c, 0], axis=1)) < 1.0
    assert np.isinf(logw[1, 0, 2:]).all()  # a 2-token span has at most 2 non-empty clusters
