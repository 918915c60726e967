"""``SekvLlama.save_state`` / ``load_state`` and ``set_cache`` (``sekv_gguf.llm_state``) on the tiny models: a state
loaded into a NEW ``SekvLlama`` continues token for token as the one that saved it; ``SekvDiskCache`` finds a
saved conversation by its longest prefix across processes (a new object on the same directory), holds memory
files (mode 0600) within its capacity; llama-cpp-python's pickling disk cache is refused."""

from __future__ import annotations

import stat

import llama_cpp
import pytest

from helpers import prose
from sekv_gguf import SekvDiskCache, SekvLlama, SekvState
from sekv_gguf.errors import MemoryMismatchError
from sekv_gguf.llm import UnsupportedError
from sekv_gguf.memory_file import read_memory_file

N_CTX, BUDGET, REPLY = 4096, 512, 8


def _llm(path, **kw) -> SekvLlama:
    return SekvLlama(str(path), n_ctx=N_CTX, kv_budget=kw.pop("kv_budget", BUDGET), n_batch=128, **kw)


def _text(llm: SekvLlama, prompt: str | list[int]) -> str:
    return llm.create_completion(prompt, max_tokens=REPLY, temperature=0.0)["choices"][0]["text"]


def _next_turn(llm: SekvLlama, more: str) -> list[int]:
    """The tokens of the memory (prompt and reply) and a new turn: a prompt that continues it token for token."""
    return list(llm.memories.live.tokens) + llm.tokenize(more.encode(), add_bos=False)


@pytest.fixture(params=["llama", "gemma"])
def model_path(request, tiny_llama, tiny_gemma):
    return tiny_llama if request.param == "llama" else tiny_gemma


def test_a_saved_state_continues_in_a_new_llm_token_for_token(model_path, tmp_path):
    doc, more = prose(2500, 100), " And then, after all of that, the question was asked again:"
    first, second = _llm(model_path), _llm(model_path)
    try:
        _text(first, doc)
        assert len(first.memories.live.memory.store) > 5  # the prompt was compressed
        state = first.save_state()
        assert isinstance(state, SekvState) and state.n_tokens == first.memories.live.n_tokens
        path = state.save(tmp_path / "conversation.gguf")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        second.load_state(SekvState.load(path))
        assert second.n_tokens == state.n_tokens and second.memories.live.tokens == first.memories.live.tokens
        turn = _next_turn(first, more)
        want, got = _text(first, turn), _text(second, turn)
        assert got == want and second.counters.cached_tokens == first.counters.cached_tokens > 0
        assert second.memories.live.tokens == first.memories.live.tokens
    finally:
        first.close()
        second.close()


def test_load_state_refuses_other_settings_and_keeps_the_conversation(tiny_llama):
    first, other = _llm(tiny_llama), _llm(tiny_llama, kv_budget=768)
    try:
        _text(first, prose(2000))
        _text(other, prose(800, 50))
        before = list(other.memories.live.tokens)
        with pytest.raises(MemoryMismatchError, match="budget_cells saved 512, here 768"):
            other.load_state(first.save_state())
        assert other.memories.live.tokens == before and before and not other.memories.saved  # nothing changed
        with pytest.raises(TypeError, match="SekvState"):
            other.load_state(object())
    finally:
        first.close()
        other.close()


def test_a_compact_state_is_smaller_and_answers(tiny_llama):
    llm, again = _llm(tiny_llama), _llm(tiny_llama)
    try:
        doc = prose(2500, 700)
        _text(llm, doc)
        lossless, compact = llm.save_state(), llm.save_state("compact")
        assert compact.llama_state_size < lossless.llama_state_size
        again.load_state(compact)
        assert len(_text(again, _next_turn(llm, " Then"))) > 0
        assert again.counters.cached_tokens > 0
    finally:
        llm.close()
        again.close()


def test_a_disk_cache_restores_a_conversation_in_a_new_llm(model_path, tmp_path):
    doc, more = prose(2500, 1300), " Said again, more slowly:"
    first = _llm(model_path)
    first.set_cache(SekvDiskCache(tmp_path / "cache", capacity_bytes=1 << 30))
    try:
        _text(first, doc)
        files = list((tmp_path / "cache").iterdir())
        assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert read_memory_file(files[0]).tokens == first.memories.live.tokens
        turn = _next_turn(first, more)
        first.set_cache(None)  # the cache keeps the memory of the first request only
        want = _text(first, turn)
    finally:
        first.close()
    second = _llm(model_path)  # a new process would see the same: the cache is read from its directory
    second.set_cache(SekvDiskCache(tmp_path / "cache", capacity_bytes=1 << 30))
    try:
        got = _text(second, turn)
        assert second.counters.cached_tokens > 0.9 * len(turn)  # restored, not prefilled
        assert got == want
    finally:
        second.close()


def test_the_disk_cache_keeps_within_its_capacity(tiny_llama, tmp_path):
    llm = _llm(tiny_llama)
    try:
        _text(llm, prose(1500, 10))
        size = llm.save_state().llama_state_size
        cache = SekvDiskCache(tmp_path / "c", capacity_bytes=int(1.5 * size))
        llm.set_cache(cache)
        _text(llm, prose(1500, 4000))  # another conversation: a second file, the first one evicted
        _text(llm, prose(1500, 8000))
        assert len(cache) == 1 and cache.cache_size <= cache.capacity_bytes
        assert len(list((tmp_path / "c").iterdir())) == 1
        key = llm.tokenize(prose(1500, 8000).encode())
        assert key in cache and cache[key].n_tokens > len(key) // 2
        with pytest.raises(KeyError):
            cache[[key[0] + 1] * 3]
    finally:
        llm.close()


def test_a_damaged_cache_file_is_skipped_with_a_warning(tiny_llama, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "broken.sekvmem.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    with pytest.warns(UserWarning, match="broken.sekvmem.gguf"):
        cache = SekvDiskCache(d)
    assert len(cache) == 0 and bool(cache)  # empty, still a cache (llama-cpp-python tests ``if self.cache``)


def test_pickling_caches_are_refused(tiny_llama, tmp_path):
    llm = _llm(tiny_llama)
    try:
        with pytest.raises(UnsupportedError, match="SekvDiskCache"):
            llm.set_cache(llama_cpp.LlamaDiskCache(str(tmp_path / "pickles")))
        llm.set_cache(llama_cpp.LlamaRAMCache())  # holds SekvState objects in RAM
        _text(llm, prose(1500))
        assert llm.cache.cache_size > 0
        llm.set_cache(None)
        assert llm.cache is None
    finally:
        llm.close()


def test_a_pickle_holds_the_arguments_and_the_memory(tiny_llama):
    import pickle

    llm = _llm(tiny_llama)
    try:
        _text(llm, prose(2500, 2100))
        data = pickle.dumps(llm)
        copy = pickle.loads(data)
        try:
            assert copy.memories.live.tokens == llm.memories.live.tokens and copy.n_cells() == llm.n_cells()
            turn = _next_turn(llm, " Once more:")
            assert _text(copy, turn) == _text(llm, turn)
            assert copy.counters.cached_tokens == llm.counters.cached_tokens > 0
        finally:
            copy.close()
    finally:
        llm.close()
