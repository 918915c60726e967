"""``SekvLlama`` (a ``llama_cpp.Llama``) on SmolLM2-135M-Instruct: exact with the full policy, a memory that
survives turns, refusals, the logical context."""

from __future__ import annotations

import llama_cpp
import pytest

from helpers import prose
from sekv_gguf.config import SekvConfig
from sekv_gguf.llm import SekvLlama, UnsupportedError
from sekv_gguf.models import smollm2_path


@pytest.fixture(scope="module")
def smol() -> str:
    return str(smollm2_path())


def test_full_policy_generates_exactly_what_stock_llama_does(smol):
    text = prose(3000, 100)
    stock = llama_cpp.Llama(smol, n_ctx=2048, flash_attn=True, verbose=False)
    want = stock.create_completion(text, temperature=0, max_tokens=40)["choices"][0]["text"]
    chat_want = stock.create_chat_completion([{"role": "user", "content": "Name a planet."}], temperature=0,
                                             max_tokens=16)["choices"][0]["message"]["content"]
    stock.close()
    llm = SekvLlama(smol, policy="full", n_ctx=2048)
    try:
        assert llm.create_completion(text, temperature=0, max_tokens=40)["choices"][0]["text"] == want
        got = llm.create_chat_completion([{"role": "user", "content": "Name a planet."}], temperature=0,
                                         max_tokens=16)["choices"][0]["message"]["content"]
        assert got == chat_want
    finally:
        llm.close()


def test_turns_evaluate_only_their_new_tokens_and_long_prompts_exceed_the_cells(smol):
    llm = SekvLlama(smol, kv_budget=512, n_ctx=4096)
    try:
        msgs = [{"role": "user", "content": f"{prose(4000, 50)}\n\nSummarise the text in one sentence."}]
        r1 = llm.create_chat_completion(msgs, temperature=0, max_tokens=16)
        assert r1["usage"]["prompt_tokens"] > llm.n_cells()  # more prompt tokens than device cells
        assert llm.counters.evaluated_tokens == r1["usage"]["prompt_tokens"]
        msgs += [r1["choices"][0]["message"], {"role": "user", "content": "Shorter."}]
        r2 = llm.create_chat_completion(msgs, temperature=0, max_tokens=8)
        new = r2["usage"]["prompt_tokens"] - r1["usage"]["prompt_tokens"]
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"]
        assert llm.counters.evaluated_tokens <= new
        assert llm.stats().live.sekv.spans > 0
        assert llm.memories.active.memory.counters.layer_routed_turns == 1  # the turn routed inside its one decode
        with pytest.raises(ValueError, match="exceed context window of 4096"):
            llm.create_completion("word " * 5000, max_tokens=4)
    finally:
        llm.close()


def test_streaming_logprobs_and_grammar_work(smol):
    llm = SekvLlama(smol, kv_budget=512, n_ctx=2048)
    try:
        msgs = [{"role": "user", "content": "Say hi."}]
        r = llm.create_chat_completion(msgs, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
        content = r["choices"][0]["logprobs"]["content"]
        assert content and all(c["logprob"] <= 0 for c in content)
        chunks = list(llm.create_completion("One, two,", max_tokens=5, temperature=0, stream=True, logprobs=1))
        assert all(c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["text"])
        g = llama_cpp.LlamaGrammar.from_string('root ::= "yes" | "no"')
        assert llm.create_completion("Is water wet? Answer:", grammar=g, max_tokens=4)["choices"][0]["text"] in (
            "yes", "no")
        with pytest.raises(UnsupportedError, match="prompt logprobs"):
            llm.create_completion("hi", echo=True, logprobs=1, max_tokens=2)
    finally:
        llm.close()


@pytest.mark.parametrize("kwargs, what", [({"logits_all": True}, "logits_all"), ({"embedding": True}, "embedding"),
                                          ({"lora_path": "x.gguf"}, "LoRA")])
def test_what_a_compressed_memory_cannot_hold_is_refused(smol, kwargs, what):
    with pytest.raises(UnsupportedError, match=what):
        SekvLlama(smol, **kwargs)


def test_sekv_parameters_are_taken_whole(smol):
    with pytest.raises(ValueError, match="without a separate prefill argument"):
        SekvLlama(smol, prefill="exact", sekv=SekvConfig(turn_routing="refresh"))
    with pytest.raises(ValueError, match="only for policy='sekv'"):
        SekvLlama(smol, policy="full", sekv=SekvConfig())
    llm = SekvLlama(smol, kv_budget=512, n_ctx=1024, sekv=SekvConfig(turn_routing="refresh", span_min=24))
    try:
        llm.create_completion("One, two,", max_tokens=2, temperature=0)
        assert llm.memories.active.config.turn_routing == "refresh" and llm.memories.active.config.span_min == 24
    finally:
        llm.close()


def test_a_pickling_cache_and_embeddings_are_refused(smol, tmp_path):
    """States and caches are memory files (tests/test_llm_state.py); llama-cpp-python's disk cache pickles llama.cpp
    states and is refused, naming the cache that works."""
    llm = SekvLlama(smol, kv_budget=512, n_ctx=1024)
    try:
        for call in (lambda: llm.set_cache(llama_cpp.LlamaDiskCache(str(tmp_path / "pickles"))),
                     lambda: llm.embed("x")):
            with pytest.raises(UnsupportedError):
                call()
    finally:
        llm.close()


def test_two_conversations_in_turn_each_find_their_memory(smol):
    """With two memories a client switching between two long conversations re-evaluates only each turn's new
    tokens: the live memory is saved, the other restored."""
    llm = SekvLlama(smol, kv_budget=512, n_ctx=4096)
    try:
        a = [{"role": "user", "content": f"{prose(5000, 0)}\n\nWhat is this about?"}]
        b = [{"role": "user", "content": f"{prose(5000, 30000)}\n\nWhat is this about?"}]
        ra = llm.create_chat_completion(a, temperature=0, max_tokens=8)
        rb = llm.create_chat_completion(b, temperature=0, max_tokens=8)
        assert rb["usage"]["prompt_tokens_details"]["cached_tokens"] < 50  # a new conversation
        a += [ra["choices"][0]["message"], {"role": "user", "content": "Shorter."}]
        ra2 = llm.create_chat_completion(a, temperature=0, max_tokens=8)
        assert ra2["usage"]["prompt_tokens_details"]["cached_tokens"] >= ra["usage"]["prompt_tokens"]
        b += [rb["choices"][0]["message"], {"role": "user", "content": "Shorter."}]
        rb2 = llm.create_chat_completion(b, temperature=0, max_tokens=8)
        assert rb2["usage"]["prompt_tokens_details"]["cached_tokens"] >= rb["usage"]["prompt_tokens"]
        s = llm.stats()
        assert s.memories.switches == 2 and s.saved_memories == 1 and s.memories_host_bytes > 0
    finally:
        llm.close()
