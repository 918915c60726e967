"""A policy's memory as a ``SavedMemory`` and back: ``capture`` (the device cells through the hook — for ``full``,
llama.cpp's own sequence state —, the memory object's plain data, the tokens, the fingerprint) and ``restore_into``
(refused, naming the problem, into a policy of another model or settings). ``save_memory`` / ``load_memory`` do
the same with a file.

Modes. ``lossless``: everything; the next logits equal the saving process's bit for bit (CPU). ``compact``: what
the restore can rebuild is left out — the zoom slots' rows (the spans that sit in them are kept and written again
from the host tier, as a zoom writes them) and, on iSWA models, the sliding-window cache with the window's newest
``n_swa + tail_refresh`` tokens (decoded again on restore over the memory, as the prompt's tail refresh decodes
them), the routing index (computed again from the host K rows) — and no carried logits; the device rows it keeps
are stored as q8_0 blocks and its arrays deflated (``packing``), so the next logits are close to, not equal to, the
saving process's. ``compact3``: compact with the host tier's 4-bit codes
stored in 3 bits. For a policy without zoom slots the compact modes only drop the logits and store the device rows
as q8_0. In every mode the spans' arrays are saved as a few flat tensors (``packing``)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from ..errors import MemoryFileError, SekvError
from ..policies.base import Policy
from ..policies.prefill import redecode_tail
from ..policies.snapshot import DeviceState, Snapshot
from . import packing
from .fileio import COMPACT_MODES, MODES, SavedMemory, read_memory_file, write_memory_file
from .fingerprint import Fingerprint

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


def _recompute_tokens(policy: Policy, memory: dict[str, Any], device: DeviceState) -> int:
    """How many of the newest tokens a compact file of a SeKV memory leaves to its restore: on an iSWA model the
    last token's sliding window and the tail refresh's tokens before it (``n_swa + tail_refresh``, or what the
    window holds if less: the first tokens decoded again see a shorter window in the local layers, and warm the
    sliding-window cache up for the last ``n_swa``); 0 elsewhere, or where the window holds no more than ``n_swa``
    tokens (the rows and the sliding-window cache are kept)."""
    info = policy.session.hook.info
    if device.swa is None or not info.is_iswa:
        return 0
    n_swa = int(info.n_swa)
    k = min(n_swa + int(getattr(policy, "tail_refresh", 0)), len(memory["window"]["pos"]))
    return k if k > n_swa else 0


def _compact(policy: Policy, device: DeviceState, memory: dict[str, Any]) -> np.ndarray:
    """Leave out of ``device`` what a compact restore rebuilds; the bool mask of ``device.cells`` whose rows are not
    saved (records in ``memory`` how many tokens the restore decodes again)."""
    blank = np.zeros(device.cells.size, dtype=bool)
    if "zoom" not in memory or "window" not in memory:
        return blank
    blank |= np.isin(device.cells, np.asarray(memory["zoom"]["slots"], dtype=np.int32))
    k = _recompute_tokens(policy, memory, device)
    if k:
        blank |= np.isin(device.cells, np.asarray(memory["window"]["cell"])[-k:])
        device.swa = None
    memory["recompute"] = k
    return blank


def _saved(policy: Policy, tokens: list[int], device: dict[str, Any] | DeviceState, memory: dict[str, Any],
           mode: str) -> SavedMemory:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    fp = Fingerprint.of(policy, tokens)
    if isinstance(device, DeviceState):
        blank = _compact(policy, device, memory) if mode in COMPACT_MODES else np.zeros(device.cells.size, dtype=bool)
        device = _device_plain(device, blank)
    if mode in COMPACT_MODES and "prev_logits" in memory:
        memory["prev_logits"] = None
    content = {"tokens": np.asarray(tokens, dtype=np.int32), "device": device, "memory": memory}
    packing.pack(content, mode)
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
    policy.reset()
    try:
        content = packing.unpack(saved.content)
        device = content["device"]
        if "llama_seq" in device:
            _put_seq_state(policy, device["llama_seq"])
        else:
            _device_state(device).put(policy.session)
        memory = content["memory"]
        recompute = int(memory.get("recompute", 0)) if isinstance(memory, dict) else 0
        policy.memory.load_plain(memory)
        policy.tokens = saved.tokens
        policy.phase = "decode"
        if saved.mode in COMPACT_MODES and "zoom" in memory and "window" in memory:
            _rebuild(policy, saved.tokens, recompute)
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


def _rebuild(policy: Policy, tokens: list[int], recompute: int) -> None:
    """What a compact file left out: the zoomed spans' rows from the host tier, then the newest ``recompute``
    tokens decoded again (the window's newest rows, the sliding-window cache, the next logits)."""
    memory = policy.memory
    memory.zoom.rebuild(memory.store.spans)
    if recompute:
        if not 0 < recompute <= min(len(tokens), len(memory.window)):
            raise ValueError(f"{recompute} tokens to decode again, the window holds {len(memory.window)}")
        redecode_tail(memory, tokens, recompute)


def save_memory(policy: Policy, path: str | Path, mode: str = "lossless") -> Path:
    """Write the memory of ``policy`` to ``path`` (atomically, mode 0600)."""
    return write_memory_file(path, capture(policy, mode))


def load_memory(policy: Policy, path: str | Path) -> SavedMemory:
    """Load the memory file at ``path`` into ``policy`` (see ``restore_into``); returns what was read."""
    saved = read_memory_file(path)
    restore_into(policy, saved, str(path))
    return saved
