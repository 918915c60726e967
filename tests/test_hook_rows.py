"""Row I/O and re-celling through the hook reproduce llama.cpp's own results."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_close_reordered, full_kv_logits, prefilled, prose, seq_cells

NEXT = "x"


def _all_rows(session, cells):
    return [session.hook.get_rows(ikv, cells) for ikv in range(session.hook.info.n_layer_kv)]


def _round_trip(open_session, path, n_chars: int, **cfg) -> None:
    text = prose(n_chars)
    want = full_kv_logits(open_session, path, text, **cfg)

    s, last = prefilled(open_session, path, text, **cfg)
    cells = seq_cells(s)
    saved = _all_rows(s, cells)
    for ikv, (k, v) in enumerate(saved):
        s.hook.set_rows(ikv, cells, np.zeros_like(k), np.zeros_like(v))
        zk, zv = s.hook.get_rows(ikv, cells)
        assert not zk.any() and not zv.any(), "zeros were not written"
    for ikv, (k, v) in enumerate(saved):
        s.hook.set_rows(ikv, cells, k, v)
    got = s.decode([last])
    np.testing.assert_array_equal(got, want)

    # the cache contents matter: with the rows left at zero the logits change
    z, last = prefilled(open_session, path, text, **cfg)
    for ikv, (k, v) in enumerate(saved):
        z.hook.set_rows(ikv, seq_cells(z), np.zeros_like(k), np.zeros_like(v))
    assert np.abs(z.decode([last]) - want).max() > 1e-3


def test_round_trip_tiny_llama(open_session, tiny_llama):
    _round_trip(open_session, tiny_llama, 400, n_ctx=512, n_batch=128, n_ubatch=128)


def test_round_trip_transposed_v(open_session, tiny_llama):
    """Flash attention off: V is stored transposed and the hook re-packs it per cell."""
    s = open_session(tiny_llama, n_ctx=512, flash_attn=False)
    assert s.hook.info.v_trans and not s.hook.info.flash_attn
    _round_trip(open_session, tiny_llama, 400, n_ctx=512, flash_attn=False)


def test_round_trip_tiny_gemma_iswa(open_session, tiny_gemma):
    s = open_session(tiny_gemma, n_ctx=512)
    assert s.hook.info.is_iswa
    assert s.hook.model_layers == [2, 5]  # only the global layers: (il + 1) % 3 == 0
    _round_trip(open_session, tiny_gemma, 400, n_ctx=512, n_batch=128, n_ubatch=128)


@pytest.mark.gemma
def test_round_trip_gemma_270m(open_session, gemma_path):
    s = open_session(gemma_path, n_ctx=512)
    info = s.hook.info
    assert info.is_iswa and info.n_layer_model == 18
    assert s.hook.model_layers == [5, 11, 17]
    assert all(layer.n_head == 4 and layer.n_head_kv == 1 and layer.head_dim_k == 256 for layer in s.hook.layers)
    assert info.bytes_per_cell == 3 * 2 * 256 * 2  # 3 global layers x (K+V) x 256 x f16 = 3 KB/token
    _round_trip(open_session, gemma_path, 1500, n_ctx=512)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
def test_relocation_matches_full_kv(open_session, tiny_llama, flash_attn):
    """Release a range of cells and re-insert their rows elsewhere at the same positions: same logits."""
    cfg = dict(n_ctx=512, n_batch=128, n_ubatch=128, flash_attn=flash_attn)
    text = prose(350, offset=1000)
    want = full_kv_logits(open_session, tiny_llama, text, **cfg)

    s, last = prefilled(open_session, tiny_llama, text, **cfg)
    cells = seq_cells(s)
    pos = s.hook.cells_pos()[cells]
    moved = cells[20:120]  # not the newest
    rows = _all_rows(s, moved)
    s.hook.release(moved)
    assert (s.hook.cells_pos()[moved] == -1).all()
    target = np.arange(400, 400 + moved.size, dtype=np.int32)[::-1].copy()  # other cells, reversed order
    s.hook.claim(target, pos[20:120])
    for ikv, (k, v) in enumerate(rows):
        s.hook.set_rows(ikv, target, k, v)
    np.testing.assert_array_equal(s.hook.cells_pos()[target], pos[20:120])
    got = s.decode([last])
    assert_close_reordered(got, want, flash_attn)

    # without re-insertion the logits differ: the released cells really left attention
    r, last = prefilled(open_session, tiny_llama, text, **cfg)
    r.hook.release(seq_cells(r)[20:120])
    assert np.abs(r.decode([last]) - want).max() > 1e-2
