"""The trained router's GGUF adapter: key names (``keys``), the base model's identity (``identity``), and typed
writing / mmap reading (``io``)."""

from .identity import ModelIdentity, model_identity
from .io import RouterAdapter, read_adapter, write_adapter

__all__ = ["ModelIdentity", "RouterAdapter", "model_identity", "read_adapter", "write_adapter"]
