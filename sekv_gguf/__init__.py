"""sekv_gguf: a resolution-adaptive KV cache for llama.cpp, used from Python."""

__version__ = "0.1.0"
