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
The budget plan is ``budget.BudgetPlan``; spans and their host factors are owned by a ``SpanStore``; the router
(``sekv_gguf.router``) scores them with the query the hook captured at the previous decode, right after prefill
and then every ``route_every`` steps. Baselines compose the same engine with another segmenter, router and no
summary rows (``quest``, ``sentencekv``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .. import native
from ..config import MIB, BudgetConfig, ContextConfig, SekvConfig
from ..errors import BudgetError, UnsupportedModelError
from ..router import LowRankMassRouter, Router, training_free
from ..segment import Segmenter, SentenceEnds
from ..session import Session, full_kv_bytes
from ..span_store import SpanStore, single_threaded_blas
from .base import Policy
from .budget import BudgetPlan
from .prefill import ExactPasses, chunk_starts, prefill_exact, refresh_tail
from .rollback import truncate
from .window import Window
from .zoom import ZoomSlots


class SekvPolicy(Policy):
    """SeKV over one budget-sized context (see the module docstring). ``segmenter`` and ``summary_rows`` let the
    baselines compose the engine differently (default: surprisal segmentation, summary rows in attention)."""

    name = "sekv"
    Params = SekvConfig
    routes = True
    stats_key = "sekv"  # the key of the policy's own statistics in ``stats``

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: SekvConfig | None = None, router: Router | None = None,
                 observer: Callable[[Policy], None] | None = None, *, segmenter: Segmenter | None = None,
                 summary_rows: bool = True):
        self.config = config = params or SekvConfig()
        self.router = router or training_free(config)
        self.plan = plan = BudgetPlan.of(budget or BudgetConfig(), n_context, config.zoom_share, config.anchor_share,
                                         config.compress_when_fits)
        self.summary_rows = summary_rows
        # full-attention passes shared with other policies (an evaluation's runs set it; see prefill.ExactPasses)
        self.exact_passes: ExactPasses | None = None
        if not plan.fits:
            max_spans = -(-max(n_context - plan.config.n_sink - plan.window, 0) // config.span_min)
            plan.check({"sinks": plan.config.n_sink, "anchors": plan.anchor_cap,
                        "summaries": max_spans if summary_rows else 0, "zoom": plan.n_zoom,
                        "window": plan.window + config.span_min + config.span_max, "chunk": plan.chunk},
                       " (or a larger span_min / smaller zoom_share)")
        self.model, self.ctx_config = model, ctx_config
        self.n_context = n_context  # the most tokens this memory holds: the streamed anchor cap is spread over it
        super().__init__(Session(model, ctx_config.sized(plan.cells, plan.chunk)), observer)
        hook = self.session.hook
        if hook.info.kv_size != plan.cells:
            raise BudgetError(f"llama.cpp allocated {hook.info.kv_size} cells for a budget of {plan.cells}")
        layer = hook.layers[0]
        if hasattr(self.router, "check"):  # a trained router must fit this cache's layers and heads
            self.router.check(hook.model_layers, layer.n_head, layer.n_head_kv, layer.head_dim_k)
        hook.enable_query_capture()
        if not plan.fits:
            hook.enable_bias()
        self.n_layer = hook.info.n_layer_kv
        self.segmenter = segmenter or Segmenter(config, plan.anchor_cap)
        self.store = SpanStore(self.n_layer, layer.n_head_kv, layer.head_dim_k, config, self.router.sketch)
        self.zoom = ZoomSlots(hook, plan.n_zoom, self.n_layer, config.max_new_zooms)
        self.window = Window()
        self.sinks: list[int] = []    # positions
        self.anchors: list[int] = []  # positions
        self.prev_logits: np.ndarray | None = None
        self.last_ubatch = 0  # tokens in the last streamed prompt ubatch (bounds what can be re-decoded on iSWA)
        self.swa_transferred = False  # the SWA cache came from another context (exact prefill)
        self.transient_kv_bytes = 0  # full KV of the temporary context of the last exact prefill (0: streamed)
        self.steps = 0
        self.signal_log = np.zeros(0, dtype=np.float32)  # [n_tokens] every token's segmentation signal
        self.sentence_end = np.zeros(0, dtype=bool)      # [n_tokens] which tokens end a sentence (span_cuts)
        self.sentence_ends = SentenceEnds(self.session.piece) if config.span_cuts == "sentence" else None
        self.carry_signal: float | None = None  # the signal of the next token when its logits are gone (rollback)
        # routing: calls, seconds (all / during decode steps), K rows read from the host tier and the device
        self.counters = {"route_calls": 0, "compress_s": 0.0, "zoom_s": 0.0, "step_route_s": 0.0,
                         "layer_routed_turns": 0, "layer_routed_steps": 0,
                         **{f"{kind}_{what}": 0 for kind in ("prompt", "step")
                            for what in ("routes", "host_rows", "device_rows")}}
        self.scan_router = LowRankMassRouter()  # exact mass over every span: the prompt routing's (prompt_scan)
        self._layer_callback = True  # until the hook says its layer callback is unsupported
        self._init_done()

    # -- decoding ----------------------------------------------------------------------------------------------

    def _decode(self, tokens: list[int], scored: bool, fill: float = 0.0) -> np.ndarray:
        """Decode after the newest token; ``scored`` also yields every token's surprisal (chunk by chunk), else
        the first token's comes from the previous logits and the others' is ``fill``."""
        p0 = self.session.pos_max() + 1
        if scored:
            surp, last = self.session.decode_scored(tokens, self.prev_logits)
        else:
            last = self.session.decode(tokens, logits="last")
            surp = np.full(len(tokens), fill, dtype=np.float32)
            if self.prev_logits is not None:
                surp[0] = native.surprisal(self.prev_logits[None, :], tokens[:1])[0]
        if self.carry_signal is not None:  # the first token after a rollback: its surprisal from before
            surp[0], self.carry_signal = self.carry_signal, None
        self.prev_logits = last
        self.note_sentence_ends(tokens)
        self._admit(p0, self.segmenter.signal(tokens, surp, self.session.piece))
        return last

    def note_sentence_ends(self, tokens: list[int]) -> None:
        """Record which of the newest ``tokens`` end a sentence (where spans may end, ``span_cuts``)."""
        if self.sentence_ends is not None:
            self.sentence_end = np.concatenate([self.sentence_end, self.sentence_ends(tokens) > 0.5])

    def span_ends(self, positions: np.ndarray) -> np.ndarray | None:
        """bool [n]: which tokens at ``positions`` end a sentence, for the segmenter's cuts (None: cut anywhere)."""
        return None if self.sentence_ends is None else self.sentence_end[np.asarray(positions, dtype=np.int64)]

    def _admit(self, p0: int, signal: np.ndarray) -> None:
        """Place the newly decoded tokens (positions p0..) into sinks or the window."""
        cells = self.session.hook.cells_from(p0)
        n_sink = max(0, min(self.plan.config.n_sink - len(self.sinks), signal.size)) if not len(self.window) else 0
        self.sinks.extend(range(p0, p0 + n_sink))
        self.signal_log = np.concatenate([self.signal_log, signal]).astype(np.float32)
        self.segmenter.observe(signal[n_sink:])
        self.window.extend(np.arange(p0 + n_sink, p0 + signal.size), cells[n_sink:], signal[n_sink:])

    def _append(self, tokens: list[int]) -> np.ndarray:
        """Stream ``tokens`` through the budget context (compressing what leaves the window), then route and
        refresh the tail; an exact prefill when asked for and the memory is empty. A turn (``turn_tokens``) is
        decoded for its last logits only (no surprisal rows), routed inside that decode (``turn_routing``)."""
        cfg = self.config
        if self._exact_prefill(tokens):
            return prefill_exact(self, tokens)
        turn = bool(self.tokens) and len(tokens) <= cfg.turn_tokens
        scored = not self.plan.fits and self.segmenter.scored
        fill = 0.0
        if scored and turn:
            scored, fill = False, self.segmenter.mean
        if turn and len(self.store) and cfg.turn_routing == "layer" and self._layer_callback:
            return self._turn_routed_in_layers(tokens, scored, fill)
        logits = None
        starts = chunk_starts(len(tokens), self.plan.chunk, cfg.refresh_tokens)
        for c0, c1 in zip(starts, starts[1:] + [len(tokens)]):
            chunk = tokens[c0:c1]
            self._maintain(len(chunk))  # room for the chunk (an elastic window may have filled the budget)
            logits = self._decode(chunk, scored=scored, fill=fill)
            self._chunk_done(c0 + len(chunk), len(chunk))
        if len(self.store):
            changes = self.zoom.changes
            self.route(prompt=True)
            if cfg.zoom_lag_refresh and self.zoom.changes != changes:  # the tail saw other spans
                logits = refresh_tail(self, tokens)
        return logits

    def _exact_prefill(self, tokens: list[int]) -> bool:
        """Whether ``tokens``, the first into this memory, are prefilled exactly (``prefill``; ``auto``: when
        streaming them would compress some (they are more than the window may hold) and their full KV fits
        ``exact_prefill_mib``). A prompt of sinks only is streamed: the refresh needs a window token."""
        cfg = self.config
        if (self.plan.fits or not self.segmenter.scored or self.tokens or cfg.prefill == "streaming"
                or len(tokens) <= self.plan.config.n_sink):
            return False
        if cfg.prefill == "exact":
            return True
        if len(tokens) <= self.window_room(0):  # streamed, nothing would be compressed: full attention anyway
            return False
        full = full_kv_bytes(self.session, len(tokens), self.session.config.n_ubatch)
        return full <= cfg.exact_prefill_mib * MIB

    def _chunk_done(self, n_prefilled: int, n_chunk: int) -> None:
        self.last_ubatch = n_chunk
        self._maintain(self.plan.chunk)
        self.n_prefilled = n_prefilled
        self.notify()

    def _turn_routed_in_layers(self, tokens: list[int], scored: bool, fill: float) -> np.ndarray:
        """A turn in one decode: each hooked layer routes with this decode's query and zooms before its attention
        (``turn_routing="layer"``); where the hook's layer callback is unsupported, the two-pass turn instead."""
        self._maintain(len(tokens))
        logits = self._routed_in_layers(tokens, scored, fill, prompt=True)
        if logits is None:
            return self._append(tokens)
        self.counters["layer_routed_turns"] += 1
        self._chunk_done(len(tokens), len(tokens))
        return logits

    @single_threaded_blas
    def _routed_in_layers(self, tokens: list[int], scored: bool, fill: float, prompt: bool) -> np.ndarray | None:
        """Decode ``tokens`` with each hooked layer routing (``route``'s ``prompt`` kind or a step's) with this
        decode's own query before its attention reads the cache (the hook's layer callback); None, with nothing
        decoded, where the hook refuses the callback (it is not asked again)."""
        kind, router = "prompt" if prompt else "step", self._router(prompt)
        rebuilt = self.zoom.rebuilt_rows

        def route_layer(ikv: int) -> None:
            t0 = time.perf_counter()
            self._route_layer(ikv, self.session.hook.query(ikv), router, kind, prompt)
            dt = time.perf_counter() - t0
            self.counters["zoom_s"] += dt
            self.counters["step_route_s"] += 0.0 if prompt else dt

        logits = None
        try:
            with self.session.hook.layer_callback(route_layer):
                logits = self._decode(tokens, scored=scored, fill=fill)
        except UnsupportedModelError:
            if logits is not None:  # raised by the routing inside the decode, not by the hook's refusal
                raise
            self._layer_callback = False  # refused before the decode: nothing was decoded
            return None
        self._count_route(kind)
        self.counters[f"{kind}_host_rows"] += self.zoom.rebuilt_rows - rebuilt
        return logits

    def _step(self, token: int) -> np.ndarray:
        self.steps += 1  # this step's number (what a routing in or after its decode records)
        due = self.steps % self.config.route_every == 0
        if due and len(self.store) and self.config.step_routing == "layer" and self._layer_callback:
            self.irreversible()
            logits = self._routed_in_layers([token], scored=False, fill=0.0, prompt=False)
            if logits is not None:
                self.counters["layer_routed_steps"] += 1
                self._maintain(1)
                return logits
            # the callback was refused before the decode: route after it instead
        logits = self._decode([token], scored=False)
        self._maintain(1)
        if due and len(self.store):
            self.irreversible()
            t0 = time.perf_counter()
            self.route()
            self.counters["step_route_s"] += time.perf_counter() - t0
        return logits

    # -- truncation and snapshots ------------------------------------------------------------------------------

    def _truncate(self, n: int) -> bool:
        return truncate(self, n)

    def _shared(self) -> list[Any]:
        return super()._shared() + self.store.shared_objects() + [self.sentence_ends]

    @property
    def host_bytes(self) -> int:
        return self.store.host_bytes

    # -- compression -------------------------------------------------------------------------------------------

    def window_room(self, incoming: int) -> int:
        """Most tokens the window may hold when ``incoming`` more are about to be decoded: the budget's fixed
        window, or (``elastic_window``) every cell that sinks, anchors, summary rows and the zoom slots do not
        hold, less ``incoming`` and a span's worth of tokens that may wait in the window for their span."""
        if not self.config.elastic_window:
            return self.plan.window
        held = len(self.sinks) + len(self.anchors) + (len(self.store) if self.summary_rows else 0) + self.plan.n_zoom
        pending = self.config.span_min + self.config.span_max
        return max(self.plan.window, self.plan.cells - held - incoming - pending)

    def _maintain(self, incoming: int) -> None:
        """Compress what left the window: anchors keep their cells, spans become summaries + host factors. An
        elastic window's room shrinks with every summary row and anchor the compression adds: compress again until
        only tokens waiting for their span are over it (fewer than span_min + span_max, the room's reserve)."""
        if self.plan.fits:
            return
        while True:
            over = len(self.window) - self.window_room(incoming)
            if over <= 0 or not self._compress_oldest(over) or not self.config.elastic_window:
                return

    def _compress_oldest(self, over: int) -> bool:
        """Segment the ``over`` oldest window tokens and compress them; whether any became an anchor or a span."""
        self.irreversible()
        t0 = time.perf_counter()
        w = self.window
        seg = self.segmenter.cut(w.signal[:over], allowance=self._anchor_allowance(int(w.pos[over - 1]) + 1),
                                 floor=self._anchor_floor(), ends=self.span_ends(w.pos[:over]))
        self.anchors.extend(int(w.pos[i]) for i in seg.anchors)
        if seg.spans:
            cells = np.concatenate([w.cell[g] for g in seg.spans])
            self.compress([w.pos[g] for g in seg.spans], [w.signal[g] for g in seg.spans],
                          lambda ikv: self.session.hook.get_rows(ikv, cells), release=cells)
        done = np.ones(over, dtype=bool)
        done[seg.pending] = False
        w.keep(np.concatenate([np.flatnonzero(~done), np.arange(over, len(w))]))
        self.counters["compress_s"] += time.perf_counter() - t0
        return bool(seg.spans) or seg.anchors.size > 0

    def _anchor_allowance(self, seen: int) -> int:
        """Most anchors the tokens before position ``seen`` may hold (``spread_anchors``): first come, first served
        (``none``: the cap), or the cap in proportion to the share of the memory they are (``share``; ``quantile``
        allows twice that, its floor doing the spreading)."""
        mode = self.config.spread_anchors
        if mode == "none":
            return self.plan.anchor_cap
        share = min(seen / max(self.n_context, 1), 1.0) * (2.0 if mode == "quantile" else 1.0)
        return int(np.ceil(self.plan.anchor_cap * share))

    def _anchor_floor(self) -> float | None:
        """``quantile``: an anchor must be among the cap / n_context most surprising of the tokens seen so far
        (what an exact prefill's selection of the cap over the whole prompt keeps, estimated while streaming)."""
        if self.config.spread_anchors != "quantile" or self.signal_log.size <= len(self.sinks):
            return None
        seen = self.signal_log[len(self.sinks):]
        return float(np.quantile(seen, 1.0 - min(self.plan.anchor_cap / max(self.n_context, 1), 1.0)))

    def compress(self, positions: list[np.ndarray], signal: list[np.ndarray],
                 rows: Callable[[int], tuple[np.ndarray, np.ndarray]], release: np.ndarray | None = None) -> None:
        """New spans into the store (``SpanStore.add``: positions, segmentation signal, rows per layer); the cells
        ``release`` (the spans' own tokens, when they sat in this context) freed; then the summary rows into free
        cells (one per span, at the span's last position, bias ``+log|S|``)."""
        weights = signal if self.segmenter.weighted else [np.ones(p.size) for p in positions]
        first = len(self.store)
        summaries = self.store.add(positions, weights, rows)
        hook = self.session.hook
        if release is not None:
            hook.release(release)  # the tokens' rows now live in the store
        if self.summary_rows:
            free = self._free_cells(len(positions))
            hook.claim(free, [int(p[-1]) for p in positions])
            for ikv, (k_sum, v_sum) in enumerate(summaries):
                hook.set_rows(ikv, free, k_sum, v_sum)
            hook.set_bias_cells(-1, free, np.log(self.store.lengths[first:]))
            self.store.place_summaries(first, free)
        if self.zoom.slots.size == 0 and self.plan.n_zoom > 0:
            self.zoom.claim(self._free_cells(self.plan.n_zoom))

    def _free_cells(self, n: int) -> np.ndarray:
        free = np.flatnonzero(self.session.hook.cells_pos()[: self.plan.cells] == -1).astype(np.int32)
        if free.size < n:
            raise BudgetError(f"no room for {n} cells within the budget of {self.plan.cells} ({free.size} free)")
        return free[:n]

    # -- routing -----------------------------------------------------------------------------------------------

    @single_threaded_blas
    def route(self, queries: list[np.ndarray] | None = None, prompt: bool = False) -> None:
        """Zoom per layer into the best-scoring spans for the captured (or given) queries. ``prompt``: the routing
        right after a prompt, where its question has just arrived: new zooms are not capped, and with
        ``prompt_scan`` a two-stage router gives way to exact mass over every span (one pass over the host rows
        per prompt, as the prefill that wrote them made)."""
        t0 = time.perf_counter()
        kind, router = "prompt" if prompt else "step", self._router(prompt)
        self._count_route(kind)
        rebuilt = self.zoom.rebuilt_rows
        for ikv in range(self.n_layer):
            query = self.session.hook.query(ikv) if queries is None else queries[ikv]
            self._route_layer(ikv, query, router, kind, prompt)
        self.counters[f"{kind}_host_rows"] += self.zoom.rebuilt_rows - rebuilt  # the new zooms' host rows
        self.counters["zoom_s"] += time.perf_counter() - t0

    def _router(self, prompt: bool) -> Router:
        """The router of a routing: exact mass over every span for a prompt with ``prompt_scan`` and a two-stage
        router, else the policy's."""
        return self.scan_router if prompt and self.config.prompt_scan and self.router.two_stage else self.router

    def _count_route(self, kind: str) -> None:
        self.counters["route_calls"] += 1
        self.counters[f"{kind}_routes"] += 1

    def _route_layer(self, ikv: int, query: np.ndarray, router: Router, kind: str, prompt: bool) -> None:
        """Rank the spans for layer ``ikv``'s query [n_head, head_dim] and zoom that layer into the best ones
        (only rows and bias of the layer change: safe inside a decode's layer callback)."""
        ranking = router.rank(ikv, query, self.store, self.zoom)
        self.counters[f"{kind}_host_rows"] += ranking.host_rows
        self.counters[f"{kind}_device_rows"] += ranking.device_rows
        self.zoom.zoom(ikv, self.zoom.choose(ranking.scores, self.store.lengths), self.store.spans, self.steps,
                       capped=not prompt)

    # -- stats -------------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        mean_rank, raw_share = self.store.rank_stats()
        calls = max(self.counters["route_calls"], 1)
        per_layer = lambda kind, what: (self.counters[f"{kind}_{what}"]  # noqa: E731
                                        / max(self.counters[f"{kind}_routes"] * self.n_layer, 1))
        out.update({
            "host_kv_bytes": self.store.host_bytes,
            self.stats_key: {
                "router": self.router.label,
                "router_score": self.router.name,
                "budget_cells": self.plan.cells,
                "prefill": "exact" if self.transient_kv_bytes else "streaming",
                "transient_kv_bytes": self.transient_kv_bytes,
                "window": self.plan.window,
                "window_tokens": len(self.window),
                "zoom_slots": int(self.zoom.slots.size),
                "spans": len(self.store),
                "span_tokens": self.store.span_tokens,
                "anchors": len(self.anchors),
                "mean_rank": mean_rank,
                "raw_share": raw_share,
                "zooms_per_step": self.zoom.zooms / calls,
                "rebuilt_rows_per_step": self.zoom.rebuilt_rows / calls,
                "compress_s": self.counters["compress_s"],
                "zoom_s": self.counters["zoom_s"],
                "index_bytes": self.store.index_bytes,
                "host_rows_read_per_route": per_layer("step", "host_rows"),      # decode-step routing
                "device_rows_read_per_route": per_layer("step", "device_rows"),
                "host_rows_read_per_prompt_route": per_layer("prompt", "host_rows"),
                "route_ms_per_step": 1e3 * self.counters["step_route_s"] / max(self.steps, 1),
            },
        })
        return out
