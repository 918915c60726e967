"""The layer callback: host code runs inside a decode at each hooked layer, between the layer's query and its
attention; what it writes (rows, bias) acts on that layer in the same decode."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import GEMMA_SPEC, LLAMA_SPEC, prefilled, prose, seq_cells
from reference import forward
from sekv_gguf.errors import HookStateError
from sekv_gguf.tiny_models import tiny_weights

CFG = dict(n_ctx=256, n_batch=128, n_ubatch=128)
MODELS = pytest.mark.parametrize("model", ["llama", "gemma"])
PATHS = pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "softmax"])


def _hooked(open_session, path, text: str, **cfg):
    s, last = prefilled(open_session, path, text, **CFG, **cfg)
    s.hook.enable_query_capture()
    s.hook.enable_bias()
    return s, last


@MODELS
def test_each_layer_is_called_once_in_order_with_this_decodes_query(open_session, tiny_llama, tiny_gemma, model):
    gemma = model == "gemma"
    spec = GEMMA_SPEC if gemma else LLAMA_SPEC
    text = prose(120, offset=40)
    s, _ = _hooked(open_session, tiny_gemma if gemma else tiny_llama, text)
    toks = s.tokenize(text)
    calls: list[tuple[int, np.ndarray]] = []
    with s.hook.layer_callback(lambda ikv: calls.append((ikv, s.hook.query(ikv)))):
        s.decode(toks[-1:])
    assert [ikv for ikv, _ in calls] == list(range(s.hook.info.n_layer_kv))
    traces, _ = forward(tiny_weights(spec, gemma), spec, toks, gemma)
    for ikv, q in calls:
        tr = traces[s.hook.layers[ikv].il]
        want = tr.q[-1] * tr.kq_scale  # the decoded token's query, read while the decode ran
        np.testing.assert_allclose(q, want, rtol=0, atol=2e-3 * np.abs(want).max())
    # disarmed after the block: the next decode calls nothing
    s.decode(s.tokenize(" and", add_bos=False))
    assert len(calls) == s.hook.info.n_layer_kv


@MODELS
@PATHS
def test_rows_and_bias_written_in_the_callback_act_on_the_same_decode(open_session, tiny_llama, tiny_gemma, model,
                                                                      flash_attn):
    """Masking some cells and overwriting others' rows at layer ``target`` from inside the decode gives the same
    logits, bit for bit, as doing it before the decode; and it changes them."""
    path = tiny_gemma if model == "gemma" else tiny_llama
    text = prose(150, offset=200)

    def edit(s, ikv: int) -> None:
        cells = seq_cells(s)
        s.hook.set_bias_cells(ikv, cells[5:40], -np.inf)
        k, v = s.hook.get_rows(ikv, cells[60:70])
        s.hook.set_rows(ikv, cells[45:55], k, v)

    plain, last = _hooked(open_session, path, text, flash_attn=flash_attn)
    untouched = plain.decode([last])
    target = plain.hook.info.n_layer_kv - 1

    before, _ = _hooked(open_session, path, text, flash_attn=flash_attn)
    edit(before, target)
    want = before.decode([last])

    inside, _ = _hooked(open_session, path, text, flash_attn=flash_attn)
    with inside.hook.layer_callback(lambda ikv: edit(inside, ikv) if ikv == target else None):
        got = inside.decode([last])
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - untouched).max() > 1e-3
    np.testing.assert_array_equal(inside.hook.get_bias(target), before.hook.get_bias(target))


def test_callback_errors_surface_after_the_decode(open_session, tiny_llama):
    text = prose(100)
    s, last = _hooked(open_session, tiny_llama, text)
    cells = seq_cells(s)

    def boom(ikv: int) -> None:
        raise ValueError(f"layer {ikv}")

    with pytest.raises(ValueError, match="layer 0"):
        with s.hook.layer_callback(boom):
            s.decode([last])
    # cells cannot change while the graph runs
    with pytest.raises(HookStateError, match="releasing cells is not allowed inside the layer callback"):
        with s.hook.layer_callback(lambda ikv: s.hook.release(cells[:2])):
            s.decode(s.tokenize(" then", add_bos=False))
    assert (s.hook.cells_pos()[cells[:2]] >= 0).all()
    s.decode(s.tokenize(" again", add_bos=False))  # the context decodes normally afterwards


def test_callback_needs_capture_and_bias(open_session, tiny_llama):
    s, _ = prefilled(open_session, tiny_llama, prose(60), **CFG)
    with pytest.raises(HookStateError, match="query capture is off"):
        with s.hook.layer_callback(lambda ikv: None):
            pass
    s.hook.enable_query_capture()
    with pytest.raises(HookStateError, match="bias is off"):
        with s.hook.layer_callback(lambda ikv: None):
            pass
