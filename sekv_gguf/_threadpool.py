"""Typed ctypes mirror of the ggml CPU thread-pool calls llama-cpp-python 0.3.36 leaves unbound
(``ggml_threadpool_params_default`` in libggml-base, ``ggml_threadpool_new`` / ``ggml_threadpool_free`` in
libggml-cpu, ``llama_attach_threadpool`` in libllama), found beside the loaded libllama. A pool made here sets
the worker threads' polling level: ggml's default (50) spins between graph nodes, fast alone and slow when other
processes want the cores; 0 makes them sleep."""

from __future__ import annotations

import ctypes

import llama_cpp
import llama_cpp.llama_cpp as _llama

from ._ggml import lib as _lib

GGML_MAX_N_THREADS = 512  # ggml.h


# struct ggml_threadpool_params { bool cpumask[GGML_MAX_N_THREADS]; int n_threads;
#     enum ggml_sched_priority prio; uint32_t poll; bool strict_cpu; bool paused; };
class ThreadpoolParams(ctypes.Structure):
    _fields_ = [("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


def new_pool(n_threads: int, poll: int) -> int:
    """A ggml CPU thread pool of ``n_threads`` threads at polling level ``poll`` (0..100); its address."""
    base, cpu = _lib("ggml-base"), _lib("ggml-cpu")
    # GGML_API struct ggml_threadpool_params ggml_threadpool_params_default(int n_threads);
    base.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
    base.ggml_threadpool_params_default.restype = ThreadpoolParams
    # GGML_BACKEND_API struct ggml_threadpool * ggml_threadpool_new(struct ggml_threadpool_params * params);
    cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
    cpu.ggml_threadpool_new.restype = ctypes.c_void_p
    params = base.ggml_threadpool_params_default(n_threads)
    params.poll = poll
    pool = cpu.ggml_threadpool_new(ctypes.byref(params))
    if not pool:
        raise RuntimeError(f"ggml_threadpool_new failed for {n_threads} threads")
    return pool


def free_pool(pool: int) -> None:
    # GGML_BACKEND_API void ggml_threadpool_free(struct ggml_threadpool * threadpool);
    cpu = _lib("ggml-cpu")
    cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
    cpu.ggml_threadpool_free.restype = None
    cpu.ggml_threadpool_free(pool)


def attach(ctx: int, pool: int) -> None:
    """Use ``pool`` for both single-token and batch decodes of ``ctx``."""
    # LLAMA_API void llama_attach_threadpool(struct llama_context * ctx, ggml_threadpool_t threadpool,
    #                                        ggml_threadpool_t threadpool_batch);
    fn = _llama._lib.llama_attach_threadpool
    fn.argtypes = [llama_cpp.llama_context_p_ctypes, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    fn(ctx, pool, pool)
