"""The serving benchmarks' conversation (``scripts/bench_serve.py`` over HTTP, ``scripts/bench_turn.py`` in one
process): a system prompt, a ~6K-token document in the first user turn, then the same questions in turn, on the same
models."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..documents import stdlib_prose
from ..models import default_model_path, qwen_coder_path, smollm2_path

SYSTEM = "You answer questions about the document the user gives."
QUESTIONS = ["What is this document about?", "Which module is described first?", "Name one function it mentions.",
             "What does that function return?", "Give one warning from the text.", "Summarise it in one sentence.",
             "Which part was the longest?", "Name a class from the text.", "What is its purpose?",
             "Thank you. Any last remark?"]
# name -> (where its GGUF is, its chat format)
MODELS: dict[str, tuple[Callable[[], Path], str | None]] = {"smollm2": (smollm2_path, None),
                                                            "qwen-coder": (qwen_coder_path, None),
                                                            "gemma": (default_model_path, "gemma")}


def document(chars: int) -> str:
    """``chars`` characters from the middle of the bundled standard-library prose (~6K tokens for 26000)."""
    prose = stdlib_prose()
    return prose[len(prose) // 2: len(prose) // 2 + chars]


def question(turn: int) -> str:
    """The question of ``turn`` (0-based; they repeat after the last)."""
    return QUESTIONS[turn % len(QUESTIONS)]
