"""Segmenters: how the tokens that leave a recent window are cut into anchors and spans.

Each works on a stream: ``cut`` is handed the segmentation signal of the tokens that left the window and returns
anchors and complete spans; an unfinished tail is returned as pending. ``signal`` makes the signal of newly
decoded tokens; ``scored`` says whether it needs their surprisal (logits of every prompt token), ``weighted``
whether a span's summary row weights its tokens by the signal (else uniformly).

- ``Segmenter``: SeKV's surprisal segmentation, anchors (capped) and spans cut at surprisal change points;
- ``BlockSegmenter``: fixed blocks (the Quest-like baseline);
- ``SentenceSegmenter``: one span per sentence (the SentenceKV-like baseline).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .config import SekvConfig


@dataclass
class Segmentation:
    anchors: np.ndarray                                           # int64 [n_a] indices into the input
    spans: list[np.ndarray] = field(default_factory=list)         # each int64 [L] indices into the input
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # indices left for later


class Segmenter:
    """Anchors above mean + alpha*std of all surprisal seen (at most ``cap`` in all); spans of [span_min, span_max]
    non-anchor tokens, cut where the surprisal changes most."""

    scored = True
    weighted = True

    def __init__(self, config: SekvConfig, cap: int):
        self.config = config
        self.cap = cap
        self.n_anchors = 0
        self._n = 0
        self._sum = 0.0
        self._sq = 0.0

    def signal(self, tokens: list[int], surprisal: np.ndarray, piece: Callable[[int], bytes]) -> np.ndarray:
        """float32 [n]: the tokens' surprisal."""
        return surprisal

    def rewind(self, surprisal: np.ndarray, n_anchors: int) -> None:
        """Statistics as if only ``surprisal`` had been observed and ``n_anchors`` anchors taken (a truncation)."""
        self._n, self._sum, self._sq, self.n_anchors = 0, 0.0, 0.0, n_anchors
        self.track(surprisal)

    def state(self) -> dict[str, float]:
        """The running statistics as plain data (``load_state`` takes them back)."""
        return {"n": self._n, "sum": self._sum, "sq": self._sq, "n_anchors": self.n_anchors}

    def load_state(self, state: dict[str, float]) -> None:
        self._n, self._sum, self._sq = int(state["n"]), float(state["sum"]), float(state["sq"])
        self.n_anchors = int(state["n_anchors"])

    def track(self, surprisal: np.ndarray) -> None:
        """Update the running statistics with newly realised tokens."""
        s = np.asarray(surprisal, dtype=np.float64)
        self._n += s.size
        self._sum += float(s.sum())
        self._sq += float((s * s).sum())

    @property
    def mean(self) -> float:
        """Mean surprisal seen so far (0 before any)."""
        return self._sum / self._n if self._n else 0.0

    @property
    def threshold(self) -> float:
        if self._n == 0:
            return float("inf")
        mean = self.mean
        std = np.sqrt(max(self._sq / self._n - mean * mean, 0.0))
        return mean + self.config.anchor_alpha * std

    def cut(self, surprisal: np.ndarray, final: bool = False, allowance: int | None = None,
            floor: float | None = None, ends: np.ndarray | None = None) -> Segmentation:
        """Segment tokens that left the window, in position order. ``final``: also emit a short tail as a span.
        ``allowance``: most anchors taken so far, this cut included (a streamed memory spreads the cap over the
        context; None: the whole cap). ``floor``: a stricter anchor threshold than mean + alpha * std. ``ends``:
        bool [n], the tokens that end a sentence (``SentenceEnds``): a span then ends at one where its length
        range holds one (None: anywhere)."""
        s = np.asarray(surprisal, dtype=np.float64)
        if ends is not None and len(ends) != s.size:
            raise ValueError(f"ends has {len(ends)} entries for {s.size} tokens")
        cfg = self.config
        # anchors: the most surprising tokens above the threshold, within what is left of the cap (and allowance)
        over = np.flatnonzero(s > max(self.threshold, -np.inf if floor is None else floor))
        room = max(min(self.cap, self.cap if allowance is None else allowance) - self.n_anchors, 0)
        if over.size > room:
            over = over[np.argsort(-s[over], kind="stable")[:room]]
        anchors = np.sort(over)
        self.n_anchors += anchors.size
        rest = np.setdiff1d(np.arange(s.size), anchors)  # [n_rest] non-anchor tokens, in order
        rest_ends = None if ends is None else np.asarray(ends, dtype=bool)[rest]  # [n_rest]
        spans: list[np.ndarray] = []
        i = 0
        while rest.size - i >= cfg.span_max + cfg.span_min or (rest.size - i >= cfg.span_min and
                                                                 rest.size - i <= cfg.span_max and final):
            n_left = rest.size - i
            if n_left <= cfg.span_max:
                length = n_left
            else:
                window = slice(i, i + cfg.span_max + 1)
                length = self._change_point(s[rest[window]], None if rest_ends is None else rest_ends[window])
            spans.append(rest[i:i + length])
            i += length
        if final and rest.size - i > 0:
            if spans and rest.size - i < cfg.span_min:
                spans[-1] = np.concatenate([spans[-1], rest[i:]])  # a short tail joins the last span
            else:
                spans.append(rest[i:])
            i = rest.size
        return Segmentation(anchors=anchors, spans=spans, pending=rest[i:])

    def _change_point(self, s: np.ndarray, ends: np.ndarray | None = None) -> int:
        """Length in [span_min, span_max] of the next span: cut before the largest surprisal jump in that range —
        among the cuts right after a sentence end when ``ends`` (bool, as ``s``) marks one there."""
        lo, hi = self.config.span_min, self.config.span_max
        jumps = np.abs(np.diff(s))[lo - 1:hi]  # [hi - lo + 1]: jumps[j] is before token lo + j (a length lo + j)
        if ends is not None:
            after_end = ends[lo - 1:hi]        # [hi - lo + 1]: token lo + j - 1 ends a sentence
            if after_end.any():
                jumps = np.where(after_end, jumps, -np.inf)
        return lo + int(np.argmax(jumps))


class RaritySegmenter(Segmenter):
    """SeKV's segmentation (anchors, change points, weights) on a signal that needs no logits: a token's
    self-information within the text seen so far, ``log((n + 1) / (c + 1))`` for a token seen ``c`` times among the
    ``n`` before it (first occurrences of a word score high, repetitions low). ``signal="rarity"``. It keeps the
    token ids it has seen, so that a truncation rewinds the counts too."""

    scored = False

    def __init__(self, config: SekvConfig, cap: int):
        super().__init__(config, cap)
        self._history: list[int] = []  # every token id signalled, in order (sinks included)
        self._counts: dict[int, int] = {}

    def signal(self, tokens: list[int], surprisal: np.ndarray, piece: Callable[[int], bytes]) -> np.ndarray:
        """float32 [n]: each token's in-text self-information (updates the counts)."""
        out = np.empty(len(tokens), dtype=np.float32)
        for i, t in enumerate(tokens):
            c = self._counts.get(int(t), 0)
            out[i] = np.log((len(self._history) + 1) / (c + 1))
            self._counts[int(t)] = c + 1
            self._history.append(int(t))
        return out

    def rewind(self, surprisal: np.ndarray, n_anchors: int) -> None:
        """As ``Segmenter.rewind``; the counts go back to the tokens kept (``surprisal`` holds the signal of those
        past the sinks, which were signalled but never tracked)."""
        n_sinks = len(self._history) - self._n
        self._recount(self._history[: n_sinks + len(surprisal)])
        super().rewind(surprisal, n_anchors)

    def _recount(self, history: list[int]) -> None:
        self._history, self._counts = list(history), {}
        for t in self._history:
            self._counts[t] = self._counts.get(t, 0) + 1

    def state(self) -> dict[str, float]:
        return {**super().state(), "history": list(self._history)}

    def load_state(self, state: dict[str, float]) -> None:
        super().load_state(state)
        self._recount([int(t) for t in state["history"]])


class BlockSegmenter(Segmenter):
    """Fixed blocks of ``block`` tokens, no anchors, no signal (the Quest-like baseline)."""

    scored = False
    weighted = False

    def __init__(self, block: int):
        super().__init__(replace(SekvConfig(), span_min=block, span_max=block, anchor_share=0.0), cap=0)

    def signal(self, tokens: list[int], surprisal: np.ndarray, piece: Callable[[int], bytes]) -> np.ndarray:
        return np.zeros(len(tokens), dtype=np.float32)


class SentenceEnds:
    """Which tokens end a sentence (their text holds a line break or ends in one of ``marks``), cached per token id.
    ``piece`` gives a token's bytes (``Session.piece``)."""

    def __init__(self, piece: Callable[[int], bytes], marks: tuple[bytes, ...] = (b".", b"!", b"?")):
        self.piece, self.marks = piece, marks
        self._ends: dict[int, bool] = {}

    def __call__(self, tokens: list[int]) -> np.ndarray:
        """float32 [n]: 1 where the token ends a sentence."""
        out = np.zeros(len(tokens), dtype=np.float32)
        for i, t in enumerate(tokens):
            if t not in self._ends:
                piece = self.piece(t)
                self._ends[t] = b"\n" in piece or piece.rstrip().endswith(self.marks)
            out[i] = self._ends[t]
        return out


def span_ends(config: SekvConfig, piece: Callable[[int], bytes], tokens: list[int]) -> np.ndarray | None:
    """bool [n]: where spans of ``tokens`` may end under ``config.span_cuts`` (None: anywhere) — for a one-off
    segmentation of a whole token list (capture, studies); a policy keeps its own record as it decodes."""
    if config.span_cuts != "sentence":
        return None
    return SentenceEnds(piece)(tokens) > 0.5


class SentenceSegmenter:
    """Spans = sentences: the signal handed to ``cut`` is 1 at a sentence's last token (``.!?`` or a line break)
    and 0 elsewhere. A sentence longer than ``span_max`` is split; no anchors. (The SentenceKV-like baseline.)"""

    scored = False
    weighted = False

    def __init__(self, span_max: int, marks: tuple[bytes, ...] = (b".", b"!", b"?")):
        self.span_max, self.marks = span_max, marks
        self.n_anchors = 0
        self._ends: SentenceEnds | None = None

    def signal(self, tokens: list[int], surprisal: np.ndarray, piece: Callable[[int], bytes]) -> np.ndarray:
        """float32 [n]: 1 where the token ends a sentence."""
        if self._ends is None:
            self._ends = SentenceEnds(piece, self.marks)
        return self._ends(tokens)

    def track(self, signal: np.ndarray) -> None:
        """Nothing to learn: sentence ends are read from the tokens."""

    def rewind(self, signal: np.ndarray, n_anchors: int) -> None:
        """Nothing to forget."""

    def state(self) -> dict[str, float]:
        return {}

    def load_state(self, state: dict[str, float]) -> None:
        """Nothing to take back."""

    def cut(self, signal: np.ndarray, final: bool = False, allowance: int | None = None,
            floor: float | None = None, ends: np.ndarray | None = None) -> Segmentation:
        """Sentences as spans; ``allowance`` and ``floor`` (anchor limits) do not apply: no anchors; ``ends`` is
        the signal already."""
        finals = np.flatnonzero(np.asarray(signal) > 0.5)  # indices of sentence-final tokens
        spans: list[np.ndarray] = []
        start = 0
        for e in finals:
            for s0 in range(start, e + 1, self.span_max):
                spans.append(np.arange(s0, min(s0 + self.span_max, e + 1)))
            start = e + 1
        n = len(signal)
        if final and start < n:
            spans.append(np.arange(start, n))
            start = n
        return Segmentation(anchors=np.zeros(0, dtype=np.int64), spans=spans, pending=np.arange(start, n))
