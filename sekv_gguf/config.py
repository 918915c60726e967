"""Configuration dataclasses, validated in ``__post_init__``: how a context is created (``ContextConfig``), how a
device budget is shared (``BudgetConfig``, every policy), SeKV's own parameters (``SekvConfig``). Each baseline's
parameters live in a dataclass in its own file (``sekv_gguf.policies``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType

from .endpoints import parse_endpoints

# K/V cache element types (llama.cpp's -ctk / -ctv names): f32 and f16 rows are numbers, q8_0 and q4_0 rows are
# ggml blocks the engine reads and writes through gguf-py's quantizers (``sekv_gguf.kv_codec``; docs/quantized-kv.md)
KV_TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
            "q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}

UNQUANTIZED_KV_TYPES = ("f32", "f16")  # the others are block-quantized

# the training-free span scores of ``sekv_gguf.router.ROUTERS``
TRAINING_FREE_SCORES = ("index", "mass", "summary", "centroid", "bound")

# how span rows are kept in the host tier where factors would not be smaller (``SekvConfig.host_format``)
HOST_FORMATS = ("auto", "f16", "q8", "q4")
# how the routing index keeps its block keys (``SekvConfig.index_format``)
INDEX_FORMATS = ("q8", "f16")
INDEX_Q8_MAX = 127  # largest int8 code of a q8 block key

MIB = 1 << 20  # bytes in a MiB


def cache_root() -> Path:
    """Where fetched models, build and capture caches live: ``$SEKV_CACHE`` or ``~/.cache/sekv_gguf``."""
    return Path(os.environ.get("SEKV_CACHE", Path.home() / ".cache" / "sekv_gguf"))

MAX_PROBES = 256  # query probes one decode can capture (the hook's SEKV_MAX_PROBES)
CELL_GRANULARITY = 256  # llama.cpp allocates KV cells in multiples of this


def round_cells(n: int, granularity: int = CELL_GRANULARITY) -> int:
    """``n`` cells rounded up to llama.cpp's allocation granularity (at least one granule)."""
    return max(granularity, -(-int(n) // granularity) * granularity)


def setting(default: Any, text: str, **meta: Any) -> Any:
    """A dataclass field with its description in ``metadata["help"]`` (and ``choices`` where the values are named):
    the one place it is written, read by the CLI's flags (``sekv_gguf.cli``)."""
    return field(default=default, metadata={"help": text, **meta})


THREADS_ENV = "SEKV_THREADS"  # threads when ContextConfig.n_threads is 0 (the tests set every core)


@dataclass
class ContextConfig:
    """How a llama_context is created for sekv_gguf (each field's ``help`` metadata says what it sets)."""

    n_ctx: int = setting(4096, "cells of the (base) KV cache; llama.cpp rounds it up to a multiple of 256")
    n_batch: int = setting(512, "most tokens per llama_decode call")
    n_ubatch: int = setting(512, "most tokens per compute step")
    logits_mib: float = setting(128.0, "most MiB of f32 logits one llama_decode returns: a decode that wants every "
                                       "token's logits (surprisal) goes in pieces of that many tokens (on Gemma's "
                                       "262K vocabulary 1 MiB a token: 128 tokens), and llama.cpp reserves its "
                                       "compute and output buffers for that many rows, not for the whole batch; 0: "
                                       "the whole batch")
    n_threads: int = setting(0, "CPU threads (0: $SEKV_THREADS if set, else half the logical cores, at least one — "
                                "llama-cpp-python's default: physical cores on SMT machines, and room for the rest of "
                                "a desktop; measured in docs/reliability.md)")
    poll: int | None = setting(None, "polling level (0..100) of the CPU worker threads between graph nodes; None: "
                                     "ggml's default (50, they spin: fastest alone, stalls when another busy process "
                                     "wants the cores); 0: they sleep (see docs/reliability.md)")
    flash_attn: bool = setting(True, "required for per-cell V rows (with it off V is stored transposed; the hook "
                                     "handles that, slower) and by llama.cpp for a quantized V cache")
    swa_full: bool = setting(False, "keep False so that iSWA models (Gemma 3) allocate a window-sized SWA cache, not "
                                    "a full one")
    type_k: str = setting("f16", "K cache element type (llama.cpp's -ctk); q8_0 / q4_0 need head sizes that are a "
                                 "multiple of 32", choices=tuple(KV_TYPES))
    type_v: str = setting("f16", "V cache element type (llama.cpp's -ctv); q8_0 / q4_0 need flash_attn and head sizes "
                                 "that are a multiple of 32", choices=tuple(KV_TYPES))
    n_gpu_layers: int = setting(-1, "layers offloaded to the GPU or the RPC servers (-1: all; ignored by a CPU build "
                                    "without them)")
    rpc_servers: tuple[str, ...] = setting((), "HOST:PORT of llama.cpp RPC servers (ggml-rpc-server) whose devices "
                                               "take the offloaded layers (and their KV cache) before this machine's "
                                               "GPUs; empty: none (see sekv_gguf.rpc); never expose such a server to "
                                               "an open network")
    rpc_timeout_s: float = setting(300.0, "an RPC call that gets no answer for this many seconds fails (0: wait "
                                          "forever)")
    repack_weights: bool = setting(True, "let the CPU backend repack quantized weights for its faster kernels "
                                         "(llama.cpp's default); off, the local CPU computes with the same kernels as "
                                         "an RPC server's CPU, bit for bit")
    verbose: bool = setting(False, "let llama.cpp log to stderr")

    def __post_init__(self) -> None:
        if self.rpc_servers:
            self.rpc_servers = parse_endpoints(self.rpc_servers)
        else:
            self.rpc_servers = ()
        if not self.rpc_timeout_s >= 0:
            raise ValueError(f"rpc_timeout_s must be >= 0, got {self.rpc_timeout_s}")
        if self.n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {self.n_ctx}")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise ValueError(f"n_batch and n_ubatch must be >= 1, got {self.n_batch}, {self.n_ubatch}")
        if not self.logits_mib >= 0:
            raise ValueError(f"logits_mib must be >= 0, got {self.logits_mib}")
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must not exceed n_batch ({self.n_batch})")
        if self.n_threads < 0:
            raise ValueError(f"n_threads must be >= 0, got {self.n_threads}")
        if self.poll is not None and not 0 <= self.poll <= 100:
            raise ValueError(f"poll must be in [0, 100] (or None), got {self.poll}")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ValueError(f"{name} must be one of the K/V cache types {', '.join(KV_TYPES)}, got "
                                 f"{getattr(self, name)!r}")
        if self.type_v not in UNQUANTIZED_KV_TYPES and not self.flash_attn:
            raise ValueError(f"type_v {self.type_v} (a quantized V cache) needs flash_attn=True: llama.cpp stores V "
                             "transposed without it, which block types cannot be")

    @property
    def threads(self) -> int:
        """``n_threads``, or $SEKV_THREADS when it is 0, or half the logical cores (at least one)."""
        if self.n_threads:
            return self.n_threads
        env = os.environ.get(THREADS_ENV, "")
        if env.isdigit() and int(env) > 0:
            return int(env)
        return max((os.cpu_count() or 1) // 2, 1)

    def sized(self, n_ctx: int, chunk: int) -> "ContextConfig":
        """This config with ``n_ctx`` cells and batches (and ubatches) of ``chunk`` tokens (what a policy's context
        needs)."""
        return replace(self, n_ctx=n_ctx, n_batch=chunk, n_ubatch=chunk)


@dataclass
class BudgetConfig:
    """The device budget every policy of a comparison shares (cells of the managed cache; each field's ``help``
    metadata says what it sets)."""

    kv_budget: float = setting(0.25, "device cells: an int, or a fraction (0, 1] of prompt + generation; rounded up "
                                     "to cell_granularity (llama.cpp allocates cells in multiples of it)")
    n_sink: int = setting(4, "first tokens kept resident (attention sinks)")
    window: int = setting(0, "recent tokens kept resident by the policies that keep a window (0: window_share of the "
                             "budget, at most window_max)")
    window_max: int = setting(256, "most recent tokens a window of window_share keeps")
    window_share: float = setting(0.125, "the window's share of the budget when window is 0")
    chunk: int = setting(256, "prompt tokens per llama_decode; while streaming at most chunk_share of the budget, so "
                              "that a chunk fits beside what stays resident (BudgetConfig.stream_chunk)")
    chunk_share: float = setting(0.125, "most of the budget a streamed prompt chunk may take")
    cell_granularity: int = setting(CELL_GRANULARITY, "cells the budget is rounded up to a multiple of")

    def __post_init__(self) -> None:
        if self.kv_budget <= 0:
            raise ValueError(f"kv_budget must be > 0 (cells, or a fraction of the context), got {self.kv_budget}")
        if not float(self.kv_budget).is_integer() and self.kv_budget > 1:
            raise ValueError(f"kv_budget above 1 must be a whole number of cells, got {self.kv_budget}")
        if self.n_sink < 1:
            raise ValueError(f"n_sink must be >= 1, got {self.n_sink}")
        if self.window < 0 or self.window_max < 1:
            raise ValueError(f"window must be >= 0 and window_max >= 1, got {self.window}, {self.window_max}")
        if not 0 < self.window_share < 1 or not 0 < self.chunk_share <= 1:
            raise ValueError(f"window_share must be in (0, 1) and chunk_share in (0, 1], got {self.window_share}, "
                             f"{self.chunk_share}")
        if self.chunk < 1 or self.cell_granularity < 1:
            raise ValueError(f"chunk and cell_granularity must be >= 1, got {self.chunk}, {self.cell_granularity}")

    def cells(self, n_context: int) -> int:
        """The budget in cells for a context of ``n_context`` tokens, rounded up to the allocation granularity."""
        cells = int(self.kv_budget) if self.kv_budget > 1 else math.ceil(self.kv_budget * n_context)
        return round_cells(cells, self.cell_granularity)

    def stream_chunk(self, cells: int, share: float | None = None) -> int:
        """Prompt tokens per decode in a budget of ``cells``: ``chunk``, at most ``share`` (default
        ``chunk_share``) of the budget."""
        return min(self.chunk, max(int(cells * (self.chunk_share if share is None else share)), 1))

    def recent_window(self, cells: int) -> int:
        """Recent tokens kept resident in a budget of ``cells``: ``window``, or ``window_share`` of the budget (at
        most ``window_max``)."""
        return self.window or min(self.window_max, int(cells * self.window_share))


@dataclass
class SekvConfig:
    """SeKV's parameters (docs/design.md §1; each field's ``help`` metadata says what it sets); the device budget is a
    ``BudgetConfig``. The measurements behind these choices are in docs/results.md."""

    zoom_share: float = setting(0.25, "share of the budget reserved for rebuilt (zoomed) span tokens, per layer")
    anchor_alpha: float = setting(1.0, "a token is an anchor when its surprisal exceeds mean + alpha * std of the "
                                       "surprisal seen so far")
    anchor_share: float = setting(0.05, "most cells anchors may take, as a share of the budget (the cap)")
    spread_anchors: str = setting(
        "none", 'how a streamed memory (no exact prefill) spends the anchor cap: "none" (first come, first served), '
                '"share" (the tokens before position p hold at most p / n_context of the cap), "quantile" (an anchor '
                "must also be among the cap / n_context most surprising of the tokens seen so far, at most twice the "
                "share) — the exact prefill takes the cap's most surprising tokens of the whole prompt at once",
        choices=("none", "share", "quantile"))
    span_min: int = setting(32, "shortest span: runs between anchors are cut at surprisal change points into spans of "
                                "span_min..span_max tokens (a shorter tail waits in the window for more tokens)")
    span_max: int = setting(64, "longest span (see span_min)")
    signal: str = setting(
        "rarity", 'the segmentation signal of a streamed prompt. "rarity": each token\'s self-information within the '
                  "text seen so far, log((n + 1) / (c + 1)) for a token seen c times among n (no logits: the context "
                  'reserves one row); "surprisal": -log p of each prompt token (a logits row over the vocabulary per '
                  'token: on Gemma 3 about half the prefill time and 256 MiB of logits buffers); prefill "exact" (the '
                  "reference) always takes surprisal",
        choices=("surprisal", "rarity"))
    span_cuts: str = setting(
        "sentence", 'where a span may end. "sentence": at the largest surprisal jump among the cuts right after a '
                    "sentence end (a token ending in . ! ? or holding a line break) in its length range, anywhere "
                    'only where the range holds none; "surprisal": at the largest jump anywhere — which cuts a '
                    'sentence at its most surprising word, typically a name (the key of a "the number for KEY is '
                    'VALUE" sentence, leaving "for" in one span and "KEY is VALUE" in the next: zoomed alone, a value '
                    "loses what it belongs to)",
        choices=("sentence", "surprisal"))
    energy: float = setting(0.999, "share of a span's squared Frobenius norm the low-rank factors keep (per layer, "
                                   "for K and for V); when that rank exceeds r_max or its fp16 factors would not be "
                                   "smaller than the raw rows, the raw rows are kept instead, so the relative "
                                   "reconstruction error never exceeds sqrt(1 - energy)")
    energy_v: float | None = setting(None, "the same for V (None: energy); values need no retrieval precision, keys "
                                           "do")
    r_max: int = setting(64, "largest rank stored")
    host_format: str = setting(
        "auto", "how span rows are stored where factors would not be smaller: \"auto\" (\"q4\", or \"q8\" on a q8_0 "
                "cache: no coarser than the cache's own rows), \"q8\" (int8 codes, one f32 scale per "
              'channel for K and per token for V: about half the bytes of "f16"), "q4" (4-bit codes with an f16 '
              "scale and zero per channel for K and per token and 32 channels for V: about 0.3 of \"f16\"; int8 "
              'where the head size is odd) or "f16" (as the device holds them: with energy 1 the host tier is then '
              "exact; on a q8_0 / q4_0 cache its own blocks, keys with an f16 copy for scoring)",
        choices=HOST_FORMATS)
    prefill: str = setting(
        "auto", '"auto": streamed through the budget context (device cells never above the budget, no full-size '
                "context), chunk by chunk (each chunk's decodes routed inside themselves: chunk_routing), then routed "
                "with the prompt's last query and its tail decoded again over "
                "the zoomed spans (refresh_tokens, and on iSWA models the sliding window before them: "
                'refresh_window); "streaming": the same (its older name); "exact": full attention over the whole '
                "prompt in a temporary full-size context (the prompt's full KV beside the budget), then "
                "segmentation and compression (the reference)",
        choices=("auto", "streaming", "exact"))
    router: str = setting(
        "index", 'the training-free score when no trained router is given: "index" (two-stage: the block index '
                 "proposes, the resident spans and verify_candidates others are ordered by exact mass; bounded "
                 "reads), \"mass\" (each span's attention mass logsumexp_t q·k_t from its host factors: reads every "
                 'host row), "summary" (the summary row\'s logit q·k̄ + log|S|), "centroid" (q·k̄) or "bound" '
                 "(Quest's channel-wise bound); see sekv_gguf.router; a trained router (TrainedRouter.from_file) "
                 "replaces it",
        choices=TRAINING_FREE_SCORES)
    verify_candidates: int = setting(16, "for the two-stage routers (index, trained), the non-resident spans they "
                                         "propose first per layer whose exact attention mass (from the host factors) "
                                         "then orders them with the resident ones; 0: the proposal alone")
    prompt_scan: bool = setting(True, "the routing right after a prompt (its question has just arrived; the first, "
                                      "decisive choice) ranks every span by exact mass instead of a two-stage "
                                      "router's proposal: one pass over the host rows per prompt, as the prefill that "
                                      "wrote them made; decode-step routing keeps its bounded reads")
    block_tokens: int = setting(16, "tokens per block of the routing index (one mean key per block, span, layer and "
                                    "KV head)")
    index_format: str = setting("q8", 'how the routing index keeps its block keys: "q8" (int8 codes, an f16 scale per '
                                      'block and KV head: half the bytes) or "f16"', choices=INDEX_FORMATS)
    prompt_reroute: bool = setting(
        False, "the tail refresh of a streamed prompt captures a query probe on (nearly) each of its tokens, routes "
               "once more by those probes (the question's own tokens, as SnapKV's observation window) and decodes "
               "the tail again if that changed a zoom; off: the prompt's last query alone decides (measured on the "
               "table task: docs/results.md)")
    prompt_consensus: float = setting(
        0.0, "share of the zoom slots that a prompt's routing gives, in every layer, to the spans that the most "
             "layers rank among what they would zoom alone (a cross-layer vote; the rest: each layer's own best); "
             "0: each layer alone")
    lexical_share: float = setting(
        0.25, "share of every layer's zoom slots given to the spans that share rare token n-grams with the question "
             "(the last lexical_cue tokens of a prompt or turn), held through the answer's decode steps: a key, an "
             "id or a name the question repeats finds the span that holds it whatever the attention says; 0: off")
    lexical_ngram: int = setting(2, "tokens per n-gram the lexical match (lexical_share) compares")
    lexical_cue: int = setting(64, "how many of a prompt's or turn's last tokens are the lexical match's question")
    lexical_max_spans: int = setting(8, "an n-gram found in more spans than this is not rare: the lexical match "
                                        "ignores it")
    lexical_min_ratio: float = setting(
        0.0, "the lexical pins keep only spans scoring at least this share of the best span's score (a question's "
             "template words, shared by every same-shaped sentence, then pin only the one its key names); 0: every "
             "positive score")
    lexical_neighbours: int = setting(
        0, "each lexical pin brings the spans this many places before and after it (its sentence's context, as full "
           "attention reads it), right after it in the pins' order; 0: the pinned spans alone")
    route_every: int = setting(2, "decode steps between routings (1: every step); zoomed spans stay resident between")
    max_new_zooms: int = setting(2, "most spans rebuilt per layer per decode step (the first routing after prefill "
                                    "has no limit); bounds the host->device traffic of a step, the zoom cache keeps "
                                    "what is already resident")
    zoom_hold: float = setting(1.0, "nats added to a resident span's exact log mass when a two-stage router ranks it "
                                    "in a step's or chunk's routing: another span displaces it only with more than "
                                    "e^zoom_hold times its mass (fewer rebuilds; 0: none)")
    zoom_lag_refresh: bool = setting(True, "re-decode the last refresh_tokens prompt tokens after the first routing, "
                                           "so the end of the prompt (typically the question) and the first "
                                           "generated token see the zoomed spans, not only summaries")
    refresh_tokens: int = setting(32, "prompt tokens zoom_lag_refresh (and a turn's tail refresh) decodes again")
    refresh_window: bool = setting(
        True, "on a model with a sliding-window cache (iSWA: Gemma 2/3), the tail refresh of a streamed prompt "
              "decodes the last token's whole sliding window again (n_swa tokens, at least refresh_tokens; the "
              "context's ubatch is the smallest whose SWA cache still holds the window before them): the local "
              "layers' rows the question reads are then computed from global layers that read the zoomed spans, "
              "not summaries (where a streamed prefill's error lives: docs/results.md, the oracle)")
    turn_tokens: int = setting(
        64, "an append of at most this many tokens into a memory that already holds tokens is a *turn* (a "
            "conversation's next message, whose time to first token a user waits for): it is decoded with logits "
            "for its last token only (its first token's surprisal comes from the previous logits, the others take "
            "the mean surprisal seen so far) instead of a logits row per token; its tail is refreshed like a "
            "prompt's: the question's own tokens must read the spans it zoomed; 0: every append is scored")
    turn_routing: str = setting(
        "layer", 'how a turn reaches the spans its question needs. "layer": one decode; inside it, each hooked layer '
                 "routes with that layer's query of this decode and zooms before its attention reads the cache (the "
                 "hook's layer callback), so every token of the turn reads the zoomed spans without a second pass; "
                 'where the hook refuses the callback (the context has an eval callback of its own) it falls back '
                 'to "refresh": decode, '
                 "route with the captured queries, decode the turn again (the tail refresh of zoom_lag_refresh)",
        choices=("layer", "refresh"))
    turn_probes: bool = setting(
        False, 'a turn routed inside its decode (turn_routing="layer") ranks the spans, per layer, by the queries of '
               "(nearly) each of its tokens, each span by its best (the question's key words read the sentence that "
               "holds the key, as the chunks' probes do; where the callback is refused, the two-pass turn routes by "
               "the chunk_probes its decode captured); off: the turn's last token's query alone")
    chunk_routing: str = setting(
        "layer", "how a streamed prompt's chunks reach the spans already compressed. \"layer\": each llama_decode of "
                 "a chunk (n_outputs tokens when surprisal is scored) routes inside itself, each hooked layer with "
                 "that decode's queries (chunk_probes) before its attention (the layer callback, new zooms capped at "
                 "max_new_zooms per layer); where the callback is unsupported, a routing after each chunk serves the "
                 "next (lagged); \"none\": they read summaries and what the zoom slots hold, routed once after the "
                 "last chunk",
        choices=("none", "layer"))
    chunk_lexical_share: float = setting(
        0.6, "share of every layer's zoom slots that a streamed chunk's routing (chunk_routing) gives first to the "
             "spans sharing rare token n-grams with the chunk itself (lexical pins, the chunk as the cue): a sentence "
             "that repeats an earlier one's rare words (a key, a name, a template) is computed reading that "
             "sentence's rows, as full attention's copying heads read them, not its summary; 0: off")
    summary_calibration: str = setting(
        "off", "each new span's summary row, per layer, fitted to the queries the hook captured in the last decode "
               "(a streamed chunk's probes: tokens after the span): its value the mean attention-weighted value "
               "sum_t softmax_t(q.k_t) v_t and its bias the mean over those queries and heads of logsumexp_t q.k_t - "
               "q.k_summary (the mass the one row must carry for the span's tokens; log|S| where the keys are equal, "
               "more by Jensen's gap where they differ). \"prefill\": the fitted bias while a prompt's chunks stream "
               "(the rows they compute), log|S| after (decode steps and turns); \"always\": the fitted bias "
               "throughout; \"off\": log|S| and the weighted mean value",
        choices=("off", "prefill", "always"))
    summary_calibration_parts: str = setting(
        "both", "what summary_calibration fits: \"both\" the bias and the value, \"bias\" the bias alone (the value "
                "stays the weighted mean, so with \"prefill\" decode steps and turns read the same rows as \"off\"), "
                "\"value\" the value alone (the bias stays log|S|)",
        choices=("both", "bias", "value"))
    summary_bias_quantile: float | None = setting(
        None, "how summary_calibration's bias is taken over the probes' queries and heads: None the mean of their "
              "gaps logsumexp_t q.k_t - q.k_summary; a number in [0, 1] that quantile of them (low: the mass the heads "
              "that read the span evenly need, not the mean over heads that read it sharply)")
    summary_bias_share: float = setting(
        1.0, "share of each batch of new spans that get summary_calibration's fitted bias: those the probes read most "
             "(each span's best share, over the probes and heads, of the attention the batch's spans get), rounded up; "
             "the rest keep log|S| (a needle the chunk reads keeps the mass it needs, running text the plain bias); "
             "1: every span")
    summary_bias_heads: bool = setting(
        False, "summary_calibration's bias fitted per query head (the mean over the probes of each head's gap), not "
               "one number per span and layer: the per-layer bias holds the mean over heads and the hook's per-head "
               "bias (patch 0008) each head's difference from it, so each hooked layer's KQ mask becomes one per "
               "head (n_head times the mask's bytes in the compute buffer). Needs summary_calibration \"prefill\" "
               "and its bias fitted (summary_calibration_parts both or bias)")
    chunk_probes: int = setting(16, "how many of a chunk decode's tokens route it (chunk_routing): the queries of "
                                    "that many tokens, evenly spaced and ending at its last (captured in the graph), "
                                    "score every span by its best probe, so spans any part of the chunk reads are "
                                    "zoomed before its attention; 1: the last token alone (fewer where the model's "
                                    "query heads times the probes exceed what the native scorer takes at once)")
    layer_steps: int = setting(0, "the first this many decode steps after a prompt or turn are each routed inside "
                                  'their own decode (as step_routing="layer" with route_every=1: the answer\'s first '
                                  "tokens read what their own queries choose); later steps as step_routing and "
                                  "route_every say; 0: none")
    step_routing: str = setting(
        "layer", "when a decode step's routing (every route_every steps) takes effect. \"lagged\": after the step, "
                  "with its query, for the steps that follow (each step reads what an earlier query chose); "
                  "\"layer\": inside the step's own decode, each hooked layer with this step's query before its "
                  'attention (the layer callback, as turn_routing; where it is unsupported, "lagged")',
        choices=("lagged", "layer"))
    elastic_window: bool = setting(True, "give the recent window every cell that sinks, anchors, summary rows and the "
                                         "zoom slots do not hold (less the next decode's tokens and a span's worth of "
                                         "pending tokens); it shrinks back as spans arrive, never below the budget's "
                                         "fixed window; off: the window is the budget's fixed window")
    compress_when_fits: bool = setting(False, "compress even when prompt + generation fit the budget (for exactness "
                                              "checks and studies; by default such a run is plain full KV)")

    def __post_init__(self) -> None:
        if not 0 < self.zoom_share < 1:
            raise ValueError(f"zoom_share must be in (0, 1), got {self.zoom_share}")
        if not 0 <= self.anchor_share < 1:
            raise ValueError(f"anchor_share must be in [0, 1), got {self.anchor_share}")
        if not 1 <= self.span_min <= self.span_max:
            raise ValueError(f"need 1 <= span_min <= span_max, got {self.span_min}, {self.span_max}")
        if not 0 < self.energy <= 1:
            raise ValueError(f"energy must be in (0, 1], got {self.energy}")
        if self.signal not in ("surprisal", "rarity"):
            raise ValueError(f"signal must be surprisal or rarity, got {self.signal!r}")
        if self.refresh_tokens < 1:
            raise ValueError(f"refresh_tokens must be >= 1, got {self.refresh_tokens}")
        if self.turn_tokens < 0:
            raise ValueError(f"turn_tokens must be >= 0, got {self.turn_tokens}")
        if not 0 <= self.prompt_consensus <= 1:
            raise ValueError(f"prompt_consensus must be in [0, 1], got {self.prompt_consensus}")
        if not 0 <= self.lexical_share <= 1:
            raise ValueError(f"lexical_share must be in [0, 1], got {self.lexical_share}")
        if not 0 <= self.chunk_lexical_share <= 1:
            raise ValueError(f"chunk_lexical_share must be in [0, 1], got {self.chunk_lexical_share}")
        if not 0 <= self.lexical_min_ratio <= 1:
            raise ValueError(f"lexical_min_ratio must be in [0, 1], got {self.lexical_min_ratio}")
        if not 1 <= self.lexical_ngram <= 4:
            raise ValueError(f"lexical_ngram must be in 1..4, got {self.lexical_ngram}")
        if self.lexical_neighbours < 0:
            raise ValueError(f"lexical_neighbours must be >= 0, got {self.lexical_neighbours}")
        for name in ("route_every", "max_new_zooms", "lexical_cue", "lexical_max_spans"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.energy_v is not None and not 0 < self.energy_v <= 1:
            raise ValueError(f"energy_v must be in (0, 1], got {self.energy_v}")
        if self.turn_routing not in ("layer", "refresh"):
            raise ValueError(f"turn_routing must be layer or refresh, got {self.turn_routing!r}")
        if not 1 <= self.chunk_probes <= MAX_PROBES:
            raise ValueError(f"chunk_probes must be in 1..{MAX_PROBES}, got {self.chunk_probes}")
        if self.chunk_routing not in ("none", "layer"):
            raise ValueError(f"chunk_routing must be none or layer, got {self.chunk_routing!r}")
        if self.step_routing not in ("lagged", "layer"):
            raise ValueError(f"step_routing must be lagged or layer, got {self.step_routing!r}")
        if self.span_cuts not in ("sentence", "surprisal"):
            raise ValueError(f"span_cuts must be sentence or surprisal, got {self.span_cuts!r}")
        if self.spread_anchors not in ("none", "share", "quantile"):
            raise ValueError(f"spread_anchors must be none, share or quantile, got {self.spread_anchors!r}")
        if self.summary_calibration not in ("off", "prefill", "always"):
            raise ValueError(f"summary_calibration must be off, prefill or always, got {self.summary_calibration!r}")
        if self.summary_calibration_parts not in ("both", "bias", "value"):
            raise ValueError("summary_calibration_parts must be both, bias or value, got "
                             f"{self.summary_calibration_parts!r}")
        if self.summary_bias_quantile is not None and not 0 <= self.summary_bias_quantile <= 1:
            raise ValueError(f"summary_bias_quantile must be in [0, 1] or None, got {self.summary_bias_quantile}")
        if not 0 < self.summary_bias_share <= 1:
            raise ValueError(f"summary_bias_share must be in (0, 1], got {self.summary_bias_share}")
        if self.summary_bias_heads and (self.summary_calibration != "prefill" or self.summary_calibration_parts == "value"):
            raise ValueError("summary_bias_heads needs summary_calibration prefill (the per-head bias is on the device "
                             "only while a prompt streams) with its bias fitted (summary_calibration_parts both or "
                             f"bias), got {self.summary_calibration!r} / {self.summary_calibration_parts!r}")
        if self.host_format not in HOST_FORMATS:
            raise ValueError(f"host_format must be one of {', '.join(HOST_FORMATS)}, got {self.host_format!r}")
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.index_format not in INDEX_FORMATS:
            raise ValueError(f"index_format must be one of {', '.join(INDEX_FORMATS)}, got {self.index_format!r}")
        if self.r_max < 1:
            raise ValueError(f"r_max must be >= 1, got {self.r_max}")
        if self.layer_steps < 0:
            raise ValueError(f"layer_steps must be >= 0, got {self.layer_steps}")
        if not 0 <= self.zoom_hold < math.inf:
            raise ValueError(f"zoom_hold must be a finite number >= 0, got {self.zoom_hold}")
        if self.verify_candidates < 0:
            raise ValueError(f"verify_candidates must be >= 0, got {self.verify_candidates}")
        if self.router not in TRAINING_FREE_SCORES:
            raise ValueError(f"router must be one of {', '.join(TRAINING_FREE_SCORES)}, got {self.router!r}")
        if self.prefill not in ("auto", "streaming", "exact"):
            raise ValueError(f"prefill must be auto, streaming or exact, got {self.prefill!r}")
