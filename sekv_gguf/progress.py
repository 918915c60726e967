"""Prompt progress on stderr: a tqdm bar fed by a policy's observer callback, closed when the first generated text
arrives (so that the answer streams on a clean line)."""

from __future__ import annotations

import sys
from tqdm import tqdm

from .policies import Policy


class Progress:
    """``observe`` is the policy's observer (``make_policy(..., observer=progress.observe)``); ``text`` marks that
    generation has started."""

    def __init__(self, total: int, label: str, disable: bool = False):
        self.label = label
        self.bar = tqdm(total=total, desc=f"prefill ({label})", unit="tok", file=sys.stderr, disable=disable,
                        leave=False)
        self.done = 0
        self.phase = "prefill"
        self.decoding = False

    def observe(self, policy: Policy) -> None:
        if self.decoding:
            return
        if policy.phase == "compress" and self.phase != "compress":
            self.bar.set_description(f"compress ({self.label})")
            self.phase = "compress"
        if policy.n_prefilled > self.done:
            self.bar.update(policy.n_prefilled - self.done)
            self.done = policy.n_prefilled

    def text(self) -> None:
        if not self.decoding:
            self.bar.close()
            self.decoding = True

    def close(self) -> None:
        self.bar.close()
