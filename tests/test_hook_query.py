"""Capture of each hooked layer's post-RoPE query, checked against an independent numpy forward pass."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import GEMMA_SPEC, LLAMA_SPEC, prose, seq_cells
from reference import forward
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
