"""The per-layer attention bias over cells, on the flash-attention (F16 mask) and the softmax (F32 mask) paths."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import GEMMA_SPEC, LLAMA_SPEC, assert_close_reordered, full_kv_logits, prefilled, prose, seq_cells
from reference import forward
from sekv_gguf.tiny_models import tiny_weights

CFG = dict(n_ctx=256, n_batch=128, n_ubatch=128)
PATHS = pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "softmax"])


def _prefilled(open_session, path, text: str, **cfg):
    s, _ = prefilled(open_session, path, text, **CFG, **cfg)
    return s, s.tokenize(text)


@PATHS
def test_zero_bias_equals_no_bias(open_session, tiny_llama, flash_attn):
    text = prose(150)
    plain, toks = _prefilled(open_session, tiny_llama, text, flash_attn=flash_attn)
    want = plain.decode(toks[-1:])
    s, _ = _prefilled(open_session, tiny_llama, text, flash_attn=flash_attn)
    s.hook.enable_bias()
    assert not s.hook.get_bias(0).any()
    np.testing.assert_array_equal(s.decode(toks[-1:]), want)


@PATHS
def test_minus_inf_bias_equals_release(open_session, tiny_llama, flash_attn):
    text = prose(150, offset=500)
    released, toks = _prefilled(open_session, tiny_llama, text, flash_attn=flash_attn)
    cells = seq_cells(released)[10:60]
    released.hook.release(cells)
    want = released.decode(toks[-1:])

    s, _ = _prefilled(open_session, tiny_llama, text, flash_attn=flash_attn)
    s.hook.enable_bias()
    s.hook.set_bias_cells(-1, cells, -np.inf)
    got = s.decode(toks[-1:])
    # release moves the slot search to the freed cells, so the new token lands in another cell than with the bias
    assert_close_reordered(got, want, flash_attn)
    assert np.abs(got - full_kv_logits(open_session, tiny_llama, text, **CFG, flash_attn=flash_attn)).max() > 1e-2

    # switching the bias off rebuilds the graph without it: the masked cells are back
    s2, _ = _prefilled(open_session, tiny_llama, text, flash_attn=flash_attn)
    s2.hook.enable_bias()
    s2.hook.set_bias_cells(-1, cells, -np.inf)
    s2.hook.enable_bias(False)
    np.testing.assert_array_equal(s2.decode(toks[-1:]), full_kv_logits(open_session, tiny_llama, text, **CFG, flash_attn=flash_attn))


class _BiasedCase:
    """A tiny model (llama or Gemma 3 iSWA) prefilled with ``offset``'s prose and the per-layer bias on; ``check``
    decodes its last token and compares the logits with the reference forward pass's under the biases asked for."""

    def __init__(self, open_session, path, gemma: bool, flash_attn: bool, offset: int):
        self.gemma, self.spec = gemma, GEMMA_SPEC if gemma else LLAMA_SPEC
        self.s, self.toks = _prefilled(open_session, path, prose(120, offset=offset), flash_attn=flash_attn)
        self.cells = seq_cells(self.s)
        self.s.hook.enable_bias()
        self.weights = tiny_weights(self.spec, gemma)

    def reference(self, bias: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """The reference's last logits with ``bias`` on each layer's last row (``forward``'s ``last_row_bias``)."""
        return forward(self.weights, self.spec, self.toks, self.gemma, last_row_bias=bias)[1][-1]

    def check(self, bias: dict[int, np.ndarray]) -> tuple[np.ndarray, float]:
        """The reference's logits under ``bias`` and the decoded logits' largest error against them (asserted
        small)."""
        got, want = self.s.decode(self.toks[-1:]), self.reference(bias)
        err = float(np.abs(got - want).max())
        assert err < 2e-3 * np.abs(want).max(), err
        return want, err


def _case(open_session, tiny_llama, tiny_gemma, model, flash_attn, offset) -> _BiasedCase:
    return _BiasedCase(open_session, tiny_gemma if model == "gemma" else tiny_llama, model == "gemma", flash_attn,
                       offset)


@pytest.mark.parametrize("model", ["llama", "gemma"])
@PATHS
def test_per_layer_bias_matches_reference(open_session, tiny_llama, tiny_gemma, model, flash_attn):
    """A bias that differs between layers (finite values, -inf holes) acts on each layer separately."""
    case = _case(open_session, tiny_llama, tiny_gemma, model, flash_attn, offset=2000)
    s, n, rng = case.s, len(case.toks), np.random.default_rng(1)
    ref_bias: dict[int, np.ndarray] = {}
    for layer in s.hook.layers:
        b = np.round(rng.uniform(-3, 3, n - 1) * 4) / 4  # quarter steps: exact in f16
        b[rng.choice(n - 1, size=20, replace=False)] = -np.inf
        if layer.ikv == 0:
            b[:] = 0.0  # first hooked layer unbiased, the others biased: the bias must be per layer
        s.hook.set_bias_cells(layer.ikv, case.cells, b)
        np.testing.assert_array_equal(s.hook.get_bias(layer.ikv)[case.cells], b.astype(np.float32))
        ref_bias[layer.il] = np.append(b, 0.0)  # the new token's own cell is unbiased (its bias stays 0)
    want, err = case.check(ref_bias)
    assert np.abs(case.reference() - want).max() > 20 * err  # the test can tell biased from unbiased
    # the same bias on every layer is not what was asked for
    assert np.abs(case.reference({il: ref_bias[max(ref_bias)] for il in ref_bias}) - want).max() > 20 * err


@pytest.mark.parametrize("model", ["llama", "gemma"])
@PATHS
def test_per_head_bias_matches_reference(open_session, tiny_llama, tiny_gemma, model, flash_attn):
    """A per-head bias adds to each query head's scores on top of the per-layer bias (-inf holes stay masked)."""
    case = _case(open_session, tiny_llama, tiny_gemma, model, flash_attn, offset=3000)
    s, n, rng = case.s, len(case.toks), np.random.default_rng(2)
    s.hook.enable_head_bias()
    ref_bias: dict[int, np.ndarray] = {}
    for layer in s.hook.layers:
        b = np.round(rng.uniform(-2, 2, n - 1) * 4) / 4                     # [n-1] per layer, exact in f16
        b[rng.choice(n - 1, size=15, replace=False)] = -np.inf
        hb = np.round(rng.uniform(-2, 2, (n - 1, layer.n_head)) * 4) / 4    # [n-1, H] per head
        s.hook.set_bias_cells(layer.ikv, case.cells, b)
        s.hook.set_head_bias_cells(layer.ikv, case.cells, hb)
        np.testing.assert_array_equal(s.hook.get_head_bias(layer.ikv)[:, case.cells], hb.T.astype(np.float32))
        ref_bias[layer.il] = np.append(b[None, :] + hb.T, np.zeros((layer.n_head, 1)), axis=1)  # [H, n]
    want, err = case.check(ref_bias)
    # the mean over heads on every head is not what was asked for
    shared = {il: np.broadcast_to(r.mean(axis=0), r.shape) for il, r in ref_bias.items()}
    assert np.abs(case.reference(shared) - want).max() > 20 * err

def test_per_head_bias_equal_heads_is_the_layer_bias(open_session, tiny_llama):
    """The same value on every head is the per-layer bias, bit for bit; switching the per-head bias off drops it."""
    text = prose(150, offset=700)
    a, toks = _prefilled(open_session, tiny_llama, text)
    cells = seq_cells(a)[5:80]
    values = np.round(np.random.default_rng(3).uniform(-3, 3, cells.size) * 4) / 4
    a.hook.enable_bias()
    a.hook.set_bias_cells(-1, cells, values)
    want = a.decode(toks[-1:])
    b, _ = _prefilled(open_session, tiny_llama, text)
    b.hook.enable_bias()
    b.hook.enable_head_bias()
    b.hook.set_head_bias_cells(-1, cells, np.repeat(values[:, None], b.hook.layers[0].n_head, axis=1))
    np.testing.assert_array_equal(b.decode(toks[-1:]), want)
    c, _ = _prefilled(open_session, tiny_llama, text)
    c.hook.enable_head_bias()
    c.hook.set_head_bias_cells(-1, cells, 1.5)
    c.hook.enable_head_bias(False)
    np.testing.assert_array_equal(c.decode(toks[-1:]), full_kv_logits(open_session, tiny_llama, text, **CFG))


def test_claim_and_release_zero_the_per_head_bias(open_session, tiny_llama):
    s, _ = _prefilled(open_session, tiny_llama, prose(100, offset=900))
    cells = seq_cells(s)
    s.hook.enable_head_bias()
    s.hook.set_head_bias_cells(-1, cells[:40], 2.0)
    s.hook.release(cells[10:20])
    hb = s.hook.get_head_bias(0)
    assert not hb[:, cells[10:20]].any() and (hb[:, cells[:10]] == 2.0).all() and (hb[:, cells[20:40]] == 2.0).all()
    s.hook.claim(cells[10:20], list(range(10, 20)))
    assert not s.hook.get_head_bias(0)[:, cells[10:20]].any()


def test_per_head_bias_errors(open_session, tiny_llama):
    from sekv_gguf.errors import HookError
    s, _ = _prefilled(open_session, tiny_llama, prose(60))
    cells = seq_cells(s)[:4]
    with pytest.raises(HookError, match="per-head bias is off"):
        s.hook.set_head_bias_cells(0, cells, 1.0)
    s.hook.enable_head_bias()
    with pytest.raises(HookError, match="must be finite"):
        s.hook.set_head_bias_cells(0, cells, -np.inf)
    with pytest.raises(HookError, match="out of range"):
        s.hook.set_head_bias_cells(0, [s.hook.info.kv_size], 1.0)
    with pytest.raises(HookError, match="layer"):
        s.hook.get_head_bias(len(s.hook.layers))
