"""Real Gemma 3 270M: needle retrieval at 4K tokens with a device budget of 25% of the context."""

from __future__ import annotations

import os

import pytest

from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.documents import needle_prompt
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.session import load_model

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
N_TOKENS = 4096
N_PREDICT = 10


@pytest.mark.gemma
def test_needles_at_quarter_budget(gemma_path):
    model = load_model(gemma_path)
    count = lambda text: len(model.tokenize(text.encode(), add_bos=True, special=False))  # noqa: E731
    correct = {"full": 0, "sekv": 0}
    report = []
    for i, depth in enumerate(DEPTHS):
        needle = needle_prompt(count, N_TOKENS, depth, seed=i)
        tokens = model.tokenize(needle.prompt.encode(), add_bos=True, special=False)
        assert abs(len(tokens) - N_TOKENS) < 32
        for name in correct:
            params = SekvConfig(router=os.environ.get("SEKV_ROUTER", "mass")) if name == "sekv" else None
            policy = make_policy(name, model, len(tokens) + N_PREDICT, budget=BudgetConfig(kv_budget=0.25),
                                 params=params)
            run = generate(policy, tokens, N_PREDICT)
            if name == "sekv":  # the hooked cache holds a quarter of the context (rounded up to 256 cells)
                assert run.sekv.budget_cells <= -(-len(tokens) // 4 // 256) * 256 + 256
                assert run.sekv.spans > 0 and run.device_kv_bytes < run.full_kv_bytes
            policy.close()
            hit = needle.answer in run.text
            correct[name] += hit
            report.append((depth, name, hit, run.text.strip()[:20]))
    print(report)
    assert correct["full"] >= 4, report  # the task is one the model can do with full KV
    assert correct["sekv"] >= correct["full"] - 1, report
