"""A policy's memory as a ``SavedMemory`` and back: ``capture`` (the device cells through the hook — for ``full``,
llama.cpp's own sequence state —, the memory object's plain data, the tokens, the fingerprint) and ``restore_into``
(refused, naming the problem, into a policy of another model or settings). ``save_memory`` / ``load_memory`` do
the same with a file.

Modes. ``lossless``: everything; the next logits equal the saving process's bit for bit (CPU). ``compact``: every
zoomed span back at summary resolution — the rows of the zoom slots (rebuilt from the host tier when a routing
wants them again, as the next turn's does) are not saved, the slots come back empty and masked — and no carried
logits (a vocabulary row, only the next append's first segmentation signal reads them); for a policy without zoom
slots only the logits are dropped."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from ..errors import MemoryFileError, SekvError
from ..policies.base import Policy
from ..policies.snapshot import DeviceState, Snapshot
from .fileio import MODES, SavedMemory, read_memory_file, write_memory_file
from .fingerprint import Fingerprint

NEG_INF = float("-inf")
FULL = "full"  # the policy whose device state is llama.cpp's own sequence state


def _seq_state(policy: Policy) -> bytes:
    """llama.cpp's state of sequence 0 (both caches of an iSWA model), written back into the context as a restore
    into a new one lays it out (see ``_repack_swa``)."""
    ctx = policy.session.ctx
    size = llama_cpp.llama_state_seq_get_size_ext(ctx, 0, 0)
    buf = (ctypes.c_uint8 * size)()
    if llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, 0, 0) != size:
        raise SekvError("llama.cpp could not write the sequence state")
    if llama_cpp.llama_state_seq_set_data_ext(ctx, buf, size, 0, 0) != size:
        raise SekvError("llama.cpp could not re-pack the sequence state")
    return bytes(buf)


def _repack_swa(policy: Policy, swa: bytes) -> None:
    """Write the sliding-window cache's own state back into it: llama.cpp puts the cells in one run from the first
    free cell, as a restore into a new context does, so the saving process and one that loads the file continue
    from the same cell layout (the order of cells is the order flash attention sums them in: bit-identical logits
    need it). The cells' positions and rows are unchanged."""
    buf = (ctypes.c_uint8 * len(swa)).from_buffer_copy(swa)
    flag = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
    if llama_cpp.llama_state_seq_set_data_ext(policy.session.ctx, buf, len(swa), 0, flag) != len(swa):
        raise SekvError("llama.cpp could not re-pack the sliding-window cache")


def _device_plain(state: DeviceState, blank: np.ndarray) -> dict[str, Any]:
    keep = ~blank
    return {"cells": state.cells, "pos": state.pos, "blank": blank,
            "rows": [[k[keep], v[keep]] for k, v in state.rows], "bias": state.bias,
            "swa": state.swa}


def _unzoom(device: DeviceState, memory: dict[str, Any]) -> np.ndarray:
    """Every zoomed span back at summary resolution in ``device`` (biases) and ``memory`` (the zoom slots' plain
    data), as ``ZoomSlots`` evicts a span; the bool mask of ``device.cells`` that are zoom slots."""
    zoom, spans = memory["zoom"], memory["store"]["spans"]
    slots = np.asarray(zoom["slots"], dtype=np.int32)
    if device.bias is not None:
        for ikv, resident in enumerate(zoom["resident"]):
            for sid, idx in resident.items():
                device.bias[ikv][slots[idx]] = NEG_INF
                span = spans[int(sid)]
                if int(span["summary_cell"]) >= 0:
                    device.bias[ikv][int(span["summary_cell"])] = math.log(int(np.asarray(span["positions"]).size))
    zoom["resident"] = [{} for _ in zoom["resident"]]
    zoom["last_use"] = [{} for _ in zoom["last_use"]]
    return np.isin(device.cells, slots)


def _saved(policy: Policy, tokens: list[int], device: dict[str, Any] | DeviceState, memory: dict[str, Any],
           mode: str) -> SavedMemory:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    fp = Fingerprint.of(policy, tokens)
    if isinstance(device, DeviceState):
        blank = np.zeros(device.cells.size, dtype=bool)
        if mode == "compact" and "zoom" in memory and "store" in memory:
            blank = _unzoom(device, memory)
        device = _device_plain(device, blank)
    if mode == "compact" and "prev_logits" in memory:
        memory["prev_logits"] = None
    content = {"tokens": np.asarray(tokens, dtype=np.int32), "device": device, "memory": memory}
    return SavedMemory(fingerprint=fp, mode=mode, content=content)


def capture(policy: Policy, mode: str = "lossless") -> SavedMemory:
    """The memory of ``policy`` as it is now, independent of it (the memory object is copied as a snapshot copies
    it: immutable span data shared). The memory is not changed; on iSWA models the sliding-window cache's cells are
    re-packed (``_repack_swa``). ``full`` is saved as llama.cpp's own sequence state."""
    memory = policy.memory.copy().to_plain()
    if policy.recipe is not None and policy.recipe.name == FULL:
        return _saved(policy, list(policy.tokens), {"llama_seq": _seq_state(policy)}, memory, mode)
    state = DeviceState.take(policy.session)
    if state.swa is not None:
        _repack_swa(policy, state.swa)
    return _saved(policy, list(policy.tokens), state, memory, mode)


def capture_snapshot(policy: Policy, snap: Snapshot, mode: str = "lossless") -> SavedMemory:
    """A snapshot of ``policy`` (``Policy.snapshot``: a memory kept in RAM) as a ``SavedMemory``."""
    device = DeviceState(cells=snap.device.cells, pos=snap.device.pos, rows=list(snap.device.rows),
                         bias=None if snap.device.bias is None else [b.copy() for b in snap.device.bias],
                         swa=snap.device.swa)
    return _saved(policy, list(snap.tokens), device, snap.memory.copy().to_plain(), mode)


def _device_state(device: dict[str, Any]) -> DeviceState:
    cells, pos, blank = (np.asarray(device[k]) for k in ("cells", "pos", "blank"))
    if not (cells.shape == pos.shape == blank.shape and cells.ndim == 1):
        raise ValueError(f"device cells {cells.shape}, positions {pos.shape}, blank mask {blank.shape} differ")
    rows = []
    for k, v in device["rows"]:
        full_k = np.zeros((cells.size,) + k.shape[1:], dtype=k.dtype)
        full_v = np.zeros((cells.size,) + v.shape[1:], dtype=v.dtype)
        full_k[~blank], full_v[~blank] = k, v
        rows.append((full_k, full_v))
    swa = device["swa"]
    return DeviceState(cells=cells.astype(np.int32), pos=pos.astype(np.int32), rows=rows, bias=device["bias"],
                       swa=None if swa is None else np.asarray(swa, dtype=np.uint8).tobytes())


def _put_seq_state(policy: Policy, data: np.ndarray) -> None:
    raw = np.asarray(data, dtype=np.uint8).tobytes()
    buf = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
    llama_cpp.llama_memory_clear(policy.session.memory, True)
    if llama_cpp.llama_state_seq_set_data_ext(policy.session.ctx, buf, len(raw), 0, 0) != len(raw):
        raise SekvError("llama.cpp refused the saved sequence state")


def restore_into(policy: Policy, saved: SavedMemory, source: str = "saved memory") -> None:
    """Make ``policy`` hold ``saved``; refused (``MemoryMismatchError``) when it was made for another model, policy,
    size, budget, K/V types, batch sizes or settings. A memory that fails half way leaves ``policy`` empty."""
    saved.fingerprint.check_fits(Fingerprint.of(policy), source)
    content = saved.content
    policy.reset()
    try:
        device = content["device"]
        if "llama_seq" in device:
            _put_seq_state(policy, device["llama_seq"])
        else:
            _device_state(device).put(policy.session)
        policy.memory.load_plain(content["memory"])
        policy.tokens = saved.tokens
        policy.phase = "decode"
    except Exception as e:
        policy.reset()
        if isinstance(e, MemoryFileError):
            raise
        raise MemoryFileError(f"{source} does not fit this {policy.recipe.name} memory ({type(e).__name__}: "
                              f"{e})") from e
    last = policy.session.pos_max()
    if last + 1 != policy.n_tokens:
        n = policy.n_tokens
        policy.reset()
        raise MemoryFileError(f"{source}: its cells end at position {last}, not at its {n} tokens")


def save_memory(policy: Policy, path: str | Path, mode: str = "lossless") -> Path:
    """Write the memory of ``policy`` to ``path`` (atomically, mode 0600)."""
    return write_memory_file(path, capture(policy, mode))


def load_memory(policy: Policy, path: str | Path) -> SavedMemory:
    """Load the memory file at ``path`` into ``policy`` (see ``restore_into``); returns what was read."""
    saved = read_memory_file(path)
    restore_into(policy, saved, str(path))
    return saved
