"""Which prefill a sekv memory takes (the default streams within the budget; ``prefill="exact"`` is the reference)
and one full-attention pass shared by exact prefills of the same prompt (``ExactPasses``,
what an evaluation's runs over budgets and routers use): each compression must be what it is alone."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.suite import EvalConfig, run_suite
from sekv_gguf.policies.prefill import ExactPasses
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
    passes = ExactPasses()
    runs = [(384, {}), (640, {}), (384, {"router": "mass"})]
    try:
        for budget, overrides in runs:
            got = []
            for shared in (passes, None):
                policy = make_policy("sekv", model, len(toks) + 12, budget=BudgetConfig(kv_budget=budget, chunk=128),
                                     params=SekvConfig(prefill="exact", **overrides))
                policy.exact_passes = shared
                policy.reset()  # a memory's reset keeps what it shares with other policies
                assert policy.exact_passes is shared
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
        assert passes.last is not None
    finally:
        passes.close()
    assert passes.last is None


def test_a_new_prompt_replaces_the_shared_pass(llama_model):
    passes, cc = ExactPasses(), ContextConfig()
    try:
        a = passes.get(llama_model, cc, 128, _tokens(llama_model, 300))
        assert passes.get(llama_model, cc, 128, _tokens(llama_model, 300)) is a and passes.reused == 1
        b = passes.get(llama_model, cc, 128, _tokens(llama_model, 300, offset=50))
        assert b is not a and a.closed and not b.closed and passes.reused == 1
        assert passes.get(llama_model, cc, 64, _tokens(llama_model, 300, offset=50)) is not b  # another batch
    finally:
        passes.close()
    assert passes.last is None


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
