"""Ctrl-C (SIGINT) during prefill and decode of ``run`` and during a ``chat`` answer: exit status 130, one line on
stderr, no traceback, and the process gone within a chunk's time."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import prose
from sekv_gguf.models import smollm2_path

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _sigint_default() -> None:
    """In the child before exec: Ctrl-C as a terminal delivers it. A runner started in the background (nohup, ``&``
    without job control) ignores SIGINT and its children inherit that; Python then installs no handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(stream, needle: bytes | None, timeout: float) -> bytes:
    """Read ``stream`` (a pipe) until ``needle`` shows up (None: any byte); what was read."""
    seen = b""
    end = time.monotonic() + timeout
    while not seen if needle is None else needle not in seen:
        left = end - time.monotonic()
        assert left > 0, f"no {needle!r} within {timeout} s: {seen[-500:]!r}"
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, f"the process closed the pipe before {needle!r}: {seen[-500:]!r}"
            seen += chunk
    return seen


def _interrupt(proc: subprocess.Popen, timeout: float = 20.0) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode("utf-8", "replace"), time.monotonic() - t0


def _assert_clean(rc: int, err: str) -> None:
    assert rc == 130, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].strip() == "interrupted", err[-500:]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_ctrl_c_in_run(tiny_llama: Path, tmp_path: Path, phase: str):
    args = [sys.executable, "-m", "sekv_gguf", "run", str(tiny_llama), "--policy", "sekv", "--kv-budget", "0.25"]
    if phase == "prefill":
        doc = tmp_path / "long.txt"
        doc.write_text(prose(60_000))
        args += ["-f", str(doc), "-n", "4"]
    else:
        args += ["-p", prose(2000), "-n", "30000", "-q"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=_sigint_default)
    try:
        if phase == "prefill":
            _wait_for(proc.stderr, b"tok/s", 120)  # the prompt bar has moved: prefill is under way
        else:
            _wait_for(proc.stdout, None, 120)  # generated text is streaming
        assert proc.poll() is None, "the run ended before the interrupt"
        rc, err, seconds = _interrupt(proc)
    finally:
        proc.kill()
    _assert_clean(rc, err)
    assert seconds < 15, seconds


def test_ctrl_c_in_chat():
    """On SmolLM2-135M-Instruct: a random model's bytes may never form UTF-8 text to show."""
    proc = subprocess.Popen([sys.executable, "-m", "sekv_gguf", "chat", str(smollm2_path()), "--max-tokens", "2000"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=_sigint_default)
    try:
        _wait_for(proc.stdout, b"/quit", 120)  # the help line: the model is loaded
        proc.stdin.write(b"tell me a long story\n")
        proc.stdin.flush()
        _wait_for(proc.stdout, None, 120)  # the answer streams
        assert proc.poll() is None
        rc, err, seconds = _interrupt(proc)
    finally:
        proc.kill()
    _assert_clean(rc, err)


def test_after_a_ctrl_c_only_the_interrupt_and_half_built_llama_objects_are_kept_quiet(monkeypatch):
    """The unraisable hook ``interrupt.install`` sets: after a SIGINT it drops the swallowed KeyboardInterrupt and
    the AttributeError of a llama-cpp-python object's ``__del__`` (its constructor cut short); everything else,
    and everything before a SIGINT, still reaches the previous hook."""
    from types import SimpleNamespace

    from llama_cpp._internals import LlamaContext
    from sekv_gguf import interrupt

    seen = []
    hook = interrupt._quiet_unraisable(seen.append)
    half_built = SimpleNamespace(exc_type=AttributeError, object=LlamaContext.__del__)
    ours = SimpleNamespace(exc_type=AttributeError, object=test_ctrl_c_in_chat)
    ki = SimpleNamespace(exc_type=KeyboardInterrupt, object=None)
    monkeypatch.setattr(interrupt, "_pending", False)
    for info in (half_built, ki):
        hook(info)
    assert seen == [half_built, ki]
    monkeypatch.setattr(interrupt, "_pending", True)
    for info in (half_built, ours, ki):
        hook(info)
    assert seen == [half_built, ki, ours]
