"""The policy lifecycle (append / step / truncate / reset / snapshot), for every policy, checked from the hook: the
last decode produced an output row, the sequence's largest position is n_tokens - 1, the cells stay within the
budget; ``full`` under this API is exact."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.policies import POLICIES

BUDGET = BudgetConfig(kv_budget=512, chunk=128)


def _tokens(model, n: int, offset: int = 0) -> list[int]:
    return model.tokenize(prose(6 * n, offset).encode(), add_bos=True, special=False)[:n]


def check_invariants(policy) -> None:
    s = policy.session
    assert llama_cpp.llama_get_logits_ith(s.ctx, -1), "the last decode gave no output row"
    assert s.pos_max() == policy.n_tokens - 1
    assert int((s.hook.cells_pos() >= 0).sum()) <= s.hook.info.kv_size


def _greedy(policy, logits, n: int) -> list[int]:
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = policy.step(t)
        check_invariants(policy)
    return out


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_keeps_the_invariants_through_its_lifecycle(llama_model, name):
    toks = _tokens(llama_model, 1400)
    policy = make_policy(name, llama_model, 2000, budget=BUDGET)
    try:
        logits = policy.append(toks[:900])
        check_invariants(policy)
        logits = policy.append(toks[900:])  # a second turn: only its tokens are decoded
        check_invariants(policy)
        gen = _greedy(policy, logits, 6)
        assert policy.tokens == toks + gen
        n = len(toks) + 2
        if policy.truncate(n):  # drop the last generated tokens: inside every recent window
            assert policy.n_tokens == n
            check_invariants(policy)
            logits = policy.append(gen[2:4])
            check_invariants(policy)
        policy.reset()
        assert policy.n_tokens == 0 and policy.session.pos_max() == -1
        policy.append(toks[:300])
        check_invariants(policy)
    finally:
        policy.close()


def test_full_policy_is_exact_under_the_lifecycle(llama_model):
    """append in parts, truncate and append again, reset: the logits of a fresh prefill of the same tokens."""
    toks = _tokens(llama_model, 700, 2000)
    ref = make_policy("full", llama_model, 1000, budget=BUDGET)
    want = ref.prefill(toks)
    want_500 = make_policy("full", llama_model, 1000, budget=BUDGET)
    w500 = want_500.prefill(toks[:500])
    want_500.close()
    ref.close()
    p = make_policy("full", llama_model, 1000, budget=BUDGET)
    p.append(toks[:300])
    got = p.append(toks[300:])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max())
    assert p.truncate(499)
    got = p.append(toks[499:500])
    # one token decoded alone against the same token at the end of a batch: ggml's CPU matmul takes other kernels
    # (and with one thread other splits) for the two; measured up to 1.2e-3 of the largest logit
    np.testing.assert_allclose(got, w500, rtol=0, atol=3e-3 * np.abs(w500).max())
    p.reset()
    np.testing.assert_array_equal(p.prefill(toks), want)
    p.close()


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_a_snapshot_restores_the_memory_exactly(llama_model, gemma_model, which):
    model = llama_model if which == "llama" else gemma_model
    toks = _tokens(model, 1500, 500)
    policy = make_policy("sekv", model, 2000, budget=BUDGET, params=SekvConfig(route_every=1))
    try:
        logits = policy.append(toks)
        snap = policy.snapshot()
        first = _greedy(policy, logits, 8)
        spans = len(policy.memory.store)
        policy.append(_tokens(model, 200, 9000))  # the memory moves on
        policy.restore(snap)
        check_invariants(policy)
        assert policy.tokens == toks and len(policy.memory.store) <= spans
        again = _greedy(policy, logits, 8)
        assert again == first
        assert snap.host_bytes > 0 and snap.n_tokens == len(toks)
    finally:
        policy.close()


def test_sekv_truncate_inside_compressed_spans_redecodes_from_the_span(llama_model):
    """A divergence deep inside the compressed part drops the spans from there on and decodes again only from the
    start of the first dropped span: far fewer tokens than a re-prefill."""
    toks = _tokens(llama_model, 1800, 700)
    policy = make_policy("sekv", llama_model, 2400, budget=BUDGET)
    try:
        policy.append(toks)
        spans = policy.memory.store.spans
        assert len(spans) > 6
        n = int(spans[len(spans) // 2].positions[10])  # inside a middle span
        start = int(spans[len(spans) // 2].positions[0])
        kept = [s.positions.tolist() for s in spans[: len(spans) // 2]]
        before = policy.session.decoded_tokens
        assert policy.truncate(n)
        check_invariants(policy)
        assert policy.memory.sentence_end.size == n  # where spans may end, as long as the memory
        redone = policy.session.decoded_tokens - before
        assert policy.n_tokens == n and policy.tokens == toks[:n]
        assert redone <= (n - start) + policy.config.refresh_tokens  # the span's start to n, and the tail refresh
        assert [s.positions.tolist() for s in policy.memory.store.spans[: len(kept)]] == kept
        assert all(s.positions[-1] < n for s in policy.memory.store.spans)
        logits = policy.append(toks[n:])  # and it goes on
        check_invariants(policy)
        _greedy(policy, logits, 4)
    finally:
        policy.close()


def test_sekv_refuses_a_truncation_in_the_first_span(llama_model):
    toks = _tokens(llama_model, 1500)
    policy = make_policy("sekv", llama_model, 2000, budget=BUDGET)
    try:
        policy.append(toks)
        n = int(policy.memory.store.spans[0].positions[3])
        assert not policy.truncate(n)
        assert policy.tokens == toks  # nothing changed
        check_invariants(policy)
    finally:
        policy.close()


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_a_turn_is_decoded_once_with_one_logits_row(llama_model, gemma_model, which):
    """A conversation's next message (a short append into a memory that holds tokens) is decoded once, with one
    logits row, each layer routing inside that decode (``turn_routing="layer"``); its tokens past the first take the
    mean surprisal seen so far (the first one's comes from the previous logits). ``refresh`` decodes its tail once
    more after the routing (one more row); ``turn_tokens=0`` gives back the prompt's path: a logits row per token,
    every token its own surprisal, and the refresh."""
    model = llama_model if which == "llama" else gemma_model
    doc, turn = _tokens(model, 1400, 300), _tokens(model, 21, 7000)[1:]
    cost = {}
    surprisal = {"signal": "surprisal"}  # the scored signal: a rarity memory never asks for a row per token
    for label, params in (("layer", SekvConfig(**surprisal)),
                          ("refresh", SekvConfig(turn_routing="refresh", **surprisal)),
                          ("prompt", SekvConfig(turn_tokens=0, **surprisal))):
        policy = make_policy("sekv", model, 2000, budget=BUDGET, params=params)
        try:
            policy.append(doc)
            assert len(policy.memory.store) > 0  # compressed: the turn is routed
            s = policy.session
            tokens, rows, routes = s.decoded_tokens, s.output_rows, policy.memory.counters.prompt.routes
            mean = policy.memory.segmenter.mean
            logits = policy.append(turn)
            check_invariants(policy)
            assert policy.memory.counters.prompt.routes == routes + 1
            cost[label] = (s.decoded_tokens - tokens, s.output_rows - rows)
            if label == "prompt":
                assert np.unique(policy.memory.signal_log[-20:]).size > 10  # every token's own surprisal
            else:
                np.testing.assert_array_equal(policy.memory.signal_log[-19:], np.float32(mean))
                assert policy.memory.signal_log[-20] != np.float32(mean)  # from the previous logits
            _greedy(policy, logits, 3)
        finally:
            policy.close()
    assert cost["layer"] == (len(turn), 1)
    assert cost["refresh"][0] == cost["prompt"][0] > len(turn)  # the turn, then its tail again after the routing
    assert cost["refresh"][1] == 2 and cost["prompt"][1] == len(turn) + 1


@pytest.mark.parametrize("case", ["last", "probes", "refused"])
def test_turn_probes_rank_each_layer_by_every_token_of_the_turn(llama_model, monkeypatch, case):
    """``turn_probes``: the turn's in-decode routing hands each layer the queries of every token of the turn (as
    more query heads, ``probe_heads``), not only its last token's (``last``: off); the capture's probe count is put
    back after the turn, so later chunks and steps capture what they did. ``refused``: where the hook refuses the
    callback, the two-pass turn routes by the probes its decode captured (``chunk_probes``)."""
    from sekv_gguf.router import probes_that_fit

    doc, turn = _tokens(llama_model, 1400, 300), _tokens(llama_model, 21, 7000)[1:]
    policy = make_policy("sekv", llama_model, 2000, budget=BUDGET, params=SekvConfig(turn_probes=case != "last"))
    try:
        policy.append(doc)
        hook, layer = policy.session.hook, policy.session.hook.layers[0]
        probes = hook.query_probes
        if case == "refused":
            _refuse_layer_callback(policy, monkeypatch)
        seen = []
        route_layer = policy.routing.route_layer

        def spy(memory, ikv, query, router, kind):
            seen.append((kind, query.shape))
            return route_layer(memory, ikv, query, router, kind)

        monkeypatch.setattr(policy.routing, "route_layer", spy)
        logits = policy.append(turn)
        check_invariants(policy)
        assert policy.memory.counters.layer_routed_turns == (case != "refused") and hook.query_probes == probes
        n_probes = {"last": 1, "probes": probes_that_fit(len(turn), layer.n_head, layer.n_head_kv, layer.head_dim_k),
                    "refused": probes}[case]
        assert n_probes == {"last": 1, "probes": len(turn), "refused": 16}[case]  # this model takes them all
        assert seen == [("prompt", (layer.n_head * n_probes, layer.head_dim_k))] * policy.memory.store.n_layer
        _greedy(policy, logits, 2)
    finally:
        policy.close()


def _refuse_layer_callback(policy, monkeypatch) -> list:
    """Make the policy's hook refuse the layer callback as a context with an eval callback of its own does; the list
    of the refused requests."""
    from sekv_gguf.errors import UnsupportedModelError

    refused = []

    def unsupported(fn):
        refused.append(fn)
        raise UnsupportedModelError("sekv_layer_cb_set", -2, "the context already has an eval callback of its own")

    monkeypatch.setattr(policy.session.hook, "layer_callback", unsupported)
    return refused


def test_a_turn_falls_back_to_two_passes_where_the_layer_callback_is_unsupported(llama_model, monkeypatch):
    """Where the hook refuses the layer callback (UnsupportedModelError before any decode), the turn takes the
    two-pass path, counted once, and later turns go there directly."""
    doc, turn = _tokens(llama_model, 1400, 300), _tokens(llama_model, 21, 7000)[1:]
    policy = make_policy("sekv", llama_model, 2000, budget=BUDGET)
    try:
        policy.append(doc)
        refused = _refuse_layer_callback(policy, monkeypatch)
        s = policy.session
        tokens, routes = s.decoded_tokens, policy.memory.counters.prompt.routes
        logits = policy.append(turn)
        check_invariants(policy)
        assert len(refused) == 1 and not policy.routing.layer_callback
        assert s.decoded_tokens - tokens > len(turn)  # decoded, routed, its tail decoded again
        assert policy.memory.counters.prompt.routes == routes + 1 and policy.memory.counters.layer_routed_turns == 0
        policy.append([int(np.argmax(logits))] + turn[:5])
        assert len(refused) == 1  # not asked again
    finally:
        policy.close()


def test_a_step_routes_after_its_decode_where_the_layer_callback_is_unsupported(llama_model, monkeypatch):
    """``step_routing="layer"`` with the callback refused: the routing step is decoded once and routed after it
    (the lagged routing), and the callback is not asked again."""
    doc = _tokens(llama_model, 1400, 300)
    policy = make_policy("sekv", llama_model, 2000, budget=BUDGET,
                         params=SekvConfig(step_routing="layer", route_every=2))
    try:
        logits = policy.append(doc)
        refused = _refuse_layer_callback(policy, monkeypatch)
        s = policy.session
        tokens, routes = s.decoded_tokens, policy.memory.counters.step.routes
        _greedy(policy, logits, 4)
        assert len(refused) == 1 and not policy.routing.layer_callback
        assert s.decoded_tokens - tokens == 4 and policy.memory.steps == 4
        assert policy.memory.counters.step.routes == routes + 2 and policy.memory.counters.layer_routed_steps == 0
    finally:
        policy.close()


def test_a_cut_takes_no_more_anchors_than_its_allowance():
    """``Segmenter.cut``'s allowance bounds the anchors taken so far; within it, the most surprising tokens."""
    from sekv_gguf.segment import Segmenter

    rng = np.random.default_rng(0)
    seg = Segmenter(SekvConfig(), cap=10)
    s = rng.gamma(2.0, 1.0, size=400).astype(np.float32)
    seg.track(s)
    first = seg.cut(s[:200], allowance=3)
    assert first.anchors.size == 3 and seg.n_anchors == 3
    over = np.flatnonzero(s[:200] > seg.threshold)
    np.testing.assert_array_equal(np.sort(first.anchors), np.sort(over[np.argsort(-s[over])[:3]]))
    second = seg.cut(s[200:], allowance=5)
    assert second.anchors.size == 2 and seg.n_anchors == 5
    assert seg.cut(s[200:], allowance=4).anchors.size == 0  # an allowance below what is held takes none
    assert seg.cut(s[200:]).anchors.size == 5                 # no allowance: the rest of the cap
    strict = Segmenter(SekvConfig(), cap=50)
    strict.track(s)
    floor = float(np.quantile(s, 0.95))
    assert np.all(s[strict.cut(s, floor=floor).anchors] > floor)  # a floor above the threshold is the bar


def test_spans_end_after_a_sentence_end_where_their_range_holds_one():
    """``span_cuts="sentence"``: the cut is the largest surprisal jump among the cuts right after a sentence end in
    [span_min, span_max]; with none in range (or ``ends`` not given) the largest jump anywhere."""
    from sekv_gguf.segment import Segmenter

    cfg = SekvConfig(span_min=4, span_max=8, anchor_share=0.0)
    s = np.zeros(40, dtype=np.float32)
    s[[6, 15]] = 5.0                           # surprisal jumps before tokens 6, 7, 15 and 16
    ends = np.zeros(40, dtype=bool)
    ends[[4, 14, 16]] = True                   # tokens 4, 14 and 16 end sentences
    plain = Segmenter(cfg, cap=0).cut(s, final=True)
    sentence = Segmenter(cfg, cap=0).cut(s, final=True, ends=ends)
    assert [int(g[0]) for g in plain.spans][:5] == [0, 6, 10, 15, 19]     # the largest jump in range
    # after token 4 (the only end in [4, 8]); none in 5 + [4, 8]: the jump (none: the shortest); of the ends 14
    # and 16 in 9 + [4, 8] the one before the larger jump (14)
    assert [int(g[0]) for g in sentence.spans][:5] == [0, 5, 9, 15, 19]
    for seg in (plain, sentence):              # every token once, in order, each span within its lengths
        np.testing.assert_array_equal(np.concatenate(seg.spans), np.arange(40))
        assert all(4 <= g.size <= 8 + 4 for g in seg.spans)
    with pytest.raises(ValueError, match="ends has 39 entries for 40 tokens"):
        Segmenter(cfg, cap=0).cut(s, ends=ends[:39])


@pytest.mark.parametrize("prefill", ["streaming", "exact"])
def test_a_memory_s_spans_end_at_sentence_ends(llama_model, prefill):
    """Streamed or exact, a span whose length range holds a sentence end ends at one (``span_cuts="sentence"``);
    cut at surprisal jumps alone, some do not."""
    from sekv_gguf.segment import SentenceEnds

    toks = _tokens(llama_model, 1800, 300)
    misses = {}
    for cuts in ("sentence", "surprisal"):
        cfg = SekvConfig(span_cuts=cuts, anchor_share=0.0, prefill=prefill)
        policy = make_policy("sekv", llama_model, 2000, budget=BUDGET, params=cfg)
        try:
            logits = policy.append(toks)
            _greedy(policy, logits, 3)
            marks = SentenceEnds(policy.session.piece)(policy.tokens) > 0.5   # [n_tokens] from the tokens
            recorded = policy.memory.sentence_end_at(np.arange(policy.n_tokens))           # what the policy noted, or None
            if cuts == "sentence":
                np.testing.assert_array_equal(recorded, marks)
            else:
                assert recorded is None
            spans = policy.memory.store.spans
            assert len(spans) > 10
            # spans whose length range [span_min, span_max] held a sentence end; did they end at one?
            could = [s for s in spans[:-1] if marks[s.positions[0] + cfg.span_min - 1:
                                                    s.positions[0] + cfg.span_max].any()]
            assert len(could) > 5
            misses[cuts] = sum(not marks[s.positions[-1]] for s in could)
        finally:
            policy.close()
    assert misses["sentence"] == 0 and misses["surprisal"] > 0


def test_turn_and_anchor_settings_are_checked():
    with pytest.raises(ValueError, match="step_routing"):
        SekvConfig(step_routing="now")
    with pytest.raises(ValueError, match="span_cuts"):
        SekvConfig(span_cuts="words")
    with pytest.raises(ValueError, match="spread_anchors"):
        SekvConfig(spread_anchors="evenly")
    with pytest.raises(ValueError, match="turn_tokens"):
        SekvConfig(turn_tokens=-1)


def test_quantile_anchors_are_among_the_most_surprising_seen(llama_model):
    """``spread_anchors="quantile"``: an anchor must be among the cap / n_context most surprising tokens seen before
    its cut, so nearly all anchors (>= 90%) are in the top 4 * cap / n_context of the whole signal, and the memory's
    anchors reach past its first half."""
    toks = _tokens(llama_model, 1900, 1100)
    policy = make_policy("sekv", llama_model, 2000, budget=BUDGET,
                         params=SekvConfig(spread_anchors="quantile", prefill="streaming"))
    try:
        policy.append(toks)
        anchors, signal = np.sort(policy.memory.anchors), policy.memory.signal_log
        share = policy.plan.anchor_cap / 2000
        assert anchors.size > 0 and anchors[-1] > len(toks) // 2
        top_overall = np.quantile(signal[len(policy.memory.sinks):], 1 - 4 * share)  # looser than the running bar
        assert np.mean(signal[anchors] > top_overall) >= 0.9
    finally:
        policy.close()


def test_spread_anchors_keep_a_streamed_memory_s_anchors_in_proportion_to_its_length(llama_model):
    """With ``spread_anchors="share"`` the tokens before position p hold at most ceil(cap * e / n_context) anchors,
    e the end of the cut that took them (p <= e <= p + a chunk and the window): the cap is not spent on the prompt's
    start."""
    toks = _tokens(llama_model, 1900, 1100)
    last = {}
    for spread in (True, False):
        params = SekvConfig(spread_anchors="share" if spread else "none", prefill="streaming")
        policy = make_policy("sekv", llama_model, 2000, budget=BUDGET, params=params)
        try:
            policy.append(toks)
            cap, anchors = policy.plan.anchor_cap, np.sort(policy.memory.anchors)
            slack = BUDGET.chunk + policy.plan.cells  # a cut ends at most a chunk and the window after its tokens
            if spread:
                for i, a in enumerate(anchors):
                    assert i + 1 <= np.ceil(cap * min((a + 1 + slack) / 2000, 1.0))
                assert anchors.size > 0 and anchors[-1] > len(toks) // 2
            last[spread] = (int(anchors[-1]), anchors.size)
        finally:
            policy.close()
    assert last[False][1] == cap and last[False][0] < len(toks) // 4  # first come, first served: the start
    assert last[False][0] < last[True][0]
