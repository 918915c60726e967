"""``SekvMemory``: everything SeKV remembers about one context, with the operations that change it.

Its boundary (what a saved conversation is made of):

device state   the cells of the budget context, read and written through ``hook``; this object keeps what they hold:
               ``sinks`` and ``anchors`` (positions at full resolution), ``window`` (the newest tokens, their cells
               and signal), the summary cell of every span (in ``store``) and the zoom slots (``zoom``: per layer
               which spans are rebuilt where, and the step each was last chosen)
host state     ``store`` (every span's K/V factors or rows, summaries, routing index), ``signal_log`` and
               ``sentence_end`` (per token: the segmentation signal and whether it ends a sentence: what a
               truncation rewinds to), the segmenter's running signal statistics
carried       ``prev_logits`` (the next token's logits, for the first surprisal of the next append), ``carry_signal``
               (that surprisal when the logits are gone after a rollback), ``steps`` (decode steps), ``clock``
               (routings so far: the zoom LRU's time stamps),
               ``swa_transferred`` (an iSWA tail cannot be re-decoded), ``counters``

Fixed parts (shared by every copy, never copied): the session and its hook, the budget plan, the configuration,
the sentence-end detector, the ``on_irreversible`` callback. ``copy`` duplicates the rest (span factors are
immutable and shared); ``to_plain`` / ``from_plain`` turn it into plain data (numbers, lists, numpy arrays) and back.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from .. import native
from ..config import SekvConfig
from ..errors import BudgetError
from ..segment import Segmenter, SentenceEnds
from ..session import Session
from ..span_store import SpanStore
from ..stats import SekvStats
from .budget import BudgetPlan
from .window import Window
from .zoom import ZoomSlots


@dataclass
class RouteCounts:
    """Routings of one kind (after a prompt or turn, or at decode steps) and the K rows they read."""

    routes: int = 0
    host_rows: int = 0    # rows read from the host tier (scored or rebuilt)


@dataclass
class RouteCounters:
    """What the memory's routings and compressions did and cost."""

    route_calls: int = 0
    compress_s: float = 0.0
    zoom_s: float = 0.0
    step_route_s: float = 0.0
    layer_routed_turns: int = 0  # turns routed inside their own decode (the layer callback)
    layer_routed_steps: int = 0
    # the hook's transfers between host and device memory during decode steps (KVHook.io_counters; none where the
    # cache is in host memory): bytes and calls host->device, bytes and calls device->host, and the steps counted
    step_io: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    io_steps: int = 0
    refreshed_tokens: int = 0    # prompt tokens decoded again by tail refreshes
    prompt: RouteCounts = field(default_factory=RouteCounts)  # after a prompt or turn
    step: RouteCounts = field(default_factory=RouteCounts)    # at decode steps
    chunk: RouteCounts = field(default_factory=RouteCounts)   # inside a streamed prompt chunk's decodes

    def of(self, kind: str) -> RouteCounts:
        return getattr(self, kind)


class SekvMemory:
    """See the module docstring. ``summary_rows``: spans keep a summary row in attention (False: the baselines
    that compose SeKV's engine without them)."""

    def __init__(self, session: Session, plan: BudgetPlan, config: SekvConfig, segmenter: Segmenter,
                 store: SpanStore, n_context: int, summary_rows: bool = True,
                 on_irreversible: Callable[[], None] | None = None):
        hook = session.hook
        self.session, self.hook, self.plan, self.config = session, hook, plan, config
        self.n_context = n_context  # the most tokens this memory holds: the streamed anchor cap is spread over it
        self.summary_rows = summary_rows
        self.on_irreversible = on_irreversible or (lambda: None)
        self.sentence_ends = SentenceEnds(session.piece) if config.span_cuts == "sentence" else None
        self.segmenter = segmenter
        self.store = store
        self.zoom = ZoomSlots(hook, plan.n_zoom, hook.info.n_layer_kv, config.max_new_zooms)
        self.window = Window()
        self.sinks: list[int] = []    # positions
        self.anchors: list[int] = []  # positions
        self.signal_log = np.zeros(0, dtype=np.float32)  # [n_tokens] every token's segmentation signal
        self.sentence_end = np.zeros(0, dtype=bool)      # [n_tokens] which tokens end a sentence (span_cuts)
        self.prev_logits: np.ndarray | None = None       # f32 [n_vocab]
        self.carry_signal: float | None = None  # the signal of the next token when its logits are gone (rollback)
        self.steps = 0
        self.prompt_step = 0  # ``steps`` when the last prompt or turn arrived
        self.clock = 0  # routings so far (prompt, chunk and step): what zooms are stamped with for the LRU
        self.pins: list[int] = []  # span ids the last prompt or turn matches lexically, best first (lexical_share)
        self.chunk_pins: list[int] = []  # span ids the streamed chunk matches lexically (chunk_lexical_share)
        # which summary bias the device holds: the fitted one (SpanStore.summary_bias) or log|S| (summary_calibration:
        # "always" fitted; "prefill" fitted only while a prompt's chunks stream, SekvPolicy._append)
        self.fitted_bias = config.summary_calibration == "always"
        self.swa_transferred = False  # the SWA cache came from another context (exact prefill)
        self.transient_kv_bytes = 0  # full KV of the temporary context of the last exact prefill (0: streamed)
        self.counters = RouteCounters()

    # -- copies ------------------------------------------------------------------------------------------------

    _FIXED = ("session", "hook", "plan", "config", "n_context", "summary_rows", "on_irreversible", "sentence_ends")

    def _shared(self) -> list[Any]:
        """What copies share instead of copying: the fixed parts, the configurations the store and segmenter hold,
        and the span data (immutable once placed)."""
        configs = [self.store.config, getattr(self.segmenter, "config", None), self.session.model]
        return [getattr(self, a) for a in self._FIXED] + configs + self.store.shared_objects()

    def copy(self) -> "SekvMemory":
        """An independent copy of the memory's state (the fixed parts and the immutable span data shared)."""
        memo = {id(o): o for o in self._shared() if o is not None}
        return copy.deepcopy(self, memo)

    # -- tokens in ---------------------------------------------------------------------------------------------

    def note_sentence_ends(self, tokens: list[int]) -> None:
        """Record which of the newest ``tokens`` end a sentence (where spans may end, ``span_cuts``)."""
        if self.sentence_ends is not None:
            self.sentence_end = np.concatenate([self.sentence_end, self.sentence_ends(tokens) > 0.5])

    def sentence_end_at(self, positions: np.ndarray) -> np.ndarray | None:
        """bool [n]: which tokens at ``positions`` end a sentence, for the segmenter's cuts (None: cut anywhere)."""
        return None if self.sentence_ends is None else self.sentence_end[np.asarray(positions, dtype=np.int64)]

    def decode(self, tokens: list[int], scored: bool, fill: float = 0.0) -> np.ndarray:
        """Decode ``tokens`` after the newest and admit them; the next token's logits. ``scored`` also yields every
        token's surprisal (chunk by chunk), else the first token's comes from the previous logits and the others'
        is ``fill``."""
        p0 = self.session.pos_max() + 1
        if scored:
            surp, last = self.session.decode_scored(tokens, self.prev_logits)
        else:
            last = self.session.decode(tokens, logits="last")
            surp = np.full(len(tokens), fill, dtype=np.float32)
            if self.prev_logits is not None and self.segmenter.scored:  # a vocabulary-wide pass only where it is read
                surp[0] = native.surprisal(self.prev_logits[None, :], tokens[:1])[0]
        if self.carry_signal is not None:  # the first token after a rollback: its surprisal from before
            surp[0], self.carry_signal = self.carry_signal, None
        self.prev_logits = last
        self.note_sentence_ends(tokens)
        self.admit(p0, self.segmenter.signal(tokens, surp, self.session.piece))
        return last

    def admit(self, p0: int, signal: np.ndarray) -> None:
        """Place the newly decoded tokens (positions p0.., their signal f32 [n]) into sinks or the window."""
        cells = self.hook.cells_from(p0)
        n_sink = max(0, min(self.plan.config.n_sink - len(self.sinks), signal.size)) if not len(self.window) else 0
        self.sinks.extend(range(p0, p0 + n_sink))
        self.signal_log = np.concatenate([self.signal_log, signal]).astype(np.float32)
        self.segmenter.track(signal[n_sink:])
        self.window.extend(np.arange(p0 + n_sink, p0 + signal.size), cells[n_sink:], signal[n_sink:])

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

    def make_room(self, incoming: int) -> None:
        """Compress what left the window: anchors keep their cells, spans become summaries + host factors. An
        elastic window's room shrinks with every summary row and anchor the compression adds: compress again until
        only tokens waiting for their span are over it (fewer than span_min + span_max, the room's reserve)."""
        if self.plan.fits:
            return
        while True:
            over = len(self.window) - self.window_room(incoming)
            if over <= 0 or not self.compress_oldest(over) or not self.config.elastic_window:
                return

    def compress_oldest(self, over: int) -> bool:
        """Segment the ``over`` oldest window tokens and compress them; whether any became an anchor or a span."""
        self.on_irreversible()
        t0 = time.perf_counter()
        w = self.window
        seg = self.segmenter.cut(w.signal[:over], allowance=self._anchor_allowance(int(w.pos[over - 1]) + 1),
                                 floor=self._anchor_floor(), ends=self.sentence_end_at(w.pos[:over]))
        self.anchors.extend(int(w.pos[i]) for i in seg.anchors)
        if seg.spans:
            cells = np.concatenate([w.cell[g] for g in seg.spans])
            self.compress([w.pos[g] for g in seg.spans], [w.signal[g] for g in seg.spans],
                          lambda ikv: self.hook.get_rows(ikv, cells), release=cells)
        done = np.ones(over, dtype=bool)
        done[seg.pending] = False
        w.keep(np.concatenate([np.flatnonzero(~done), np.arange(over, len(w))]))
        self.counters.compress_s += time.perf_counter() - t0
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
        cells (one per span, at the span's last position, bias ``+log|S|``; ``summary_calibration``: the bias and
        value fitted to the last decode's captured queries, per layer)."""
        weights = signal if self.segmenter.weighted else [np.ones(p.size) for p in positions]
        first = len(self.store)
        hook = self.hook
        fit = self.config.summary_calibration != "off" and self.summary_rows
        summaries = self.store.add(positions, weights, rows, hook.queries if fit else None)
        if release is not None:
            hook.release(release)  # the tokens' rows now live in the store
        if self.summary_rows:
            free = self.free_cells(len(positions))
            hook.claim(free, [int(p[-1]) for p in positions])
            for ikv, (k_sum, v_sum) in enumerate(summaries):
                hook.set_values(ikv, free, k_sum, v_sum)  # quantized on the way into a quantized cache
            if not self.fitted_bias:
                hook.set_bias_cells(-1, free, np.log(self.store.lengths[first:]))
            else:  # fitted per layer (and per head: summary_bias_heads)
                for ikv, bias in enumerate(self.store.summary_bias):
                    hook.set_bias_cells(ikv, free, bias[first:])
                self._set_head_offsets(np.arange(first, first + free.size), free)
            self.store.place_summaries(first, free)
        if self.zoom.slots.size == 0 and self.plan.n_zoom > 0:
            self.zoom.claim(self.free_cells(self.plan.n_zoom))

    def _set_head_offsets(self, sids: np.ndarray, cells: np.ndarray, on: bool = True) -> None:
        """Give the summary cells ``cells`` of spans ``sids`` their per-head offsets (``on``) or zeros, in every
        layer (``summary_bias_heads``; the hook zeroed them when the cells were claimed)."""
        if not self.config.summary_bias_heads:
            return
        for ikv, offset in enumerate(self.store.head_offset):
            if offset.shape[1]:
                rows = offset[sids]                                                    # [n, H]
                self.hook.set_head_bias_cells(ikv, cells, rows if on else np.zeros_like(rows))

    def summary_bias(self, ikv: int) -> np.ndarray | None:
        """f32 [n_spans]: the bias layer ``ikv``'s summary rows take where they are not zoomed, as the device holds
        it now (``fitted_bias``): the fitted one, or None for log|S|."""
        return self.store.summary_bias[ikv] if self.fitted_bias else None

    def use_fitted_bias(self, on: bool) -> None:
        """Give every summary row that is not zoomed its fitted bias (``on``) or log|S|, in every layer; with
        ``summary_bias_heads`` every summary row its per-head offsets or zeros, written whenever asked (a device
        state put back by ``DeviceState.put`` holds none: claiming a cell zeroes them)."""
        if not self.summary_rows or not len(self.store) and on == self.fitted_bias:
            return
        changed, self.fitted_bias = on != self.fitted_bias, on
        cells = np.array([s.summary_cell for s in self.store.spans], dtype=np.int32)        # [S]
        log_len = np.log(self.store.lengths)
        for ikv, resident in enumerate(self.zoom.resident if changed and len(self.store) else []):
            out = np.ones(cells.size, dtype=bool)
            out[list(resident)] = False                                                      # zoomed: stays -inf
            out &= cells >= 0
            bias = self.store.summary_bias[ikv] if on else log_len
            self.hook.set_bias_cells(ikv, cells[out], bias[out])
        placed = np.flatnonzero(cells >= 0)  # (a zoomed summary keeps its offsets: its -inf masks every head)
        self._set_head_offsets(placed, cells[placed], on)

    def free_cells(self, n: int) -> np.ndarray:
        free = np.flatnonzero(self.hook.cells_pos()[: self.plan.cells] == -1).astype(np.int32)
        if free.size < n:
            raise BudgetError(f"no room for {n} cells within the budget of {self.plan.cells} ({free.size} free)")
        return free[:n]

    # -- what it reports ----------------------------------------------------------------------------------------

    def stats(self, router: Any) -> SekvStats:
        """What the memory holds and what its routing did (``router``: the policy's, for its label)."""
        store, counters = self.store, self.counters
        mean_rank, raw_share = store.rank_stats()
        calls = max(counters.route_calls, 1)

        def per_layer(counts: RouteCounts, rows: int) -> float:
            return rows / max(counts.routes * store.n_layer, 1)

        return SekvStats(
            router=router.label, router_score=router.name, budget_cells=self.plan.cells,
            prefill="exact" if self.transient_kv_bytes else "streaming", transient_kv_bytes=self.transient_kv_bytes,
            window=self.plan.window, window_tokens=len(self.window), zoom_slots=int(self.zoom.slots.size),
            spans=len(store), span_tokens=store.span_tokens, anchors=len(self.anchors), mean_rank=mean_rank,
            raw_share=raw_share, zooms_per_step=self.zoom.zooms / calls,
            rebuilt_rows_per_step=self.zoom.rebuilt_rows / calls, compress_s=counters.compress_s,
            zoom_s=counters.zoom_s, index_bytes=store.index_bytes,
            host_rows_read_per_route=per_layer(counters.step, counters.step.host_rows),
            host_rows_read_per_prompt_route=per_layer(counters.prompt, counters.prompt.host_rows),
            chunk_routes=counters.chunk.routes, refreshed_tokens=counters.refreshed_tokens,
            host_rows_read_per_chunk_route=per_layer(counters.chunk, counters.chunk.host_rows),
            layer_routed_steps=counters.layer_routed_steps, layer_routed_turns=counters.layer_routed_turns,
            pinned_spans=len(self.pins),
            route_ms_per_step=1e3 * counters.step_route_s / max(self.steps, 1),
            **{f"{name}_per_step": n / max(counters.io_steps, 1) for name, n in
               zip(("h2d_bytes", "h2d_calls", "d2h_bytes", "d2h_calls"), counters.step_io)})

    # -- plain data --------------------------------------------------------------------------------------------

    def to_plain(self) -> dict[str, Any]:
        """The state as plain data (numbers, lists, dicts, numpy arrays): what ``from_plain`` rebuilds."""
        return {
            "sinks": list(self.sinks), "anchors": list(self.anchors),
            "window": {"pos": self.window.pos, "cell": self.window.cell, "signal": self.window.signal},
            "signal_log": self.signal_log, "sentence_end": self.sentence_end,
            "segmenter": self.segmenter.state(), "store": self.store.to_plain(), "zoom": self.zoom.to_plain(),
            "prev_logits": self.prev_logits, "carry_signal": self.carry_signal, "steps": self.steps,
            "prompt_step": self.prompt_step,
            "clock": self.clock, "pins": list(self.pins),
            "swa_transferred": self.swa_transferred,
            "transient_kv_bytes": self.transient_kv_bytes, "counters": asdict(self.counters),
        }

    def load_plain(self, data: dict[str, Any]) -> None:
        """Take the state ``data`` (from ``to_plain`` of a memory over the same model and settings)."""
        self.sinks, self.anchors = [int(p) for p in data["sinks"]], [int(p) for p in data["anchors"]]
        self.window = Window()
        self.window.extend(data["window"]["pos"], data["window"]["cell"], data["window"]["signal"])
        self.signal_log = np.asarray(data["signal_log"], dtype=np.float32).copy()
        self.sentence_end = np.asarray(data["sentence_end"], dtype=bool).copy()
        self.segmenter.load_state(data["segmenter"])
        self.store.load_plain(data["store"])
        self.zoom.load_plain(data["zoom"])
        logits = data["prev_logits"]
        self.prev_logits = None if logits is None else np.asarray(logits, dtype=np.float32).copy()
        self.carry_signal = data["carry_signal"]
        self.steps, self.clock = int(data["steps"]), int(data["clock"])
        self.prompt_step = int(data.get("prompt_step", self.steps))  # files written before it: no answer steps
        # (absent from the files of versions before lexical pins: no question seen)
        self.pins = [int(s) for s in data.get("pins", [])]
        self.swa_transferred, self.transient_kv_bytes = bool(data["swa_transferred"]), int(data["transient_kv_bytes"])
        counters = dict(data["counters"])
        kinds = {k: RouteCounts(**counters.pop(k)) for k in ("prompt", "step", "chunk")}
        self.counters = RouteCounters(**counters, **kinds)
