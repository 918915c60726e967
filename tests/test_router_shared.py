"""Routers hold no span data: one router instance serves any number of policies (the eval suite hands one trained
router to every sekv run), and each policy routes exactly as it would with a router of its own."""

from __future__ import annotations

import numpy as np

from helpers import prose
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.router import LowRankMassRouter


def _tokens(model, n: int, offset: int) -> list[int]:
    return model.tokenize(prose(6 * n, offset).encode(), add_bos=True, special=False)[:n]


def _run(model, tokens, router=None):
    """Generated tokens and every hooked layer's bias (which spans are zoomed, which summaries are masked)."""
    policy = make_policy("sekv", model, len(tokens) + 8, budget=BudgetConfig(kv_budget=512, chunk=128),
                         params=SekvConfig(route_every=1, prefill="streaming"), router=router)
    try:
        run = generate(policy, tokens, 8, stop_at_eos=False)
        hook = policy.session.hook
        return run, [hook.get_bias(ikv) for ikv in range(hook.info.n_layer_kv)]
    finally:
        policy.close()


def test_two_policies_sharing_one_router_route_as_with_their_own(llama_model):
    shared = LowRankMassRouter()
    first, _ = _run(llama_model, _tokens(llama_model, 900, 0), shared)
    later = _tokens(llama_model, 1500, 40000)  # more spans than the first run: its rows must not be reused
    got, got_bias = _run(llama_model, later, shared)
    want, want_bias = _run(llama_model, later, LowRankMassRouter())  # a router of its own, of the same kind
    assert 0 < first.sekv.spans < got.sekv.spans
    assert got.sekv.zooms_per_step > 0
    for ikv, (g, w) in enumerate(zip(got_bias, want_bias)):
        np.testing.assert_array_equal(g, w, err_msg=f"layer {ikv}")
    assert got.tokens == want.tokens


def test_one_router_scores_two_stores_as_fresh_routers_do(tiny_llama):
    """Every router over two stores in turn (the second with more spans, as in an eval's next case) gives each
    store the scores a router of its own gives it."""
    from sekv_gguf.adapter import model_identity
    from sekv_gguf.router import ROUTERS, TrainedRouter
    from sekv_gguf.span_store import SpanStore
    from test_adapter import _adapter

    rng = np.random.default_rng(9)
    adapter = _adapter(model_identity(tiny_llama), rng, layers=(0,))
    sketch = (adapter.spread_rank, adapter.n_centroids, adapter.kmeans_iters)

    def store(n_spans: int) -> SpanStore:
        mats = [rng.standard_normal((int(n), 2, 16)).astype(np.float32) for n in rng.integers(4, 20, n_spans)]
        rows = np.concatenate(mats)  # [sum L, Hkv, d]
        s = SpanStore(1, 2, 16, SekvConfig(), sketch)
        s.add([np.arange(m.shape[0]) for m in mats], [np.ones(m.shape[0]) for m in mats], lambda ikv: (rows, rows))
        return s

    first, second = store(6), store(9)
    query = rng.standard_normal((4, 16)).astype(np.float32)
    makers = {**ROUTERS, "trained": lambda: TrainedRouter(adapter, candidates=3)}
    for name, make in makers.items():
        shared = make()
        shared.score(0, query, first)
        np.testing.assert_array_equal(shared.score(0, query, second), make().score(0, query, second), err_msg=name)
        np.testing.assert_array_equal(shared.score(0, query, first), make().score(0, query, first), err_msg=name)
