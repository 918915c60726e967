"""Plain helpers the tests import (``from helpers import ...``): the tiny models' shapes, natural text, a session's
cells, reference logits, and a ``serve`` process on a free port. The fixtures are in ``conftest.py``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from sekv_gguf.documents import stdlib_prose
from sekv_gguf.session import Session
from sekv_gguf.tiny_models import TinySpec
from sekv_gguf.models import smollm2_path

ROOT = Path(__file__).resolve().parents[1]

LLAMA_SPEC = TinySpec()
GEMMA_SPEC = TinySpec(n_layer=6, n_head_kv=1, head_dim=32)

# Same cells visited in another order: the CPU flash-attention kernel accumulates f16 V rows in f16 with an online
# softmax, so the result moves at f16 rounding (~1e-3 of the logit scale); the F32 softmax path moves at f32 rounding.
ORDER_RTOL = {True: 2e-3, False: 1e-5}


def assert_close_reordered(got: np.ndarray, want: np.ndarray, flash_attn: bool) -> None:
    """Logits equal up to the rounding of a different cell order."""
    np.testing.assert_allclose(got, want, rtol=0, atol=ORDER_RTOL[flash_attn] * np.abs(want).max())


_PROSE = stdlib_prose()


def prose(n_chars: int, offset: int = 0) -> str:
    """``n_chars`` characters of natural text, starting ``offset`` characters in (repeated if needed)."""
    text = _PROSE * (1 + (offset + n_chars) // len(_PROSE))
    return text[offset:offset + n_chars]


def prefilled(open_session: Callable[..., Session], path: Path, text: str, **config: object) -> tuple[Session, int]:
    """A session (made by the ``open_session`` fixture) that decoded ``text`` minus its last token, and that last
    token."""
    s = open_session(path, **config)
    toks = s.tokenize(text)
    s.decode(toks[:-1], logits="none")
    return s, toks[-1]


def full_kv_logits(open_session: Callable[..., Session], path: Path, text: str, **config: object) -> np.ndarray:
    """Next-token logits after ``text`` on an untouched cache (the reference every re-celling is compared with)."""
    s, last = prefilled(open_session, path, text, **config)
    return s.decode([last])


def seq_cells(session: Session) -> np.ndarray:
    """Cells of sequence 0 in the hooked cache, in position order."""
    pos = session.hook.cells_pos()
    cells = np.flatnonzero(pos >= 0)
    return cells[np.argsort(pos[cells], kind="stable")].astype(np.int32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """``serve`` (SmolLM2 by path, 512 device cells, logical context 4096, ``flags``) on a free port, up and healthy; the
    process (stdout and stderr together, as text) and its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sekv_gguf", "serve", str(smollm2_path()), "--port", str(port),
                             "--kv-budget", "512", "--n-ctx", "4096", *flags], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    wait_until_up(proc, base + "/health", "serve", lambda: proc.stdout.read())
    return proc, base


def wait_until_up(proc: subprocess.Popen, url: str, name: str, output: Callable[[], str],
                  timeout_s: float = 120) -> None:
    """Poll ``url`` until it answers 200; a ``RuntimeError`` with ``output()`` if ``proc`` exits first, or (after
    killing it) when ``timeout_s`` passes."""
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {output()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{name} did not come up: {output()}")
