"""How SeKV chooses spans and zooms a memory into them: per hooked layer, the router ranks the spans for that
layer's query and the zoom slots take the best (``ZoomSlots.zoom``). A routing is of one kind: ``prompt`` (right
after a prompt or turn: new zooms uncapped, and with ``prompt_scan`` exact mass over every span when the policy's
router is two-stage), ``chunk`` (inside a streamed prompt chunk's decode) or ``step`` (a decode step's); the last
two rebuild at most ``max_new_zooms`` spans per layer. Each routing advances the memory's ``clock``, which stamps the
zooms for the LRU. What it reads and rebuilds is counted in the memory's ``counters``."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..config import SekvConfig
from ..errors import UnsupportedModelError
from ..router import LowRankMassRouter, Ranking, Router, probe_heads
from ..span_store import single_threaded_blas
from .sekv_memory import SekvMemory
from .zoom import choose_consensus


class SpanRouting:
    """``router`` ranks spans at decode steps (and after prompts unless ``prompt_scan`` replaces a two-stage one)."""

    def __init__(self, router: Router, config: SekvConfig):
        self.router, self.config = router, config
        self.scan_router = LowRankMassRouter()  # exact mass over every span: the prompt routing's (prompt_scan)
        self.layer_callback = True  # until the hook says its layer callback is unsupported

    def router_for(self, kind: str) -> Router:
        """The router of a routing: exact mass over every span for a prompt with ``prompt_scan`` and a two-stage
        router, else the policy's."""
        scan = kind == "prompt" and self.config.prompt_scan and self.router.two_stage
        return self.scan_router if scan else self.router

    @single_threaded_blas
    def route(self, memory: SekvMemory, queries: list[np.ndarray] | None = None, kind: str = "step",
              probes: bool = False) -> None:
        """Zoom every layer of ``memory`` into the best-scoring spans for the captured (or given) queries
        [n_head, head_dim] per layer (``probes``: every captured probe's, as a chunk's routing takes them). A
        prompt's routing with ``prompt_consensus`` ranks every layer first and gives that share of the slots to
        the spans most layers would zoom (``choose_consensus``), after the lexical pins' share."""
        t0 = time.perf_counter()
        router, counts = self.router_for(kind), memory.counters.of(kind)
        memory.clock += 1
        self.count(memory, kind)
        rebuilt = memory.zoom.rebuilt_rows
        layers = range(memory.store.n_layer)
        asked = [self.query(memory, ikv, router, "chunk" if probes else kind) if queries is None else queries[ikv]
                 for ikv in layers]
        if kind == "prompt" and self.config.prompt_consensus > 0:
            rankings = [self.ranking(memory, ikv, asked[ikv], router, kind) for ikv in layers]
            first = memory.zoom.pinned(memory.pins, memory.store.lengths, self.config.lexical_share)
            chosen = choose_consensus([r.scores for r in rankings], memory.store.lengths, memory.zoom.capacity,
                                      self.config.prompt_consensus, first)
            for ikv in layers:
                memory.zoom.zoom(ikv, chosen[ikv], memory.store.spans, memory.clock, capped=False,
                                 summary_bias=memory.summary_bias(ikv))
        else:
            for ikv in layers:
                self.route_layer(memory, ikv, asked[ikv], router, kind)
        counts.host_rows += memory.zoom.rebuilt_rows - rebuilt  # the new zooms' host rows
        memory.counters.zoom_s += time.perf_counter() - t0

    def query(self, memory: SekvMemory, ikv: int, router: Router, kind: str) -> np.ndarray:
        """Layer ``ikv``'s captured query [n_head, d] of the last decode; for a chunk's routing with query probes on
        (``chunk_probes``) and a router that takes them, every probe's [n_head * p, d] (``probe_heads``)."""
        hook = memory.hook
        if kind != "chunk" or hook.query_probes == 1 or not router.takes_probes:
            return hook.query(ikv)
        return probe_heads(hook.queries(ikv), memory.store.n_head_kv)

    def ranking(self, memory: SekvMemory, ikv: int, query: np.ndarray, router: Router, kind: str) -> Ranking:
        """The router's ranking of the spans for layer ``ikv``'s query, its reads counted; a step's or chunk's holds
        the resident spans by ``zoom_hold`` nats."""
        hold = self.config.zoom_hold if kind != "prompt" else 0.0
        ranking = router.rank(ikv, query, memory.store, memory.zoom, hold)
        counts = memory.counters.of(kind)
        counts.host_rows += ranking.host_rows
        return ranking

    def count(self, memory: SekvMemory, kind: str) -> None:
        memory.counters.route_calls += 1
        memory.counters.of(kind).routes += 1

    def route_layer(self, memory: SekvMemory, ikv: int, query: np.ndarray, router: Router, kind: str) -> None:
        """Rank the spans for layer ``ikv``'s query [n_head, head_dim] and zoom that layer into the best ones, the
        memory's lexical pins first (``lexical_share``; in a streamed chunk's routing, no question yet, the chunk's own
        pins, ``chunk_lexical_share``); only rows and bias of the layer change: safe inside a decode's layer
        callback."""
        ranking = self.ranking(memory, ikv, query, router, kind)
        cfg = self.config
        if kind == "chunk":
            pins, share = memory.chunk_pins, cfg.chunk_lexical_share
        else:
            pins, share = memory.pins, cfg.lexical_share
        chosen = memory.zoom.choose(ranking.scores, memory.store.lengths, pins, share)
        memory.zoom.zoom(ikv, chosen, memory.store.spans, memory.clock, capped=kind != "prompt",
                         summary_bias=memory.summary_bias(ikv))

    @single_threaded_blas
    def in_layers(self, memory: SekvMemory, decode: Callable[[], np.ndarray], kind: str,
                  probes: bool = False) -> np.ndarray | None:
        """Run ``decode`` (decodes into ``memory``'s context) with each hooked layer routing, in every llama_decode,
        with that decode's own query before its attention reads the cache (the hook's layer callback; ``probes``:
        every captured probe's, as a chunk's); its logits, or None, with nothing decoded, where the hook refuses the
        callback (it is not asked again)."""
        router, counters = self.router_for(kind), memory.counters
        rebuilt = memory.zoom.rebuilt_rows
        per_decode = kind == "chunk"  # a chunk's every llama_decode is a routing of its own
        if not per_decode:
            memory.clock += 1

        def route_layer(ikv: int) -> None:
            t0 = time.perf_counter()
            if per_decode and ikv == 0:
                memory.clock += 1
                self.count(memory, kind)
            self.route_layer(memory, ikv, self.query(memory, ikv, router, "chunk" if probes else kind), router, kind)
            dt = time.perf_counter() - t0
            counters.zoom_s += dt
            counters.step_route_s += dt if kind == "step" else 0.0

        logits = None
        try:
            with memory.hook.layer_callback(route_layer):
                logits = decode()
        except UnsupportedModelError:
            if logits is not None:  # raised by the routing inside the decode, not by the hook's refusal
                raise
            self.layer_callback = False  # refused before the decode: nothing was decoded
            return None
        if not per_decode:
            self.count(memory, kind)
        counters.of(kind).host_rows += memory.zoom.rebuilt_rows - rebuilt
        return logits
