"""Which spans the zoom slots take for a ranking: the best-scoring spans that fit together, in score order."""

from __future__ import annotations

import numpy as np
import pytest

from sekv_gguf.policies.zoom import choose_fitting


def _greedy(scores: np.ndarray, lengths: np.ndarray, capacity: int) -> list[int]:
    """The rule written plainly: every span in score order, taken when it still fits."""
    chosen, used = [], 0
    for sid in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        if used + lengths[sid] <= capacity:
            chosen.append(sid)
            used += int(lengths[sid])
    return chosen


@pytest.mark.parametrize("seed", range(20))
def test_choice_is_the_plain_greedy_rule(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    scores = rng.standard_normal(n)
    scores[rng.integers(0, n, n // 4)] = 0.0  # ties
    lengths = rng.integers(1 if seed % 2 else 20, 70, n)
    capacity = int(rng.integers(0, 800))
    got = choose_fitting(scores, lengths, capacity)
    assert got == _greedy(scores, lengths, capacity)
    assert int(lengths[got].sum()) <= capacity


def test_no_spans_and_no_room():
    assert choose_fitting(np.zeros(0), np.zeros(0, dtype=np.int64), 100) == []
    assert choose_fitting(np.ones(3), np.array([5, 6, 7]), 4) == []
