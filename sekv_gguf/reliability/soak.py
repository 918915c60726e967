"""Long runs of a policy: ``decode_soak`` (a prompt, then many greedy decode steps with routing every step, the
process's resident memory sampled along the way, and the same run again to check it yields the same tokens) and
``open_close_soak`` (a policy opened, used and closed many times in one process: memory and open file descriptors
before and after)."""

from __future__ import annotations

import gc
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..config import BudgetConfig, ContextConfig, SekvConfig
from ..decode import decode_loop, greedy
from ..documents import stdlib_prose
from ..engine import make_policy
from ..session import full_kv_bytes
from . import rss_bytes


@dataclass(frozen=True)
class SoakConfig:
    """steps: decode steps per run; prompt_tokens: prompt before them; budget: device share; route_every: steps
    between routings; samples: resident-memory samples per run; warm_share: the share of steps after which memory
    is taken as warmed up; cycles / cycle_tokens / cycle_steps: the open/close loop; threads: llama.cpp threads."""

    steps: int = 10_000
    prompt_tokens: int = 2048
    budget: float = 0.1
    route_every: int = 1
    samples: int = 20
    warm_share: float = 0.1
    cycles: int = 200
    cycle_tokens: int = 256
    cycle_steps: int = 4
    threads: int = 1

    def __post_init__(self) -> None:
        if min(self.steps, self.prompt_tokens, self.samples, self.cycles, self.cycle_tokens, self.threads) < 1 \
                or not 0 < self.budget <= 1 or not 0 <= self.warm_share < 1 or self.route_every < 1:
            raise ValueError(f"bad soak settings: {self}")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _prompt(model: Any, n: int) -> list[int]:
    return model.tokenize(stdlib_prose().encode("utf-8"), add_bos=True, special=False)[:n]


def _run(model: Any, cfg: SoakConfig, progress: Callable[[int], None] | None) -> dict[str, Any]:
    tokens = _prompt(model, cfg.prompt_tokens)
    n_ctx = len(tokens) + cfg.steps + 1
    policy = make_policy("sekv", model, n_ctx, ContextConfig(n_threads=cfg.threads),
                         BudgetConfig(kv_budget=cfg.budget), SekvConfig(route_every=cfg.route_every))
    every = max(1, cfg.steps // cfg.samples)
    samples: list[dict[str, int]] = []
    t0 = time.perf_counter()

    def sample(k: int, logits: np.ndarray) -> None:
        if k % every == 0:
            samples.append({"step": k, "rss": rss_bytes(os.getpid()), "host": int(policy.host_bytes)})
            if progress:
                progress(k)

    try:
        out = decode_loop(policy.step, policy.prefill(tokens), cfg.steps, greedy, after_step=sample).tokens
        stats = policy.stats()
        full = full_kv_bytes(policy.session, n_ctx, policy.full_kv_ubatch)
    finally:
        policy.close()
    return {"tokens": out, "samples": samples, "seconds": time.perf_counter() - t0, "stats": stats,
            "full_kv_bytes": full}


def decode_soak(model: Any, cfg: SoakConfig = SoakConfig(),
                progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Two identical runs; memory growth after warm-up less what the host tier legitimately added, host bytes against
    full KV, and whether the runs' tokens agree."""
    first = _run(model, cfg, progress)
    second = _run(model, cfg, progress)
    s = first["samples"]
    warm = next(x for x in s if x["step"] >= cfg.warm_share * cfg.steps)
    last = s[-1]
    other_growth = (last["rss"] - last["host"]) - (warm["rss"] - warm["host"])  # growth not in the host tier
    digest = lambda toks: hashlib.sha256(np.asarray(toks, dtype=np.int32).tobytes()).hexdigest()[:16]  # noqa: E731
    sekv = first["stats"].sekv
    return {"steps": cfg.steps, "prompt_tokens": cfg.prompt_tokens, "budget": cfg.budget,
            "route_every": cfg.route_every, "seconds": round(first["seconds"], 1),
            "rss_warm_bytes": warm["rss"], "rss_end_bytes": last["rss"],
            "host_warm_bytes": warm["host"], "host_end_bytes": last["host"],
            "rss_growth_outside_host_tier": round(other_growth / warm["rss"], 4),
            "host_over_full_kv": round(last["host"] / first["full_kv_bytes"], 4),
            "same_tokens_on_rerun": first["tokens"] == second["tokens"],
            "tokens_sha256": digest(first["tokens"]), "spans": sekv.spans if sekv else None,
            "route_ms_per_step": sekv.route_ms_per_step if sekv else None,
            "zooms_per_step": sekv.zooms_per_step if sekv else None,
            "samples": s}


def open_close_soak(model: Any, cfg: SoakConfig = SoakConfig(),
                    progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``cfg.cycles`` times: a sekv policy opened, prompted, stepped and closed. Memory and descriptors after a tenth
    of the cycles (warm) and at the end."""
    tokens = _prompt(model, cfg.cycle_tokens)
    warm_at = max(1, cfg.cycles // 10)
    warm: dict[str, int] = {}
    for i in range(cfg.cycles):
        policy = make_policy("sekv", model, len(tokens) + cfg.cycle_steps + 1, ContextConfig(n_threads=cfg.threads),
                             BudgetConfig(kv_budget=0.5), SekvConfig())
        try:
            decode_loop(policy.step, policy.prefill(tokens), cfg.cycle_steps, greedy)
        finally:
            policy.close()
        if i + 1 == warm_at:
            gc.collect()
            warm = {"rss": rss_bytes(os.getpid()), "fds": _fds()}
        if progress:
            progress(i + 1)
    gc.collect()
    end = {"rss": rss_bytes(os.getpid()), "fds": _fds()}
    return {"cycles": cfg.cycles, "rss_warm_bytes": warm["rss"], "rss_end_bytes": end["rss"],
            "rss_growth": round(end["rss"] / warm["rss"] - 1, 4), "fds_warm": warm["fds"], "fds_end": end["fds"]}
