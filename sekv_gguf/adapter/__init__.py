"""The trained router's GGUF adapter: key names (``keys``), the base model's identity (``identity``), and typed
writing / mmap reading (``io``)."""

from importlib.resources import files
from pathlib import Path

from .identity import ModelIdentity, model_identity
from .io import RouterAdapter, read_adapter, write_adapter

__all__ = ["ModelIdentity", "RouterAdapter", "bundled_adapter", "model_identity", "read_adapter", "write_adapter"]

BUNDLED = "gemma3-270m-router.gguf"  # trained for the default model (python -m sekv_gguf train), in sekv_gguf/data


def bundled_adapter() -> Path | None:
    """The router adapter shipped with the package, if there is one."""
    p = Path(str(files("sekv_gguf") / "data" / BUNDLED))
    return p if p.is_file() else None
