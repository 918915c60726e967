"""The one decode loop: every caller that steps a memory token by token goes through ``decode_loop`` — greedy
generation (``engine.generate``, evaluation turns, soak runs, traces), teacher forcing (fidelity) and the tokens
llama-cpp-python's sampler hands ``SekvLlama.eval``. What a caller adds rides on its hooks: ``on_token`` (a token
is chosen, before it is decoded: streaming text, cancellation) and ``after_step`` (after its decode: checks,
traces, timing, logits rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

# the next token given the current logits f32 [n_vocab] and how many tokens the loop has produced
TokenSource = Callable[[np.ndarray, int], int]


def greedy(logits: np.ndarray, i: int) -> int:
    """The most likely token."""
    return int(np.argmax(logits))


def forced(tokens: Sequence[int]) -> TokenSource:
    """Teacher forcing: token ``i`` of ``tokens`` whatever the logits."""
    return lambda logits, i: int(tokens[i])


@dataclass
class Decoded:
    """What a loop produced: the tokens and the logits after the last decode."""

    tokens: list[int]
    logits: np.ndarray


def decode_loop(step: Callable[[int], np.ndarray], logits: np.ndarray, n: int, source: TokenSource = greedy, *,
                eos: int | None = None, step_last: bool = True,
                on_token: Callable[[int], None] | None = None,
                after_step: Callable[[int, np.ndarray], None] | None = None) -> Decoded:
    """Up to ``n`` tokens from ``source``, each decoded by ``step`` (a policy's ``step``; a bare session's decode of one
    token) starting from the logits ``logits`` of a prefill or append. ``eos``: a token that ends the loop undecoded. ``step_last`` False leaves the
    last token undecoded (a reply whose next logits nobody reads). ``after_step(k, logits)`` runs after the k-th
    token's decode."""
    out: list[int] = []
    for i in range(n):
        tok = source(logits, i)
        if eos is not None and tok == eos:
            return Decoded(out, logits)
        out.append(tok)
        if on_token is not None:
            on_token(tok)
        if i + 1 < n or step_last:
            logits = step(tok)
            if after_step is not None:
                after_step(len(out), logits)
    return Decoded(out, logits)
