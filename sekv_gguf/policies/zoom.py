"""Zoom slots: the cells of the budget reserved for rebuilt spans. Per hooked layer they hold that layer's zoomed
spans (bias 0; the span's summary row gets -inf) or nothing (bias -inf); a layer keeps what it zoomed until the
slots are needed for newer choices (least recently chosen first)."""

from __future__ import annotations

import math

import numpy as np

from ..hook import KVHook
from ..spans import Span

NEG_INF = float("-inf")


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

    def keys(self, ikv: int) -> dict[int, np.ndarray]:
        """span id -> K rows f16 [L, Hkv, d] of each span layer ``ikv`` holds, read from its device cells (what a
        two-stage router judges resident spans by, without reading the host tier)."""
        resident = self.resident[ikv]
        if not resident:
            return {}
        idx = np.concatenate(list(resident.values()))                 # [n] slot indices, span after span
        k, _ = self.hook.get_values(ikv, self.slots[idx])              # [n, Hkv, d] numbers (blocks dequantized)
        k = k.astype(np.float16, copy=False)
        cut = np.cumsum([0] + [i.size for i in resident.values()])
        return {sid: k[cut[j]:cut[j + 1]] for j, sid in enumerate(resident)}

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

    def forget(self, first: int) -> None:
        """Spans ``first, first+1, ...`` are gone (a rollback): free their slots in every layer."""
        for ikv, resident in enumerate(self.resident):
            for sid in [s for s in resident if s >= first]:
                self.hook.set_bias_cells(ikv, self.slots[resident.pop(sid)], NEG_INF)
                del self.last_use[ikv][sid]

    def choose(self, scores: np.ndarray, lengths: np.ndarray) -> list[int]:
        """Span ids in descending score that fit the slots together (a span that does not fit is skipped)."""
        chosen, used = [], 0
        for sid in np.argsort(-scores, kind="stable"):
            if used + lengths[sid] <= self.n_zoom:
                chosen.append(int(sid))
                used += int(lengths[sid])
        return chosen

    def zoom(self, ikv: int, chosen: list[int], spans: list[Span], step: int, capped: bool = True) -> None:
        """Make layer ``ikv`` hold the ``chosen`` spans (score order): those resident stay, new ones are rebuilt
        from their host factors (at most ``max_new`` when ``capped`` — a decode step's routing — after the first
        step), evicting the least recently chosen."""
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
        for sid in sorted((s for s in resident if s not in chosen), key=lambda s: last_use[s]):
            if need <= int((~taken).sum()):
                break
            idx = resident.pop(sid)
            del last_use[sid]
            taken[idx] = False
            self.changes += 1
            hook.set_bias_cells(ikv, self.slots[idx], NEG_INF)
            if spans[sid].summary_cell >= 0:
                hook.set_bias_cells(ikv, [spans[sid].summary_cell], math.log(spans[sid].length))
        for sid in want:
            span = spans[sid]
            free = np.flatnonzero(~taken)
            if free.size < span.length:
                continue
            idx = free[: span.length]
            taken[idx] = True
            cells = self.slots[idx]
            # [L, Hkv, d] f16, or a quantized cache's blocks (kept ones byte for byte)
            k = span.k[ikv].device_rows(hook.info.type_k)
            v = span.v[ikv].device_rows(hook.info.type_v)
            hook.set_rows(ikv, cells, k, v)
            hook.set_bias_cells(ikv, cells, 0.0)
            if span.summary_cell >= 0:
                hook.set_bias_cells(ikv, [span.summary_cell], NEG_INF)
            resident[sid] = idx
            last_use[sid] = step
            self.zooms += 1
            self.changes += 1
            self.rebuilt_rows += span.length
