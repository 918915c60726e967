"""Configuration dataclasses: every tunable number of the package lives here, validated in ``__post_init__``."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

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


@dataclass
class SekvConfig:
    """Parameters of the SeKV policy (DESIGN.md §1); every number the engine uses lives here.

    kv_budget: device cells of the managed cache: an int, or a fraction (0, 1] of prompt + generation.
        llama.cpp allocates cells in multiples of ``cell_granularity``; the budget is rounded up to it.
    n_sink: first tokens kept resident (attention sinks).
    window: recent tokens kept resident (0: a quarter of the budget, at most ``window_max``).
    zoom_share: share of the budget reserved for rebuilt (zoomed) span tokens, per layer.
    anchor_alpha: a token is an anchor when its surprisal exceeds mean + alpha * std of the surprisal seen so far.
    anchor_share: most cells anchors may take, as a share of the budget (the cap).
    span_min / span_max: span lengths; runs between anchors are cut at surprisal change points into spans of
        these lengths (a shorter tail waits in the window for more tokens).
    energy: share of a span's squared Frobenius norm the low-rank factors keep (per layer, for K and for V);
        when that rank exceeds ``r_max`` or its fp16 factors would not be smaller than the raw rows, the raw rows
        are kept instead, so the relative reconstruction error never exceeds sqrt(1 - energy).
    r_max: largest rank stored.
    router: "mass" (default: each span's attention mass logsumexp_t q·k_t from its host factors) or "summary"
        (the summary row's logit q·k̄ + log|S|); both training-free. On Gemma 3 270M needles at 4K / 25% budget the
        summary score missed needles the mass score found, and energies of 0.95-0.995 lost them (see README).
        The baselines use "bound" (Quest's channel-wise min/max bound) and "centroid" (q·k̄ without the length term).
        A trained router (a GGUF adapter, ``--adapter``) replaces them.
    verify_candidates: with a trained router, the spans it ranks first per layer whose exact attention mass (the
        ``mass`` score, from the host factors) then orders them; 0: the trained score alone. The trained score
        decides which spans are looked at, the host factors decide among those.
    chunk: prompt tokens per llama_decode in streaming prefill.
    prefill: "streaming" (device cells never above the budget), "exact" (full attention in a temporary full-size
        context, then compression), or "auto" (streaming when the prompt does not fit the budget).
    route_every: decode steps between routings (1: every step). The mass score costs O(span tokens · d) per layer on
        the host, so routing every step would cost about as much as full attention; zoomed spans stay resident between.
    max_new_zooms: most spans rebuilt per layer per decode step (the first routing after prefill has no limit);
        bounds the host->device traffic of a step, the zoom cache keeps what is already resident.
    zoom_lag_refresh: re-decode the last ``refresh_tokens`` prompt tokens after the first routing, so the end of the
        prompt (typically the question) and the first generated token see the zoomed spans, not only summaries.
    compress_when_fits: compress even when prompt + generation fit the budget (for exactness checks and studies;
        by default such a run is plain full KV).
    segmentation: "surprisal" (anchors and change-point spans from the prompt's surprisal) or "blocks" (fixed
        blocks of ``span_max`` tokens, no anchors, no logits beyond the last: the Quest-like baseline) or
        "sentences" (one span per sentence, split at ``span_max``: the SentenceKV-like baseline).
    summary_rows: keep one summary row per span in the device cache (SeKV's coarse resolution); False: spans are
        either zoomed or absent from attention (the Quest-like baseline; routing still reads the host summaries).
    """

    kv_budget: float = 0.25
    n_sink: int = 4
    window: int = 0
    window_max: int = 256
    zoom_share: float = 0.25
    anchor_alpha: float = 1.0
    anchor_share: float = 0.05
    span_min: int = 32
    span_max: int = 64
    energy: float = 0.999
    r_max: int = 64
    chunk: int = 256
    prefill: str = "auto"
    router: str = "mass"
    verify_candidates: int = 24
    route_every: int = 4
    max_new_zooms: int = 2
    zoom_lag_refresh: bool = True
    refresh_tokens: int = 32
    compress_when_fits: bool = False
    cell_granularity: int = 256
    segmentation: str = "surprisal"
    summary_rows: bool = True

    def __post_init__(self) -> None:
        if self.kv_budget <= 0:
            raise ValueError(f"kv_budget must be > 0 (cells, or a fraction of the context), got {self.kv_budget}")
        if not float(self.kv_budget).is_integer() and self.kv_budget > 1:
            raise ValueError(f"kv_budget above 1 must be a whole number of cells, got {self.kv_budget}")
        if self.n_sink < 1:
            raise ValueError(f"n_sink must be >= 1, got {self.n_sink}")
        if self.window < 0 or self.window_max < 1:
            raise ValueError(f"window must be >= 0 and window_max >= 1, got {self.window}, {self.window_max}")
        if not 0 < self.zoom_share < 1:
            raise ValueError(f"zoom_share must be in (0, 1), got {self.zoom_share}")
        if not 0 <= self.anchor_share < 1:
            raise ValueError(f"anchor_share must be in [0, 1), got {self.anchor_share}")
        if not 1 <= self.span_min <= self.span_max:
            raise ValueError(f"need 1 <= span_min <= span_max, got {self.span_min}, {self.span_max}")
        if not 0 < self.energy <= 1:
            raise ValueError(f"energy must be in (0, 1], got {self.energy}")
        if self.refresh_tokens < 1:
            raise ValueError(f"refresh_tokens must be >= 1, got {self.refresh_tokens}")
        if self.route_every < 1 or self.max_new_zooms < 1:
            raise ValueError(f"route_every and max_new_zooms must be >= 1, got {self.route_every}, {self.max_new_zooms}")
        if self.r_max < 1 or self.chunk < 1:
            raise ValueError(f"r_max and chunk must be >= 1, got {self.r_max}, {self.chunk}")
        if self.verify_candidates < 0:
            raise ValueError(f"verify_candidates must be >= 0, got {self.verify_candidates}")
        if self.router not in ("mass", "summary", "bound", "centroid"):
            raise ValueError(f"router must be mass, summary, bound or centroid, got {self.router!r}")
        if self.segmentation not in ("surprisal", "blocks", "sentences"):
            raise ValueError(f"segmentation must be surprisal, blocks or sentences, got {self.segmentation!r}")
        if self.prefill not in ("auto", "streaming", "exact"):
            raise ValueError(f"prefill must be auto, streaming or exact, got {self.prefill!r}")

    def budget_cells(self, n_context: int) -> int:
        """The budget in cells for a context of ``n_context`` tokens, rounded up to the allocation granularity."""
        cells = int(self.kv_budget) if self.kv_budget > 1 else int(np.ceil(self.kv_budget * n_context))
        g = self.cell_granularity
        return max(g, -(-cells // g) * g)


@dataclass
class BaselineConfig:
    """Parameters of the baseline policies (the device budget and sinks come from ``SekvConfig``: every policy
    of a comparison takes the same ``kv_budget`` in cells of the managed cache).

    recent_share: share of the budget the eviction baselines keep as a recent window (H2O: the other part holds the
        heavy hitters; StreamingLLM: everything but the sinks is the window, this is not used).
    evict_batch: tokens evicted at once when the cache is full during decode (1 = the paper's per-step eviction;
        larger batches cut the per-step host work, the kept set differs only in the last few choices).
    obs_window: SnapKV's observation window, the last prompt tokens whose queries vote.
    pool_kernel: SnapKV's pooling (average over neighbouring positions) kernel size, odd.
    block: Quest's page size in tokens (the routing unit).
    chunk_size: ChunkKV's chunk length in tokens.
    pyramid_beta: PyramidKV's slope: the top layer keeps 1/beta of the mean per-layer budget.
    """

    recent_share: float = 0.5
    evict_batch: int = 16
    obs_window: int = 32
    pool_kernel: int = 7
    block: int = 32
    chunk_size: int = 10
    pyramid_beta: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.recent_share < 1:
            raise ValueError(f"recent_share must be in (0, 1), got {self.recent_share}")
        if self.evict_batch < 1 or self.obs_window < 1 or self.block < 1:
            raise ValueError(f"evict_batch, obs_window and block must be >= 1, got {self.evict_batch}, "
                             f"{self.obs_window}, {self.block}")
        if self.chunk_size < 1 or self.pyramid_beta < 1:
            raise ValueError(f"chunk_size and pyramid_beta must be >= 1, got {self.chunk_size}, {self.pyramid_beta}")
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be a positive odd number, got {self.pool_kernel}")
