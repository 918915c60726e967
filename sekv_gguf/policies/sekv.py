"""SeKV: a fixed budget of device cells holds sinks, anchors, one summary row per compressed span, zoom slots and a
recent window; every compressed span keeps low-rank K/V factors in host memory and is rebuilt into the zoom slots
of a layer when the router picks it for that layer. Nothing is thrown away.

Device layout (cells of the hooked cache, all below the budget):
  sinks      the first ``n_sink`` tokens
  anchors    high-surprisal tokens (capped), at full resolution
  summaries  one cell per span at the span's last position, bias ``+log|S|`` (``-inf`` in layers where it is zoomed)
  zoom slots ``zoom_share`` of the budget, claimed at position 0; per layer they hold that layer's zoomed spans
             (bias 0) or nothing (bias ``-inf``)                                       (``zoom.ZoomSlots``)
  window     the newest tokens (plus a short pending tail waiting to form a span)     (``window.Window``)
What SeKV remembers is one ``SekvMemory`` (``sekv_memory.py``: the state and the operations that change it); this
policy orchestrates the budget (``budget.BudgetPlan``), the prefill (``prefill.py``), when to route
(``span_routing.py``: after a prompt or turn, then every ``route_every`` steps) and truncation (``rollback.py``).
Baselines compose the same engine with another segmenter, router and no summary rows (``quest``, ``sentencekv``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable

import llama_cpp
import numpy as np

from ..config import BudgetConfig, ContextConfig, SekvConfig
from ..errors import AdapterError, BudgetError
from ..hook import KVInfo
from ..router import Router, probes_that_fit, training_free
from ..segment import RaritySegmenter, Segmenter
from ..session import Session, swa_ubatch
from ..span_store import SpanStore
from ..stats import PolicyStats
from .base import Policy
from .budget import BudgetPlan
from .lexical import SpanNgrams, lexical_pins
from .prefill import chunk_starts, exact_key, exact_pass, prefill_exact, refresh_tail, wants_exact
from .rollback import truncate
from .sekv_memory import SekvMemory
from .span_routing import SpanRouting

ONE_ROW_MIB = 1e-9  # a ContextConfig.logits_mib that leaves llama.cpp one logits row (session.output_rows)


class SekvPolicy(Policy):
    """SeKV over one budget-sized context (see the module docstring). ``segmenter`` and ``summary_rows`` let the
    baselines compose the engine differently (default: surprisal segmentation, summary rows in attention)."""

    name = "sekv"
    Config = SekvConfig
    takes_router = True
    stats_key = "sekv"  # where ``stats`` reports the engine's statistics ("baseline" for the baselines on it)
    memory: SekvMemory

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: SekvConfig | None = None, router: Router | None = None,
                 observer: Callable[[Policy], None] | None = None, *, segmenter: Segmenter | None = None,
                 summary_rows: bool = True):
        self.config = config = params or SekvConfig()
        router = router or training_free(config)
        self.plan = plan = BudgetPlan.of(budget or BudgetConfig(), n_context, config.zoom_share, config.anchor_share,
                                         config.compress_when_fits)
        if not plan.fits:
            max_spans = -(-max(n_context - plan.config.n_sink - plan.window, 0) // config.span_min)
            plan.check({"sinks": plan.config.n_sink, "anchors": plan.anchor_cap,
                        "summaries": max_spans if summary_rows else 0, "zoom": plan.n_zoom,
                        "window": plan.window + config.span_min + config.span_max, "chunk": plan.chunk},
                       " (or a larger span_min / smaller zoom_share)")
        self.model, self.ctx_config = model, ctx_config
        # a streamed prompt's tail refresh; on iSWA models the last token's whole sliding window, whose window
        # before it the SWA cache must still hold: the ubatch is the smallest that sizes that cache so (the chunks
        # stay plan.chunk tokens; the compute buffer grows with the ubatch, the SWA cache by its 256-cell pad)
        n_swa = int(llama_cpp.llama_model_n_swa(model.model)) if config.refresh_window else 0
        self.tail_refresh = min(max(config.refresh_tokens, n_swa), max(plan.cells, config.refresh_tokens))
        ubatch = swa_ubatch(n_swa, self.tail_refresh, plan.chunk) if n_swa else plan.chunk
        if segmenter is None:
            rarity = config.signal == "rarity" and config.prefill != "exact"  # the reference takes surprisal
            segmenter = (RaritySegmenter if rarity else Segmenter)(config, plan.anchor_cap)
        sized = ctx_config.sized(plan.cells, ubatch)
        if not segmenter.scored:  # no decode asks for more than the last token's logits: reserve one row
            sized = replace(sized, logits_mib=ONE_ROW_MIB)
        super().__init__(Session(model, sized), observer)
        hook = self.session.hook
        if hook.info.kv_size != plan.cells:
            raise BudgetError(f"llama.cpp allocated {hook.info.kv_size} cells for a budget of {plan.cells}")
        layer = hook.layers[0]
        if hasattr(router, "check"):  # a trained router must fit this cache's layers and heads
            router.check(hook.model_layers, layer.n_head, layer.n_head_kv, layer.head_dim_k)
            if hook.info.rot_k:
                raise AdapterError(f"a trained router adapter scores keys in the model's own basis, and this "
                                  f"{KVInfo.type_name(hook.info.type_k)} K cache holds them Hadamard-rotated "
                                  "(llama.cpp's attn_rot_k): use type_k f16 or a training-free router")
        hook.enable_query_capture()
        if config.chunk_routing == "layer" and router.takes_probes:
            hook.set_query_probes(probes_that_fit(config.chunk_probes, layer.n_head, layer.n_head_kv, layer.head_dim_k))
        if not plan.fits:
            hook.enable_bias()
            if config.summary_bias_heads and summary_rows:
                hook.enable_head_bias()
        self.routing = SpanRouting(router, config)
        store = SpanStore(hook.info.n_layer_kv, layer.n_head_kv, layer.head_dim_k, config, router.sketch,
                          router.reads, kv_types=(hook.info.type_k, hook.info.type_v))
        self.memory = SekvMemory(self.session, plan, config, segmenter, store,
                                 n_context, summary_rows, on_irreversible=self.irreversible)
        self._init_done()

    @property
    def router(self) -> Router:
        return self.routing.router

    # -- decoding ----------------------------------------------------------------------------------------------

    def _append(self, tokens: list[int]) -> np.ndarray:
        """Stream ``tokens`` through the budget context (compressing what leaves the window), then route and
        refresh the tail; an exact prefill when asked for and the memory is empty. A turn (``turn_tokens``) is
        decoded for its last logits only (no surprisal rows), routed inside that decode (``turn_routing``)."""
        cfg, mem = self.config, self.memory
        mem.prompt_step = mem.steps  # the steps after this prompt or turn count from here (layer_steps)
        if not self.tokens and wants_exact(mem, tokens):
            return self._prefill_exact(tokens)
        turn = bool(self.tokens) and len(tokens) <= cfg.turn_tokens
        scored = not self.plan.fits and mem.segmenter.scored
        fill = 0.0
        if scored and turn:
            scored, fill = False, mem.segmenter.mean
        if turn and len(mem.store) and cfg.turn_routing == "layer" and self.routing.layer_callback:
            mem.make_room(len(tokens))
            self._pin(tokens)
            logits = self._turn_in_layers(tokens, scored, fill)
            if logits is not None:
                mem.counters.layer_routed_turns += 1
                self._chunk_done(len(tokens))
                return logits
        starts = chunk_starts(len(tokens), self.plan.chunk, cfg.refresh_tokens)
        routed = not self.plan.fits and not turn and cfg.chunk_routing == "layer"
        ngrams = SpanNgrams(cfg) if routed and cfg.chunk_lexical_share > 0 else None
        every = self.tokens + list(tokens) if ngrams else []  # every token once this prompt is in, by position
        mem.use_fitted_bias(cfg.summary_calibration != "off")  # "prefill": fitted while the prompt streams
        try:
            try:
                for c0, c1 in zip(starts, starts[1:] + [len(tokens)]):
                    mem.make_room(c1 - c0)  # room for the chunk (an elastic window may have filled the budget)
                    if ngrams is not None and len(mem.store):
                        ngrams.extend(every, mem.store.spans)
                        mem.chunk_pins = ngrams.pins(tokens[c0:c1], len(mem.store))  # the chunk as the cue
                    logits = self._decode_chunk(tokens[c0:c1], routed, scored, fill)
                    self._chunk_done(c1)
            finally:
                mem.chunk_pins = []
            if len(mem.store):
                changes = mem.zoom.changes
                self._pin(tokens)
                self.routing.route(mem, kind="prompt", probes=turn and cfg.turn_probes)  # a turn: by its probes
                reroute = cfg.prompt_reroute and not turn and mem.hook.query_probes > 1
                if cfg.zoom_lag_refresh and (reroute or mem.zoom.changes != changes):  # the tail saw other spans
                    if reroute:
                        logits = self._reroute_tail(tokens)
                    else:
                        logits = refresh_tail(mem, tokens, cfg.refresh_tokens if turn else self.tail_refresh)
                    self.notify()
        finally:
            mem.use_fitted_bias(cfg.summary_calibration == "always")  # "prefill": log|S| for what follows
        return logits

    def _turn_in_layers(self, tokens: list[int], scored: bool, fill: float) -> np.ndarray | None:
        """A turn decoded with each layer routing inside the decode (``SpanRouting.in_layers``); with
        ``turn_probes``, by a query probe on (nearly) each of its tokens. Its logits, or None where the hook refuses
        the callback."""
        mem = self.memory

        def decode() -> np.ndarray:
            return mem.decode(tokens, scored, fill)

        if not (self.config.turn_probes and self.router.takes_probes):
            return self.routing.in_layers(mem, decode, "prompt")
        with self._probes_on(len(tokens)):
            return self.routing.in_layers(mem, decode, "prompt", probes=True)

    @contextmanager
    def _probes_on(self, n_tokens: int) -> Iterator[None]:
        """The hook captures a query probe on (nearly) each of the next decodes' ``n_tokens`` tokens (as many as the
        native scorer takes, ``probes_that_fit``); the probe count it had is put back after."""
        hook = self.memory.hook
        layer = hook.layers[0]
        probes = hook.query_probes
        hook.set_query_probes(probes_that_fit(n_tokens, layer.n_head, layer.n_head_kv, layer.head_dim_k))
        try:
            yield
        finally:
            hook.set_query_probes(probes)

    def _pin(self, incoming: list[int]) -> None:
        """``lexical_share``: the memory's lexical pins for this prompt's or turn's routings and the decode steps
        after it, from every token (``self.tokens``, then ``incoming``, the prompt or turn not yet appended)."""
        if self.config.lexical_share > 0:
            tokens = np.asarray(self.tokens + list(incoming), dtype=np.int64)  # [n] every token, in position order
            self.memory.pins = lexical_pins(tokens, self.memory.store.spans, self.config)

    def _reroute_tail(self, tokens: list[int]) -> np.ndarray:
        """``prompt_reroute``: the tail refresh with a query probe on (nearly) each of its tokens — the question's
        own tokens, as SnapKV's observation window — then a routing by those probes, and the tail decoded once more
        if that changed a zoom. The next token's logits."""
        mem = self.memory
        with self._probes_on(self.tail_refresh):
            logits = refresh_tail(mem, tokens, self.tail_refresh)
            changes = mem.zoom.changes
            self.routing.route(mem, kind="prompt", probes=True)
        if mem.zoom.changes != changes:
            logits = refresh_tail(mem, tokens, self.tail_refresh)
        return logits

    def _decode_chunk(self, chunk: list[int], routed: bool, scored: bool, fill: float) -> np.ndarray:
        """One streamed chunk; ``routed`` (``chunk_routing``, once spans exist): routed inside its decodes, or, where
        the layer callback is refused, decoded and then routed for the next chunk."""
        mem = self.memory
        if not (routed and len(mem.store)):
            return mem.decode(chunk, scored=scored, fill=fill)
        if self.routing.layer_callback:
            logits = self.routing.in_layers(mem, lambda: mem.decode(chunk, scored=scored, fill=fill), "chunk")
            if logits is not None:
                return logits
        logits = mem.decode(chunk, scored=scored, fill=fill)
        self.routing.route(mem, kind="chunk")
        return logits

    def _prefill_exact(self, tokens: list[int]) -> np.ndarray:
        """Full attention over ``tokens`` in a temporary full-size context (from ``shared_passes`` when it holds one
        for this prompt), compressed into the memory (``prefill.prefill_exact``)."""

        def on_chunk(n_done: int) -> None:
            self.n_prefilled = n_done
            self.notify()

        def on_compress() -> None:
            self.n_prefilled, self.phase = len(tokens), "compress"
            self.notify()

        chunk, shared = self.plan.config.chunk, self.shared_passes
        make = lambda: exact_pass(self.model, self.ctx_config, chunk, tokens, on_chunk)  # noqa: E731
        done = make() if shared is None else shared.get(exact_key(tokens, chunk, self.ctx_config), self.model, make)
        logits = prefill_exact(self.memory, self.routing, done, tokens, owned=shared is None, on_compress=on_compress,
                               on_placed=lambda: self._pin(tokens))
        self.notify()
        return logits

    def _chunk_done(self, n_prefilled: int) -> None:
        self.memory.make_room(self.plan.chunk)
        self.n_prefilled = n_prefilled
        self.notify()

    def _step(self, token: int) -> np.ndarray:
        hook, counters = self.session.hook, self.memory.counters
        before = hook.io_counters()
        try:
            return self._routed_step(token)
        finally:
            counters.step_io = [a + n - b for a, n, b in zip(counters.step_io, hook.io_counters(), before)]
            counters.io_steps += 1

    def _routed_step(self, token: int) -> np.ndarray:
        mem = self.memory
        cfg = self.config
        mem.steps += 1  # this step's number (what a routing in or after its decode records)
        answer = mem.steps - mem.prompt_step <= cfg.layer_steps  # one of the first steps after a prompt or turn
        due = answer or mem.steps % cfg.route_every == 0
        in_layers = answer or cfg.step_routing == "layer"
        if due and len(mem.store) and in_layers and self.routing.layer_callback:
            self.irreversible()
            logits = self.routing.in_layers(mem, lambda: mem.decode([token], scored=False), "step")
            if logits is not None:
                mem.counters.layer_routed_steps += 1
                mem.make_room(1)
                return logits
            # the callback was refused before the decode: route after it instead
        logits = self.memory.decode([token], scored=False)
        mem.make_room(1)
        if due and len(mem.store):
            self.irreversible()
            t0 = time.perf_counter()
            self.routing.route(mem)
            mem.counters.step_route_s += time.perf_counter() - t0
        return logits

    def _truncate(self, n: int) -> bool:
        b = truncate(self.memory, n)
        if b is None:
            return False
        self.memory.pins = [sid for sid in self.memory.pins if sid < len(self.memory.store)]  # the spans kept
        redo = self.tokens[b:n]
        self.discard_from(b)
        if redo:
            self.append(redo)
        return True

    @property
    def full_kv_ubatch(self) -> int:
        """The full-KV policy's ubatch (the budget's chunk), not the budget context's (sized for the tail
        refresh too)."""
        return self.plan.config.chunk

    @property
    def host_bytes(self) -> int:
        return self.memory.store.host_bytes

    def stats(self) -> PolicyStats:
        own = self.memory.stats(self.router)
        return PolicyStats(device_kv_bytes=self.device_kv_bytes, host_kv_bytes=self.memory.store.host_bytes,
                           **{self.stats_key: own})
