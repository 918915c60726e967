"""Streamed prefill with chunk routing (``chunk_routing="layer"``): every llama_decode of a prompt chunk routes inside
itself, each hooked layer zooming before its attention. The exactness anchor: with a host tier that is exact (full
rank, f16 rows) and zoom slots that hold every span, each chunk's K/V rows are full KV's, in every hooked layer —
which the same streamed prefill without chunk routing (later chunks read summaries) does not give."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import prose, seq_cells
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy


def _rows_by_position(session, ikv: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions [n] and K rows [n, Hkv*d] (f32) of sequence 0's cells of layer ``ikv``, in position order."""
    cells = seq_cells(session)
    k, _ = session.hook.get_rows(ikv, cells)
    return session.hook.cells_pos()[cells], k.reshape(cells.size, -1).astype(np.float32)


def _streamed(model, toks: list[int], chunk_routing: str, refused: bool = False):
    cfg = SekvConfig(prefill="streaming", chunk_routing=chunk_routing, energy=1.0, host_format="f16", zoom_share=0.6,
                     compress_when_fits=True, elastic_window=False, max_new_zooms=10_000, zoom_lag_refresh=False)
    policy = make_policy("sekv", model, len(toks) + 1, ContextConfig(flash_attn=False),
                         BudgetConfig(kv_budget=2048, chunk=128), cfg)
    if refused:  # a device whose cache is not in host memory: the hook refuses the layer callback
        policy.routing.layer_callback = False
    logits = policy.prefill(toks)
    return policy, logits


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_chunks_routed_inside_their_decodes_compute_full_kv_rows(llama_model, gemma_model, which):
    model = llama_model if which == "llama" else gemma_model
    toks = model.tokenize(prose(4000, offset=2000).encode(), add_bos=True, special=False)[:900]
    full = make_policy("full", model, len(toks) + 1, ContextConfig(flash_attn=False), BudgetConfig(chunk=128))
    want_logits = full.prefill(toks)
    results = {}
    try:
        for mode in ("layer", "none"):
            policy, logits = _streamed(model, toks, mode)
            try:
                mem = policy.memory
                assert len(mem.store) > 3
                assert mode == "layer" or mem.counters.chunk.routes == 0
                window = set(int(p) for p in mem.window.pos) | set(mem.anchors)  # rows decoded by this context
                errs = []
                for ikv in range(mem.store.n_layer):
                    pos_f, k_full = _rows_by_position(full.session, ikv)
                    pos_s, k_sekv = _rows_by_position(policy.session, ikv)
                    keep = np.isin(pos_s, list(window))
                    idx = np.searchsorted(pos_f, pos_s[keep])
                    errs.append(np.abs(k_sekv[keep] - k_full[idx]).max() / np.abs(k_full).max())
                results[mode] = (max(errs[1:]) if len(errs) > 1 else errs[0], logits, mem.counters.chunk.routes)
            finally:
                policy.close()
    finally:
        full.close()
    err_routed, logits_routed, routes = results["layer"]
    err_plain, logits_plain, _ = results["none"]
    assert routes > 4  # a routing per scored decode once spans exist
    assert err_routed < 2e-3, err_routed  # f16 rows: rounding only
    assert err_plain > 10 * max(err_routed, 1e-4)  # without chunk routing the later chunks read summaries
    scale = np.abs(want_logits).max()
    assert np.abs(logits_routed - want_logits).max() < 1e-3 * scale
    assert np.abs(logits_plain - want_logits).max() > np.abs(logits_routed - want_logits).max()


def test_refused_callback_routes_after_each_chunk_for_the_next(llama_model):
    """Where the layer callback is refused, each chunk is decoded and then routed (lagged): chunk routings happen
    and the prompt still ends with its exact-scan routing."""
    toks = llama_model.tokenize(prose(4000, offset=900).encode(), add_bos=True, special=False)[:900]
    policy, logits = _streamed(llama_model, toks, "layer", refused=True)
    try:
        c = policy.memory.counters
        assert c.chunk.routes > 2 and c.prompt.routes == 1 and np.isfinite(logits).all()
        assert len(policy.memory.zoom.resident[0]) > 0
    finally:
        policy.close()


def test_the_window_refresh_recomputes_the_sliding_window_over_the_zoomed_spans(gemma_model):
    """iSWA (the tiny Gemma: n_swa 32): a streamed prompt whose last chunk read only the summaries of spans computed
    exactly before it. With ``refresh_window`` the tail refresh decodes the whole sliding window and the refreshed
    tokens again (n_swa + refresh_tokens = 64, the last chunk) once every span is zoomed: full KV's logits (f16
    rows, full rank); with the plain refresh of 32 tokens the others keep the rows computed over summaries — in
    the sliding-window layers too — and the logits move away; with no refresh, further."""
    toks = gemma_model.tokenize(prose(4000, offset=300).encode(), add_bos=True, special=False)[:256]
    full = make_policy("full", gemma_model, len(toks) + 1, ContextConfig(flash_attn=False), BudgetConfig(chunk=64))
    want = full.prefill(toks)
    full.close()
    errs, refreshed = {}, {}
    for name, window, lag in (("window", True, True), ("plain", False, True), ("none", False, False)):
        cfg = SekvConfig(refresh_window=window, zoom_lag_refresh=lag, energy=1.0, host_format="f16", zoom_share=0.6,
                         compress_when_fits=True, elastic_window=False, max_new_zooms=10_000)
        policy = make_policy("sekv", gemma_model, len(toks) + 1, ContextConfig(flash_attn=False),
                             BudgetConfig(kv_budget=1024, chunk=64, window=64), cfg)
        try:
            got = policy.prefill(toks)
            assert len(policy.memory.store) >= 2 and policy.stats().sekv.prefill == "streaming"
            refreshed[name] = policy.memory.counters.refreshed_tokens
        finally:
            policy.close()
        errs[name] = float(np.abs(got - want).max() / np.abs(want).max())
    assert refreshed == {"window": 64, "plain": 32, "none": 0}
    assert errs["window"] < 1e-5, errs
    assert errs["plain"] > 30 * errs["window"] and errs["none"] > 10 * errs["plain"], errs
