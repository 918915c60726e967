"""Bad input to the hook gives a clean exception that names the problem, leaves the cache unchanged, never crashes."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from helpers import prose, seq_cells
from sekv_gguf import _hook_api as api
from sekv_gguf.errors import HookIndexError, HookStateError, HookValueError, UnsupportedModelError
from sekv_gguf.hook import KVHook, check


@pytest.fixture
def s(open_session, tiny_llama):
    session = open_session(tiny_llama, n_ctx=256)
    session.decode(session.tokenize(prose(80)), logits="none")
    return session


def _i32(values) -> ctypes.Array:
    return (ctypes.c_int32 * len(values))(*values)


def test_layer_index_out_of_range(s):
    with pytest.raises(HookIndexError, match=r"KV layer index 2 out of range \[0, 2\)"):
        s.hook.get_rows(2, [0])
    with pytest.raises(HookIndexError, match=r"KV layer index -2 out of range \[0, 2\) \(or -1 for all\)"):
        s.hook.enable_bias()
        s.hook.set_bias(-2, np.zeros(256))
    # the C entry point checks on its own
    buf = ctypes.create_string_buffer(64)
    rc = api.sekv_kv_get_rows(s.ctx, 0, 7, _i32([0]), 1, buf, 64, buf, 64)
    with pytest.raises(HookIndexError, match="sekv_kv_get_rows: KV layer index 7"):
        check("sekv_kv_get_rows", rc)


@pytest.mark.parametrize("cells, message", [
    ([256], r"cells\[0\] = 256 out of range \[0, 256\)"),
    ([3, -1], r"cells\[1\] = -1 out of range"),
    ([5, 5], r"cells\[1\] = 5 appears twice"),
])
def test_cell_index_out_of_range(s, cells, message):
    with pytest.raises(HookIndexError, match=message):
        s.hook.get_rows(0, cells)
    with pytest.raises(HookIndexError, match=message):
        s.hook.release(cells)


def test_sequence_out_of_range(s):
    with pytest.raises(HookIndexError, match=r"sequence id 1 out of range \[0, 1\) \(the context's n_seq_max\)"):
        s.hook.cells_pos(seq=1)


def test_claim_position_above_maximum(s):
    top = s.pos_max()
    before = s.hook.cells_pos()
    with pytest.raises(HookValueError, match=rf"pos\[1\] = {top + 1} outside \[0, {top}\]"):
        s.hook.claim([200, 201], [3, top + 1])
    np.testing.assert_array_equal(s.hook.cells_pos(), before)  # all or nothing: cell 200 was not claimed
    with pytest.raises(HookValueError, match=r"pos\[0\] = -4"):
        s.hook.claim([200], [-4])


def test_claim_busy_cell_and_bad_lengths(s):
    with pytest.raises(HookValueError, match=r"cells\[0\] = 0 is not empty"):
        s.hook.claim([0], [0])
    with pytest.raises(HookValueError, match="2 cells but 1 positions"):
        s.hook.claim([200, 201], [0])


def test_claim_on_empty_sequence_sets_the_next_position(open_session, tiny_llama):
    """An empty sequence takes any positions; the largest becomes the maximum and the next decode follows it."""
    empty = open_session(tiny_llama, n_ctx=256)
    empty.hook.claim([7, 3], [40, 12])
    assert empty.pos_max() == 40
    with pytest.raises(HookValueError, match=r"pos\[0\] = 41 outside \[0, 40\]"):
        empty.hook.claim([8], [41])
    assert np.isfinite(empty.decode(empty.tokenize("a"), pos0=41)).all()


def test_release_foreign_or_newest_cell(s):
    with pytest.raises(HookValueError, match=r"cells\[0\] = 250 does not belong to sequence 0"):
        s.hook.release([250])
    newest = int(seq_cells(s)[-1])
    with pytest.raises(HookValueError, match="newest position"):
        s.hook.release([1, newest])
    assert s.hook.cells_pos()[1] == 1  # nothing was released


def test_null_buffers_and_wrong_sizes(s):
    n = 2
    row = s.hook.layers[0].k_row_bytes
    buf = ctypes.create_string_buffer(n * row)
    cells = _i32([0, 1])
    s.hook.enable_bias()
    s.hook.enable_query_capture()
    # (call, message): each is checked right after it runs, since the message belongs to the thread's last call
    cases = [
        (lambda: api.sekv_kv_get_rows(s.ctx, 0, 0, cells, n, None, n * row, buf, n * row), "dst_k is NULL"),
        (lambda: api.sekv_kv_set_rows(s.ctx, 0, 0, cells, n, buf, n * row, None, n * row), "src_v is NULL"),
        (lambda: api.sekv_kv_get_rows(s.ctx, 0, 0, None, n, buf, n * row, buf, n * row), "cells is NULL"),
        (lambda: api.sekv_kv_get_rows(s.ctx, 0, 0, cells, n, buf, n * row - 1, buf, n * row),
         rf"dst_k has {n * row - 1} bytes, {n * row} needed"),
        (lambda: api.sekv_kv_get_rows(s.ctx, 0, 0, cells, -1, buf, 0, buf, 0), "n = -1 is negative"),
        (lambda: api.sekv_kv_get_info(s.ctx, None), "out is NULL"),
        (lambda: api.sekv_kv_get_info(None, ctypes.byref(api.sekv_kv_info())), "ctx is NULL"),
        (lambda: api.sekv_kv_cells_pos(s.ctx, 0, None, 256), "pos_out is NULL"),
        (lambda: api.sekv_kv_cells_pos(s.ctx, 0, _i32([0] * 10), 10), "kv_size = 256 needed"),
        (lambda: api.sekv_kv_claim(s.ctx, 0, _i32([200]), None, 1), "pos is NULL"),
        (lambda: api.sekv_bias_set_layer(s.ctx, 0, None, 256), "bias is NULL"),
        (lambda: api.sekv_qcap_get(s.ctx, 0, None, 64), "out is NULL"),
        (lambda: api.sekv_qcap_get(s.ctx, 0, (ctypes.c_float * 8)(), 8), "out has 8 entries, n_head\\*head_dim_k = 64"),
        (lambda: api.sekv_qcap_probes(s.ctx, 0), "n_probes = 0, expected 1..256"),
        (lambda: api.sekv_qcap_probes(s.ctx, 257), "n_probes = 257, expected 1..256"),
        (lambda: api.sekv_qcap_get_probes(s.ctx, 0, (ctypes.c_float * 64)(), 64, None), "n_got is NULL"),
        (lambda: api.sekv_qcap_get_probes(s.ctx, 0, None, 64, ctypes.byref(ctypes.c_int32())), "out is NULL"),
        (lambda: api.sekv_qcap_get_probes(s.ctx, 0, (ctypes.c_float * 8)(), 8, ctypes.byref(ctypes.c_int32())),
         "out has 8 entries, n_probes\\*n_head\\*head_dim_k = 64"),
        (lambda: api.sekv_layer_cb_set(None, api.sekv_layer_callback(lambda ikv, user: None), None), "ctx is NULL"),
        (lambda: api.sekv_io_counters(s.ctx, None, 4), "out is NULL"),
        (lambda: api.sekv_io_counters(s.ctx, (ctypes.c_uint64 * 3)(), 3), "out has 3 entries, 4 needed"),
        (lambda: api.sekv_io_counters(None, (ctypes.c_uint64 * 4)(), 4), "ctx is NULL"),
    ]
    for call, message in cases:
        with pytest.raises(HookValueError, match=message):
            check("call", call())


def test_bias_values_and_state(s):
    with pytest.raises(HookStateError, match="bias is off"):
        s.hook.set_bias(0, np.zeros(256))
    with pytest.raises(HookStateError, match="bias is off"):
        s.hook.get_bias(0)
    s.hook.enable_bias()
    with pytest.raises(HookValueError, match=r"values\[1\] = nan"):
        s.hook.set_bias_cells(0, [0, 1], [0.0, np.nan])
    with pytest.raises(HookValueError, match=r"bias\[3\] = inf: a bias must be finite or -inf"):
        b = np.zeros(256)
        b[3] = np.inf
        s.hook.set_bias(0, b)
    with pytest.raises(HookValueError, match="bias has 10 entries, kv_size = 256 needed"):
        s.hook.set_bias(0, np.zeros(10))
    assert not s.hook.get_bias(0).any()  # rejected writes changed nothing


def test_query_capture_off(s):
    with pytest.raises(HookStateError, match="query capture is off"):
        s.hook.query(0)


def test_unsupported_model(open_session, tiny_mrope):
    m = open_session(tiny_mrope, n_ctx=256)
    m.decode(m.tokenize("works without the hook"))  # the model itself runs
    with pytest.raises(UnsupportedModelError, match="M-RoPE"):
        KVHook(m.ctx)


def test_context_survives_bad_calls(s):
    """After every kind of refused call the context still decodes and the cache is intact."""
    before = s.hook.cells_pos()
    for bad in (lambda: s.hook.get_rows(0, [999]), lambda: s.hook.claim([0], [0]), lambda: s.hook.release([250]),
                lambda: s.hook.query(0)):
        with pytest.raises((HookIndexError, HookValueError, HookStateError)):
            bad()
    np.testing.assert_array_equal(s.hook.cells_pos(), before)
    assert np.isfinite(s.decode(s.tokenize(" ok", add_bos=False))).all()
