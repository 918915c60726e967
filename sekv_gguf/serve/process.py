"""The server process: load the model (``load_llm``), bound glibc's heap for a long run (``bound_malloc``), serve
until SIGTERM or Ctrl-C and close the model (``serve``)."""

import signal
from typing import Any, Callable

from ..config import SekvConfig
from ..memory import MemoryConfig
from ..memory_dir import MemoryDirConfig
from .app import create_app
from .settings import ServeConfig, is_loopback


def load_llm(cfg: ServeConfig) -> Any:
    """The ``SekvLlama`` the server runs."""
    from ..llm import SekvLlama
    from ..models import default_chat_model_path

    path = cfg.model or str(default_chat_model_path())
    memory_dir = (MemoryDirConfig(path=cfg.memory_dir, max_bytes=cfg.memory_dir_bytes, mode=cfg.memory_mode)
                  if cfg.memory_dir else None)
    sekv = SekvConfig(prefill=cfg.prefill, lexical_share=cfg.lexical_share) if cfg.policy == "sekv" else None
    return SekvLlama(path, policy=cfg.policy, kv_budget=cfg.kv_budget, n_ctx=cfg.n_ctx, sekv=sekv,
                     adapter=cfg.adapter, chat_format=cfg.chat_format, n_threads=cfg.threads or None,
                     memories=MemoryConfig(memories=cfg.memories), memory_dir=memory_dir, rpc_servers=cfg.rpc,
                     n_gpu_layers=cfg.n_gpu_layers, rpc_timeout_s=cfg.rpc_timeout, type_k=cfg.cache_type_k,
                     type_v=cfg.cache_type_v)


def serve(cfg: ServeConfig, log: Callable[[str], None] | None = None) -> int:
    """Load the model and serve until SIGTERM or Ctrl-C: then stop accepting, end the running request at its next
    token (a stream with its last chunk and [DONE]), write every conversation to the memory directory (with
    ``memory_dir``), and return 0."""
    import uvicorn

    bound_malloc()
    llm = load_llm(cfg)
    app = create_app(llm, cfg)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            llm.cancel.set()  # a non-streamed reply ends now too, with what it has
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # a requested stop that went as planned: exit 0, not re-raised (uvicorn would)
                self._captured_signals.remove(sig)

    if log:
        log(f"serving {cfg.alias or llm.model_name} ({llm.policy_name}, {llm.n_cells()} device cells, logical "
            f"context {llm.n_ctx()}) on http://{cfg.host}:{cfg.port}/v1")
        if not is_loopback(cfg.host):
            log(f"warning: listening on {cfg.host}: anyone who can reach this machine can use the model"
                + ("" if cfg.api_key else " (no --api-key set)"))
    try:
        Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                              timeout_graceful_shutdown=cfg.shutdown_grace_s + 5)).run()
    finally:
        llm.close()
    return 0


MALLOC_ARENAS = 2  # glibc arenas for the server's threads
MALLOC_MMAP_THRESHOLD = 128 << 10  # allocations at least this large always come from (and go back to) mmap


def bound_malloc() -> None:
    """Keep a long-running server's resident memory flat under glibc: by default every worker thread may get its own
    malloc arena, and each large free raises the mmap threshold, so the big buffers a request frees (a scratch
    context, a snapshot's device copy) stay in the heap instead of going back to the system. Over 1,000 mixed
    requests resident memory crept up 30% that way; with two arenas and a fixed threshold it stays within ~2%.
    A no-op where the C library is not glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_mmap_threshold, m_arena_max = -3, -8  # glibc's <malloc.h> parameter numbers
    mallopt(m_arena_max, MALLOC_ARENAS)
    mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)
