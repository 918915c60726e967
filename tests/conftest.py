"""Shared fixtures: tiny random-weight GGUF models (written once per session), the real Gemma 3 270M, sessions and a
server. Plain helpers (shapes, text, reference logits, ``start_server``) are in ``helpers.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from helpers import GEMMA_SPEC, LLAMA_SPEC, start_server
from sekv_gguf.config import THREADS_ENV, ContextConfig
from sekv_gguf.session import Session, load_model
from sekv_gguf.tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_mrope

# the tests run alone on the machine: every core (ContextConfig's default is half of them); child processes inherit it
os.environ.setdefault(THREADS_ENV, str(os.cpu_count() or 1))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(model_dir: Path) -> Path:
    return write_tiny_llama(model_dir / "tiny-llama.gguf", LLAMA_SPEC)


@pytest.fixture(scope="session")
def tiny_gemma(model_dir: Path) -> Path:
    return write_tiny_gemma3(model_dir / "tiny-gemma3.gguf", GEMMA_SPEC)


@pytest.fixture(scope="session")
def tiny_mrope(model_dir: Path) -> Path:
    return write_tiny_mrope(model_dir / "tiny-qwen2vl.gguf")


@pytest.fixture(scope="session")
def llama_model(tiny_llama: Path):
    """The tiny llama loaded once (sessions share its weights)."""
    return load_model(tiny_llama)


@pytest.fixture(scope="session")
def gemma_model(tiny_gemma: Path):
    """The tiny Gemma-3-like model loaded once."""
    return load_model(tiny_gemma)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from sekv_gguf.models import default_model_path

    return default_model_path()


@pytest.fixture
def open_session() -> Iterator[Callable[..., Session]]:
    """Factory of sessions that are closed at the end of the test."""
    opened: list[Session] = []

    def make(path: Path, **config: object) -> Session:
        s = Session.open(path, ContextConfig(**config))  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture(scope="module")
def server():
    """A ``start_server`` for a test module (alias "smol", replies capped at 48 tokens); its base URL."""
    proc, base = start_server("--alias", "smol", "--max-tokens", "48")
    yield base
    proc.terminate()
    proc.wait(timeout=30)
