"""The decode loop shared by every policy: prefill, greedy generation, timing and the run's statistics."""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from typing import Any, Callable

import llama_cpp
import numpy as np

from .config import BudgetConfig, ContextConfig
from .policies import POLICIES, Policy
from .session import Session, full_kv_bytes


@dataclass
class RunResult:
    """What one generation produced and measured (the CLI's JSON, docs/design.md §4)."""

    text: str
    tokens: list[int]
    policy: str
    model: str
    prompt_tokens: int
    generated_tokens: int
    device_kv_bytes: int
    full_kv_bytes: int
    host_kv_bytes: int
    prefill_s: float
    decode_s: float
    sekv: dict[str, Any] | None = None      # SeKV's own statistics (spans, anchors, router, ...)
    baseline: dict[str, Any] | None = None  # a baseline policy's own statistics

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("text", "policy", "model", "prompt_tokens", "generated_tokens",
                                             "device_kv_bytes", "full_kv_bytes", "host_kv_bytes", "prefill_s",
                                             "decode_s", "prefill_tok_s", "decode_tok_s")}
        for name in ("sekv", "baseline"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def make_policy(name: str, model: Any, n_context: int, ctx_config: ContextConfig | None = None,
                budget: BudgetConfig | None = None, params: Any = None, router: Any = None,
                observer: Callable[[Policy], None] | None = None) -> Policy:
    """Policy ``name`` over ``model`` for ``n_context`` tokens (prompt + generation): ``budget`` is shared by
    every policy, ``params`` is the policy's own dataclass (``POLICIES[name].Params``), ``router`` replaces the
    default scorer of a policy that routes."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    cls = POLICIES[name]
    if params is not None and (cls.Params is None or not isinstance(params, cls.Params)):
        want = cls.Params.__name__ if cls.Params is not None else "none"
        raise TypeError(f"policy {name!r} takes parameters of type {want}, got {type(params).__name__}")
    extra = {}
    if router is not None:
        if not cls.routes:
            raise ValueError(f"policy {name!r} takes no router")
        extra["router"] = router
    return cls(model, n_context, ctx_config or ContextConfig(), budget, params, observer=observer, **extra)


def generate(policy: Policy, prompt: list[int], n_predict: int, model_name: str = "",
             on_text: Callable[[str], None] | None = None, stop_at_eos: bool = True) -> RunResult:
    """Prefill ``prompt`` and decode up to ``n_predict`` tokens greedily."""
    session = policy.session
    eos = llama_cpp.llama_vocab_eos(session.model.vocab)
    t0 = time.perf_counter()
    logits = policy.prefill(prompt)
    t1 = time.perf_counter()
    out: list[int] = []
    pieces: list[bytes] = []
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    for i in range(n_predict):
        tok = int(np.argmax(logits))
        if stop_at_eos and tok == eos:
            break
        out.append(tok)
        piece = session.piece(tok)
        pieces.append(piece)
        if on_text is not None:
            on_text(utf8.decode(piece))
        if i + 1 < n_predict:
            logits = policy.step(tok)
    t2 = time.perf_counter()
    stats = policy.stats()
    return RunResult(
        text=b"".join(pieces).decode("utf-8", "replace"), tokens=out, policy=policy.name, model=model_name,
        prompt_tokens=len(prompt), generated_tokens=len(out), device_kv_bytes=int(stats["device_kv_bytes"]),
        full_kv_bytes=full_kv_bytes(session, len(prompt) + n_predict, session.config.n_ubatch),
        host_kv_bytes=int(stats.get("host_kv_bytes", 0)), prefill_s=t1 - t0, decode_s=t2 - t1,
        sekv=stats.get("sekv"), baseline=stats.get("baseline"))
