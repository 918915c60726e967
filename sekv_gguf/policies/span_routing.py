"""How SeKV chooses spans and zooms a memory into them: per hooked layer, the router ranks the spans for that
layer's query and the zoom slots take the best (``ZoomSlots.zoom``). A routing right after a prompt or turn may
use another router than decode steps (``prompt_scan``: exact mass over every span when the policy's router is
two-stage). What it reads and rebuilds is counted in the memory's ``counters``."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..config import SekvConfig
from ..errors import UnsupportedModelError
from ..router import LowRankMassRouter, Router
from ..span_store import single_threaded_blas
from .sekv_memory import SekvMemory


class SpanRouting:
    """``router`` ranks spans at decode steps (and after prompts unless ``prompt_scan`` replaces a two-stage one)."""

    def __init__(self, router: Router, config: SekvConfig):
        self.router, self.config = router, config
        self.scan_router = LowRankMassRouter()  # exact mass over every span: the prompt routing's (prompt_scan)
        self.layer_callback = True  # until the hook says its layer callback is unsupported

    def router_for(self, prompt: bool) -> Router:
        """The router of a routing: exact mass over every span for a prompt with ``prompt_scan`` and a two-stage
        router, else the policy's."""
        return self.scan_router if prompt and self.config.prompt_scan and self.router.two_stage else self.router

    @single_threaded_blas
    def route(self, memory: SekvMemory, queries: list[np.ndarray] | None = None, prompt: bool = False) -> None:
        """Zoom every layer of ``memory`` into the best-scoring spans for the captured (or given) queries
        [n_head, head_dim] per layer. ``prompt``: the routing right after a prompt, where its question has just
        arrived: new zooms are not capped."""
        t0 = time.perf_counter()
        router, counts = self.router_for(prompt), memory.counters.of(prompt)
        self.count(memory, prompt)
        rebuilt = memory.zoom.rebuilt_rows
        for ikv in range(memory.store.n_layer):
            query = memory.hook.query(ikv) if queries is None else queries[ikv]
            self.route_layer(memory, ikv, query, router, prompt)
        counts.host_rows += memory.zoom.rebuilt_rows - rebuilt  # the new zooms' host rows
        memory.counters.zoom_s += time.perf_counter() - t0

    def count(self, memory: SekvMemory, prompt: bool) -> None:
        memory.counters.route_calls += 1
        memory.counters.of(prompt).routes += 1

    def route_layer(self, memory: SekvMemory, ikv: int, query: np.ndarray, router: Router, prompt: bool) -> None:
        """Rank the spans for layer ``ikv``'s query [n_head, head_dim] and zoom that layer into the best ones
        (only rows and bias of the layer change: safe inside a decode's layer callback)."""
        ranking = router.rank(ikv, query, memory.store, memory.zoom)
        counts = memory.counters.of(prompt)
        counts.host_rows += ranking.host_rows
        counts.device_rows += ranking.device_rows
        memory.zoom.zoom(ikv, memory.zoom.choose(ranking.scores, memory.store.lengths), memory.store.spans,
                         memory.steps, capped=not prompt)

    @single_threaded_blas
    def in_layers(self, memory: SekvMemory, decode: Callable[[], np.ndarray], prompt: bool) -> np.ndarray | None:
        """Run ``decode`` (one decode into ``memory``'s context) with each hooked layer routing (a prompt's routing
        or a step's) with this decode's own query before its attention reads the cache (the hook's layer
        callback); its logits, or None, with nothing decoded, where the hook refuses the callback (it is not asked
        again)."""
        router, counters = self.router_for(prompt), memory.counters
        rebuilt = memory.zoom.rebuilt_rows

        def route_layer(ikv: int) -> None:
            t0 = time.perf_counter()
            self.route_layer(memory, ikv, memory.hook.query(ikv), router, prompt)
            dt = time.perf_counter() - t0
            counters.zoom_s += dt
            counters.step_route_s += 0.0 if prompt else dt

        logits = None
        try:
            with memory.hook.layer_callback(route_layer):
                logits = decode()
        except UnsupportedModelError:
            if logits is not None:  # raised by the routing inside the decode, not by the hook's refusal
                raise
            self.layer_callback = False  # refused before the decode: nothing was decoded
            return None
        self.count(memory, prompt)
        counters.of(prompt).host_rows += memory.zoom.rebuilt_rows - rebuilt
        return logits
