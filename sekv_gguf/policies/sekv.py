"""SeKV: a fixed budget of device cells holds sinks, anchors, one summary row per compressed span, zoom slots and a
recent window; every compressed span keeps low-rank K/V factors in host memory and is rebuilt into the zoom slots
of a layer when the router picks it for that layer. Nothing is thrown away.

Device layout (cells of the hooked cache, all below the budget):
  sinks      the first ``n_sink`` tokens
  anchors    high-surprisal tokens (capped), at full resolution
  summaries  one cell per span at the span's last position, bias ``+log|S|`` (``-inf`` in layers where it is zoomed)
  zoom slots ``zoom_share`` of the budget, claimed at position 0; per layer they hold that layer's zoomed spans
             (bias 0) or nothing (bias ``-inf``)
  window     the newest tokens (plus a short pending tail waiting to form a span)
Routing uses the query the hook captured at the previous decode (the previous step's query), right after prefill
and then every ``route_every`` steps.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable

import llama_cpp
import numpy as np
from threadpoolctl import ThreadpoolController

from .. import native
from ..config import ContextConfig, SekvConfig
from ..errors import BudgetError
from ..router import ROUTERS, Router
from ..segment import SentenceEnds, SentenceSegmenter, Segmenter
from ..session import Session
from ..spans import KeySketch, Span, factorize, sketches, weighted_mean
from .base import Policy, pad_cells
from .transfer import cell_of_position, copy_tokens

NEG_INF = float("-inf")
_BLAS = ThreadpoolController()


def _single_threaded_blas(fn: Callable) -> Callable:
    """Run ``fn`` with one BLAS/LAPACK thread: its calls are small, and more threads only contend with llama.cpp's
    (a stacked SVD of 40 spans took 10 s with 2 OpenBLAS threads beside a decode, 0.09 s with one)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _BLAS.limit(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


class SekvPolicy(Policy):
    """SeKV over one budget-sized context (see the module docstring)."""

    name = "sekv"

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, config: SekvConfig | None = None,
                 router: Router | None = None, observer: Callable[[Policy], None] | None = None, **_: Any):
        self.config = config = config or SekvConfig()
        self.router = router or ROUTERS[config.router]()
        self.router.configure(config)
        self.n_context = n_context
        self.budget = config.budget_cells(n_context)
        # nothing ever needs compressing: behave as full KV
        self.fits = n_context <= self.budget and not config.compress_when_fits
        self.chunk = min(config.chunk, max(self.budget // 8, 1))
        self.window = n_context if self.fits else (config.window or min(config.window_max, self.budget // 8))
        self.n_zoom = 0 if self.fits else int(config.zoom_share * self.budget)
        self.anchor_cap = 0 if self.fits else int(config.anchor_share * self.budget)
        if not self.fits:
            self._check_budget()
        self.model, self.ctx_config = model, ctx_config
        super().__init__(Session(model, self.context_config(ctx_config, self.budget, self.chunk)), observer)
        hook = self.session.hook
        if hook.info.kv_size != self.budget:
            raise BudgetError(f"llama.cpp allocated {hook.info.kv_size} cells for a budget of {self.budget}")
        self.n_layer = hook.info.n_layer_kv
        if hasattr(self.router, "check"):  # a trained router must fit this cache's layers and heads
            layer = hook.layers[0]
            self.router.check(list(hook.model_layers), layer.n_head, layer.n_head_kv, layer.head_dim_k)
        hook.enable_query_capture()
        if not self.fits:
            hook.enable_bias()

        self.segmenter = (SentenceSegmenter(config) if config.segmentation == "sentences"
                          else Segmenter(config, self.anchor_cap))
        self._sentence_ends = SentenceEnds(self.session.piece) if config.segmentation == "sentences" else None
        self.sinks: list[tuple[int, int]] = []       # (pos, cell)
        self.anchors: list[tuple[int, int]] = []     # (pos, cell)
        self.win_pos: list[int] = []                 # window: positions, cells, surprisal (oldest first)
        self.win_cell: list[int] = []
        self.win_surp: list[float] = []
        self.spans: list[Span] = []
        self.lengths = np.zeros(0, dtype=np.float32)  # [n_spans] tokens per span
        self.keys: list[np.ndarray] = [np.zeros((0,)) for _ in range(self.n_layer)]  # [n_spans, Hkv, d] per layer
        # per layer: channel-wise (min, max) of every span's K [n_spans, Hkv, d] each
        self.bounds: list[tuple[np.ndarray, np.ndarray] | None] = [None] * self.n_layer
        self.slots = np.zeros(0, dtype=np.int32)    # zoom slot cells
        # per layer: span id -> slot indices, and last use (step) of each resident span
        self.resident: list[dict[int, np.ndarray]] = [{} for _ in range(self.n_layer)]
        self.last_use: list[dict[int, int]] = [{} for _ in range(self.n_layer)]
        self.prev_logits: np.ndarray | None = None
        self.last_ubatch = 0  # tokens in the last streamed prompt ubatch (bounds what can be re-decoded on iSWA)
        self.swa_transferred = False  # the SWA cache came from another context (exact prefill)
        self.steps = 0
        self.counters = {"zooms": 0, "rebuilt_rows": 0, "route_calls": 0, "compress_s": 0.0, "zoom_s": 0.0}

    # -- budget ------------------------------------------------------------------------------------------------

    def _check_budget(self) -> None:
        cfg = self.config
        max_spans = math.ceil(max(self.n_context - cfg.n_sink - self.window, 0) / cfg.span_min)
        parts = {"sinks": cfg.n_sink, "anchors": self.anchor_cap, "summaries": max_spans if cfg.summary_rows else 0,
                 "zoom": self.n_zoom, "window": self.window + cfg.span_min + cfg.span_max, "chunk": self.chunk}
        need = sum(parts.values())
        if need > self.budget:
            detail = " + ".join(f"{k} {v}" for k, v in parts.items())
            raise BudgetError(
                f"kv_budget of {self.budget} cells ({self.config.kv_budget:g} asked, in llama.cpp's units of "
                f"{self.config.cell_granularity}) cannot hold what must stay resident for {self.n_context} tokens: "
                f"{detail} = {need} cells; use a budget of at least {pad_cells(need)} cells "
                f"(or a larger span_min / smaller zoom_share)")

    # -- decoding ----------------------------------------------------------------------------------------------

    def _decode(self, tokens: list[int], scored: bool) -> np.ndarray:
        """Decode after the newest token; ``scored`` also yields every token's surprisal (chunk by chunk)."""
        p0 = self.session.pos_max() + 1
        if scored:
            surp, last = self.session.decode_scored(tokens, self.prev_logits)
        else:
            last = self.session.decode(tokens, logits="last")
            surp = np.zeros(len(tokens), dtype=np.float32)
            if self.prev_logits is not None:
                surp[0] = native.surprisal(self.prev_logits[None, :], tokens[:1])[0]
        self.prev_logits = last
        if self.config.segmentation == "sentences":
            surp = self._sentence_ends(tokens)  # the segmentation signal: 1 at sentence ends
        self._admit(p0, surp)
        return last

    def _admit(self, p0: int, surp: np.ndarray) -> None:
        """Place the newly decoded tokens (positions p0..) into sinks or the window."""
        cells = self.session.hook.cells_from(p0)
        assert cells.size == surp.size
        n_sink = max(0, min(self.config.n_sink - len(self.sinks), surp.size)) if not self.win_pos else 0
        self.sinks.extend((p0 + i, int(cells[i])) for i in range(n_sink))
        self.segmenter.observe(surp[n_sink:])
        self.win_pos.extend(range(p0 + n_sink, p0 + surp.size))
        self.win_cell.extend(int(c) for c in cells[n_sink:])
        self.win_surp.extend(float(x) for x in surp[n_sink:])

    def prefill(self, tokens: list[int]) -> np.ndarray:
        if not tokens:
            raise ValueError("empty prompt")
        mode = self.config.prefill
        if mode == "exact" and not self.fits and self.config.segmentation == "surprisal":
            return self._prefill_exact(tokens)
        logits = None
        for c0 in range(0, len(tokens), self.chunk):
            chunk = tokens[c0:c0 + self.chunk]
            logits = self._decode(chunk, scored=not self.fits and self.config.segmentation == "surprisal")
            self.last_ubatch = len(chunk)
            self._maintain()
            self.n_prefilled = c0 + len(chunk)
            self.notify()
        if self.spans:
            self._route()
            if self.config.zoom_lag_refresh:
                logits = self._redecode_tail(tokens)
        self.phase = "decode"
        return logits

    def _prefill_exact(self, tokens: list[int]) -> np.ndarray:
        """Full attention over the whole prompt in a temporary full-size context, then compression into the budget."""
        full = Session(self.model, self.context_config(self.ctx_config, pad_cells(len(tokens)), self.config.chunk))
        try:
            full.hook.enable_query_capture()
            surp = np.zeros(len(tokens), dtype=np.float32)
            prev = None
            for c0 in range(0, len(tokens), full.n_batch):
                chunk = tokens[c0:c0 + full.n_batch]
                surp[c0:c0 + len(chunk)], prev = full.decode_scored(chunk, prev)
                self.n_prefilled = c0 + len(chunk)
                self.notify()
            self.prev_logits = prev
            self.phase = "compress"
            self.notify()
            self._transfer(full, surp)
            queries = [full.hook.query(ikv) for ikv in range(self.n_layer)]
        finally:
            full.close()
        if self.spans:
            self._route(queries)
        logits = self._redecode_tail(tokens)
        self.phase = "decode"
        return logits

    def _transfer(self, full: Session, surp: np.ndarray) -> None:
        """Segment and compress the full context's tokens; copy the resident ones into the budget context."""
        n = surp.size
        cell_full = cell_of_position(full, n)
        n_sink = min(self.config.n_sink, n)
        window_start = max(n_sink, n - self.window)
        self.segmenter.observe(surp[n_sink:])
        seg = self.segmenter.cut(surp[n_sink:window_start], final=True)
        anchors = n_sink + seg.anchors
        groups = [n_sink + g for g in seg.spans]
        resident = np.concatenate([np.arange(n_sink), anchors, np.arange(window_start, n)]).astype(np.int64)
        cells = copy_tokens(full, self.session, resident)
        self.swa_transferred = full.hook.info.is_iswa
        self.sinks = [(int(p), int(c)) for p, c in zip(resident[:n_sink], cells[:n_sink])]
        self.anchors = [(int(p), int(c)) for p, c in zip(anchors, cells[n_sink:n_sink + anchors.size])]
        self.win_pos = [int(p) for p in range(window_start, n)]
        self.win_cell = [int(c) for c in cells[n_sink + anchors.size:]]
        self.win_surp = [float(x) for x in surp[window_start:]]
        if groups:
            self._compress(groups, source=full, source_cells=cell_full, surp=surp, positions=np.arange(n))

    def _redecode_tail(self, tokens: list[int]) -> np.ndarray:
        """Decode the last ``refresh_tokens`` prompt tokens again, now that the router has zoomed in for the prompt's
        end: the question at the end of a long prompt then reads the rebuilt spans, not only their summaries."""
        p_last = self.session.pos_max()
        k = max(1, min(self.config.refresh_tokens, len(tokens), len(self.win_pos)))
        if self.session.hook.info.is_iswa:
            # the sliding-window cache must still hold the window before the tail: llama.cpp keeps n_swa positions
            # before the last ubatch, but a cache moved over with the state API holds only the last n_swa positions
            k = min(k, 1 if self.swa_transferred else self.last_ubatch)
        p0 = p_last - k + 1
        assert self.win_pos[-k] == p0 and self.win_pos[-1] == p_last
        llama_cpp.llama_memory_seq_rm(self.session.memory, 0, p0, -1)
        surp = self.win_surp[-k:]
        del self.win_pos[-k:], self.win_cell[-k:], self.win_surp[-k:]
        out = self.session.decode(tokens[-k:], pos0=p0)
        cells = self.session.hook.cells_from(p0)
        self.win_pos.extend(range(p0, p_last + 1))
        self.win_cell.extend(int(c) for c in cells)
        self.win_surp.extend(surp)
        self.prev_logits = out.copy()
        self.notify()
        return out

    def step(self, token: int) -> np.ndarray:
        logits = self._decode([token], scored=False)
        self.steps += 1
        self._maintain()
        if self.spans and self.steps % self.config.route_every == 0:
            self._route()
        self.notify()
        return logits

    # -- compression -------------------------------------------------------------------------------------------

    def _maintain(self) -> None:
        """Compress what left the window: anchors keep their cells, spans become summaries + host factors."""
        over = len(self.win_pos) - self.window
        if self.fits or over <= 0:
            return
        t0 = time.perf_counter()
        seg = self.segmenter.cut(np.asarray(self.win_surp[:over]))
        for i in seg.anchors:
            self.anchors.append((self.win_pos[i], self.win_cell[i]))
        if seg.spans:
            self._compress(seg.spans)
        done = np.ones(over, dtype=bool)
        done[seg.pending] = False
        keep = np.concatenate([np.flatnonzero(~done), np.arange(over, len(self.win_pos))])
        self.win_pos = [self.win_pos[i] for i in keep]
        self.win_cell = [self.win_cell[i] for i in keep]
        self.win_surp = [self.win_surp[i] for i in keep]
        self.counters["compress_s"] += time.perf_counter() - t0

    @_single_threaded_blas
    def _compress(self, groups: list[np.ndarray], source: Session | None = None,
                  source_cells: np.ndarray | None = None, surp: np.ndarray | None = None,
                  positions: np.ndarray | None = None) -> None:
        """Spans from index groups into (by default) the window; their rows come from ``source`` (default: this
        context, whose token cells are then released)."""
        hook = self.session.hook
        own = source is None
        source_cells = np.asarray(self.win_cell, dtype=np.int32) if own else source_cells
        surp = np.asarray(self.win_surp) if own else surp
        positions = np.asarray(self.win_pos, dtype=np.int32) if own else positions
        src_hook = hook if own else source.hook
        cells = np.concatenate([source_cells[g] for g in groups]).astype(np.int32)
        bounds = np.cumsum([0] + [g.size for g in groups])
        new = [Span(id=len(self.spans) + i, positions=positions[g].astype(np.int32), summary_cell=-1)
               for i, g in enumerate(groups)]
        k_sum, v_sum = [], []  # per layer f16 [n_spans, Hkv*d]
        for ikv in range(self.n_layer):
            k, v = src_hook.get_rows(ikv, cells)  # f16 [n, Hkv, d]
            k_parts = [k[bounds[i]:bounds[i + 1]].astype(np.float32) for i in range(len(groups))]
            v_parts = [v[bounds[i]:bounds[i + 1]].astype(np.float32) for i in range(len(groups))]
            for span, kf, vf in zip(new, factorize(k_parts, self.config), factorize(v_parts, self.config)):
                span.k.append(kf)
                span.v.append(vf)
            # summary weights: the tokens' surprisal (uniform when the signal is not surprisal)
            weights = [surp[g] if self.config.segmentation == "surprisal" else np.ones(g.size) for g in groups]
            km = [weighted_mean(kp, w) for kp, w in zip(k_parts, weights)]
            vm = [weighted_mean(vp, w) for vp, w in zip(v_parts, weights)]
            for span, m, kp in zip(new, km, k_parts):
                span.k_mean.append(m)
                span.k_min.append(kp.min(axis=0))
                span.k_max.append(kp.max(axis=0))
            if self.router.sketch is not None:  # the trained router reads a sketch of each span's keys
                sk = sketches(k_parts, *self.router.sketch)  # {field: [B, Hkv, ...]}
                for i, span in enumerate(new):
                    span.sketch.append(KeySketch(**{name: x[i] for name, x in sk.items()}))
            k_sum.append(np.stack(km).reshape(len(groups), -1).astype(np.float16))
            v_sum.append(np.stack(vm).reshape(len(groups), -1).astype(np.float16))
        # the tokens' cells go; one summary cell per span comes (position: the span's last)
        if own:
            hook.release(cells)
        lengths = np.array([s.length for s in new], dtype=np.float32)
        if self.config.summary_rows:
            free = self._free_cells(len(new))
            hook.claim(free, [int(s.positions[-1]) for s in new])
            for ikv in range(self.n_layer):
                hook.set_rows(ikv, free, k_sum[ikv], v_sum[ikv])
            hook.set_bias_cells(-1, free, np.log(lengths))
            for span, c in zip(new, free):
                span.summary_cell = int(c)
        self.spans.extend(new)
        self.lengths = np.concatenate([self.lengths, lengths])
        for ikv in range(self.n_layer):
            add = np.stack([s.k_mean[ikv] for s in new])
            self.keys[ikv] = add if self.keys[ikv].size == 0 else np.concatenate([self.keys[ikv], add])
            lo, hi = np.stack([s.k_min[ikv] for s in new]), np.stack([s.k_max[ikv] for s in new])
            self.bounds[ikv] = (lo, hi) if self.bounds[ikv] is None else (
                np.concatenate([self.bounds[ikv][0], lo]), np.concatenate([self.bounds[ikv][1], hi]))
        if self.slots.size == 0 and self.n_zoom > 0:
            self._claim_slots()

    def _free_cells(self, n: int) -> np.ndarray:
        free = np.flatnonzero(self.session.hook.cells_pos()[: self.budget] == -1).astype(np.int32)
        if free.size < n:
            raise BudgetError(f"no room for {n} cells within the budget of {self.budget} ({free.size} free)")
        return free[:n]

    def _claim_slots(self) -> None:
        hook = self.session.hook
        self.slots = self._free_cells(self.n_zoom)
        hook.claim(self.slots, np.zeros(self.slots.size, dtype=np.int32))
        hook.set_bias_cells(-1, self.slots, NEG_INF)

    # -- routing and zoom --------------------------------------------------------------------------------------

    @_single_threaded_blas
    def _route(self, queries: list[np.ndarray] | None = None) -> None:
        """Zoom per layer into the best-scoring spans for the captured (or given) queries."""
        t0 = time.perf_counter()
        hook = self.session.hook
        lengths = self.lengths
        self.counters["route_calls"] += 1
        for ikv in range(self.n_layer):
            query = hook.query(ikv) if queries is None else queries[ikv]
            scores = self.router.score(ikv, query, self.keys[ikv], lengths, self.spans, self.bounds[ikv])
            chosen, used = [], 0
            for sid in np.argsort(-scores, kind="stable"):
                if used + lengths[sid] <= self.n_zoom:
                    chosen.append(int(sid))
                    used += int(lengths[sid])
            self._zoom_layer(ikv, chosen)
        self.counters["zoom_s"] += time.perf_counter() - t0

    def _zoom_layer(self, ikv: int, chosen: list[int]) -> None:
        hook = self.session.hook
        resident, last_use = self.resident[ikv], self.last_use[ikv]
        for sid in chosen:
            if sid in resident:
                last_use[sid] = self.steps
        taken = np.zeros(self.slots.size, dtype=bool)
        for idx in resident.values():
            taken[idx] = True
        want = [sid for sid in chosen if sid not in resident]  # in score order
        if self.steps > 0:
            want = want[: self.config.max_new_zooms]
        need = sum(self.spans[sid].length for sid in want)
        # evict the least recently used spans that were not chosen until the new ones fit
        for sid in sorted((s for s in resident if s not in chosen), key=lambda s: last_use[s]):
            if need <= int((~taken).sum()):
                break
            idx = resident.pop(sid)
            del last_use[sid]
            taken[idx] = False
            hook.set_bias_cells(ikv, self.slots[idx], NEG_INF)
            if self.spans[sid].summary_cell >= 0:
                hook.set_bias_cells(ikv, [self.spans[sid].summary_cell], math.log(self.spans[sid].length))
        for sid in want:
            span = self.spans[sid]
            free = np.flatnonzero(~taken)
            if free.size < span.length:
                continue
            idx = free[: span.length]
            taken[idx] = True
            cells = self.slots[idx]
            k = span.k[ikv].rebuild().reshape(span.length, -1)  # [L, Hkv*d]
            v = span.v[ikv].rebuild().reshape(span.length, -1)
            hook.set_rows(ikv, cells, native.f32_to_f16(k), native.f32_to_f16(v))
            hook.set_bias_cells(ikv, cells, 0.0)
            if span.summary_cell >= 0:
                hook.set_bias_cells(ikv, [span.summary_cell], NEG_INF)
            resident[sid] = idx
            last_use[sid] = self.steps
            self.counters["zooms"] += 1
            self.counters["rebuilt_rows"] += span.length

    # -- stats -------------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        ranks = [f.rank for s in self.spans for f in s.k + s.v]
        raw = [f.raw is not None for s in self.spans for f in s.k + s.v]
        steps = max(self.counters["route_calls"], 1)
        out.update({
            "host_kv_bytes": int(sum(s.nbytes for s in self.spans)),
            "sekv": {
                "router": self.router.name,
                "router_score": self.router.score_kind,
                "budget_cells": self.budget,
                "window": self.window,
                "zoom_slots": int(self.slots.size),
                "spans": len(self.spans),
                "span_tokens": int(sum(s.length for s in self.spans)),
                "anchors": len(self.anchors),
                "mean_rank": float(np.mean(ranks)) if ranks else 0.0,
                "raw_share": float(np.mean(raw)) if raw else 0.0,
                "zooms_per_step": self.counters["zooms"] / steps,
                "rebuilt_rows_per_step": self.counters["rebuilt_rows"] / steps,
                "compress_s": self.counters["compress_s"],
                "zoom_s": self.counters["zoom_s"],
            },
        })
        return out
