"""Zoom slots: the cells of the budget reserved for rebuilt spans. Per hooked layer they hold that layer's zoomed
spans (bias 0; the span's summary row gets -inf) or nothing (bias -inf); a layer keeps what it zoomed until the
slots are needed for newer choices (least recently chosen first).

Where a layer's cache is on a device (a GPU, an RPC server), every row write is a transfer: a routing's changes to
a layer go out as one row write and one bias write per kind of change (new spans, evicted spans, summary cells), and
nothing is read back (a two-stage router judges the resident spans by the host rows they were rebuilt from)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..hook import KVHook
from ..spans import Span

NEG_INF = float("-inf")


def choose_fitting(scores: np.ndarray, lengths: np.ndarray, capacity: int) -> list[int]:
    """Span ids in descending score (ties: lower id first) that fit ``capacity`` token rows together
    (``fit_in_order``)."""
    return fit_in_order(np.argsort(-scores, kind="stable"), lengths, capacity)


def fit_in_order(sids: Iterable[int], lengths: np.ndarray, capacity: int) -> list[int]:
    """The spans of ``sids``, in their order, that fit ``capacity`` token rows together: one that does not fit is
    skipped, and the scan stops once not even the shortest span would fit."""
    order = np.fromiter(sids, dtype=np.int64) if not isinstance(sids, np.ndarray) else sids.astype(np.int64)
    if not order.size:
        return []
    length = lengths[order].astype(np.int64)                           # [n] rows of each, in order
    k = int(np.searchsorted(np.cumsum(length), capacity, side="right"))  # the leading ones that fit together
    chosen, used = order[:k].tolist(), int(length[:k].sum())
    shortest = int(length.min())
    while k < order.size and capacity - used >= shortest:
        fits = np.flatnonzero(length[k:] <= capacity - used)          # the next one that still fits, if any
        if not fits.size:
            break
        k += int(fits[0])
        chosen.append(int(order[k]))
        used += int(length[k])
        k += 1
    return chosen


def choose_consensus(scores: list[np.ndarray], lengths: np.ndarray, capacity: int, share: float,
                     first: list[int] = ()) -> list[list[int]]:
    """Per layer, the spans to zoom when a ``share`` of the ``capacity`` rows goes to a cross-layer vote: each
    layer's own choice (``choose_fitting`` of its scores [n_spans]) votes for its spans; the spans of the most votes
    (ties: the higher summed rank score 1/(1+rank)) that fit ``share * capacity`` rows are zoomed in every layer,
    each layer's best others fill the rest. ``first`` (span ids that fit ``capacity`` together: the lexical pins,
    fitted to their own share) come before the vote's in every layer; the vote keeps its share of what they leave."""
    n_layer, n_spans = len(scores), lengths.size
    votes = np.zeros(n_spans, dtype=np.float64)   # [n_spans] layers whose own choice holds the span
    rank_score = np.zeros(n_spans, dtype=np.float64)  # [n_spans] summed 1/(1+rank) over layers
    for s in scores:
        order = np.argsort(-s, kind="stable")
        rank_score[order] += 1.0 / (1.0 + np.arange(n_spans))
        votes[choose_fitting(s, lengths, capacity)] += 1.0
    # votes first; the summed rank score (at most n_layer, less than one vote's weight n_layer + 1) breaks ties
    used = int(lengths[list(first)].sum())
    common = choose_around(list(first), votes * (n_layer + 1) + rank_score, lengths,
                           min(used + int(share * capacity), capacity))
    return [choose_around(common, s, lengths, capacity) for s in scores]


def choose_around(common: list[int], scores: np.ndarray, lengths: np.ndarray, capacity: int) -> list[int]:
    """``common`` (span ids that fit ``capacity`` together), then the best others by ``scores`` [n_spans] that fit
    the rest (``choose_fitting``)."""
    used = int(lengths[common].sum()) if common else 0
    rest = scores.astype(np.float64, copy=True)
    rest[common] = -np.inf
    return list(common) + [sid for sid in choose_fitting(rest, lengths, capacity - used) if np.isfinite(rest[sid])]


class ZoomSlots:
    """``n_zoom`` cells claimed at position 0 (``claim``); per layer: span id -> slot indices, and each resident
    span's last choice (decode step)."""

    def __init__(self, hook: KVHook, n_zoom: int, n_layer: int, max_new: int):
        self.hook, self.n_zoom, self.max_new = hook, n_zoom, max_new
        self.slots = np.zeros(0, dtype=np.int32)                      # [n_zoom] cells, once claimed
        self.resident: list[dict[int, np.ndarray]] = [{} for _ in range(n_layer)]
        self.last_use: list[dict[int, int]] = [{} for _ in range(n_layer)]
        self.zooms = 0         # spans rebuilt into slots
        self.rebuilt_rows = 0  # token rows rebuilt
        self.changes = 0       # spans zoomed in or out (a routing that changes nothing leaves it)

    @property
    def capacity(self) -> int:
        """Token rows the slots hold per layer."""
        return self.n_zoom

    def held(self, ikv: int) -> list[int]:
        """The span ids layer ``ikv`` holds, in the order they were zoomed."""
        return list(self.resident[ikv])

    def claim(self, cells: np.ndarray) -> None:
        """Take ``cells`` (free cells of the budget) as the slots, masked in every layer until used."""
        self.slots = np.asarray(cells, dtype=np.int32)
        self.hook.claim(self.slots, np.zeros(self.slots.size, dtype=np.int32))
        self.hook.set_bias_cells(-1, self.slots, NEG_INF)

    def to_plain(self) -> dict:
        """The slots' cells, per layer which span sits in which slots and when it was last chosen, the counters."""
        return {"slots": self.slots, "resident": [{int(k): v for k, v in r.items()} for r in self.resident],
                "last_use": [dict(u) for u in self.last_use], "zooms": self.zooms,
                "rebuilt_rows": self.rebuilt_rows, "changes": self.changes}

    def load_plain(self, data: dict) -> None:
        self.slots = np.asarray(data["slots"], dtype=np.int32)
        self.resident = [{int(k): np.asarray(v, dtype=np.int64) for k, v in r.items()} for r in data["resident"]]
        self.last_use = [{int(k): int(v) for k, v in u.items()} for u in data["last_use"]]
        if len(self.resident) != len(self.last_use):
            raise ValueError("saved zoom slots: resident and last_use differ in layers")
        self.zooms, self.rebuilt_rows, self.changes = int(data["zooms"]), int(data["rebuilt_rows"]), int(data["changes"])

    def rebuild(self, spans: list[Span]) -> None:
        """Write every resident span's rows into its slots again from the host tier, as ``zoom`` wrote them (a
        compact memory file leaves the slots' rows out); biases are not touched."""
        for ikv, resident in enumerate(self.resident):
            if not resident:
                continue
            sids = list(resident)
            bad = [sid for sid in sids if not (0 <= sid < len(spans) and resident[sid].size == spans[sid].length
                                               and resident[sid].max(initial=-1) < self.slots.size)]
            if bad:
                raise ValueError(f"zoom slots of layer {ikv}: span {bad[0]} does not fit its slots")
            self._write_rows(ikv, sids, [resident[sid] for sid in sids], spans)

    def _write_rows(self, ikv: int, sids: list[int], idx: list[np.ndarray], spans: list[Span]) -> np.ndarray:
        """Write the rows of spans ``sids`` in layer ``ikv`` from the host tier into the slots ``idx[i]`` (one row
        write for all); the cells written."""
        hook = self.hook
        # [L, Hkv, d] f16, or a quantized cache's blocks (kept ones byte for byte)
        k = [spans[sid].k[ikv].device_rows(hook.info.type_k) for sid in sids]
        v = [spans[sid].v[ikv].device_rows(hook.info.type_v) for sid in sids]
        cells = self.slots[np.concatenate(idx)]
        hook.set_rows(ikv, cells, np.concatenate([r.reshape(r.shape[0], -1) for r in k]),
                      np.concatenate([r.reshape(r.shape[0], -1) for r in v]))
        return cells

    def forget(self, first: int) -> None:
        """Spans ``first, first+1, ...`` are gone (a rollback): free their slots in every layer."""
        for ikv, resident in enumerate(self.resident):
            gone = [s for s in resident if s >= first]
            if not gone:
                continue
            idx = np.concatenate([resident.pop(sid) for sid in gone])
            self.hook.set_bias_cells(ikv, self.slots[idx], NEG_INF)  # one write for the layer
            for sid in gone:
                del self.last_use[ikv][sid]

    def choose(self, scores: np.ndarray, lengths: np.ndarray, pins: list[int] = (), share: float = 0.0) -> list[int]:
        """Span ids in descending score that fit the slots together (``choose_fitting``); with ``pins`` (span ids,
        best first), those that fit ``share`` of the slots come first (``pinned``)."""
        if not len(pins) or share <= 0:
            return choose_fitting(scores, lengths, self.n_zoom)
        return choose_around(self.pinned(pins, lengths, share), scores, lengths, self.n_zoom)

    def pinned(self, pins: list[int], lengths: np.ndarray, share: float) -> list[int]:
        """The ``pins`` (span ids, best first) that fit ``share`` of the slots together, in their order."""
        return fit_in_order(pins, lengths, int(share * self.n_zoom)) if share > 0 else []

    def zoom(self, ikv: int, chosen: list[int], spans: list[Span], step: int, capped: bool = True,
             summary_bias: np.ndarray | None = None) -> None:
        """Make layer ``ikv`` hold the ``chosen`` spans (score order): those resident stay, new ones are rebuilt
        from their host factors (at most ``max_new`` when ``capped`` — a decode step's routing — after the first
        step), evicting the least recently chosen; an evicted span's summary row gets its bias back
        (``summary_bias`` f32 [n_spans], the layer's: ``SpanStore.summary_bias``; None: log|S|)."""
        hook, resident, last_use = self.hook, self.resident[ikv], self.last_use[ikv]
        for sid in chosen:
            if sid in resident:
                last_use[sid] = step
        taken = np.zeros(self.slots.size, dtype=bool)
        for idx in resident.values():
            taken[idx] = True
        want = [sid for sid in chosen if sid not in resident]
        if capped and step > 0:
            want = want[: self.max_new]
        need = sum(spans[sid].length for sid in want)
        # the layer's changes, written together at the end: slots masked / unmasked, summary cells' bias, new rows
        masked: list[np.ndarray] = []
        summary_cells: list[int] = []
        biases: list[float] = []
        for sid in sorted((s for s in resident if s not in chosen), key=lambda s: last_use[s]):
            if need <= int((~taken).sum()):
                break
            idx = resident.pop(sid)
            del last_use[sid]
            taken[idx] = False
            self.changes += 1
            masked.append(idx)
            if spans[sid].summary_cell >= 0:
                summary_cells.append(spans[sid].summary_cell)
                biases.append(math.log(spans[sid].length) if summary_bias is None else float(summary_bias[sid]))
        new_sids: list[int] = []
        new_idx: list[np.ndarray] = []
        for sid in want:
            span = spans[sid]
            free = np.flatnonzero(~taken)
            if free.size < span.length:
                continue
            idx = free[: span.length]
            taken[idx] = True
            new_sids.append(sid)
            new_idx.append(idx)
            if span.summary_cell >= 0:
                summary_cells.append(span.summary_cell)
                biases.append(NEG_INF)
            resident[sid] = idx
            last_use[sid] = step
            self.zooms += 1
            self.changes += 1
            self.rebuilt_rows += span.length
        if masked:
            # slots freed and not taken again by a new span stay masked (a new span's slots get bias 0 below)
            freed = np.concatenate(masked)
            freed = freed[~taken[freed]]
            if freed.size:
                hook.set_bias_cells(ikv, self.slots[freed], NEG_INF)
        if new_idx:
            hook.set_bias_cells(ikv, self._write_rows(ikv, new_sids, new_idx, spans), 0.0)
        if summary_cells:
            # a span evicted and zoomed again in one routing cannot happen (evicted spans are not chosen), so each
            # summary cell appears once
            hook.set_bias_cells(ikv, summary_cells, np.asarray(biases, dtype=np.float32))
