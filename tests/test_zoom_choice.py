"""Which spans the zoom slots take for a ranking: the best-scoring spans that fit together, in score order."""

from __future__ import annotations

import numpy as np
import pytest

from sekv_gguf.policies.zoom import choose_consensus, choose_fitting


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


def test_consensus_share_zero_is_each_layer_alone():
    rng = np.random.default_rng(7)
    scores = [rng.standard_normal(40) for _ in range(6)]
    lengths = rng.integers(5, 30, 40)
    got = choose_consensus(scores, lengths, 120, 0.0)
    assert got == [choose_fitting(s, lengths, 120) for s in scores]


def test_consensus_gives_every_layer_the_span_most_layers_rank_best():
    """Span 3 is the best of 5 layers of 8 and ranks last in the other 3: with a consensus share it is zoomed in all
    8; each layer still takes its own best in the rest, never over capacity, never a span twice."""
    n_layer, n = 8, 30
    rng = np.random.default_rng(1)
    lengths = np.full(n, 10)
    scores = [rng.standard_normal(n) for _ in range(n_layer)]
    for layer, s in enumerate(scores):
        s[3] = 10.0 if layer < 5 else -10.0
    alone = [choose_fitting(s, lengths, 40) for s in scores]
    assert sum(3 in c for c in alone) == 5
    got = choose_consensus(scores, lengths, 40, 0.25)  # one span's rows of four
    for layer, chosen in enumerate(got):
        assert chosen[0] == 3 and len(set(chosen)) == len(chosen) and int(lengths[chosen].sum()) <= 40
        own = [sid for sid in alone[layer] if sid != 3]
        assert chosen[1:] == own[: len(chosen) - 1]  # the layer's own order fills the rest
    assert all(len(c) == 4 for c in got)


def test_consensus_after_pins():
    """With ``first`` (the lexical pins) every layer starts with them, then the vote's spans (its own share, of
    what the pins leave), then its own best; a pinned span is never voted in twice."""
    n_layer, n = 6, 30
    rng = np.random.default_rng(2)
    lengths = np.full(n, 10)
    scores = [rng.standard_normal(n) for _ in range(n_layer)]
    for s in scores:
        s[3] = 10.0
    for first, share, n_common in (([7], 0.17, 2), ([7], 0.34, 3), ([7, 3], 0.17, 3), ([7, 11, 12, 13, 14], 0.5, 6)):
        got = choose_consensus(scores, lengths, 60, share, first=first)  # the vote's share: 10 or 20 or 30 rows
        common = got[0][:n_common]
        assert common[: len(first)] == first and 3 in common
        for s, chosen in zip(scores, got):
            assert chosen[:n_common] == common and len(set(chosen)) == len(chosen) == 6
            own = [int(sid) for sid in np.argsort(-s, kind="stable") if sid not in common]  # equal lengths
            assert chosen[n_common:] == own[: 6 - n_common]


@pytest.mark.parametrize("seed", range(10))
def test_consensus_fits_the_slots(seed):
    rng = np.random.default_rng(seed)
    n_layer, n = int(rng.integers(1, 12)), int(rng.integers(1, 120))
    lengths = rng.integers(1, 60, n)
    capacity, share = int(rng.integers(0, 400)), float(rng.uniform(0, 1))
    got = choose_consensus([rng.standard_normal(n) for _ in range(n_layer)], lengths, capacity, share)
    common = set(got[0]).intersection(*map(set, got)) if got else set()
    assert int(lengths[list(common)].sum()) <= capacity
    for chosen in got:
        assert len(set(chosen)) == len(chosen) and int(lengths[chosen].sum()) <= capacity
