"""sekv_gguf: a resolution-adaptive KV cache for llama.cpp, used from Python.

``SekvLlama`` (a ``llama_cpp.Llama`` whose memory is a KV policy) is imported on first use, so that the package's
lower layers load without llama-cpp-python's high-level API."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["SekvDiskCache", "SekvLlama", "SekvState", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "SekvLlama":
        from .llm import SekvLlama

        return SekvLlama
    if name in ("SekvState", "SekvDiskCache"):
        from . import llm_state

        return getattr(llm_state, name)
    raise AttributeError(f"module 'sekv_gguf' has no attribute {name!r}")
