"""The decode loop shared by every policy: prefill, greedy generation, timing and the run's statistics."""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import llama_cpp
import numpy as np

from .config import ContextConfig, SekvConfig
from .policies import POLICIES, Policy
from .policies.base import pad_cells
from .session import Session


@dataclass
class RunResult:
    """What one generation produced and measured (the CLI's JSON, DESIGN.md §4)."""

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
    sekv: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

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
        if self.sekv is not None:
            out["sekv"] = self.sekv
        out.update(self.extra)
        return out


def full_kv_bytes(session: Session, n_tokens: int, n_ubatch: int) -> int:
    """Bytes llama.cpp would allocate for full KV of ``n_tokens`` (``swa_full=False``), from the hook's row sizes."""
    info = session.hook.info
    cells = pad_cells(n_tokens)
    total = info.bytes_per_cell * cells
    if info.is_iswa and info.swa_kv_size:
        swa_cells = pad_cells(info.n_swa + n_ubatch)  # sized by its window (patches/0003), not capped by the base
        total += info.swa_kv_bytes // info.swa_kv_size * swa_cells
    return int(total)


def make_policy(name: str, model: Any, n_context: int, ctx_config: ContextConfig | None = None,
                config: SekvConfig | None = None, **kwargs: Any) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    return POLICIES[name](model, n_context, ctx_config or ContextConfig(), config=config, **kwargs)


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
        sekv=stats.get("sekv"), extra={"baseline": stats["baseline"]} if "baseline" in stats else {})
