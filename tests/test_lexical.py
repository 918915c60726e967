"""Lexical pins (``lexical_share``): the spans that share rare token n-grams with the question take a share of every
layer's zoom slots before the router's ranking fills the rest, and keep it while the answer is generated."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.policies.lexical import (SpanNgrams, lexical_pins, lexical_scores, ngram_keys, pair_scores, pins_of,
                                        span_of_positions, with_neighbours)
from sekv_gguf.policies.zoom import choose_around, fit_in_order
from sekv_gguf.spans import Span


def _spans(bounds: list[tuple[int, int]]) -> list[Span]:
    return [Span(i, np.arange(a, b, dtype=np.int32)) for i, (a, b) in enumerate(bounds)]


def test_ngram_keys_equal_exactly_for_equal_ngrams():
    toks = np.array([5, 7, 9, 5, 7, 8, 7, 5])
    keys = ngram_keys(toks, 2)
    assert keys.size == 7 and keys.dtype == np.uint64
    assert keys[0] == keys[3]                          # (5, 7) twice
    assert len(set(keys.tolist())) == 6                # every other bigram distinct, (7, 5) != (5, 7)
    assert ngram_keys(toks, 9).size == 0
    assert np.unique(ngram_keys(toks, 1)).size == 4     # unigrams: the 4 distinct tokens


def test_scores_weigh_rare_ngrams_and_ignore_common_ones():
    cfg = SekvConfig(lexical_ngram=2, lexical_cue=6, lexical_max_spans=2)
    rng = np.random.default_rng(0)
    toks = rng.integers(100, 1000, size=120)
    toks[20:22] = [1, 2]                   # the question's rare bigram, in span 1 only
    for at in (5, 45, 65, 85):             # a common bigram, in four spans (> lexical_max_spans)
        toks[at:at + 2] = [3, 4]
    toks[70:72] = [9, 9]                   # a bigram in two spans (= the cap): counted, less than the rare one
    toks[90:92] = [9, 9]
    toks[114:120] = [3, 4, 1, 2, 9, 9]     # the question, the last 6 tokens: held by no span (the window)
    spans = _spans([(0, 20), (20, 40), (40, 60), (60, 80), (80, 100)])
    owner = span_of_positions(spans, toks.size)
    assert owner[19] == 0 and owner[20] == 1 and owner[100] == -1 and owner[119] == -1
    scores = lexical_scores(toks, spans, cfg)
    assert scores[1] == pytest.approx(np.log1p(5 / 1))
    assert scores[3] == scores[4] == pytest.approx(np.log1p(5 / 2))
    assert scores[0] == scores[2] == 0.0   # the common bigram alone
    assert lexical_pins(toks, spans, cfg) == [1, 3, 4]
    assert lexical_pins(toks, spans, SekvConfig(lexical_cue=1)) == []  # a one-token question has no bigram
    assert lexical_pins(toks, spans, replace(cfg, lexical_min_ratio=0.5)) == [1, 3, 4]  # log(6/2) >= log(6) / 2
    assert lexical_pins(toks, spans, replace(cfg, lexical_min_ratio=0.7)) == [1]
    # each pin brings its neighbours right after it (nearest first, before then after), every span once
    assert lexical_pins(toks, spans, replace(cfg, lexical_neighbours=1)) == [1, 0, 2, 3, 4]
    assert lexical_pins(toks, spans, replace(cfg, lexical_min_ratio=0.7, lexical_neighbours=1)) == [1, 0, 2]
    assert lexical_pins(toks, spans, replace(cfg, lexical_min_ratio=0.7, lexical_neighbours=9)) == [1, 0, 2, 3, 4]


def test_the_span_ngram_index_scores_every_chunk_as_a_pass_over_every_token_does():
    """``SpanNgrams`` (the chunk pins' index, extended as spans are cut, merged past its tail size): at every chunk of
    a stream its scores and pins equal ``lexical_scores`` / ``lexical_pins`` over every token so far with the chunk
    as the cue — spans that skip anchor positions, bigrams repeated across spans, rare and common ones."""
    cfg = SekvConfig(lexical_ngram=2, lexical_max_spans=3)
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 40, size=3000)              # a small vocabulary: many bigrams shared by several spans
    anchors = set(rng.choice(3000, size=60, replace=False).tolist())
    spans, start, sid = [], 0, 0
    while start < 2900:                                 # spans of 20-50 positions, anchors left out
        end = start + int(rng.integers(20, 51))
        spans.append(Span(sid, np.array([p for p in range(start, end) if p not in anchors], dtype=np.int32)))
        start, sid = end, sid + 1
    index = SpanNgrams(cfg)
    index.MERGE_AT = 64                                 # merges happen inside this short stream
    every = toks.tolist()
    checked = 0
    for c1 in range(200, 3000, 100):                    # a chunk of 100 tokens; the spans cut 60 tokens behind it
        cut = [s for s in spans if int(s.positions.max()) < c1 - 160]
        index.extend(every, cut)
        assert index.n_spans == len(cut)
        want = lexical_scores(toks[:c1], cut, cfg, cue=100)
        np.testing.assert_array_equal(index.scores(toks[c1 - 100:c1], len(cut)), want)  # bit for bit
        assert index.pins(toks[c1 - 100:c1], len(cut)) == lexical_pins(toks[:c1], cut, cfg, cue=100)
        checked += bool(want.any())
    assert checked > 10 and index.keys.size > 0         # compared where scores were not all zero, after merges
    index.extend(every, spans[:3])                      # fewer spans than indexed (a rollback): indexed again
    assert index.n_spans == 3
    np.testing.assert_array_equal(index.scores(toks[-50:], 3), lexical_scores(toks, spans[:3], cfg, cue=50))


def test_a_span_score_does_not_depend_on_the_order_of_its_pairs():
    """``pair_scores`` sums each span's weights in one order whatever order the (n-gram, span) pairs come in, so
    spans matching n-grams of the same rarity tie exactly and the pins' tie rule (the lower id first) holds: summed in
    the pairs' order, these scores differ in their last bits from one permutation to the next."""
    cfg = SekvConfig(lexical_max_spans=8)
    rng = np.random.default_rng(0)
    n_spans = 50
    pairs = np.unique(np.stack([rng.integers(0, 400, size=3000).astype(np.uint64),
                                rng.integers(0, n_spans, size=3000).astype(np.uint64)]), axis=1)
    keys, sids = pairs[0], pairs[1].astype(np.int64)             # [p] distinct (key, span), ~12 keys per span
    want = pair_scores(keys, sids, n_spans, cfg)
    assert np.count_nonzero(want) > 40
    for _ in range(5):
        perm = rng.permutation(keys.size)
        np.testing.assert_array_equal(pair_scores(keys[perm], sids[perm], n_spans, cfg), want)
    # two spans matching n-grams of the same rarity (df 1, 1, 2: spans 1 and 3 share the third), listed in different
    # orders: equal scores, the lower id first
    keys = np.array([10, 11, 12, 20, 21, 12], dtype=np.uint64)
    sids = np.array([3, 3, 3, 1, 1, 1], dtype=np.int64)
    tied = pair_scores(keys[[2, 0, 1, 5, 4, 3]], sids[[2, 0, 1, 5, 4, 3]], 5, cfg)
    assert tied[1] == tied[3] > 0 and pins_of(tied, cfg)[:2] == [1, 3]


def test_neighbours_stay_inside_the_spans():
    assert with_neighbours([0, 4], 5, 2) == [0, 1, 2, 4, 3]
    assert with_neighbours([2], 5, 0) == [2]
    assert with_neighbours([], 5, 3) == []


@pytest.mark.parametrize("bad, message", [
    ({"lexical_share": 1.5}, "lexical_share must be in [0, 1], got 1.5"),
    ({"chunk_lexical_share": -0.5}, "chunk_lexical_share must be in [0, 1], got -0.5"),
    ({"lexical_ngram": 0}, "lexical_ngram must be in 1..4, got 0"),
    ({"lexical_min_ratio": -0.1}, "lexical_min_ratio must be in [0, 1], got -0.1"),
    ({"lexical_cue": 0}, "lexical_cue must be >= 1, got 0"),
    ({"lexical_max_spans": 0}, "lexical_max_spans must be >= 1, got 0"),
    ({"lexical_neighbours": -1}, "lexical_neighbours must be >= 0, got -1"),
])
def test_bad_lexical_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SekvConfig(**bad)


def test_pins_take_their_share_first_and_the_ranking_fills_the_rest():
    lengths = np.array([10, 10, 30, 10, 10])
    assert fit_in_order([2, 4, 0], lengths, 20) == [4, 0]  # span 2 does not fit the share: skipped
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    assert choose_around([4], scores, lengths, 30) == [4, 0, 1]


def _keyed_prompt(model) -> tuple[list[int], list[int], set[int]]:
    """Tokens of ~700 prose tokens with a made-up key in the middle, the key's tokens, and the key's positions."""
    text = prose(4000, offset=700)
    tokens = lambda s, bos=False: model.tokenize(s.encode(), add_bos=bos, special=False)  # noqa: E731
    before, after = tokens(text[:2000], True)[:350], tokens(text[2000:])[:350]
    keyed = tokens(" QZXWV-7781-KPLM")
    assert len(keyed) >= 3
    at = len(before) + 1
    return before + tokens(" key") + keyed + after, keyed, set(range(at, at + len(keyed)))


def test_pinned_span_is_zoomed_in_every_layer_and_kept_while_decoding(llama_model):
    """On the tiny llama model: a made-up key sits in the middle of a long prompt and the question at its end repeats
    it; with ``lexical_share`` its span is zoomed in every layer after the prompt and stays through the decode steps'
    routings (capped new zooms evict the least recently chosen, never a pin); without, the router alone decides."""
    doc, keyed, key_at = _keyed_prompt(llama_model)
    toks = doc + llama_model.tokenize(b" Which key?", add_bos=False, special=False) + keyed
    got = {}
    for share in (0.5, 0.0):
        cfg = SekvConfig(prefill="streaming", zoom_share=0.3, compress_when_fits=True, lexical_share=share,
                         route_every=1, max_new_zooms=1)
        policy = make_policy("sekv", llama_model, len(toks) + 40, ContextConfig(flash_attn=False),
                             BudgetConfig(kv_budget=300, chunk=128), cfg)
        try:
            logits = policy.prefill(toks)
            mem = policy.memory
            if share:
                sid = mem.pins[0]  # the best match: a span holding (part of) the key
                assert key_at & set(mem.store.spans[sid].positions.tolist())
            held = [sid in r for r in mem.zoom.resident]
            for _ in range(12):
                logits = policy.step(int(np.argmax(logits)))
            got[share] = (held, [sid in r for r in mem.zoom.resident], list(mem.pins))
            assert policy.stats().sekv.pinned_spans == len(mem.pins)
        finally:
            policy.close()
    held, kept, pins = got[0.5]
    assert all(held) and all(kept) and pins[0] == sid
    held, kept, pins = got[0.0]
    assert pins == [] and not (all(held) and all(kept))  # the router alone does not keep it everywhere


def test_a_turn_sets_the_question_and_pins_its_match(llama_model):
    """A document prefilled with no question, then a question as a turn (``turn_tokens``): the key's span is pinned
    and zoomed in every layer by the turn's in-layer routing."""
    doc, keyed, key_at = _keyed_prompt(llama_model)
    turn = llama_model.tokenize(b" Which key?", add_bos=False, special=False) + keyed
    cfg = SekvConfig(prefill="streaming", zoom_share=0.3, compress_when_fits=True, lexical_share=0.5)
    policy = make_policy("sekv", llama_model, len(doc) + len(turn) + 8, ContextConfig(flash_attn=False),
                         BudgetConfig(kv_budget=300, chunk=128), cfg)
    try:
        policy.prefill(doc)
        mem = policy.memory
        before = list(mem.pins)  # the document's tail's matches
        policy.append(turn)
        assert mem.counters.layer_routed_turns == 1
        sid = mem.pins[0]
        assert key_at & set(mem.store.spans[sid].positions.tolist()) and mem.pins != before
        assert all(sid in r for r in mem.zoom.resident)
    finally:
        policy.close()


def test_a_streamed_chunk_that_repeats_a_key_reads_its_span(llama_model):
    """``chunk_lexical_share``: a made-up key early in a streamed prompt, repeated whole inside a later chunk; while
    that chunk is decoded a span holding the key (compressed by then) is its first pin and zoomed in every layer
    before the chunk's attention, so the repeat reads the first occurrence's rows as full attention would. The chunk
    pins end with the prompt."""
    doc, keyed, key_at = _keyed_prompt(llama_model)
    tail = llama_model.tokenize(prose(3000, offset=5000).encode(), add_bos=False, special=False)
    cfg = SekvConfig(prefill="streaming", zoom_share=0.3, compress_when_fits=True, lexical_share=0.0,
                     chunk_lexical_share=0.5, chunk_routing="layer")
    n_context = len(doc) + 4 * 128 + len(keyed) + 100  # the most the prompt below holds
    policy = make_policy("sekv", llama_model, n_context, ContextConfig(flash_attn=False),
                         BudgetConfig(kv_budget=300, chunk=128), cfg)
    chunk = policy.plan.chunk
    pad = (8 - len(doc)) % chunk + 3 * chunk   # the repeat starts 8 tokens into a chunk, three chunks on
    assert len(tail) >= pad + 100
    toks = doc + tail[:pad] + keyed + tail[pad:pad + 100]  # 100: the last chunk is not moved back
    seen = []  # per chunk holding the whole repeat: (its pins, the spans holding the key, per layer: pin resident)
    decode_chunk = policy._decode_chunk

    def spy(part, *args):
        logits = decode_chunk(part, *args)
        mem = policy.memory
        if len(part) == chunk and part[8:8 + len(keyed)] == keyed:
            owners = [s.id for s in mem.store.spans if key_at & set(s.positions.tolist())]
            pins = list(mem.chunk_pins)
            seen.append((pins, owners, [bool(pins) and pins[0] in r for r in mem.zoom.resident]))
        return logits

    policy._decode_chunk = spy
    try:
        policy.prefill(toks)
        assert len(seen) == 1, "the repeat was not streamed whole in one chunk"
        pins, owners, held = seen[0]
        assert owners and pins and pins[0] in owners and all(held)
        assert policy.memory.chunk_pins == [] and policy.memory.counters.chunk.routes > 0
    finally:
        policy.close()
