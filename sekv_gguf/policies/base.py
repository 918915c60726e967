"""The policy interface: a policy owns one llama_context and decides what its KV cache holds.

Lifecycle, for every policy: ``append(tokens)`` decodes tokens after the newest (a prompt, or a turn's new part)
and returns the next token's logits; ``step(token)`` decodes one generated token; ``truncate(n)`` keeps the first
``n`` tokens (False: this memory cannot, and the caller resets and appends again); ``reset()`` empties it;
``snapshot()`` / ``restore()`` save and bring back a memory. What a policy remembers lives in one object,
``memory`` (a ``PolicyMemory``: copied by snapshots, turned into plain data and back); the policy itself holds only
fixed parts (its session, budget plan, settings). Invariants, checked by the tests from the hook: the
last decode produced an output row; the sequence's largest position is ``n_tokens - 1``; the device cells never
exceed the budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import llama_cpp
import numpy as np

from ..errors import HookStateError
from ..session import Session
from ..stats import PolicyStats
from .memory_state import PolicyMemory
from .shared_passes import SharedPasses
from .snapshot import DeviceState, Snapshot


@dataclass(frozen=True)
class PolicyRecipe:
    """How ``engine.make_policy`` made a policy (its name, size, shared budget, own parameters and router label):
    what a saved memory's fingerprint compares (``sekv_gguf.memory_file``)."""

    name: str
    n_context: int
    budget: Any  # BudgetConfig
    params: Any  # the policy's Config instance, or None (its defaults)
    router: str  # the label of a router handed in ("": the policy's own)


class Policy(ABC):
    """Decode a prompt and generated tokens into one llama_context; ``stats`` reports what the cache held.

    Constructors take ``(model, n_context, ctx_config, budget, params, observer)``: the model, the most tokens the
    memory will hold, the context settings, the shared ``BudgetConfig`` and the policy's own parameters (an
    instance of ``Config``, None for a policy without any); a policy that ``takes_router`` also takes a ``router``.
    A constructor sets ``self.memory`` and ends with ``_init_done()``."""

    name: str = "policy"
    Config: type | None = None  # the dataclass of the policy's own parameters
    takes_router: bool = False  # its constructor takes a ``router`` (``sekv_gguf.router``)
    memory: PolicyMemory
    recipe: PolicyRecipe | None = None  # set by ``engine.make_policy``

    def __init__(self, session: Session, observer: Callable[["Policy"], None] | None = None):
        self.session = session
        self.observer = observer
        self.phase = "prefill"  # what the policy is doing when it notifies: prefill, compress, decode
        self.n_prefilled = 0    # tokens of the current append through the model so far
        self.tokens: list[int] = []  # every token of the memory, in position order
        # called once before the memory next changes in a way ``truncate`` cannot undo (a checkpoint is due)
        self.before_irreversible: Callable[[], None] | None = None
        # full-attention passes over a prompt shared with other runs on it (an evaluation's); a reset keeps it
        self.shared_passes: SharedPasses | None = None

    def _init_done(self) -> None:
        """Called at the end of a constructor: the empty memory that ``reset`` returns to."""
        self._empty = self.memory.copy()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def append(self, tokens: Sequence[int]) -> np.ndarray:
        """Decode ``tokens`` after the newest one; float32 logits [n_vocab] of the next token."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("no tokens to append")
        self.phase = "prefill"
        logits = self._append(tokens)
        self.tokens.extend(tokens)
        self.phase = "decode"
        return logits

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """``append`` into an empty memory."""
        if not tokens:
            raise ValueError("empty prompt")
        if self.tokens:
            raise ValueError("prefill needs an empty memory (reset() it, or append())")
        return self.append(tokens)

    def step(self, token: int) -> np.ndarray:
        """Decode one generated token after the newest; logits of the next one."""
        self.tokens.append(int(token))
        logits = self._step(int(token))
        self.notify()
        return logits

    def irreversible(self) -> None:
        """About to change the memory beyond what ``truncate`` undoes: run (once) what waits for that."""
        callback, self.before_irreversible = self.before_irreversible, None
        if callback is not None:
            callback()

    def truncate(self, n: int) -> bool:
        """Keep the first ``n`` tokens; False when this memory cannot drop what follows them (nothing changed)."""
        if n >= len(self.tokens):
            return True
        if n <= 0:
            self.reset()
            return True
        return self._truncate(n)

    def reset(self) -> None:
        """Empty the memory (the context and the policy's bookkeeping)."""
        llama_cpp.llama_memory_clear(self.session.memory, True)
        hook = self.session.hook
        try:
            for ikv in range(hook.info.n_layer_kv):
                hook.set_bias(ikv, np.zeros(hook.info.kv_size, dtype=np.float32))
        except HookStateError:  # the bias is off
            pass
        self.memory = self._empty.copy()
        self.tokens, self.phase, self.n_prefilled = [], "prefill", 0

    @abstractmethod
    def _append(self, tokens: list[int]) -> np.ndarray:
        """Decode ``tokens`` after ``self.tokens`` (not yet extended); logits of the next token."""

    @abstractmethod
    def _step(self, token: int) -> np.ndarray:
        """Decode one generated token."""

    def _truncate(self, n: int) -> bool:
        """Keep the first ``n`` of more than ``n`` tokens (0 < n); the default refuses."""
        return False

    def swa_covers(self, n: int) -> bool:
        """Whether the sliding-window cache of an iSWA model still holds the window before position ``n``, so that
        decoding can go on from ``n`` once later positions are removed (always true without one)."""
        return self.session.swa_covers(n)

    def discard_from(self, n: int) -> None:
        """Remove every position >= ``n`` from the context (both caches of an iSWA model) and the token list."""
        llama_cpp.llama_memory_seq_rm(self.session.memory, 0, n, -1)
        del self.tokens[n:]

    # -- snapshots ---------------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The memory as it is now, restorable with ``restore``."""
        device = DeviceState.take(self.session)
        return Snapshot(tokens=list(self.tokens), device=device, memory=self.memory.copy(),
                        host_bytes=device.nbytes + self.host_bytes)

    def restore(self, snap: Snapshot) -> None:
        """Bring back the memory of ``snap`` (taken from this policy)."""
        snap.device.put(self.session)
        self.memory = snap.memory.copy()
        self.tokens = list(snap.tokens)

    @property
    def host_bytes(self) -> int:
        """Bytes of this memory kept in host memory (0: everything is on the device)."""
        return 0

    # -- reporting ---------------------------------------------------------------------------------------------

    @property
    def device_kv_bytes(self) -> int:
        """KV bytes llama.cpp allocated for this context (the SWA cache of an iSWA model included)."""
        info = self.session.hook.info
        return int(info.kv_bytes + info.swa_kv_bytes)

    @property
    def full_kv_ubatch(self) -> int:
        """The ubatch a full-KV context of the same settings would have (it sizes an iSWA model's SWA cache: the
        reference ``RunResult.full_kv_bytes`` is computed with it)."""
        return self.session.config.n_ubatch

    def stats(self) -> PolicyStats:
        return PolicyStats(device_kv_bytes=self.device_kv_bytes)

    def notify(self) -> None:
        if self.observer is not None:
            self.observer(self)

    def close(self) -> None:
        self.session.close()


class StreamedPolicy(Policy):
    """A policy that feeds appended tokens to ``_decode`` in chunks of ``self.chunk`` tokens."""

    chunk: int

    @abstractmethod
    def _decode(self, tokens: list[int]) -> np.ndarray:
        """Decode ``tokens`` after the newest one (and keep the cache within its rule); logits of the next one."""

    def _append(self, tokens: list[int]) -> np.ndarray:
        logits = None
        for c0 in range(0, len(tokens), self.chunk):
            logits = self._decode(tokens[c0:c0 + self.chunk])
            self.n_prefilled = min(c0 + self.chunk, len(tokens))
            self.notify()
        return logits

    def _step(self, token: int) -> np.ndarray:
        return self._decode([token])
