"""The hook on contexts that llama-cpp-python's ``Llama`` created, and on new contexts over its model."""

from __future__ import annotations

import llama_cpp
import numpy as np

from helpers import LLAMA_SPEC, prose, seq_cells
from reference import forward
from sekv_gguf.hook import KVHook
from sekv_gguf.session import Session
from sekv_gguf.tiny_models import tiny_weights


def test_hook_on_llama_context(tiny_llama):
    llm = llama_cpp.Llama(model_path=str(tiny_llama), n_ctx=256, flash_attn=True, verbose=False)
    toks = llm.tokenize(prose(100).encode())
    llm.eval(toks)
    hook = KVHook.from_llama(llm)
    assert hook.info.kv_size == 256 and hook.info.flash_attn
    pos = hook.cells_pos()
    assert (pos >= 0).sum() == len(toks)
    traces, _ = forward(tiny_weights(LLAMA_SPEC), LLAMA_SPEC, toks)
    cells = np.flatnonzero(pos >= 0)
    cells = cells[np.argsort(pos[cells])]
    for layer in hook.layers:
        k, v = hook.get_rows(layer.ikv, cells)
        np.testing.assert_allclose(k, traces[layer.il].k, atol=5e-3)
        np.testing.assert_allclose(v, traces[layer.il].v, atol=5e-3)
    llm.close()


def test_session_over_llama_model_shares_weights(tiny_llama):
    llm = llama_cpp.Llama(model_path=str(tiny_llama), n_ctx=256, verbose=False)
    s = Session.from_llama(llm)
    assert s.model.model == llm._model.model  # same llama_model, no reload
    assert s.ctx != llm.ctx
    toks = s.tokenize(prose(60))
    got = s.decode(toks)
    own = Session.open(tiny_llama)
    np.testing.assert_array_equal(got, own.decode(toks))
    assert seq_cells(s).size == len(toks)
    s.close()
    own.close()
    llm.close()
