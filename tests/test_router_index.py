"""The two-stage ``index`` router (the default): its stage-1 estimate, its bounded verify, and reads that do not
grow with the context while ``mass`` reads every host row."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import prose
from sekv_gguf import native
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.router import HeldSpans, IndexRouter, LowRankMassRouter, verify
from sekv_gguf.span_store import SpanStore


def _store(rng, n_spans: int, config: SekvConfig, hkv: int = 2, d: int = 16) -> SpanStore:
    mats = [rng.standard_normal((int(n), hkv, d)).astype(np.float32)
            for n in rng.integers(config.span_min, config.span_max + 1, n_spans)]
    rows = np.concatenate(mats)                                           # [sum L, Hkv, d]
    store = SpanStore(1, hkv, d, config)
    store.add([np.arange(m.shape[0]) for m in mats], [np.ones(m.shape[0]) for m in mats], lambda ikv: (rows, rows))
    return store


def _case(seed: int, n_spans: int) -> tuple[SekvConfig, SpanStore, np.ndarray]:
    """Config, a store of ``n_spans`` random spans of 8–16 tokens (full rank) and a query [4, 16]."""
    rng = np.random.default_rng(seed)
    cfg = SekvConfig(span_min=8, span_max=16, energy=1.0)
    store = _store(rng, n_spans, cfg)
    return cfg, store, rng.standard_normal((4, 16)).astype(np.float32)


def test_one_token_blocks_estimate_exact_mass():
    """With one token per block, stage 1's logsumexp over blocks is the span's exact attention mass."""
    rng = np.random.default_rng(0)
    cfg = SekvConfig(span_min=4, span_max=12, block_tokens=1, energy=1.0, host_format="f16", index_format="f16")
    store = _store(rng, 30, cfg)
    query = rng.standard_normal((4, 16)).astype(np.float32)
    got = IndexRouter().propose(0, query, store)
    want = LowRankMassRouter().score(0, query, store)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("group", [1, 4, 6])
def test_native_index_score_equals_the_widened_index(group):
    """The q8 index scored as held, in native code, gives the numpy score over the index widened to f32 (padding
    blocks of short spans included), for a query head or a group of them per KV head."""
    rng = np.random.default_rng(7)
    cfg = SekvConfig(span_min=3, span_max=40, block_tokens=16)
    store = _store(rng, 50, cfg)
    assert np.isinf(store.block_logn).any() and store.q8_index
    query = rng.standard_normal((2 * group, 16)).astype(np.float32)
    got = IndexRouter().propose(0, query, store)
    want = IndexRouter.propose_widened(0, query, store)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert got.dtype == np.float32 and got.shape == (50,)


def test_native_index_score_refuses_bad_shapes():
    cfg = SekvConfig(span_min=8, span_max=16)
    store = _store(np.random.default_rng(0), 5, cfg)
    q = np.zeros((4, 16), dtype=np.float32)
    codes, scale, logn = store.blocks[0], store.block_scale[0], store.block_logn
    with pytest.raises(native.NativeError, match="int8"):
        native.index_score(q, codes.astype(np.float32), scale, logn)
    with pytest.raises(native.NativeError, match="scales"):
        native.index_score(q, codes, scale[:, :3], logn)
    with pytest.raises(native.NativeError, match="log sizes"):
        native.index_score(q, codes, scale, logn[:3])
    with pytest.raises(native.NativeError, match="query"):
        native.index_score(q[:3], codes, scale, logn)
    padded = logn.copy()
    padded[2, 0] = -np.inf
    with pytest.raises(native.NativeError, match="real first block"):
        native.index_score(q, codes, scale, padded)


def test_blocks_cover_each_span_once():
    rng = np.random.default_rng(1)
    cfg = SekvConfig(span_min=5, span_max=40, block_tokens=16)
    store = _store(rng, 20, cfg)
    sizes = np.exp(store.block_logn)                                      # [S, B] (0 for padding)
    np.testing.assert_allclose(sizes.sum(axis=1), store.lengths, rtol=1e-5)
    assert store.blocks[0].shape == (2, 20, 3, 16) and np.isfinite(store.block_logn[:, 0]).all()
    assert store.blocks[0].dtype == np.int8 and store.block_scale[0].shape == (2, 20, 3)  # the default: q8
    assert store.index_bytes == store.blocks[0].size + (store.block_scale[0].size * 2 + store.block_logn.size * 4)


def test_a_q8_index_scores_as_the_f16_one_in_half_the_bytes():
    """int8 block keys (a scale per block and KV head): every stage-1 score within 1% of the score's spread
    from the f16 index's, the same best spans, about half the index bytes; a zero block stays zero."""
    rng = np.random.default_rng(3)
    mats = [rng.standard_normal((int(n), 2, 16)).astype(np.float32) * 2 for n in rng.integers(8, 17, 60)]
    mats[5][:] = 0.0
    rows = np.concatenate(mats)
    stores = {}
    for fmt in ("q8", "f16"):
        stores[fmt] = SpanStore(1, 2, 16, SekvConfig(span_min=8, span_max=16, block_tokens=4, index_format=fmt))
        stores[fmt].add([np.arange(m.shape[0]) for m in mats], [np.ones(m.shape[0]) for m in mats],
                        lambda ikv: (rows, rows))
    q8, f16 = stores["q8"], stores["f16"]
    assert not q8.block_keys(0)[:, 5].any() and np.isfinite(q8.block_keys(0)).all()
    np.testing.assert_allclose(q8.block_keys(0), f16.block_keys(0), atol=0.6 * float(q8.block_scale[0].max()))
    for seed in range(5):
        query = np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)
        a, b = IndexRouter().propose(0, query, q8), IndexRouter().propose(0, query, f16)
        assert np.abs(a - b).max() < 0.01 * (b.max() - b.min())
        assert set(np.argsort(-a)[:5]) == set(np.argsort(-b)[:5])
    assert q8.index_bytes < 0.6 * f16.index_bytes
    with pytest.raises(ValueError, match="index_format"):
        SekvConfig(index_format="q4")


def test_a_store_keeps_only_the_routing_data_its_router_reads(llama_model):
    """The default policy's store keeps the block index alone (no summary keys or key bounds: the index router
    reads neither), in fewer host bytes, and the index router ranks it as it ranks a store that keeps everything;
    the kept arrays are f16 and the bounds still bound every key."""
    from sekv_gguf.router import BoundRouter, TrainedRouter

    rng = np.random.default_rng(7)
    cfg = SekvConfig(span_min=8, span_max=16)
    mats = [rng.standard_normal((12, 2, 16)).astype(np.float32) * 3 for _ in range(20)]
    rows = np.concatenate(mats)
    stores = {}
    for name, fields in (("all", frozenset({"keys", "bounds", "blocks"})), ("index", IndexRouter.reads)):
        stores[name] = SpanStore(1, 2, 16, cfg, fields=fields)
        stores[name].add([np.arange(12) for _ in mats], [np.ones(12) for _ in mats], lambda ikv: (rows, rows))
    full, lean = stores["all"], stores["index"]
    assert lean.keys[0].shape[0] == lean.kmin[0].shape[0] == 0 and full.keys[0].shape == (20, 2, 16)
    assert lean.routing_bytes < full.routing_bytes and lean.host_bytes < full.host_bytes
    assert {a.dtype for a in (full.keys[0], full.kmin[0], full.kmax[0])} == {np.dtype(np.float16)}
    lo, hi = full.bounds(0)
    assert (lo.astype(np.float32) <= np.stack([m.min(axis=0) for m in mats])).all()
    assert (hi.astype(np.float32) >= np.stack([m.max(axis=0) for m in mats])).all()
    query = rng.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_array_equal(IndexRouter().propose(0, query, lean), IndexRouter().propose(0, query, full))
    assert BoundRouter.reads == {"bounds"} and TrainedRouter.reads == {"keys", "bounds"}
    with pytest.raises(ValueError, match="unknown routing fields"):
        SpanStore(1, 2, 16, cfg, fields=frozenset({"sketch"}))
    policy = make_policy("sekv", llama_model, 2000, budget=BudgetConfig(kv_budget=512, chunk=64))
    try:
        assert policy.memory.store.fields == IndexRouter.reads  # the default router's
    finally:
        policy.close()


def test_verify_orders_resident_and_candidates_by_exact_mass_with_bounded_host_rows():
    cfg, store, query = _case(2, 60)
    proposed = IndexRouter().propose(0, query, store)
    exact = LowRankMassRouter().score(0, query, store)
    held = HeldSpans(store, [3, 17, 40], capacity=64)
    r = verify(0, query, store, proposed, 5, held)
    order = np.argsort(-r.scores, kind="stable")
    first = order[:8]                                                     # 3 resident + 5 host candidates
    assert set(held.ids) <= set(first)
    host = [s for s in np.argsort(-proposed, kind="stable") if s not in held.ids][:5]
    assert set(first) == set(held.ids) | set(host)
    np.testing.assert_array_equal(first, sorted(first, key=lambda s: -exact[s]))  # ordered by exact mass
    # the resident spans and the candidates, read from the host tier, nothing else
    assert r.host_rows == int(store.lengths[host].sum() + store.lengths[held.ids].sum()) <= 8 * cfg.span_max
    # the rest keeps the proposal's order
    rest = order[8:]
    np.testing.assert_array_equal(rest, [s for s in np.argsort(-proposed, kind="stable") if s not in first])


def test_verify_everything_is_exact_mass_order_and_zero_candidates_is_the_proposal():
    cfg, store, query = _case(3, 25)
    exact = LowRankMassRouter().score(0, query, store)
    got = IndexRouter(candidates=100).score(0, query, store)
    np.testing.assert_array_equal(np.argsort(-got, kind="stable"), np.argsort(-exact, kind="stable"))
    proposal = IndexRouter(candidates=0)
    np.testing.assert_array_equal(proposal.score(0, query, store), proposal.propose(0, query, store))
    # the first routing of a layer (nothing resident) also verifies what fills the slots
    r = verify(0, query, store, proposal.propose(0, query, store), 2, HeldSpans(store, [], capacity=40))
    assert 2 * cfg.span_min < r.host_rows <= 40 + 2 * cfg.span_max


def test_hold_keeps_resident_spans_ahead_unless_another_has_e_hold_times_their_mass():
    cfg, store, query = _case(4, 40)
    proposed = IndexRouter().propose(0, query, store)
    exact = LowRankMassRouter().score(0, query, store)                   # [S] log mass, exact at full rank
    weak = [int(s) for s in np.argsort(exact)[:2]]                        # the two spans of least mass, held
    held = HeldSpans(store, weak, capacity=64)
    plain = np.argsort(-verify(0, query, store, proposed, 40, held).scores, kind="stable")
    assert not set(weak) & set(plain[:2])
    # log mass the best span leads the weakest held one by: a larger hold puts both held spans first
    held_first = np.argsort(-verify(0, query, store, proposed, 40, held,
                                    hold=float(exact.max() - exact[weak].min()) + 1.0).scores, kind="stable")
    assert set(held_first[:2]) == set(weak)
    # a hold short of the best span's lead over the strongest held one lets it pass them
    lead = float(exact.max() - exact[weak].max())
    passed = np.argsort(-verify(0, query, store, proposed, 40, held, hold=lead / 2).scores, kind="stable")
    assert passed[0] == int(np.argmax(exact)) and passed[0] not in weak
    with pytest.raises(ValueError, match="zoom_hold"):
        SekvConfig(zoom_hold=-1.0)


def test_index_config_is_checked():
    with pytest.raises(ValueError, match="block_tokens"):
        SekvConfig(block_tokens=0)
    with pytest.raises(ValueError, match="candidates"):
        IndexRouter(candidates=-1)
    assert SekvConfig().router == "index"


def _reads(model, n: int, router: str, **params) -> dict:
    tokens = model.tokenize(prose(5 * n).encode(), add_bos=True, special=False)[:n]
    policy = make_policy("sekv", model, len(tokens) + 12, budget=BudgetConfig(kv_budget=2560, chunk=256),
                         params=SekvConfig(route_every=1, router=router, prefill="streaming", **params))
    try:
        return generate(policy, tokens, 12, stop_at_eos=False).sekv
    finally:
        policy.close()


def test_index_reads_do_not_grow_with_the_context(llama_model):
    """Same device budget and settings at 8K and 32K tokens: the index router's host rows per decode-step routing
    call and layer stay within the zoom slots (the resident spans) plus (candidates + new zooms) spans, while
    ``mass`` reads every span token; the routing right after the prompt scans every span once (``prompt_scan``),
    or verifies what fills the slots without it."""
    cfg = SekvConfig()
    small, large = _reads(llama_model, 8192, "index"), _reads(llama_model, 32768, "index")
    assert large.spans > 3 * small.spans
    for s in (small, large):
        bound = s.zoom_slots + (cfg.verify_candidates + cfg.max_new_zooms) * cfg.span_max
        assert 0 < s.host_rows_read_per_route <= bound
        assert s.host_rows_read_per_prompt_route >= s.span_tokens  # the prompt's one exact scan
    assert large.host_rows_read_per_route <= 1.25 * small.host_rows_read_per_route
    mass = _reads(llama_model, 8192, "mass")
    assert mass.host_rows_read_per_route >= mass.span_tokens
    assert large.host_rows_read_per_route < 0.1 * large.span_tokens
    bounded = _reads(llama_model, 32768, "index", prompt_scan=False)
    fill = bounded.zoom_slots + (cfg.verify_candidates + 1) * cfg.span_max  # slots, candidates, rebuilt rows
    assert bounded.host_rows_read_per_prompt_route <= fill + bounded.zoom_slots


def test_probes_as_heads_score_each_span_by_its_best_probe():
    """``probe_heads`` stacks p queries as more heads of each KV group: every training-free router (and the index
    router's proposal) then scores a span as the best of its scores for each probe alone."""
    from sekv_gguf.router import ROUTERS, IndexRouter, probe_heads
    from sekv_gguf.span_store import SpanStore

    rng = np.random.default_rng(4)
    n_head, n_head_kv, d, p = 4, 2, 16, 3
    mats = [rng.standard_normal((int(n), n_head_kv, d)).astype(np.float32) for n in rng.integers(4, 40, 12)]
    rows = np.concatenate(mats)
    store = SpanStore(1, n_head_kv, d, SekvConfig(), None)
    store.add([np.arange(m.shape[0]) for m in mats], [np.ones(m.shape[0]) for m in mats], lambda ikv: (rows, rows))
    probes = rng.standard_normal((p, n_head, d)).astype(np.float32)
    stacked = probe_heads(probes, n_head_kv)
    assert stacked.shape == (n_head * p, d)
    np.testing.assert_array_equal(stacked[:2 * p].reshape(p, 2, d), probes[:, :2])  # KV head 0's group, probe-major
    for name, cls in ROUTERS.items():
        router = cls()
        score = router.propose if isinstance(router, IndexRouter) else router.score
        want = np.max([score(0, q, store) for q in probes], axis=0)
        np.testing.assert_allclose(score(0, stacked, store), want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_probes_are_cut_to_what_the_native_scorer_takes():
    """The probe count a policy captures: the configured one where the heads fit the native scorer (Qwen2.5's 12
    heads of 2 KV groups, Gemma 3's 4 of 1), fewer where they would not; a query of that many heads scores."""
    from sekv_gguf.router import probes_that_fit

    assert probes_that_fit(16, 12, 2, 128) == 16 and probes_that_fit(16, 4, 1, 256) == 16
    assert probes_that_fit(256, 128, 128, 128) == native.MAX_HEADS // 128  # heads bind (group 1)
    wide = probes_that_fit(16, 64, 4, 128)  # 16 query heads per KV head
    assert wide == native.MAX_QV // (16 * 128) < 16
    assert probes_that_fit(16, 4096, 1, 128) == 1
    rng = np.random.default_rng(1)
    table = native.SpanTable.of_rows([rng.standard_normal((5, 4, 128)).astype(np.float16)], 4, 128)
    q = rng.standard_normal((64 * wide, 128)).astype(np.float32)
    assert native.span_mass(q, table).shape == (1, 64 * wide)
