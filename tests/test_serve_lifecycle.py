"""``serve`` at the edges of a request's life: SIGTERM ends a running stream with its last chunk and exits 0; a
client that goes away during its prompt frees the model within a chunk; ``--api-key``; binding beyond the loopback
needs ``--expose`` and warns."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers import free_port, prose, start_server
from sekv_gguf.models import smollm2_path

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[1]


def _chat(text: str, max_tokens: int, stream: bool) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}


def test_sigterm_ends_the_running_stream_with_its_last_chunk_and_exits_0():
    proc, base = start_server("--max-tokens", "2000")
    events: list[str] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", base + "/v1/chat/completions", timeout=120,
                          json=_chat("Write a very long story about a lighthouse keeper.", 2000, True)) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) >= 3:
                        started.set()

    reader = threading.Thread(target=read)
    try:
        reader.start()
        assert started.wait(120), events
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
        assert time.monotonic() - t0 < 30
    finally:
        proc.kill()
    assert not reader.is_alive() and events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "stop", last
    assert len(events) < 2000  # it ended early, not at max_tokens
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/health", timeout=2)


def test_a_client_gone_during_its_prompt_frees_the_model_within_a_chunk():
    proc, base = start_server("--max-tokens", "8")
    try:
        long_prompt = prose(14000, 100)  # ~3000 tokens: several prompt chunks
        t0 = time.monotonic()
        r = httpx.post(base + "/v1/chat/completions", json=_chat(long_prompt, 1, False), timeout=300)
        full_prompt_s = time.monotonic() - t0
        assert r.status_code == 200
        httpx.post(base + "/v1/chat/completions", json=_chat("Hi.", 1, False), timeout=300)  # another memory
        other = prose(14000, 7000)  # a new long prompt, cancelled early
        client = httpx.Client(timeout=300)
        with client.stream("POST", base + "/v1/chat/completions", json=_chat(other, 8, True)):
            time.sleep(min(0.5, full_prompt_s / 4))
        client.close()  # the connection goes: the prompt stops at its next chunk
        t1 = time.monotonic()
        r = httpx.post(base + "/v1/chat/completions", json=_chat("Say yes.", 2, False), timeout=300)
        waited = time.monotonic() - t1
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        assert waited < 0.6 * full_prompt_s, (waited, full_prompt_s)
        assert httpx.get(base + "/health", timeout=5).json() == {"status": "ok"}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_api_key_is_required_when_set():
    proc, base = start_server("--api-key", "s3cret", "--max-tokens", "4")
    try:
        body = _chat("Hi.", 2, False)
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=120).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert httpx.post(base + "/v1/chat/completions", json=body, headers=bad, timeout=120).status_code == 401
        assert httpx.get(base + "/v1/models", timeout=30).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.post(base + "/v1/chat/completions", json=body, headers=good, timeout=120).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_listening_beyond_the_loopback_needs_expose_and_warns():
    out = subprocess.run([sys.executable, "-m", "sekv_gguf", "serve", str(smollm2_path()), "--host", "0.0.0.0",
                          "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "--expose" in out.stderr and "Traceback" not in out.stderr, out.stderr
    proc, _ = start_server("--host", "0.0.0.0", "--expose", "--max-tokens", "4")
    proc.terminate()
    assert proc.wait(timeout=60) == 0
    log = proc.stdout.read()
    assert "warning: listening on 0.0.0.0" in log and "no --api-key" in log, log
