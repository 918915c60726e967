"""The policy interface: a policy owns one llama_context and decides what its KV cache holds."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

from ..session import Session


class Policy(ABC):
    """Prefill a prompt, then decode one token at a time; ``stats`` reports what the cache held.

    Constructors take ``(model, n_context, ctx_config, budget, params, observer)``: the model, prompt + generation
    tokens, the context settings, the shared ``BudgetConfig`` and the policy's own parameters (an instance of
    ``Params``, None for a policy without any); a policy that ``routes`` also takes a ``router``."""

    name: str = "policy"
    Params: type | None = None  # the dataclass of the policy's own parameters
    routes: bool = False        # takes a ``router`` (``sekv_gguf.router``)

    def __init__(self, session: Session, observer: Callable[["Policy"], None] | None = None):
        self.session = session
        self.observer = observer
        self.phase = "prefill"  # what the policy is doing when it notifies: prefill, compress, decode
        self.n_prefilled = 0    # prompt tokens through the model so far

    @abstractmethod
    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Decode the prompt; float32 logits [n_vocab] of the next token."""

    @abstractmethod
    def step(self, token: int) -> np.ndarray:
        """Decode one token after the newest; logits of the next one."""

    def stats(self) -> dict[str, Any]:
        info = self.session.hook.info
        return {"device_kv_bytes": info.kv_bytes + info.swa_kv_bytes}

    def notify(self) -> None:
        if self.observer is not None:
            self.observer(self)

    def close(self) -> None:
        self.session.close()


class StreamedPolicy(Policy):
    """A policy that feeds the prompt to ``_decode`` in chunks of ``self.chunk`` tokens, then each new token."""

    chunk: int

    @abstractmethod
    def _decode(self, tokens: list[int]) -> np.ndarray:
        """Decode ``tokens`` after the newest one (and keep the cache within its rule); logits of the next one."""

    def prefill(self, tokens: list[int]) -> np.ndarray:
        if not tokens:
            raise ValueError("empty prompt")
        logits = None
        for c0 in range(0, len(tokens), self.chunk):
            logits = self._decode(tokens[c0:c0 + self.chunk])
            self.n_prefilled = min(c0 + self.chunk, len(tokens))
            self.notify()
        self.phase = "decode"
        return logits

    def step(self, token: int) -> np.ndarray:
        logits = self._decode([token])
        self.notify()
        return logits
