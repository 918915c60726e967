"""Positions beyond n_ctx: a small cache serves a long sequence when cells are released between chunks."""

from __future__ import annotations

import llama_cpp
import numpy as np

from helpers import prose

N_CTX = 512
CHUNK = 128
SINKS = 4


def _stream(session, toks: list[int], release) -> tuple[np.ndarray, int]:
    """Feed ``toks`` in chunks, freeing the oldest non-sink cells before each chunk; return the final logits and the
    largest number of occupied cells seen (read from the hook)."""
    peak = 0
    logits = None
    for c0 in range(0, len(toks), CHUNK):
        chunk = toks[c0:c0 + CHUNK]
        pos = session.hook.cells_pos()
        used = np.flatnonzero(pos >= 0)
        excess = used.size + len(chunk) - N_CTX
        if excess > 0:
            order = used[np.argsort(pos[used])]
            release(order[SINKS:SINKS + excess], pos)
        logits = session.decode(chunk)
        peak = max(peak, int((session.hook.cells_pos() >= 0).sum()))
    return logits, peak


def test_small_cache_serves_long_sequence(open_session, tiny_llama):
    toks = open_session(tiny_llama, n_ctx=N_CTX).tokenize(prose(2300))
    assert len(toks) > 2000

    def hook_release(cells, pos):
        s_hook.hook.release(cells)

    s_hook = open_session(tiny_llama, n_ctx=N_CTX, n_batch=CHUNK, n_ubatch=CHUNK)
    assert s_hook.hook.info.kv_size == N_CTX
    got, peak = _stream(s_hook, toks, hook_release)
    assert peak <= N_CTX
    pos = s_hook.hook.cells_pos()
    assert pos.max() == len(toks) - 1 > N_CTX  # positions run past the cache size
    assert s_hook.pos_max() == len(toks) - 1
    assert sorted(pos[pos >= 0])[:SINKS] == list(range(SINKS))  # the sinks stayed

    # the same evictions through llama.cpp's own API (positions, not cells) give the same logits
    s_ref = open_session(tiny_llama, n_ctx=N_CTX, n_batch=CHUNK, n_ubatch=CHUNK)

    def api_release(cells, pos):
        p = np.sort(pos[cells])
        assert (np.diff(p) == 1).all()
        llama_cpp.llama_memory_seq_rm(s_ref.memory, 0, int(p[0]), int(p[-1]) + 1)

    want, _ = _stream(s_ref, toks, api_release)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(s_ref.hook.cells_pos(), pos)
