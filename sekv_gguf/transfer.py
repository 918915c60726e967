"""Copying tokens from one session to another: a prompt prefilled in a temporary full-size context moves into a
budget-sized one (exact prefill, SnapKV's selection)."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from .errors import BudgetError
from .session import Session


def copy_swa_state(src: Session, dst: Session) -> None:
    """Copy an iSWA model's sliding-window cache whole through llama.cpp's state API (PARTIAL_ONLY)."""
    flag = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
    size = llama_cpp.llama_state_seq_get_size_ext(src.ctx, 0, flag)
    buf = (ctypes.c_uint8 * size)()
    got = llama_cpp.llama_state_seq_get_data_ext(src.ctx, buf, size, 0, flag)
    if got != size or llama_cpp.llama_state_seq_set_data_ext(dst.ctx, buf, size, 0, flag) != size:
        raise BudgetError("the sliding-window cache does not fit the budget context")


def copy_tokens(src: Session, dst: Session, positions: np.ndarray) -> np.ndarray:
    """Claim cells 0..k-1 of ``dst`` for ``positions`` (ascending) and copy their K/V rows from ``src`` in every
    hooked layer; the sliding-window cache of an iSWA model comes over too. Returns the cells (int32 [k])."""
    positions = np.asarray(positions, dtype=np.int32)
    src_cells = src.hook.cells_of(int(positions.max()) + 1 if positions.size else 0)[positions]
    if src.hook.info.is_iswa:
        copy_swa_state(src, dst)
    cells = np.arange(positions.size, dtype=np.int32)
    dst.hook.claim(cells, positions)
    for ikv in range(dst.hook.info.n_layer_kv):
        k, v = src.hook.get_rows(ikv, src_cells)
        dst.hook.set_rows(ikv, cells, k, v)
    return cells
