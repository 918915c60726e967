"""Capture of each hooked layer's post-RoPE query, checked against an independent numpy forward pass."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import GEMMA_SPEC, LLAMA_SPEC, prose, seq_cells
from reference import forward
from sekv_gguf.errors import HookStateError
from sekv_gguf.tiny_models import tiny_weights


@pytest.mark.parametrize("model", ["llama", "gemma"])
def test_captured_query_matches_reference(open_session, tiny_llama, tiny_gemma, model):
    gemma = model == "gemma"
    spec = GEMMA_SPEC if gemma else LLAMA_SPEC
    s = open_session(tiny_gemma if gemma else tiny_llama, n_ctx=256, n_batch=64, n_ubatch=32)
    s.hook.enable_query_capture()
    toks = s.tokenize(prose(150, offset=300))
    s.decode(toks)  # several ubatches: the capture holds the batch's last token
    traces, _ = forward(tiny_weights(spec, gemma), spec, toks, gemma)
    cells = seq_cells(s)
    for layer in s.hook.layers:
        tr = traces[layer.il]
        q = s.hook.query(layer.ikv)
        want = tr.q[-1] * tr.kq_scale
        assert q.shape == want.shape == (layer.n_head, layer.head_dim_k)
        np.testing.assert_allclose(q, want, rtol=0, atol=2e-3 * np.abs(want).max())

        # the capture is in the basis of the stored K rows: q . k gives the reference attention logits
        k, _ = s.hook.get_rows(layer.ikv, cells)
        group = layer.n_head // layer.n_head_kv
        for h in range(layer.n_head):
            logits = k[:, h // group, :].astype(np.float64) @ q[h]
            ref = tr.k[:, h // group, :] @ want[h]
            np.testing.assert_allclose(logits, ref, rtol=0, atol=5e-3 * np.abs(ref).max())


def test_capture_follows_each_decode(open_session, tiny_llama):
    s = open_session(tiny_llama, n_ctx=256)
    s.hook.enable_query_capture()
    assert not s.hook.query(0).any()  # nothing decoded yet
    toks = s.tokenize(prose(60))
    s.decode(toks[:-1])
    first = s.hook.query(1)
    s.decode(toks[-1:])
    second = s.hook.query(1)
    traces, _ = forward(tiny_weights(LLAMA_SPEC), LLAMA_SPEC, toks)
    np.testing.assert_allclose(first, traces[1].q[-2] * traces[1].kq_scale, atol=2e-3)
    np.testing.assert_allclose(second, traces[1].q[-1] * traces[1].kq_scale, atol=2e-3)

    # capture off and on again: the graph is rebuilt, capture resumes
    s.hook.enable_query_capture(False)
    s.hook.enable_query_capture(True)
    s.decode(s.tokenize(" more", add_bos=False))
    assert s.hook.query(1).any()


@pytest.mark.parametrize("model", ["llama", "gemma"])
def test_query_probes_are_the_queries_of_evenly_spaced_tokens(open_session, tiny_llama, tiny_gemma, model):
    """With 4 probes, a decode of several ubatches keeps the queries of 4 tokens of its last ubatch, spaced by
    n_tokens // 4 and ending at its last token; ``query`` is still the last token's; a ubatch shorter than the probe
    count gives each of its tokens."""
    gemma = model == "gemma"
    spec = GEMMA_SPEC if gemma else LLAMA_SPEC
    s = open_session(tiny_gemma if gemma else tiny_llama, n_ctx=256, n_batch=64, n_ubatch=32)
    s.hook.set_query_probes(4)  # before the capture is on: it is sized by the probes when enabled
    s.hook.enable_query_capture()
    toks = s.tokenize(prose(150, offset=300))[:120]
    s.decode(toks[:-2])  # 118 tokens: ubatches of 32, 32, 32 and 22; 4 probes of the last, spaced by 22 // 4 = 5
    want_idx = [102, 107, 112, 117]  # token order, the last token last
    traces, _ = forward(tiny_weights(spec, gemma), spec, toks, gemma)
    for layer in s.hook.layers:
        tr = traces[layer.il]
        got = s.hook.queries(layer.ikv)
        want = tr.q[want_idx] * tr.kq_scale  # [4, n_head, d]
        assert got.shape == want.shape == (4, layer.n_head, layer.head_dim_k)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())
        np.testing.assert_array_equal(s.hook.query(layer.ikv), got[-1])
    s.decode(toks[-2:])  # 2 tokens < 4 probes: both
    for layer in s.hook.layers:
        tr = traces[layer.il]
        want = tr.q[-2:] * tr.kq_scale
        np.testing.assert_allclose(s.hook.queries(layer.ikv), want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_query_probes_change_while_capture_is_on_and_inside_the_layer_callback(open_session, tiny_llama):
    s = open_session(tiny_llama, n_ctx=256, n_batch=64, n_ubatch=64)
    s.hook.enable_query_capture()
    s.hook.enable_bias()
    toks = s.tokenize(prose(60, offset=20))
    s.decode(toks[:20])
    s.hook.set_query_probes(5)  # reallocates the capture; the next decode captures 5
    seen: list[np.ndarray] = []
    with s.hook.layer_callback(lambda ikv: seen.append(s.hook.queries(ikv)) if ikv == 1 else None):
        s.decode(toks[20:40])
    with pytest.raises(HookStateError, match="changing the query probes is not allowed inside the layer callback"):
        with s.hook.layer_callback(lambda ikv: s.hook.set_query_probes(2)):
            s.decode(toks[40:41])
    traces, _ = forward(tiny_weights(LLAMA_SPEC), LLAMA_SPEC, toks[:40])
    want = traces[s.hook.layers[1].il].q[[23, 27, 31, 35, 39]] * traces[s.hook.layers[1].il].kq_scale
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], want, rtol=0, atol=2e-3 * np.abs(want).max())
    for bad in (0, 257):
        with pytest.raises(ValueError, match="query probes must be 1..256"):
            s.hook.set_query_probes(bad)


def test_the_configs_probe_bound_is_the_hooks():
    """``config.MAX_PROBES`` (config cannot import the hook's ctypes mirror) is the C header's SEKV_MAX_PROBES."""
    from sekv_gguf import _hook_api
    from sekv_gguf.config import MAX_PROBES

    assert MAX_PROBES == _hook_api.SEKV_MAX_PROBES
