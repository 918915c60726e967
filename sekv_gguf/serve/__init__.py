"""``python -m sekv_gguf serve``: an OpenAI-compatible server over one ``SekvLlama`` (``/v1/models``,
``/v1/completions``, ``/v1/chat/completions`` with SSE streaming), on llama-cpp-python's FastAPI server pieces
(request types, auth, the request lock, tokenize routes, SSE publisher library).

What it does beyond llama-cpp-python's own server: requests queue and are never cut (no ``interrupt_requests``); a
``max_tokens`` cap for requests that omit it (``max_completion_tokens`` is read too); ``role: developer`` is a
system message; a streamed chat ends with a usage chunk when ``stream_options.include_usage`` is set; usage carries
``prompt_tokens_details.cached_tokens``; ``/v1/models`` gives the logical context length; bad requests (malformed
JSON, wrong types, unsupported features, a base model asked to chat) get OpenAI-shaped 4xx errors, never a 500.
Needs the ``serve`` extra (FastAPI, uvicorn, sse-starlette, starlette-context, pydantic-settings).

By job, imports pointing one way: ``settings`` (``ServeConfig``, its file loading) <- ``app`` (``create_app``: request
normalisation, error mapping, the model proxy) <- ``process`` (``serve``, ``load_llm``, ``bound_malloc``).
"""

from .app import CONTEXT_EXCEEDED, create_app
from .process import MALLOC_ARENAS, MALLOC_MMAP_THRESHOLD, bound_malloc, load_llm, serve
from .settings import DEFAULT_MAX_TOKENS, ServeConfig, is_loopback

__all__ = ["CONTEXT_EXCEEDED", "DEFAULT_MAX_TOKENS", "MALLOC_ARENAS", "MALLOC_MMAP_THRESHOLD", "ServeConfig",
           "bound_malloc", "create_app", "is_loopback", "load_llm", "serve"]
