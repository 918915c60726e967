"""Snapshots of a policy's memory, restorable into the same policy: the device cells of the hooked cache (rows,
positions, per-layer bias), the sliding-window cache of an iSWA model, and a copy of the policy's memory object
(``PolicyMemory``). Span factors in host memory are immutable and shared with the live memory, not copied. What a conversation memory, a
prompt checkpoint and the LRU of memories are made of (``sekv_gguf.memory``)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp
import numpy as np

from ..errors import HookStateError
from ..session import Session
from .memory_state import PolicyMemory


@dataclass
class DeviceState:
    """cells int32 [n], pos int32 [n]; per hooked layer K and V rows [n, ...] and the bias [kv_size] (None when the
    bias is off); the SWA cache's bytes (iSWA models)."""

    cells: np.ndarray
    pos: np.ndarray
    rows: list[tuple[np.ndarray, np.ndarray]]
    bias: list[np.ndarray] | None
    swa: bytes | None

    @classmethod
    def take(cls, session: Session) -> "DeviceState":
        hook = session.hook
        pos = hook.cells_pos()
        cells = np.flatnonzero(pos >= 0).astype(np.int32)
        rows = [hook.get_rows(ikv, cells) for ikv in range(hook.info.n_layer_kv)]
        try:
            bias = [hook.get_bias(ikv) for ikv in range(hook.info.n_layer_kv)]
        except HookStateError:  # bias switched off
            bias = None
        swa = None
        if hook.info.is_iswa:
            flag = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the SWA cache only
            size = llama_cpp.llama_state_seq_get_size_ext(session.ctx, 0, flag)
            buf = (ctypes.c_uint8 * size)()
            if llama_cpp.llama_state_seq_get_data_ext(session.ctx, buf, size, 0, flag) != size:
                raise RuntimeError("could not read the sliding-window cache")
            swa = bytes(buf)
        return cls(cells=cells, pos=pos[cells].astype(np.int32), rows=rows, bias=bias, swa=swa)

    def put(self, session: Session) -> None:
        """Make ``session``'s cache hold exactly this state (same cells, positions, rows, bias)."""
        hook = session.hook
        llama_cpp.llama_memory_seq_rm(session.memory, 0, -1, -1)
        if self.swa is not None:
            buf = (ctypes.c_uint8 * len(self.swa)).from_buffer_copy(self.swa)
            flag = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if llama_cpp.llama_state_seq_set_data_ext(session.ctx, buf, len(self.swa), 0, flag) != len(self.swa):
                raise RuntimeError("could not restore the sliding-window cache")
        hook.claim(self.cells, self.pos)
        for ikv, (k, v) in enumerate(self.rows):
            hook.set_rows(ikv, self.cells, k, v)
        if self.bias is not None:
            hook.enable_bias()
            for ikv, b in enumerate(self.bias):
                hook.set_bias(ikv, b)

    @property
    def nbytes(self) -> int:
        rows = sum(k.nbytes + v.nbytes for k, v in self.rows)
        return int(rows + sum(b.nbytes for b in self.bias or []) + len(self.swa or b"") + self.cells.nbytes * 2)


@dataclass
class Snapshot:
    """A policy's memory of ``tokens``: its device state and a copy of its memory object (``Policy.snapshot``)."""

    tokens: list[int]
    device: DeviceState
    memory: PolicyMemory
    host_bytes: int  # bytes this snapshot holds in host memory (its device copy, bookkeeping and the spans it keeps)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)
