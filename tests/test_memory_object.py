"""What a policy remembers is one memory object (``Policy.memory``): snapshots copy it and nothing else of the policy,
``reset`` returns to a copy of the empty one, and it survives a round trip through plain data (what a saved
conversation will write) into another policy over the same model and settings, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.policies import POLICIES, Policy
from sekv_gguf.policies.sekv_memory import SekvMemory
from sekv_gguf.policies.snapshot import DeviceState

PLAIN_SCALARS = (int, float, str, bool, type(None), np.integer, np.floating, np.bool_)


def _assert_plain(x, path: str = "memory") -> None:
    """Numbers, strings, lists, dicts and numpy arrays only (no objects of this package)."""
    if isinstance(x, dict):
        for k, v in x.items():
            assert isinstance(k, (str, int)), f"{path}: key {k!r}"
            _assert_plain(v, f"{path}.{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _assert_plain(v, f"{path}[{i}]")
    else:
        assert isinstance(x, PLAIN_SCALARS + (np.ndarray,)), f"{path} is a {type(x).__name__}"
        assert not (isinstance(x, np.ndarray) and x.dtype == object), f"{path} holds objects"


def _make(model, name: str, n: int) -> Policy:
    params = SekvConfig(route_every=2) if name == "sekv" else None
    return make_policy(name, model, n, budget=BudgetConfig(kv_budget=512, chunk=128), params=params)


def _greedy(policy: Policy, logits: np.ndarray, n: int) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        logits = policy.step(int(np.argmax(logits)))
        out.append(logits)
    return out


@pytest.fixture(params=["llama", "gemma"])
def model(request, llama_model, gemma_model):
    return llama_model if request.param == "llama" else gemma_model


def test_snapshot_and_restore_touch_only_the_memory_object(model, monkeypatch):
    """A policy cannot be deep-copied here: snapshot, restore and reset must work on ``memory`` alone; attributes
    of the policy that are not its memory are left as they are."""
    toks = model.tokenize(prose(9000).encode(), add_bos=True, special=False)[:1500]
    policy = _make(model, "sekv", len(toks) + 16)

    def refuse(self, memo):
        raise AssertionError("a policy was deep-copied")

    monkeypatch.setattr(Policy, "__deepcopy__", refuse, raising=False)
    try:
        logits = policy.prefill(toks)
        assert isinstance(policy.memory, SekvMemory) and len(policy.memory.store) > 0
        policy.fixed_marker = "before"  # not memory: a snapshot must not take it
        snap = policy.snapshot()
        assert snap.memory is not policy.memory and snap.memory.store.spans[0] is policy.memory.store.spans[0]
        want = _greedy(policy, logits, 6)  # routes twice (route_every=2): zooms change the memory
        policy.fixed_marker = "kept"  # nor may a restore bring back its old value
        before = {k: v for k, v in vars(policy).items() if k not in ("memory", "tokens")}
        policy.restore(snap)
        assert {k: v for k, v in vars(policy).items() if k not in ("memory", "tokens")} == before
        assert policy.tokens == toks
        got = _greedy(policy, logits, 6)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        policy.reset()
        assert policy.tokens == [] and len(policy.memory.store) == 0 and policy.fixed_marker == "kept"
    finally:
        policy.close()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_memory_round_trip_through_plain_data(model, name):
    """Memory as plain data + the device cells, loaded into a second policy of the same settings: the next steps'
    logits are bit-identical to the first policy's."""
    toks = model.tokenize(prose(9000, offset=300).encode(), add_bos=True, special=False)[:1400]
    first, second = _make(model, name, len(toks) + 16), _make(model, name, len(toks) + 16)
    try:
        logits = first.prefill(toks)
        logits = _greedy(first, logits, 3)[-1]
        plain = first.memory.to_plain()
        _assert_plain(plain)
        DeviceState.take(first.session).put(second.session)
        second.memory.load_plain(plain)
        second.tokens = list(first.tokens)
        want, got = _greedy(first, logits, 5), _greedy(second, logits, 5)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        assert second.memory.to_plain().keys() == plain.keys()
    finally:
        first.close()
        second.close()
