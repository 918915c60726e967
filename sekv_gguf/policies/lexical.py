"""Lexical pins: the spans that share rare token n-grams with the question (``SekvConfig.lexical_share``).

A question that names a key, an id or a variable ("the code in the row whose id is KXQRM") repeats tokens of the
one span that holds the answer; attention at span granularity may rank that span low in most layers (a table of
near-identical rows, a chain of assignments), while an exact match of its rare tokens finds it at once. Per span,
the score is the sum over the question's distinct n-grams found in it of ``log(1 + n_spans / df)`` (``df``: the
spans holding that n-gram), n-grams in more than ``lexical_max_spans`` spans ignored; the pins are the spans of a
positive score (at least ``lexical_min_ratio`` of the best), best first. They take ``lexical_share`` of every
layer's zoom slots before the router's ranking fills the rest (``ZoomSlots.choose``), and keep it through the decode
steps' routings until the next prompt or turn sets new ones (a pin is never evicted for a step's new zooms). One
pass over the memory's token ids per prompt or turn (~8 ms at 32K tokens), no host rows, nothing at decode steps."""

from __future__ import annotations

import numpy as np

from ..config import SekvConfig
from ..spans import Span

HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit multiplier (Fibonacci hashing) to combine token ids


def ngram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 [len(tokens) - n + 1]: one key per n-gram starting at each position (equal n-grams, equal keys)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    m = tokens.size - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    keys = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):  # keys = (keys * C + token + 1) mod 2^64
            keys = keys * HASH_MULT + (tokens[j:j + m].astype(np.uint64) + np.uint64(1))
    return keys


def span_of_positions(spans: list[Span], n: int) -> np.ndarray:
    """int64 [n]: the id of the span holding each position below ``n``, -1 for positions no span holds (sinks,
    anchors, the window)."""
    owner = np.full(n, -1, dtype=np.int64)
    for span in spans:
        pos = span.positions[span.positions < n]
        owner[pos] = span.id
    return owner


def lexical_scores(tokens: np.ndarray, spans: list[Span], config: SekvConfig, cue: int | None = None) -> np.ndarray:
    """f64 [n_spans]: each span's lexical match with the question (see the module docstring); ``tokens`` int [n]:
    every token of the memory in position order, the question its last ``cue`` (default ``lexical_cue``)."""
    n_spans = len(spans)
    scores = np.zeros(n_spans, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.int64)
    n = config.lexical_ngram
    if not n_spans or tokens.size < n:
        return scores
    cue = config.lexical_cue if cue is None else cue
    cue_keys = np.unique(ngram_keys(tokens[-cue:], n))       # [k] the question's n-grams
    keys = ngram_keys(tokens, n)                              # [m] every n-gram of the memory
    owner = span_of_positions(spans, tokens.size)[:keys.size]  # [m] the span of each n-gram's first token
    hit = (owner >= 0) & np.isin(keys, cue_keys)
    if not hit.any():
        return scores
    pairs = np.unique(np.stack([keys[hit], owner[hit].astype(np.uint64)]), axis=1)  # [2, p] distinct (key, span)
    return pair_scores(pairs[0], pairs[1].astype(np.int64), n_spans, config)


def pair_scores(keys: np.ndarray, sids: np.ndarray, n_spans: int, config: SekvConfig) -> np.ndarray:
    """f64 [n_spans]: the lexical score of each span from the distinct (n-gram, span) pairs ``keys`` uint64 [p] /
    ``sids`` int64 [p] that match the cue: ``log(1 + n_spans / df)`` per pair, n-grams in more than
    ``lexical_max_spans`` spans left out. Each span's weights are summed in ascending order, so the score depends on
    the pairs, not on their order: spans matching n-grams of the same rarity tie exactly (``pins_of``: the lower id
    first), and ``SpanNgrams.scores`` equals ``lexical_scores`` bit for bit."""
    _, inverse, df = np.unique(keys, return_inverse=True, return_counts=True)  # spans per n-gram
    df = df[inverse]                                                            # [p]
    rare = df <= config.lexical_max_spans
    weight, rare_sids = np.log1p(n_spans / df[rare]), sids[rare]                # [r]
    order = np.lexsort((weight, rare_sids))                                     # by span, then weight
    return np.bincount(rare_sids[order], weights=weight[order], minlength=n_spans)


def lexical_pins(tokens: np.ndarray, spans: list[Span], config: SekvConfig, cue: int | None = None) -> list[int]:
    """Span ids of a positive lexical score of at least ``lexical_min_ratio`` of the best one, best first (ties: the
    lower id), each followed by its ``lexical_neighbours`` (``with_neighbours``); the cue as ``lexical_scores``."""
    return pins_of(lexical_scores(tokens, spans, config, cue), config)


def pins_of(scores: np.ndarray, config: SekvConfig) -> list[int]:
    """``lexical_pins`` from the spans' scores f64 [n_spans]."""
    order = np.argsort(-scores, kind="stable")
    floor = config.lexical_min_ratio * float(scores.max(initial=0.0))
    pins = [int(sid) for sid in order if scores[sid] > 0 and scores[sid] >= floor]
    return with_neighbours(pins, scores.size, config.lexical_neighbours)


def with_neighbours(pins: list[int], n_spans: int, reach: int) -> list[int]:
    """``pins`` (span ids, best first), each followed by the spans up to ``reach`` places before and after it
    (nearest first, before then after; ids below ``n_spans``), every id once."""
    out: list[int] = []
    seen: set[int] = set()
    for sid in pins:
        near = [sid] + [n for d in range(1, reach + 1) for n in (sid - d, sid + d)]
        for n in near:
            if 0 <= n < n_spans and n not in seen:
                seen.add(n)
                out.append(n)
    return out


class SpanNgrams:
    """The distinct (n-gram, span) pairs of a memory's spans, indexed as spans are cut, so that matching a cue (a
    streamed chunk: ``chunk_lexical_share``) hashes no token twice: the pairs are kept sorted by n-gram and looked up
    per cue n-gram (binary search), the newest in an unsorted tail that is scanned and merged in once it holds
    ``MERGE_AT`` pairs or a quarter of the sorted ones (a scan of at most that quarter, not of every token, and no
    span-owner array rebuilt per chunk). ``scores`` equals ``lexical_scores`` over the same tokens and spans. Built
    for one streamed prompt: spans only grow meanwhile (a memory with fewer spans than indexed, after a rollback, is
    indexed again from its first span)."""

    MERGE_AT = 4096  # tail pairs that trigger a merge into the sorted part (also at a quarter of the sorted part)

    def __init__(self, config: SekvConfig):
        self.config = config
        self.n = config.lexical_ngram
        self._reset()

    def _reset(self) -> None:
        self.n_spans = 0  # spans indexed (ids 0 .. n_spans-1)
        self.keys = np.zeros(0, dtype=np.uint64)   # [P] n-gram keys, sorted
        self.sids = np.zeros(0, dtype=np.int64)    # [P] the span of each pair
        self.tail_keys: list[np.ndarray] = []      # unsorted pairs not merged yet
        self.tail_sids: list[np.ndarray] = []
        self.tail_size = 0

    def extend(self, tokens: list[int], spans: list[Span]) -> None:
        """Index the spans not indexed yet; ``tokens``: every token of the memory in position order. A span whose
        last n-gram runs past ``tokens`` waits (with the spans after it) for a later call."""
        if len(spans) < self.n_spans:
            self._reset()
        for span in spans[self.n_spans:]:
            pos = span.positions.astype(np.int64)   # [L] (anchors left out: not always contiguous)
            if pos.size:
                first, last = int(pos.min()), int(pos.max())
                if last + self.n > len(tokens):
                    break
                window = np.asarray(tokens[first:last + self.n], dtype=np.int64)
                keys = np.unique(ngram_keys(window, self.n)[pos - first])  # the n-grams starting in the span
                self.tail_keys.append(keys)
                self.tail_sids.append(np.full(keys.size, span.id, dtype=np.int64))
                self.tail_size += keys.size
            self.n_spans += 1
        if self.tail_size >= max(self.MERGE_AT, self.keys.size // 4):
            self._merge()

    def _merge(self) -> None:
        keys = np.concatenate([self.keys, *self.tail_keys])
        sids = np.concatenate([self.sids, *self.tail_sids])
        order = np.argsort(keys, kind="stable")
        self.keys, self.sids = keys[order], sids[order]
        self.tail_keys, self.tail_sids, self.tail_size = [], [], 0

    def scores(self, cue: np.ndarray, n_spans: int) -> np.ndarray:
        """f64 [n_spans]: each indexed span's lexical match with the token ids ``cue`` (``lexical_scores``'s)."""
        scores = np.zeros(n_spans, dtype=np.float64)
        cue_keys = np.unique(ngram_keys(np.asarray(cue, dtype=np.int64), self.n))  # [k]
        if not cue_keys.size or not n_spans:
            return scores
        lo = np.searchsorted(self.keys, cue_keys, side="left")                     # [k]
        hi = np.searchsorted(self.keys, cue_keys, side="right")
        count = hi - lo
        at = np.repeat(lo - np.concatenate([[0], np.cumsum(count)[:-1]]), count) + np.arange(count.sum())
        hit_keys, hit_sids = [self.keys[at]], [self.sids[at]]                      # pairs in the sorted part
        for keys, sids in zip(self.tail_keys, self.tail_sids):
            hit = np.isin(keys, cue_keys)
            hit_keys.append(keys[hit])
            hit_sids.append(sids[hit])
        keys, sids = np.concatenate(hit_keys), np.concatenate(hit_sids)            # [p] distinct (key, span)
        if not keys.size:
            return scores
        return pair_scores(keys, sids, n_spans, self.config)

    def pins(self, cue: np.ndarray, n_spans: int) -> list[int]:
        """``lexical_pins`` with ``cue`` as the question."""
        return pins_of(self.scores(cue, n_spans), self.config)
