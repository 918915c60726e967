"""A memory directory (``SekvLlama(memory_dir=...)``, ``serve --memory-dir``): each request's conversation is saved
by a background thread, the older file of the same conversation replaced; every conversation at ``close``; a new
``SekvLlama`` (a restarted server) serves a prompt that continues a saved conversation by restoring it, token for
token as the one that saved it; damaged files are skipped; the size cap drops the least recently used."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from helpers import prose
from sekv_gguf import SekvLlama
from sekv_gguf.memory import MemoryConfig
from sekv_gguf.memory_dir import SUFFIX, MemoryDir, MemoryDirConfig
from sekv_gguf.memory_file import read_memory_file

N_CTX, BUDGET, REPLY = 4096, 512, 8


def _llm(path, mdir: Path, **kw) -> SekvLlama:
    cfg = MemoryDirConfig(path=str(mdir), **kw)
    return SekvLlama(str(path), n_ctx=N_CTX, kv_budget=BUDGET, n_batch=128, memory_dir=cfg,
                     memories=MemoryConfig(memories=3))


def _text(llm: SekvLlama, prompt) -> str:
    return llm.create_completion(prompt, max_tokens=REPLY, temperature=0.0)["choices"][0]["text"]


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*" + SUFFIX))


@pytest.fixture(params=["llama", "gemma"])
def model_path(request, tiny_llama, tiny_gemma):
    return tiny_llama if request.param == "llama" else tiny_gemma


def test_a_restarted_llm_restores_the_conversation_instead_of_prefilling(model_path, tmp_path):
    mdir = tmp_path / "memories"
    first = _llm(model_path, mdir)
    try:
        _text(first, prose(2500, 300))
        first.memories.disk.flush()
        files = _files(mdir)
        assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert stat.S_IMODE(mdir.stat().st_mode) == 0o700
        assert read_memory_file(files[0]).tokens == first.memories.live.tokens
        turn = list(first.memories.live.tokens) + first.tokenize(b" And again:", add_bos=False)
        first.memories.disk.close()  # keep the file of the first request only: the restart starts from it
        first.memories.disk = None
        want = _text(first, turn)
    finally:
        first.close()
    second = _llm(model_path, mdir)
    try:
        got = _text(second, turn)
        assert second.memories.counters.disk_restores == 1
        assert second.counters.cached_tokens > 0.9 * len(turn)  # restored, not prefilled
        assert got == want
        second.memories.disk.flush()
        files = _files(mdir)  # the conversation went on: its newer file replaced the older one
        assert len(files) == 1 and read_memory_file(files[0]).tokens == second.memories.live.tokens
    finally:
        second.close()


def test_every_conversation_is_saved_at_close(tiny_llama, tmp_path):
    mdir = tmp_path / "m"
    llm = _llm(tiny_llama, mdir)
    try:
        _text(llm, prose(1500, 100))
        _text(llm, prose(1500, 5000))  # another conversation: the first one waits in RAM
        a, b = llm.tokenize(prose(1500, 100).encode()), llm.tokenize(prose(1500, 5000).encode())
    finally:
        llm.close()
    saved = [read_memory_file(p).tokens for p in _files(mdir)]
    assert len(saved) == 2
    assert any(s[:len(a)] == a for s in saved) and any(s[:len(b)] == b for s in saved)


def test_a_damaged_file_is_skipped_and_the_cap_holds(tiny_llama, tmp_path):
    mdir = tmp_path / "m"
    mdir.mkdir()
    (mdir / ("0" * 32 + SUFFIX)).write_bytes(b"GGUF" + b"\1" * 64)
    logged: list[str] = []
    d = MemoryDir(MemoryDirConfig(path=str(mdir), max_bytes=1), log=logged.append)
    assert len(d) == 0 and "skipping" in logged[0]
    d.close()
    llm = _llm(tiny_llama, mdir, max_bytes=1)  # room for the newest file only
    try:
        _text(llm, prose(1500, 100))
        _text(llm, prose(1500, 5000))
        llm.memories.disk.flush()
        kept = [p for p in _files(mdir) if p.name != "0" * 32 + SUFFIX]
        assert len(kept) == 1 and read_memory_file(kept[0]).tokens == llm.memories.live.tokens
        assert llm.memories.disk.counts.removed >= 1 and not llm.memories.disk.counts.failures
    finally:
        llm.close()


def test_a_memory_of_other_settings_is_not_restored(tiny_llama, tmp_path):
    mdir = tmp_path / "m"
    first = _llm(tiny_llama, mdir)
    try:
        _text(first, prose(1500, 100))
        turn = list(first.memories.live.tokens) + first.tokenize(b" More:", add_bos=False)
    finally:
        first.close()
    other = SekvLlama(str(tiny_llama), n_ctx=N_CTX, kv_budget=768, n_batch=128,
                      memory_dir=MemoryDirConfig(path=str(mdir)))
    try:
        with pytest.warns(UserWarning, match="budget_cells saved 512, here 768"):
            _text(other, turn)
        assert other.memories.counters.disk_restores == 0 and other.counters.cached_tokens == 0
    finally:
        other.memories.disk.log = lambda line: None
        other.close()


def test_serve_config_takes_a_memory_dir(tmp_path):
    from sekv_gguf.serve import ServeConfig

    cfg = ServeConfig(memory_dir=str(tmp_path), memory_dir_bytes=1 << 20, memory_mode="compact")
    assert cfg.memory_mode == "compact"
    with pytest.raises(ValueError, match="memory_dir_bytes >= 0"):
        ServeConfig(memory_dir=str(tmp_path), memory_dir_bytes=-1)
    with pytest.raises(ValueError, match="memory_mode"):
        ServeConfig(memory_mode="zip")


@pytest.mark.serve
def _continue_after_restart(mdir: Path, messages: list[dict], first: dict) -> None:
    """A server restarted on ``mdir`` continues the conversation of ``messages`` (answered ``first``) from its file:
    one disk restore, most of the prompt cached."""
    import httpx

    from helpers import start_server

    reply = first["choices"][0]["message"]["content"]
    body = {"model": "m", "max_tokens": 8, "temperature": 0,
            "messages": messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]}
    proc, base = start_server("--memory-dir", str(mdir))
    try:
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=300).json()
        stats = httpx.get(base + "/sekv/stats", timeout=30).json()
    finally:
        proc.kill()
    assert stats["disk_restores"] == 1, stats
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0.8 * r["usage"]["prompt_tokens"], r["usage"]


def test_serve_saves_at_shutdown_and_a_restart_restores_the_conversation(tmp_path):
    """``serve --memory-dir``: SIGTERM writes the conversation; a restarted server serves the next turn from the
    file (``disk_restores``, most of the prompt cached)."""
    import signal

    import httpx

    from helpers import start_server

    mdir = tmp_path / "conversations"
    messages = [{"role": "user", "content": "Remember this: " + prose(1500, 200)}]
    body = {"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0}
    proc, base = start_server("--memory-dir", str(mdir))
    try:
        first = httpx.post(base + "/v1/chat/completions", json=body, timeout=300).json()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stdout.read()
    finally:
        proc.kill()
    assert len(_files(mdir)) == 1
    _continue_after_restart(mdir, messages, first)


def test_serve_killed_mid_request_keeps_every_conversation_saved_before_it(tmp_path):
    """``serve --memory-dir`` killed with SIGKILL while it prefills a second conversation: the first one's file,
    written after its request, is whole and loads; nothing half-written is taken for a memory; a restarted server
    continues the first conversation from its file."""
    import signal
    import threading
    import time

    import httpx

    from helpers import start_server

    mdir = tmp_path / "conversations"
    first_msgs = [{"role": "user", "content": "Remember this: " + prose(1500, 200)}]
    body = {"model": "m", "messages": first_msgs, "max_tokens": 8, "temperature": 0}
    proc, base = start_server("--memory-dir", str(mdir))
    try:
        first = httpx.post(base + "/v1/chat/completions", json=body, timeout=300).json()
        deadline = time.time() + 120
        while not _files(mdir) and time.time() < deadline:  # written in the background after the request
            time.sleep(0.2)
        assert len(_files(mdir)) == 1
        other = {"model": "m", "messages": [{"role": "user", "content": prose(9000, 4000)}], "max_tokens": 64}
        def second() -> None:
            try:
                httpx.post(base + "/v1/chat/completions", json=other, timeout=300)
            except httpx.HTTPError:  # the server is killed under it
                pass

        threading.Thread(target=second, daemon=True).start()
        time.sleep(1.5)  # the second conversation is being prefilled
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    files = _files(mdir)
    assert len(files) == 1 and read_memory_file(files[0]).tokens  # whole, and it loads
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    _continue_after_restart(mdir, first_msgs, first)


def test_chat_saves_and_resumes_a_conversation(tiny_llama, tmp_path):
    """``/save NAME`` writes the memory and the messages; ``--resume NAME`` in a new chat starts from them: the
    next turn reuses the memory instead of prefilling it."""
    import io

    from sekv_gguf.chat import run_chat

    def chat(script: str, resume: str | None = None) -> tuple[int, str, SekvLlama]:
        llm = SekvLlama(str(tiny_llama), n_ctx=N_CTX, kv_budget=BUDGET, n_batch=128, chat_format="chatml")
        out = io.StringIO()
        rc = run_chat(llm, io.StringIO(script), out, max_tokens=6, saves=tmp_path / "chats", resume=resume)
        return rc, out.getvalue(), llm

    rc, out, llm = chat(f"Remember: {prose(1500, 40).replace(chr(10), ' ')}\n/save notes\n/save bad name!\n/quit\n")
    tokens = list(llm.memories.live.tokens)
    llm.close()
    assert rc == 0 and "(saved " in out and "cannot save" in out
    path = tmp_path / "chats" / "notes.sekvmem.gguf"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and read_memory_file(path).tokens == tokens
    rc, out, llm = chat("And what was it?\n/quit\n", resume="notes")
    try:
        assert rc == 0 and "(resumed " in out and "2 messages" in out
        assert llm.counters.cached_tokens > 0.8 * len(tokens)
    finally:
        llm.close()
    rc, out, llm = chat("/quit\n", resume="missing")
    llm.close()
    assert rc == 1 and "cannot resume missing" in out


def test_chat_cli_save_and_resume(tiny_llama, tmp_path):
    """The flags: ``/save NAME`` under ``--saves DIR``, then ``chat --resume NAME`` starts with that memory."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    base = [sys.executable, "-m", "sekv_gguf", "chat", str(tiny_llama), "--chat-format", "chatml", "--kv-budget", "512",
            "--n-ctx", "4096", "--max-tokens", "4", "--saves", str(tmp_path / "chats")]
    r = subprocess.run(base, input="Hello there, remember the number 7463343.\n/save first\n/quit\n",
                       capture_output=True, text=True, cwd=root, timeout=300)
    assert r.returncode == 0 and "(saved " in r.stdout, r.stderr
    r = subprocess.run(base + ["--resume", "first"], input="/stats\n/quit\n", capture_output=True, text=True,
                       cwd=root, timeout=300)
    assert r.returncode == 0 and "(resumed " in r.stdout, r.stderr
    stats = [line for line in r.stdout.splitlines() if line.startswith("sekv:")]
    assert stats and int(stats[0].split(": ")[1].split(" tokens")[0]) > 10
