"""FullKV: llama.cpp as is (``swa_full=False``), a cache as large as prompt + generation."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..config import BudgetConfig, ContextConfig, round_cells
from ..session import Session
from .base import Policy
from .memory_state import PolicyMemory


class FullPolicy(Policy):
    """Every token stays in the device cache; the budget is ignored but for ``chunk`` (prompt tokens per
    llama_decode)."""

    name = "full"

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: None = None, observer: Callable[[Policy], None] | None = None):
        chunk = (budget or BudgetConfig()).chunk
        super().__init__(Session(model, ctx_config.sized(round_cells(n_context), chunk)), observer)
        self.memory = PolicyMemory()  # the cache holds everything
        self._init_done()

    def _append(self, tokens: list[int]) -> np.ndarray:
        logits = None
        for c0 in range(0, len(tokens), self.session.n_batch):
            logits = self.session.decode(tokens[c0:c0 + self.session.n_batch])
            self.n_prefilled = min(c0 + self.session.n_batch, len(tokens))
            self.notify()
        return logits

    def _step(self, token: int) -> np.ndarray:
        return self.session.decode([token])

    def _truncate(self, n: int) -> bool:
        if not self.swa_covers(n):
            return False
        self.discard_from(n)
        return True
