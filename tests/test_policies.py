"""The baseline policies beside SeKV: same engine, same budget; each keeps exactly what its rule selects."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.ndimage import uniform_filter1d

from helpers import prose
from sekv_gguf.config import BudgetConfig, SekvConfig, round_cells
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.errors import BudgetError
from sekv_gguf.policies import POLICIES, ChunkKVConfig, H2OConfig, PyramidKVConfig, QuestConfig, SnapKVConfig
from sekv_gguf.session import Session, load_model


def _tokens(model, n: int, offset: int = 0) -> list[int]:
    return model.tokenize(prose(6 * n, offset).encode(), add_bos=True, special=False)[:n]


def _resident_positions(policy) -> np.ndarray:
    """Positions held by the managed cache, read from the hook (not from the policy's own bookkeeping)."""
    pos = policy.session.hook.cells_pos()
    return np.sort(pos[pos >= 0])


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_every_policy_with_budget_covering_context_equals_full(llama_model, gemma_model, which):
    model = llama_model if which == "llama" else gemma_model
    toks = _tokens(model, 300)
    n = 16
    runs = {}
    for name in POLICIES:
        policy = make_policy(name, model, len(toks) + n, budget=BudgetConfig(kv_budget=1.0, chunk=128))
        runs[name] = generate(policy, toks, n, stop_at_eos=False)
        policy.close()
    assert set(runs) >= {"full", "streaming", "h2o", "snapkv", "quest", "sekv"}
    for name, run in runs.items():
        assert run.tokens == runs["full"].tokens, name
    assert runs["sekv"].sekv.spans == 0  # nothing needed compressing


@pytest.mark.parametrize("name", ["streaming", "h2o", "snapkv", "quest", "sekv"])
def test_every_policy_runs_within_the_budget(llama_model, name):
    toks = _tokens(llama_model, 1500)
    policy = make_policy(name, llama_model, len(toks) + 8, budget=BudgetConfig(kv_budget=512, chunk=128))
    run = generate(policy, toks, 8, stop_at_eos=False)
    assert len(run.tokens) == 8
    assert policy.session.hook.info.kv_size == 512
    assert (policy.session.hook.cells_pos() >= 0).sum() <= 512
    assert run.device_kv_bytes < run.full_kv_bytes
    policy.close()


def test_streaming_keeps_sinks_and_the_newest_tokens(llama_model):
    toks = _tokens(llama_model, 1200)
    policy = make_policy("streaming", llama_model, len(toks) + 40, budget=BudgetConfig(kv_budget=256, chunk=64))
    logits = policy.prefill(toks)
    for _ in range(40):
        logits = policy.step(int(np.argmax(logits)))
    got = _resident_positions(policy)
    newest = len(toks) + 39
    n_tail = got.size - 4
    want = np.concatenate([np.arange(4), np.arange(newest - n_tail + 1, newest + 1)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.sort(policy.memory.pos), got)
    policy.close()


def test_h2o_scores_are_native_attention_and_lightest_go(llama_model):
    toks = _tokens(llama_model, 900)
    policy = make_policy("h2o", llama_model, len(toks) + 64, budget=BudgetConfig(kv_budget=256, chunk=64),
                         params=H2OConfig(evict_batch=8))
    logits = policy.prefill(toks)
    hook = policy.session.hook
    # one decode step: its score update equals numpy's softmax attention of the captured queries
    before = policy.memory.score.copy()
    n_before = policy.memory.pos.size
    pos_before = policy.memory.pos.copy()
    logits = policy.step(int(np.argmax(logits)))
    keep = np.isin(pos_before, policy.memory.pos)
    delta = policy.memory.score[: keep.sum()] - before[keep]
    want = np.zeros(policy.memory.pos.size)
    for ikv in range(policy.n_layer):
        k, _ = hook.get_rows(ikv, policy.memory.cell)
        q = hook.query(ikv).astype(np.float64)  # [n_head, d]
        hkv = k.shape[1]
        logit = np.einsum("nhd,hgd->hgn", k.astype(np.float64), q.reshape(hkv, -1, q.shape[1]))
        p = np.exp(logit - logit.max(-1, keepdims=True))
        want += (p / p.sum(-1, keepdims=True)).sum(axis=(0, 1))
    np.testing.assert_allclose(delta, want[: keep.sum()], rtol=1e-4, atol=1e-6)
    # an eviction drops exactly the lowest scores outside the sinks and the recent window
    while policy.memory.pos.size < policy.budget:
        logits = policy.step(int(np.argmax(logits)))
    scores, positions = policy.memory.score.copy(), policy.memory.pos.copy()
    recent = int(policy.params.recent_share * policy.budget)
    heavy = np.arange(4, positions.size - recent)
    want_gone = positions[heavy[np.argsort(scores[heavy], kind="stable")[:8]]]
    policy.step(int(np.argmax(logits)))
    gone = np.setdiff1d(positions, _resident_positions(policy))
    np.testing.assert_array_equal(np.sort(gone), np.sort(want_gone))
    assert n_before <= policy.budget
    policy.close()


def test_snapkv_keeps_the_pooled_vote_winners(llama_model):
    """Reference: full prefill, observation queries captured one by one, numpy softmax votes, average pooling."""
    toks = _tokens(llama_model, 1000)
    n_gen, w, kernel = 4, 16, 7
    params = SnapKVConfig(obs_window=w, pool_kernel=kernel)
    policy = make_policy("snapkv", llama_model, len(toks) + n_gen, budget=BudgetConfig(kv_budget=256, chunk=128),
                         params=params)
    policy.prefill(toks)
    got = _resident_positions(policy)

    ref = Session(llama_model, policy.session.config.sized(1024, 128))
    ref.hook.enable_query_capture()
    n_prefix = len(toks) - w
    ref.decode(toks[:n_prefix], logits="none")
    pos = ref.hook.cells_pos()
    cells = np.argsort(np.where(pos >= 0, pos, 1 << 30))[:n_prefix].astype(np.int32)
    votes = np.zeros(n_prefix)
    for t in toks[n_prefix:]:
        ref.decode([t])
        for ikv in range(ref.hook.info.n_layer_kv):
            k, _ = ref.hook.get_rows(ikv, cells)
            q = ref.hook.query(ikv).astype(np.float64)
            logit = np.einsum("nhd,hgd->hgn", k.astype(np.float64), q.reshape(k.shape[1], -1, q.shape[1]))
            p = np.exp(logit - logit.max(-1, keepdims=True))
            votes += (p / p.sum(-1, keepdims=True)).sum(axis=(0, 1))
    ref.close()
    pooled = uniform_filter1d(votes, size=kernel, mode="constant")
    pooled[:4] = np.inf
    n_keep = policy.budget - w - n_gen - 1
    want = np.concatenate([np.sort(np.argsort(-pooled, kind="stable")[:n_keep]), np.arange(n_prefix, len(toks))])
    np.testing.assert_array_equal(got, want)
    policy.close()


def test_chunkkv_keeps_whole_chunks(llama_model):
    toks = _tokens(llama_model, 1000)
    policy = make_policy("chunkkv", llama_model, len(toks) + 4, budget=BudgetConfig(kv_budget=256, chunk=128),
                         params=ChunkKVConfig(obs_window=16, chunk_size=10))
    policy.prefill(toks)
    got = _resident_positions(policy)
    prefix = got[got < len(toks) - 16]
    chunks, counts = np.unique(prefix // 10, return_counts=True)
    partial = chunks[counts < 10]
    assert set(partial.tolist()) <= {(len(toks) - 17) // 10}  # only the prefix's last, cut chunk may be partial
    assert prefix.size > 100 and np.array_equal(got[-16:], np.arange(len(toks) - 16, len(toks)))
    policy.close()


def test_pyramidkv_layers_keep_shrinking_sets_within_the_budget(llama_model, tiny_llama):
    from sekv_gguf.tiny_models import TinySpec, write_tiny_llama

    deep = load_model(write_tiny_llama(tiny_llama.parent / "deep.gguf", TinySpec(n_layer=4)))
    toks = _tokens(deep, 1000)
    policy = make_policy("pyramidkv", deep, len(toks) + 4, budget=BudgetConfig(kv_budget=256, chunk=128),
                         params=PyramidKVConfig(obs_window=16, pyramid_beta=4))
    policy.prefill(toks)
    hook = policy.session.hook
    resident = np.flatnonzero(hook.cells_pos() >= 0)
    assert resident.size <= 256
    visible = [int(np.isfinite(hook.get_bias(ikv)[resident]).sum()) for ikv in range(4)]
    assert visible[0] > visible[1] > visible[2] > visible[3] >= 16 + 4, visible  # shrinking with depth
    assert visible[0] <= resident.size
    # the newest tokens (observation window) are visible in every layer
    pos = hook.cells_pos()
    window = np.flatnonzero(pos >= len(toks) - 16)
    assert all(np.isfinite(hook.get_bias(ikv)[window]).all() for ikv in range(4))
    run_logits = policy.step(int(toks[-1]))
    assert np.isfinite(run_logits).all()
    policy.close()


def test_quest_is_blocks_without_summary_rows(llama_model):
    toks = _tokens(llama_model, 1500)
    policy = make_policy("quest", llama_model, len(toks) + 4, budget=BudgetConfig(kv_budget=512, chunk=128),
                         params=QuestConfig(block=16))
    generate(policy, toks, 4, stop_at_eos=False)
    spans = policy.memory.store.spans
    assert spans and all(s.length == 16 and s.summary_cell == -1 for s in spans)
    assert not policy.memory.anchors and policy.router.name == "bound"
    policy.close()


def test_sentencekv_spans_are_sentences(llama_model):
    toks = _tokens(llama_model, 1500)
    policy = make_policy("sentencekv", llama_model, len(toks) + 4, budget=BudgetConfig(kv_budget=512, chunk=128))
    generate(policy, toks, 4, stop_at_eos=False)
    spans = policy.memory.store.spans
    assert len(spans) > 10 and all(s.summary_cell == -1 for s in spans)
    session = policy.session
    ends = 0
    for span in spans:
        last = toks[int(span.positions[-1])]
        piece = session.piece(last)
        ends += b"\n" in piece or piece.rstrip().endswith((b".", b"!", b"?"))
        assert span.length <= policy.config.span_max
    assert ends >= 0.9 * len(spans)  # only sentences longer than span_max are cut elsewhere
    assert policy.router.name == "centroid"
    policy.close()


def test_semanticache_merges_into_cores_with_log_count_bias(llama_model):
    toks = _tokens(llama_model, 2000)
    policy = make_policy("semanticache", llama_model, len(toks) + 4, budget=BudgetConfig(kv_budget=512, chunk=128))
    generate(policy, toks, 4, stop_at_eos=False)
    hook = policy.session.hook
    resident = np.flatnonzero(hook.cells_pos() >= 0)
    assert resident.size <= 512 and policy.memory.cores > 0 and policy.memory.merged_tokens > 5 * policy.memory.cores
    for ikv in range(policy.n_layer):
        b = hook.get_bias(ikv)[resident]
        counts = np.exp(b[np.isfinite(b) & (b > 0)])
        assert counts.size and np.allclose(counts, np.round(counts), atol=1e-3)  # bias = log(member count)
    # every layer's cores account for every merged token exactly once (bias 0: a 1-member core or an unmerged token)
    for ikv in range(policy.n_layer):
        b = hook.get_bias(ikv)[resident]
        assert int(np.round(np.exp(b[b > 0])).sum()) + int((b == 0).sum()) == policy.memory.merged_tokens + (
            resident.size - policy.memory.cores)
    policy.close()


def test_bad_policy_inputs():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope", None, 100)
    with pytest.raises(ValueError, match="kv_budget must be > 0"):
        BudgetConfig(kv_budget=0)
    with pytest.raises(ValueError, match="pool_kernel"):
        SnapKVConfig(pool_kernel=4)


def test_a_wrong_option_fails(llama_model):
    """Each policy takes its own parameter dataclass and nothing else; only the routing policy takes a router."""
    from sekv_gguf.router import SummaryRouter

    with pytest.raises(TypeError, match="SnapKVConfig"):
        make_policy("snapkv", llama_model, 1000, params=H2OConfig())
    with pytest.raises(TypeError, match="none"):
        make_policy("full", llama_model, 1000, params=SekvConfig())
    with pytest.raises(ValueError, match="takes no router"):
        make_policy("h2o", llama_model, 1000, router=SummaryRouter())
    with pytest.raises(TypeError):
        H2OConfig(obs_window=3)  # a SnapKV option


def test_one_cell_rounding_rule():
    assert [round_cells(n) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]
    assert BudgetConfig(kv_budget=0.1).cells(4096) == 512 and BudgetConfig(kv_budget=300).cells(10) == 512


def test_eviction_budget_too_small(llama_model):
    with pytest.raises(BudgetError, match="cannot hold"):
        make_policy("h2o", llama_model, 5000, budget=BudgetConfig(kv_budget=8, chunk=256, cell_granularity=1))
