"""Configuration dataclasses: every tunable number of the package lives here, validated in ``__post_init__``."""

from __future__ import annotations

import os
from dataclasses import dataclass

# K/V cache types the hook can address per cell (ggml type ids)
KV_TYPES = {"f32": 0, "f16": 1}


@dataclass
class ContextConfig:
    """How a llama_context is created for sekv_gguf.

    n_ctx: cells of the (base) KV cache; llama.cpp rounds it up to a multiple of 256.
    n_batch / n_ubatch: most tokens per ``llama_decode`` call / per compute step.
    n_threads: CPU threads (0: all cores).
    flash_attn: required for per-cell V rows (with it off V is stored transposed; the hook handles that, slower).
    swa_full: keep False so that iSWA models (Gemma 3) allocate a window-sized SWA cache, not a full one.
    type_k / type_v: cache element types ("f16" or "f32").
    n_gpu_layers: layers offloaded to the GPU (-1: all; ignored by a CPU build).
    verbose: let llama.cpp log to stderr.
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0
    flash_attn: bool = True
    swa_full: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int = -1
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {self.n_ctx}")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise ValueError(f"n_batch and n_ubatch must be >= 1, got {self.n_batch}, {self.n_ubatch}")
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must not exceed n_batch ({self.n_batch})")
        if self.n_threads < 0:
            raise ValueError(f"n_threads must be >= 0, got {self.n_threads}")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ValueError(f"{name} must be one of {sorted(KV_TYPES)}, got {getattr(self, name)!r}")

    @property
    def threads(self) -> int:
        return self.n_threads or (os.cpu_count() or 1)
