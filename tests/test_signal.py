"""The segmentation signal without logits (``SekvConfig.signal="rarity"``): in-text self-information of each token;
a memory on it reserves one logits row and still compresses, routes and round-trips through plain data."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.segment import RaritySegmenter


def test_rarity_is_self_information_within_the_text_so_far():
    seg = RaritySegmenter(SekvConfig(), cap=8)
    got = seg.signal([5, 5, 7], np.zeros(3, dtype=np.float32), lambda t: b"")
    np.testing.assert_allclose(got, np.log([1 / 1, 2 / 2, 3 / 1]), rtol=1e-6)
    more = seg.signal([7, 9], np.zeros(2, dtype=np.float32), lambda t: b"")  # 7 seen once among 3, 9 never among 4
    np.testing.assert_allclose(more, np.log([4 / 2, 5 / 1]), rtol=1e-6)
    copy = RaritySegmenter(SekvConfig(), cap=8)
    copy.load_state(seg.state())
    assert copy.signal([9], np.zeros(1), lambda t: b"")[0] == seg.signal([9], np.zeros(1), lambda t: b"")[0]
    with pytest.raises(ValueError, match="signal"):
        SekvConfig(signal="entropy")



@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_a_rarity_memory_reserves_one_logits_row_and_compresses(llama_model, gemma_model, which):
    model = llama_model if which == "llama" else gemma_model
    toks = model.tokenize(prose(9000, offset=700).encode(), add_bos=True, special=False)[:1500]
    policy = make_policy("sekv", model, len(toks) + 8, budget=BudgetConfig(kv_budget=384, chunk=128),
                         params=SekvConfig(signal="rarity"))
    try:
        assert policy.session.n_outputs == 1
        before = policy.session.output_rows
        r = generate(policy, toks, 6)
        stats = policy.stats().sekv
        assert stats.spans > 5 and stats.anchors > 0 and len(r.tokens) == 6
        assert policy.session.output_rows - before < len(toks) // 10  # last-token logits only, never a row per token
        plain = policy.memory.to_plain()
        policy.memory.load_plain(plain)
        assert policy.memory.segmenter.state() == plain["segmenter"]
    finally:
        policy.close()
    exact = make_policy("sekv", model, len(toks) + 8, budget=BudgetConfig(kv_budget=384, chunk=128),
                        params=SekvConfig(signal="rarity", prefill="exact"))
    try:  # the exact prefill (the reference) segments by surprisal whatever the signal
        assert type(exact.memory.segmenter) is not RaritySegmenter and exact.memory.segmenter.scored
    finally:
        exact.close()


def test_a_truncated_rarity_memory_signals_what_a_fresh_one_does(llama_model):
    """Rolling back and decoding again gives the same signal as a memory that never saw the discarded tokens."""
    toks = llama_model.tokenize(prose(9000, offset=1300).encode(), add_bos=True, special=False)[:900]
    other = llama_model.tokenize(prose(9000, offset=5000).encode(), add_bos=False, special=False)[:40]
    logs = []
    for detour in (True, False):
        policy = make_policy("sekv", llama_model, 1200, budget=BudgetConfig(kv_budget=384, chunk=128),
                             params=SekvConfig(signal="rarity"))
        try:
            policy.prefill(toks)
            if detour:
                policy.append(other)
                policy.truncate(len(toks))
            policy.append(toks[100:140])
            logs.append(policy.memory.signal_log.copy())
        finally:
            policy.close()
    np.testing.assert_array_equal(logs[0], logs[1])
