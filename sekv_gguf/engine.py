"""A run: a policy made by name (``make_policy``), a prompt prefilled and a reply generated greedily through the
decode loop (``generate``), timed, with its statistics (``RunResult``)."""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from typing import Any, Callable

import llama_cpp

from .config import BudgetConfig, ContextConfig
from .decode import decode_loop, greedy
from .policies import POLICIES, Policy
from .policies.base import PolicyRecipe
from .session import full_kv_bytes
from .stats import PolicyStats, SekvStats


@dataclass
class RunResult:
    """What one generation produced and measured (the CLI's JSON, docs/design.md §4)."""

    text: str
    tokens: list[int]
    policy: str
    model: str
    prompt_tokens: int
    generated_tokens: int
    full_kv_bytes: int
    prefill_s: float
    decode_s: float
    stats: PolicyStats  # device and host bytes, SeKV's or a baseline's own statistics

    @classmethod
    def of(cls, policy: Policy, prompt_tokens: int, tokens: list[int], n_context: int, prefill_s: float,
           decode_s: float, model_name: str = "") -> "RunResult":
        """The result of ``policy`` after a prompt of ``prompt_tokens`` and the generated ``tokens``, its full-KV
        bytes those of a context of ``n_context`` tokens (the one result builder)."""
        session = policy.session
        return cls(text=session.text(tokens), tokens=list(tokens), policy=policy.name, model=model_name,
                   prompt_tokens=prompt_tokens, generated_tokens=len(tokens),
                   full_kv_bytes=full_kv_bytes(session, n_context, policy.full_kv_ubatch), prefill_s=prefill_s,
                   decode_s=decode_s, stats=policy.stats())

    @property
    def device_kv_bytes(self) -> int:
        return self.stats.device_kv_bytes

    @property
    def host_kv_bytes(self) -> int:
        return self.stats.host_kv_bytes

    @property
    def sekv(self) -> SekvStats | None:
        return self.stats.sekv

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
        own = self.stats.to_json()
        return out | {k: own[k] for k in ("sekv", "baseline") if k in own}


def make_policy(name: str, model: Any, n_context: int, ctx_config: ContextConfig | None = None,
                budget: BudgetConfig | None = None, params: Any = None, router: Any = None,
                observer: Callable[[Policy], None] | None = None) -> Policy:
    """Policy ``name`` over ``model`` for ``n_context`` tokens (prompt + generation): ``budget`` is shared by
    every policy, ``params`` is the policy's own dataclass (``POLICIES[name].Config``), ``router`` replaces the
    default scorer of a policy that routes."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    cls = POLICIES[name]
    if params is not None and (cls.Config is None or not isinstance(params, cls.Config)):
        want = cls.Config.__name__ if cls.Config is not None else "none"
        raise TypeError(f"policy {name!r} takes parameters of type {want}, got {type(params).__name__}")
    extra = {}
    if router is not None:
        if not cls.takes_router:
            raise ValueError(f"policy {name!r} takes no router")
        extra["router"] = router
    policy = cls(model, n_context, ctx_config or ContextConfig(), budget, params, observer=observer, **extra)
    policy.recipe = PolicyRecipe(name, n_context, budget or BudgetConfig(), params,
                                 getattr(router, "label", type(router).__name__) if router is not None else "")
    return policy


def generate(policy: Policy, prompt: list[int], n_predict: int, model_name: str = "",
             on_text: Callable[[str], None] | None = None, stop_at_eos: bool = True) -> RunResult:
    """Prefill ``prompt`` and decode up to ``n_predict`` tokens greedily (``decode.decode_loop``)."""
    session = policy.session
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    t0 = time.perf_counter()
    logits = policy.prefill(prompt)
    t1 = time.perf_counter()
    done = decode_loop(policy.step, logits, n_predict, greedy,
                       eos=llama_cpp.llama_vocab_eos(session.model.vocab) if stop_at_eos else None, step_last=False,
                       on_token=None if on_text is None else lambda tok: on_text(utf8.decode(session.piece(tok))))
    t2 = time.perf_counter()
    return RunResult.of(policy, len(prompt), done.tokens, len(prompt) + n_predict, t1 - t0, t2 - t1, model_name)
