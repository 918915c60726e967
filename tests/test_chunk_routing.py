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
from sekv_gguf.session import swa_cache_cells, swa_ubatch


def _rows_by_position(session, ikv: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions [n] and K rows [n, Hkv*d] (f32) of sequence 0's cells of layer ``ikv``, in position order."""
    cells = seq_cells(session)
    k, _ = session.hook.get_rows(ikv, cells)
    return session.hook.cells_pos()[cells], k.reshape(cells.size, -1).astype(np.float32)


def _streamed(model, toks: list[int], chunk_routing: str, refused: bool = False, probes: int = 1):
    cfg = SekvConfig(prefill="streaming", chunk_routing=chunk_routing, chunk_probes=probes, energy=1.0,
                     host_format="f16", zoom_share=0.6, compress_when_fits=True, elastic_window=False, max_new_zooms=10_000, zoom_lag_refresh=False)
    policy = make_policy("sekv", model, len(toks) + 1, ContextConfig(flash_attn=False),
                         BudgetConfig(kv_budget=2048, chunk=128), cfg)
    if refused:  # where the hook refuses the layer callback (the context has an eval callback of its own)
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
        for mode in ("layer", "probes", "none"):  # probes: the chunk's decodes routed by 8 of their tokens
            policy, logits = _streamed(model, toks, "none" if mode == "none" else "layer",
                                       probes=8 if mode == "probes" else 1)
            try:
                mem = policy.memory
                assert policy.session.hook.query_probes == (8 if mode == "probes" else 1)
                assert len(mem.store) > 3
                assert mode != "none" or mem.counters.chunk.routes == 0
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
    err_probes, logits_probes, routes_probes = results["probes"]
    assert routes_probes > 4 and err_probes < 2e-3, err_probes
    assert np.abs(logits_probes - want_logits).max() < 1e-3 * np.abs(want_logits).max()
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
    """iSWA (the tiny Gemma: n_swa 32): a streamed prompt whose last chunk read only the summary of a span computed
    exactly before it. With ``refresh_window`` the tail refresh decodes the last token's whole sliding window again
    (n_swa = 32 tokens, more than refresh_tokens = 16: the last chunk) once every span is zoomed: full KV's logits
    (f16 rows, full rank); with the plain refresh of 16 tokens the others keep the rows computed over summaries —
    in the sliding-window layers too — and the logits move away; with no refresh, further."""
    toks = gemma_model.tokenize(prose(4000, offset=300).encode(), add_bos=True, special=False)[:224]
    full = make_policy("full", gemma_model, len(toks) + 1, ContextConfig(flash_attn=False), BudgetConfig(chunk=64))
    want = full.prefill(toks)
    full.close()
    errs, refreshed = {}, {}
    for name, window, lag in (("window", True, True), ("plain", False, True), ("none", False, False)):
        # chunk_routing none: the last chunk reads a summary (routed chunks would zoom it in their own decodes)
        cfg = SekvConfig(refresh_window=window, zoom_lag_refresh=lag, chunk_routing="none", energy=1.0,
                         host_format="f16", zoom_share=0.6,
                         compress_when_fits=True, elastic_window=False, max_new_zooms=10_000, refresh_tokens=16)
        policy = make_policy("sekv", gemma_model, len(toks) + 1, ContextConfig(flash_attn=False),
                             BudgetConfig(kv_budget=1024, chunk=32, window=64), cfg)
        try:
            got = policy.prefill(toks)
            assert len(policy.memory.store) >= 1 and policy.stats().sekv.prefill == "streaming"
            refreshed[name] = policy.memory.counters.refreshed_tokens
        finally:
            policy.close()
        errs[name] = float(np.abs(got - want).max() / np.abs(want).max())
    assert refreshed == {"window": 32, "plain": 16, "none": 0}
    assert errs["window"] < 1e-5, errs
    assert errs["plain"] > 30 * errs["window"] and errs["none"] > 10 * errs["plain"], errs


@pytest.mark.parametrize("budget", [512, 768])
def test_the_budget_context_sizes_its_sliding_window_cache_for_the_refresh_and_no_more(gemma_model, budget):
    """iSWA: the budget context's ubatch is the smallest whose sliding-window cache (llama.cpp's rule, mirrored by
    ``swa_cache_cells``) keeps the window before the tail refresh; llama.cpp allocates exactly that, and the
    refresh of a long prompt then removes and decodes again every token it planned to."""
    policy = make_policy("sekv", gemma_model, 2000, ContextConfig(), BudgetConfig(kv_budget=budget, chunk=32))
    try:
        info, n_swa, ubatch = policy.session.hook.info, policy.session.hook.info.n_swa, policy.session.n_batch
        assert n_swa == 32 and policy.tail_refresh == min(max(policy.config.refresh_tokens, n_swa), budget)
        assert info.swa_kv_size == swa_cache_cells(n_swa, ubatch) >= n_swa + policy.tail_refresh
        assert ubatch == policy.plan.chunk or swa_cache_cells(n_swa, ubatch - 1) < n_swa + policy.tail_refresh
        toks = gemma_model.tokenize(prose(6000, offset=50).encode(), add_bos=True, special=False)[:1500]
        policy.prefill(toks)
        assert policy.memory.counters.refreshed_tokens == policy.tail_refresh
    finally:
        policy.close()


def test_swa_ubatch_is_the_smallest_that_holds_the_redo():
    for n_swa, redo, least in [(512, 512, 256), (512, 544, 256), (512, 32, 256), (4096, 4096, 256), (32, 32, 64)]:
        u = swa_ubatch(n_swa, redo, least)
        assert u >= least and swa_cache_cells(n_swa, u) >= n_swa + redo
        assert u == least or swa_cache_cells(n_swa, u - 1) < n_swa + redo
    assert swa_ubatch(512, 512, 256) == 257 and swa_cache_cells(512, 257) == 1024


def test_prompt_consensus_and_reroute_options(llama_model):
    """``prompt_consensus=1``: the prompt's routing gives every layer the same spans (the cross-layer vote's);
    ``prompt_reroute``: a second prompt routing with the refreshed tail's probes, the tail refreshed again when it
    changed a zoom. Off (the default): one prompt routing, each layer its own choice."""
    toks = llama_model.tokenize(prose(4000, offset=1500).encode(), add_bos=True, special=False)[:900]
    got = {}
    for name, over in (("alone", {}), ("consensus", {"prompt_consensus": 1.0}), ("reroute", {"prompt_reroute": True})):
        cfg = SekvConfig(prefill="streaming", chunk_probes=8, zoom_share=0.3, compress_when_fits=True, **over)
        policy = make_policy("sekv", llama_model, len(toks) + 1, ContextConfig(flash_attn=False),
                             BudgetConfig(kv_budget=400, chunk=128), cfg)
        try:
            logits = policy.prefill(toks)
            mem = policy.memory
            assert np.isfinite(logits).all() and len(mem.store) > 3
            got[name] = ([set(r) for r in mem.zoom.resident], mem.counters.prompt.routes,
                         mem.counters.refreshed_tokens, mem.zoom.changes)
        finally:
            policy.close()
    layers, routes, _, _ = got["alone"]
    assert routes == 1 and len({frozenset(s) for s in layers}) > 1  # the layers choose differently alone
    layers, routes, _, _ = got["consensus"]
    assert routes == 1 and len({frozenset(s) for s in layers}) == 1 and layers[0]
    _, routes, refreshed, changes = got["reroute"]
    _, _, refreshed_alone, changes_alone = got["alone"]
    # the first routing is the same; the second changed zooms here, so the tail was decoded once more
    assert routes == 2 and changes > changes_alone and refreshed > refreshed_alone > 0
