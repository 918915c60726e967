"""Summary rows fitted to queries (``SekvConfig.summary_calibration``): for the query it was fitted to, a summary row
stands for its span exactly (same softmax mass, same attention output); with equal keys it is the plain summary
(log|S|, the mean value); in a policy, every layer's summary cells carry the store's fitted biases, which a zoom's
eviction puts back and a saved memory keeps; with "prefill" only while a prompt's chunks stream, log|S| after."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from helpers import prose
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.policies.snapshot import DeviceState
from sekv_gguf.span_store import SpanStore
from sekv_gguf.spans import calibrated_summaries


def test_a_row_fitted_to_one_query_gives_it_the_spans_exact_attention_output():
    rng = np.random.default_rng(0)
    L, d = 24, 16
    k, v = rng.normal(size=(L, 1, d)).astype(np.float32), rng.normal(size=(L, 1, d)).astype(np.float32)
    k_sum = k.mean(axis=0)                                                   # [1, d]
    q = (2.0 * rng.normal(size=(1, 1, d))).astype(np.float32)               # [m=1, H=1, d]
    (bias,), (value,) = calibrated_summaries([k], [v], k_sum[None], q)
    assert bias > np.log(L)  # Jensen: the plain row under-weights a span whose keys differ
    others_k, others_v = rng.normal(size=(40, d)), rng.normal(size=(40, d))  # the rest of the cache
    full = softmax(np.concatenate([others_k @ q[0, 0], k[:, 0] @ q[0, 0]]))
    want = full @ np.concatenate([others_v, v[:, 0]])                        # the span's rows in attention
    row = softmax(np.concatenate([others_k @ q[0, 0], [k_sum[0] @ q[0, 0] + bias]]))
    got = row @ np.concatenate([others_v, value])                           # its one fitted row instead
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_equal_keys_give_the_plain_summary_for_grouped_heads():
    rng = np.random.default_rng(1)
    L, n_kv, group, d = 10, 2, 3, 8
    key = rng.normal(size=(1, n_kv, d)).astype(np.float32)
    k = np.repeat(key, L, axis=0)                                            # [L, Hkv, d], every key the same
    v = rng.normal(size=(L, n_kv, d)).astype(np.float32)
    q = rng.normal(size=(5, n_kv * group, d)).astype(np.float32)            # [m, H, d]
    # a second, longer span beside it: the padding to the longest span must not leak into the shorter one
    k2, v2 = rng.normal(size=(L + 7, n_kv, d)).astype(np.float32), rng.normal(size=(L + 7, n_kv, d)).astype(np.float32)
    bias, value = calibrated_summaries([k, k2], [v, v2], np.stack([key[0], k2.mean(axis=0)]), q)
    assert bias[0] == pytest.approx(np.log(L), abs=1e-5) and bias[1] > np.log(L + 7)
    np.testing.assert_allclose(value[0], v.mean(axis=0), rtol=1e-5, atol=1e-6)


def _policy(model, n: int, mode: str):
    return make_policy("sekv", model, n, budget=BudgetConfig(kv_budget=512, chunk=128),
                       params=SekvConfig(summary_calibration=mode, route_every=2))


def test_a_policy_puts_each_layers_fitted_bias_on_its_summary_cells_and_keeps_it(llama_model):
    toks = llama_model.tokenize(prose(9000).encode(), add_bos=True, special=False)[:1400]
    first, second, plain = (_policy(llama_model, len(toks) + 16, c) for c in ("always", "always", "off"))
    try:
        logits = first.prefill(toks)
        plain.prefill(toks)
        mem, hook = first.memory, first.session.hook
        spans = mem.store.spans
        assert len(spans) > 4
        log_len = np.log(mem.store.lengths)
        fitted = np.stack(mem.store.summary_bias)                             # [n_layer, n_spans]
        assert np.all(np.isfinite(fitted)) and np.abs(fitted - log_len).max() > 0.05
        np.testing.assert_allclose(np.stack(plain.memory.store.summary_bias), log_len[None, :].repeat(len(fitted), 0))
        for ikv in range(mem.store.n_layer):
            bias = hook.get_bias(ikv)
            resident = mem.zoom.resident[ikv]
            for span in spans:
                want = -np.inf if span.id in resident else fitted[ikv, span.id]
                assert bias[span.summary_cell] == pytest.approx(want, rel=1e-6), (ikv, span.id)
        # decode steps zoom and evict: an evicted span's summary gets its fitted bias back, and a memory loaded
        # from plain data goes on bit for bit
        for _ in range(4):
            logits = first.step(int(np.argmax(logits)))
        for ikv in range(mem.store.n_layer):
            bias = hook.get_bias(ikv)
            for span in spans:
                if span.id not in mem.zoom.resident[ikv]:
                    assert bias[span.summary_cell] == pytest.approx(fitted[ikv, span.id], rel=1e-6)
        DeviceState.take(first.session).put(second.session)
        second.memory.load_plain(mem.to_plain())
        second.tokens = list(first.tokens)
        for _ in range(4):
            token = int(np.argmax(logits))
            logits = first.step(token)
            np.testing.assert_array_equal(second.step(token), logits)
    finally:
        for p in (first, second, plain):
            p.close()


def test_prefill_mode_fits_the_bias_while_the_prompt_streams_and_puts_log_len_back_after(llama_model):
    toks = llama_model.tokenize(prose(9000, offset=500).encode(), add_bos=True, special=False)[:1400]
    fitted, always, plain = (_policy(llama_model, len(toks) + 16, c) for c in ("prefill", "always", "off"))
    try:
        got = [p.prefill(toks) for p in (fitted, always, plain)]
        np.testing.assert_array_equal(got[0], got[1])  # the same prompt computed: fitted bias through it
        assert np.abs(got[0] - got[2]).max() > 1e-3    # ... which log|S| does not give
        mem, hook = fitted.memory, fitted.session.hook
        np.testing.assert_array_equal(np.stack(mem.store.summary_bias), np.stack(always.memory.store.summary_bias))
        log_len = np.log(mem.store.lengths)
        logits = got[0]
        for step in range(3):  # after the prompt (and across the steps' zooms and evictions): log|S|
            for ikv in range(mem.store.n_layer):
                bias = hook.get_bias(ikv)
                for span in mem.store.spans:
                    want = -np.inf if span.id in mem.zoom.resident[ikv] else log_len[span.id]
                    assert bias[span.summary_cell] == pytest.approx(want, rel=1e-6), (step, ikv, span.id)
            logits = fitted.step(int(np.argmax(logits)))
    finally:
        for p in (fitted, always, plain):
            p.close()


@pytest.mark.parametrize("parts", ["both", "bias", "value"])
def test_the_store_fits_only_the_parts_asked_for(parts):
    rng = np.random.default_rng(2)
    n_kv, d, lengths = 2, 16, (12, 16)
    cfg = SekvConfig(span_min=8, span_max=16, block_tokens=4, summary_calibration="always",
                     summary_calibration_parts=parts)
    store, plain = SpanStore(1, n_kv, d, cfg), SpanStore(1, n_kv, d, SekvConfig(span_min=8, span_max=16, block_tokens=4))
    k = rng.normal(size=(sum(lengths), n_kv, d)).astype(np.float16)            # [sum L_i, Hkv, d]
    v = rng.normal(size=(sum(lengths), n_kv, d)).astype(np.float16)
    q = (2.0 * rng.normal(size=(3, 2 * n_kv, d))).astype(np.float32)        # [m, H, d]
    positions = [np.arange(lengths[0]), lengths[0] + np.arange(lengths[1])]
    weights = [np.ones(n) for n in lengths]
    (k_fit, v_fit), = store.add(positions, weights, lambda ikv: (k, v), lambda ikv: q)
    (k_plain, v_plain), = plain.add(positions, weights, lambda ikv: (k, v))
    np.testing.assert_array_equal(k_fit, k_plain)                            # the key is the mean either way
    fitted_bias = np.abs(store.summary_bias[0] - plain.summary_bias[0]).max() > 0.05
    fitted_value = np.abs(v_fit.astype(np.float32) - v_plain.astype(np.float32)).max() > 0.05
    assert (fitted_bias, fitted_value) == {"both": (True, True), "bias": (True, False), "value": (False, True)}[parts]
    if parts == "bias":
        np.testing.assert_array_equal(v_fit, v_plain)
    if parts == "value":
        np.testing.assert_array_equal(store.summary_bias[0], plain.summary_bias[0])
    with pytest.raises(ValueError, match="summary_calibration_parts"):
        SekvConfig(summary_calibration_parts="keys")


def _one_span(seed: int, L: int, n_kv: int, group: int, d: int, m: int) -> tuple[np.ndarray, ...]:
    """A random span's keys and values f32 [L, Hkv, d], their mean key [Hkv, d] and m queries [m, H, d]."""
    rng = np.random.default_rng(seed)
    k, v = rng.normal(size=(L, n_kv, d)).astype(np.float32), rng.normal(size=(L, n_kv, d)).astype(np.float32)
    return k, v, k.mean(axis=0), (2.0 * rng.normal(size=(m, n_kv * group, d))).astype(np.float32)


def _gaps(k: np.ndarray, k_sum: np.ndarray, q: np.ndarray, group: int) -> np.ndarray:
    """Each query's and head's gap written out, f64 [m, H]: logsumexp_t q.k_t - q.k_sum over the head's KV head (k
    [L, Hkv, d], k_sum [Hkv, d], q [m, H, d], ``group`` query heads per KV head)."""
    return np.array([[np.logaddexp.reduce(k[:, h // group] @ q[i, h]) - k_sum[h // group] @ q[i, h]
                      for h in range(q.shape[1])] for i in range(q.shape[0])])


def test_a_bias_quantile_takes_that_quantile_of_the_gaps_over_queries_and_heads():
    group = 2
    k, v, k_sum, q = _one_span(3, L=20, n_kv=2, group=group, d=8, m=6)
    gaps = _gaps(k, k_sum, q, group)                                          # [m, H]
    (mean,), (value,) = calibrated_summaries([k], [v], k_sum[None], q)
    assert mean == pytest.approx(gaps.mean(), rel=1e-5)
    for quantile in (0.0, 0.25, 1.0):
        (bias,), (same_value,) = calibrated_summaries([k], [v], k_sum[None], q, quantile)
        assert bias == pytest.approx(np.quantile(gaps, quantile), rel=1e-5)
        np.testing.assert_array_equal(same_value, value)                     # the value does not depend on it
    assert calibrated_summaries([k], [v], k_sum[None], q, 0.0)[0][0] < mean < gaps.max()
    with pytest.raises(ValueError, match="summary_bias_quantile"):
        SekvConfig(summary_bias_quantile=1.5)


def test_a_bias_share_fits_only_the_spans_the_queries_read_most():
    rng = np.random.default_rng(5)
    n_kv, group, d, m = 1, 2, 8, 4
    lengths = (12, 9, 15, 7)
    k = [rng.normal(size=(n, n_kv, d)).astype(np.float32) for n in lengths]
    v = [rng.normal(size=(n, n_kv, d)).astype(np.float32) for n in lengths]
    q = (0.3 * rng.normal(size=(m, n_kv * group, d))).astype(np.float32)    # [m, H, d] weak everywhere
    q[0, 1] = 8.0 * k[2][4, 0]                                               # one probe head reads span 2's 5th token
    k_sum = np.stack([x.mean(axis=0) for x in k])                            # [n, Hkv, d]
    all_bias, value = calibrated_summaries(k, v, k_sum, q)
    for share, fitted in ((0.25, {2}), (0.2, {2}), (1.0, {0, 1, 2, 3})):
        bias, same_value = calibrated_summaries(k, v, k_sum, q, share=share)
        for i, n in enumerate(lengths):                                      # fitted where kept, log|S| elsewhere
            assert bias[i] == pytest.approx(all_bias[i] if i in fitted else np.log(n), rel=1e-6)
        np.testing.assert_array_equal(same_value, value)
    assert all_bias[2] > np.log(lengths[2]) + 1                              # the sharply read span's bias is its own
    with pytest.raises(ValueError, match="summary_bias_share"):
        SekvConfig(summary_bias_share=0.0)


def test_a_bias_per_head_is_each_heads_mean_gap_and_their_mean_the_shared_bias():
    L, group = 14, 3
    k, v, k_sum, q = _one_span(6, L=L, n_kv=2, group=group, d=8, m=5)
    q[:, 4] *= 4.0                                                           # one head reads the span sharply
    gaps = _gaps(k, k_sum, q, group)                                          # [m, H]
    (shared,), (value,) = calibrated_summaries([k], [v], k_sum[None], q)
    (per_head,), (same_value,) = calibrated_summaries([k], [v], k_sum[None], q, per_head=True)
    np.testing.assert_allclose(per_head, gaps.mean(axis=0), rtol=1e-5)       # [H]
    assert per_head.mean() == pytest.approx(shared, rel=1e-5)
    assert per_head[4] > per_head.mean() + 1                                  # the sharp head's own, not the mean
    np.testing.assert_array_equal(same_value, value)
    (q25,), _ = calibrated_summaries([k], [v], k_sum[None], q, 0.25, per_head=True)
    np.testing.assert_allclose(q25, np.quantile(gaps, 0.25, axis=0), rtol=1e-5)
    # with a share, the spans not kept get log|S| on every head
    k2, v2 = 0.01 * k, v                                                     # a span every head reads evenly
    both, _ = calibrated_summaries([k, k2], [v, v2], np.stack([k_sum, k2.mean(axis=0)]), q, share=0.5, per_head=True)
    np.testing.assert_allclose(both[0], per_head, rtol=1e-5)
    np.testing.assert_allclose(both[1], np.log(L))


def test_a_policy_gives_summary_cells_their_per_head_bias_while_the_prompt_streams(llama_model):
    toks = llama_model.tokenize(prose(9000, offset=1500).encode(), add_bos=True, special=False)[:1400]
    cfg = dict(summary_calibration="prefill", route_every=2)
    heads, shared = (make_policy("sekv", llama_model, len(toks) + 16, budget=BudgetConfig(kv_budget=512, chunk=128),
                                 params=SekvConfig(summary_bias_heads=h, **cfg)) for h in (True, False))
    try:
        seen: list[float] = []

        def check_during_prompt(*_):  # after each chunk: offsets on the device, the mean in the layer bias
            mem, hook = heads.memory, heads.session.hook
            if not len(mem.store):
                return
            cells = np.array([s.summary_cell for s in mem.store.spans])
            for ikv in range(mem.store.n_layer):
                offset = mem.store.head_offset[ikv]                            # [S, H]
                np.testing.assert_allclose(offset.sum(axis=1), 0, atol=1e-4)   # offsets around the shared bias
                np.testing.assert_array_equal(hook.get_head_bias(ikv)[:, cells].T, offset)
                seen.append(float(np.abs(offset).max()))

        heads._chunk_done = (lambda orig: lambda n: (orig(n), check_during_prompt()))(heads._chunk_done)
        got = heads.prefill(toks)
        assert seen and max(seen) > 0.1                                      # the heads differ
        assert np.abs(got - shared.prefill(toks)).max() > 1e-3              # and that changes the computation
        mem, hook = heads.memory, heads.session.hook
        for ikv in range(mem.store.n_layer):                                 # after the prompt: no per-head bias
            assert not hook.get_head_bias(ikv).any()
    finally:
        for p in (heads, shared):
            p.close()
    with pytest.raises(ValueError, match="summary_bias_heads"):
        SekvConfig(summary_bias_heads=True)
    with pytest.raises(ValueError, match="summary_bias_heads"):
        SekvConfig(summary_bias_heads=True, summary_calibration="prefill", summary_calibration_parts="value")
    with pytest.raises(ValueError, match="summary_bias_heads"):  # a device state put back would not hold them
        SekvConfig(summary_bias_heads=True, summary_calibration="always")


def test_the_store_keeps_per_head_offsets_around_the_shared_bias_and_saves_them():
    rng = np.random.default_rng(7)
    n_kv, d, lengths = 2, 16, (12, 16, 10)
    cfg = SekvConfig(span_min=8, span_max=16, block_tokens=4, summary_calibration="prefill", summary_bias_heads=True)
    store, shared = SpanStore(2, n_kv, d, cfg), SpanStore(2, n_kv, d, SekvConfig(
        span_min=8, span_max=16, block_tokens=4, summary_calibration="prefill"))
    k = rng.normal(size=(sum(lengths), n_kv, d)).astype(np.float16)            # [sum L_i, Hkv, d]
    v = rng.normal(size=(sum(lengths), n_kv, d)).astype(np.float16)
    q = (2.0 * rng.normal(size=(3, 2 * n_kv, d))).astype(np.float32)        # [m, H, d]
    cut = np.cumsum((0,) + lengths)
    positions = [np.arange(cut[i], cut[i + 1]) for i in range(len(lengths))]
    weights = [np.ones(n) for n in lengths]
    store.add(positions[:1], weights[:1], lambda ikv: (k[:12], v[:12]))       # no queries yet: no offsets
    assert all(o.shape == (1, 0) for o in store.head_offset)
    assert "head_offset" not in store.to_plain()                              # nothing per head to save
    store.add(positions[1:], weights[1:], lambda ikv: (k[12:], v[12:]), lambda ikv: q)
    shared.add(positions[1:], weights[1:], lambda ikv: (k[12:], v[12:]), lambda ikv: q)
    for ikv in range(2):
        offset = store.head_offset[ikv]                                       # [3, H]
        assert offset.shape == (3, 2 * n_kv) and not offset[0].any()          # the first span: zeros
        np.testing.assert_allclose(offset[1:].sum(axis=1), 0, atol=1e-5)
        np.testing.assert_allclose(store.summary_bias[ikv][1:], shared.summary_bias[ikv], rtol=1e-5)
        assert np.abs(offset[1:]).max() > 0.01
    again = SpanStore(2, n_kv, d, cfg)
    again.load_plain(store.to_plain())
    for a, b in zip(again.head_offset, store.head_offset):
        np.testing.assert_array_equal(a, b)
    store.truncate(2)
    assert all(o.shape == (2, 2 * n_kv) for o in store.head_offset)
