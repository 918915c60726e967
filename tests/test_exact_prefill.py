"""Which prefill a sekv memory takes (the default streams within the budget; ``prefill="exact"`` is the reference)
and one full-attention pass shared by the runs of the same prompt (``SharedPasses``, what an evaluation's runs over
budgets, routers and policies use): each compression or selection must be what it is alone."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.suite import EvalConfig, run_suite
from sekv_gguf.policies.prefill import exact_key, exact_pass
from sekv_gguf.policies.shared_passes import SharedPasses
from sekv_gguf.session import full_kv_bytes


def _tokens(model, n: int, offset: int = 0) -> list[int]:
    return model.tokenize(prose(9000, offset).encode(), add_bos=True, special=False)[:n]


def _prefill_kind(model, toks, **params) -> dict:
    policy = make_policy("sekv", model, len(toks) + 8, budget=BudgetConfig(kv_budget=512, chunk=128),
                         params=SekvConfig(**params))
    try:
        policy.prefill(toks)
        return asdict(policy.stats().sekv) | {"full": full_kv_bytes(policy.session, len(toks),
                                                               policy.session.config.n_ubatch)}
    finally:
        policy.close()


def test_only_an_explicit_exact_prefill_makes_a_full_size_context(llama_model, gemma_model, monkeypatch):
    """The default prefill of a prompt longer than the budget creates no context above the budget (the peak stays
    the budget context: no transient full-size one); ``prefill="exact"`` does, and says so in its statistics."""
    from sekv_gguf import session as session_mod

    sizes: list[int] = []
    real = session_mod.Session.__init__

    def spy(self, model, config, owner=None):
        sizes.append(config.n_ctx)
        real(self, model, config, owner)

    monkeypatch.setattr(session_mod.Session, "__init__", spy)
    for model in (llama_model, gemma_model):
        toks = _tokens(model, 1500, offset=200)
        for prefill in ("auto", "streaming"):
            sizes.clear()
            kind = _prefill_kind(model, toks, prefill=prefill)
            assert kind["prefill"] == "streaming" and kind["transient_kv_bytes"] == 0
            assert sizes and max(sizes) == kind["budget_cells"] < len(toks)
        sizes.clear()
        exact = _prefill_kind(model, toks, prefill="exact")
        assert exact["prefill"] == "exact" and exact["transient_kv_bytes"] == exact["full"] > 0
        assert max(sizes) >= len(toks)


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_a_shared_exact_pass_compresses_as_a_prefill_alone(llama_model, gemma_model, which):
    """Two budgets and two routers compress one shared pass: each run's prefill logits and greedy tokens equal
    those of the same run with a pass of its own (Gemma: its sliding-window cache is copied from the shared pass)."""
    model = llama_model if which == "llama" else gemma_model
    toks = _tokens(model, 1400, offset=4000)
    passes = SharedPasses()
    runs = [(384, {}), (640, {}), (384, {"router": "mass"})]
    try:
        for budget, overrides in runs:
            got = []
            for shared in (passes, None):
                policy = make_policy("sekv", model, len(toks) + 12, budget=BudgetConfig(kv_budget=budget, chunk=128),
                                     params=SekvConfig(prefill="exact", **overrides))
                policy.shared_passes = shared
                policy.reset()  # a memory's reset keeps what it shares with other policies
                assert policy.shared_passes is shared
                try:
                    logits = policy.prefill(toks).copy()
                    steps = [int(np.argmax(logits))]
                    for _ in range(6):
                        steps.append(int(np.argmax(policy.step(steps[-1]))))
                    got.append((logits, steps, asdict(policy.stats().sekv)["spans"]))
                finally:
                    policy.close()
            (a, steps_a, spans_a), (b, steps_b, spans_b) = got
            np.testing.assert_array_equal(a, b)
            assert steps_a == steps_b and spans_a == spans_b > 0
        assert passes.reused == len(runs) - 1  # one pass made, handed out again to every later run
        assert set(passes.last) == {"exact"}
    finally:
        passes.close()
    assert passes.last == {}


def test_a_new_prompt_replaces_the_shared_pass(llama_model):
    passes, cc = SharedPasses(), ContextConfig()

    def get(chunk: int, tokens: list[int]):
        return passes.get(exact_key(tokens, chunk, cc), llama_model,
                          lambda: exact_pass(llama_model, cc, chunk, tokens))

    try:
        a = get(128, _tokens(llama_model, 300))
        assert get(128, _tokens(llama_model, 300)) is a and passes.reused == 1
        b = get(128, _tokens(llama_model, 300, offset=50))
        assert b is not a and a.closed and not b.closed and passes.reused == 1
        assert get(64, _tokens(llama_model, 300, offset=50)) is not b  # another batch
        with pytest.raises(AssertionError, match="another key"):  # a maker that answers another prompt
            passes.get(exact_key([1, 2, 3], 64, cc), llama_model, lambda: exact_pass(llama_model, cc, 64, [1, 2, 4]))
        assert passes.last == {}  # the kept pass of the kind was closed for the new key, the wrong one refused
    finally:
        passes.close()
    assert passes.last == {}


def test_eval_variants_share_the_prompt_s_pass(llama_model):
    """``sekv_variants`` add sekv runs named by their overrides; every exact prefill after the first of a prompt
    compresses the shared pass (``shared_prefill``), and a variant scores what it scores run alone."""
    model = llama_model
    base = dict(policies=("sekv",), budgets=(0.3,), tasks=("niah_number",), lengths=(1024,), samples=1,
                haystacks=("prose",), n_predict=4, fidelity_docs=0)
    exact = {"prefill": "exact"}
    both = run_suite(model, EvalConfig(**base, sekv=exact, sekv_variants=({"router": "mass"},)), progress=False)
    rows = {r["policy"]: r for r in both["cases"]}
    assert set(rows) == {"sekv-prefill=exact", "sekv-mass-prefill=exact"}
    assert not rows["sekv-prefill=exact"]["shared_prefill"] and rows["sekv-mass-prefill=exact"]["shared_prefill"]
    assert both["params"]["policies"] == ["sekv-prefill=exact", "sekv-mass-prefill=exact"]
    alone = run_suite(model, EvalConfig(**base, sekv={**exact, "router": "mass"}), progress=False)["cases"][0]
    assert alone["policy"] == "sekv-mass-prefill=exact"
    assert alone["output"] == rows["sekv-mass-prefill=exact"]["output"]
    with pytest.raises(ValueError, match="add sekv"):
        EvalConfig(**{**base, "policies": ("full",)}, sekv_variants=({"router": "mass"},))


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_shared_votes_select_as_a_pass_alone(llama_model, gemma_model, which):
    """SnapKV, ChunkKV and PyramidKV at two budgets select from one shared observation-window pass: each run's
    prefill logits, resident positions and greedy tokens equal those of the same run with a pass of its own."""
    model = llama_model if which == "llama" else gemma_model
    toks = _tokens(model, 1100, offset=2000)
    passes = SharedPasses()
    runs = [("snapkv", 256), ("chunkkv", 256), ("snapkv", 384), ("pyramidkv", 384)]
    try:
        for name, budget in runs:
            got = []
            for shared in (passes, None):
                policy = make_policy(name, model, len(toks) + 8, budget=BudgetConfig(kv_budget=budget, chunk=128))
                policy.shared_passes = shared
                try:
                    logits = policy.prefill(toks).copy()
                    steps = [int(np.argmax(logits))]
                    for _ in range(5):
                        steps.append(int(np.argmax(policy.step(steps[-1]))))
                    got.append((logits, steps, policy.memory.pos.copy()))
                finally:
                    policy.close()
            (a, steps_a, pos_a), (b, steps_b, pos_b) = got
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(pos_a, pos_b)
            assert steps_a == steps_b and pos_a.size < len(toks)  # the run selected: some tokens are gone
        assert passes.reused == len(runs) - 1  # one vote pass for every policy and budget
        assert set(passes.last) == {"vote"}
    finally:
        passes.close()


def test_eval_baselines_share_the_vote_pass(llama_model):
    """In an evaluation, SnapKV and ChunkKV at every budget after the first run take the prompt's vote pass
    (``shared_prefill``) and answer as run alone."""
    base = dict(budgets=(0.25, 0.4), tasks=("niah_number",), lengths=(1024,), samples=1, haystacks=("prose",),
                n_predict=4, fidelity_docs=0)
    both = run_suite(llama_model, EvalConfig(policies=("snapkv", "chunkkv"), **base), progress=False)["cases"]
    assert [r["shared_prefill"] for r in both] == [False, True, True, True]
    alone = run_suite(llama_model, EvalConfig(policies=("chunkkv",), **{**base, "budgets": (0.4,)}),
                      progress=False)["cases"]
    assert not alone[0]["shared_prefill"] and alone[0]["output"] == both[-1]["output"]
