"""Typed ctypes mirror of ``include/llama-sekv.h`` (the KV hook our patches add to libllama).

One binding per C function, its declaration above it. The functions are resolved in the libllama that
llama-cpp-python has already loaded (``llama_cpp.llama_cpp._lib``), so they act on the same library instance as
every ``llama_context`` the user holds. Errors are returned as codes here; ``sekv_gguf.hook`` turns them into
exceptions.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, TypeVar

import llama_cpp.llama_cpp as _llama

SEKV_API_VERSION = 5
SEKV_MAX_PROBES = 256

# enum sekv_status
SEKV_OK = 0
SEKV_ERR_NULL = -1
SEKV_ERR_UNSUPPORTED = -2
SEKV_ERR_LAYER = -3
SEKV_ERR_CELL = -4
SEKV_ERR_SEQ = -5
SEKV_ERR_POS = -6
SEKV_ERR_CELL_BUSY = -7
SEKV_ERR_CELL_NOT_SEQ = -8
SEKV_ERR_SIZE = -9
SEKV_ERR_TYPE = -10
SEKV_ERR_VALUE = -11
SEKV_ERR_STATE = -12
SEKV_ERR_INTERNAL = -13

llama_context_p = ctypes.c_void_p
int32_p = ctypes.POINTER(ctypes.c_int32)
float_p = ctypes.POINTER(ctypes.c_float)


class sekv_kv_info(ctypes.Structure):
    """struct sekv_kv_info"""

    _fields_ = [
        ("n_layer_kv", ctypes.c_int32),
        ("n_layer_model", ctypes.c_int32),
        ("kv_size", ctypes.c_uint32),
        ("n_stream", ctypes.c_uint32),
        ("type_k", ctypes.c_int32),
        ("type_v", ctypes.c_int32),
        ("v_trans", ctypes.c_int32),
        ("rot_k", ctypes.c_int32),
        ("rot_v", ctypes.c_int32),
        ("is_iswa", ctypes.c_int32),
        ("flash_attn", ctypes.c_int32),
        ("n_swa", ctypes.c_uint32),
        ("swa_kv_size", ctypes.c_uint32),
        ("kv_bytes", ctypes.c_uint64),
        ("swa_kv_bytes", ctypes.c_uint64),
    ]


class sekv_kv_layer(ctypes.Structure):
    """struct sekv_kv_layer"""

    _fields_ = [
        ("il", ctypes.c_int32),
        ("n_head", ctypes.c_int32),
        ("n_head_kv", ctypes.c_int32),
        ("head_dim_k", ctypes.c_int32),
        ("head_dim_v", ctypes.c_int32),
        ("k_row_bytes", ctypes.c_uint64),
        ("v_row_bytes", ctypes.c_uint64),
    ]


F = TypeVar("F", bound=Callable[..., Any])


class HookLibraryError(RuntimeError):
    """The loaded libllama has no sekv hook (llama-cpp-python was not built by scripts/setup.sh)."""


def _lib() -> ctypes.CDLL:
    lib = _llama._lib
    if not hasattr(lib, "sekv_api_version"):
        raise HookLibraryError(
            f"libllama at {getattr(lib, '_name', '?')} has no sekv hook: install llama-cpp-python with "
            "scripts/setup.sh (the patched build)"
        )
    return lib


def ctypes_function(name: str, argtypes: list, restype: Any) -> Callable[[F], F]:
    """Bind the C function ``name`` of the loaded libllama with the stub's name and docstring."""

    def decorator(stub: F) -> F:
        holder: dict[str, Any] = {}

        def call(*args: Any) -> Any:
            fn = holder.get("fn")
            if fn is None:
                fn = getattr(_lib(), name)
                fn.argtypes = argtypes
                fn.restype = restype
                holder["fn"] = fn
            return fn(*args)

        call.__name__ = stub.__name__
        call.__doc__ = stub.__doc__
        return call  # type: ignore[return-value]

    return decorator


# LLAMA_API int32_t sekv_api_version(void);
@ctypes_function("sekv_api_version", [], ctypes.c_int32)
def sekv_api_version() -> int:
    """Version of the hook API compiled into libllama."""
    ...


# LLAMA_API const char * sekv_last_error(void);
@ctypes_function("sekv_last_error", [], ctypes.c_char_p)
def sekv_last_error() -> bytes:
    """Description of the calling thread's last failure."""
    ...


# LLAMA_API int32_t sekv_kv_get_info(struct llama_context * ctx, sekv_kv_info * out);
@ctypes_function("sekv_kv_get_info", [llama_context_p, ctypes.POINTER(sekv_kv_info)], ctypes.c_int32)
def sekv_kv_get_info(ctx: int, out: Any, /) -> int: ...


# LLAMA_API int32_t sekv_kv_get_layer(struct llama_context * ctx, int32_t ikv, sekv_kv_layer * out);
@ctypes_function(
    "sekv_kv_get_layer", [llama_context_p, ctypes.c_int32, ctypes.POINTER(sekv_kv_layer)], ctypes.c_int32
)
def sekv_kv_get_layer(ctx: int, ikv: int, out: Any, /) -> int: ...


# LLAMA_API int32_t sekv_kv_cells_pos(struct llama_context * ctx, llama_seq_id seq, int32_t * pos_out, int32_t n);
@ctypes_function("sekv_kv_cells_pos", [llama_context_p, ctypes.c_int32, int32_p, ctypes.c_int32], ctypes.c_int32)
def sekv_kv_cells_pos(ctx: int, seq: int, pos_out: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_kv_get_rows(struct llama_context * ctx, llama_seq_id seq, int32_t ikv,
#                                    const int32_t * cells, int32_t n,
#                                    void * dst_k, size_t dst_k_size, void * dst_v, size_t dst_v_size);
@ctypes_function(
    "sekv_kv_get_rows",
    [llama_context_p, ctypes.c_int32, ctypes.c_int32, int32_p, ctypes.c_int32,
     ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t],
    ctypes.c_int32,
)
def sekv_kv_get_rows(ctx: int, seq: int, ikv: int, cells: Any, n: int,
                     dst_k: Any, dst_k_size: int, dst_v: Any, dst_v_size: int, /) -> int: ...


# LLAMA_API int32_t sekv_kv_set_rows(struct llama_context * ctx, llama_seq_id seq, int32_t ikv,
#                                    const int32_t * cells, int32_t n,
#                                    const void * src_k, size_t src_k_size, const void * src_v, size_t src_v_size);
@ctypes_function(
    "sekv_kv_set_rows",
    [llama_context_p, ctypes.c_int32, ctypes.c_int32, int32_p, ctypes.c_int32,
     ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t],
    ctypes.c_int32,
)
def sekv_kv_set_rows(ctx: int, seq: int, ikv: int, cells: Any, n: int,
                     src_k: Any, src_k_size: int, src_v: Any, src_v_size: int, /) -> int: ...


# LLAMA_API int32_t sekv_kv_claim(struct llama_context * ctx, llama_seq_id seq,
#                                 const int32_t * cells, const llama_pos * pos, int32_t n);
@ctypes_function("sekv_kv_claim", [llama_context_p, ctypes.c_int32, int32_p, int32_p, ctypes.c_int32], ctypes.c_int32)
def sekv_kv_claim(ctx: int, seq: int, cells: Any, pos: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_kv_release(struct llama_context * ctx, llama_seq_id seq, const int32_t * cells, int32_t n);
@ctypes_function("sekv_kv_release", [llama_context_p, ctypes.c_int32, int32_p, ctypes.c_int32], ctypes.c_int32)
def sekv_kv_release(ctx: int, seq: int, cells: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_bias_enable(struct llama_context * ctx, int32_t on);
@ctypes_function("sekv_bias_enable", [llama_context_p, ctypes.c_int32], ctypes.c_int32)
def sekv_bias_enable(ctx: int, on: int, /) -> int: ...


# LLAMA_API int32_t sekv_bias_set_layer(struct llama_context * ctx, int32_t ikv, const float * bias, int32_t n);
@ctypes_function("sekv_bias_set_layer", [llama_context_p, ctypes.c_int32, float_p, ctypes.c_int32], ctypes.c_int32)
def sekv_bias_set_layer(ctx: int, ikv: int, bias: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_bias_set_cells(struct llama_context * ctx, int32_t ikv,
#                                       const int32_t * cells, const float * values, int32_t n);
@ctypes_function(
    "sekv_bias_set_cells", [llama_context_p, ctypes.c_int32, int32_p, float_p, ctypes.c_int32], ctypes.c_int32
)
def sekv_bias_set_cells(ctx: int, ikv: int, cells: Any, values: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_bias_get_layer(struct llama_context * ctx, int32_t ikv, float * out, int32_t n);
@ctypes_function("sekv_bias_get_layer", [llama_context_p, ctypes.c_int32, float_p, ctypes.c_int32], ctypes.c_int32)
def sekv_bias_get_layer(ctx: int, ikv: int, out: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_head_bias_enable(struct llama_context * ctx, int32_t on);
@ctypes_function("sekv_head_bias_enable", [llama_context_p, ctypes.c_int32], ctypes.c_int32)
def sekv_head_bias_enable(ctx: int, on: int, /) -> int: ...


# LLAMA_API int32_t sekv_head_bias_set_cells(struct llama_context * ctx, int32_t ikv,
#                                            const int32_t * cells, const float * values, int32_t n);
@ctypes_function(
    "sekv_head_bias_set_cells", [llama_context_p, ctypes.c_int32, int32_p, float_p, ctypes.c_int32], ctypes.c_int32
)
def sekv_head_bias_set_cells(ctx: int, ikv: int, cells: Any, values: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_head_bias_get_layer(struct llama_context * ctx, int32_t ikv, float * out, int32_t n);
@ctypes_function(
    "sekv_head_bias_get_layer", [llama_context_p, ctypes.c_int32, float_p, ctypes.c_int32], ctypes.c_int32
)
def sekv_head_bias_get_layer(ctx: int, ikv: int, out: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_qcap_enable(struct llama_context * ctx, int32_t on);
@ctypes_function("sekv_qcap_enable", [llama_context_p, ctypes.c_int32], ctypes.c_int32)
def sekv_qcap_enable(ctx: int, on: int, /) -> int: ...


# LLAMA_API int32_t sekv_qcap_get(struct llama_context * ctx, int32_t ikv, float * out, int32_t n);
@ctypes_function("sekv_qcap_get", [llama_context_p, ctypes.c_int32, float_p, ctypes.c_int32], ctypes.c_int32)
def sekv_qcap_get(ctx: int, ikv: int, out: Any, n: int, /) -> int: ...


# LLAMA_API int32_t sekv_qcap_probes    (struct llama_context * ctx, int32_t n_probes);
@ctypes_function("sekv_qcap_probes", [llama_context_p, ctypes.c_int32], ctypes.c_int32)
def sekv_qcap_probes(ctx: int, n_probes: int, /) -> int: ...


# LLAMA_API int32_t sekv_qcap_get_probes(struct llama_context * ctx, int32_t ikv, float * out, int32_t n, int32_t * n_got);
@ctypes_function("sekv_qcap_get_probes",
                 [llama_context_p, ctypes.c_int32, float_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)],
                 ctypes.c_int32)
def sekv_qcap_get_probes(ctx: int, ikv: int, out: Any, n: int, n_got: Any, /) -> int: ...


# typedef void (*sekv_layer_callback)(int32_t ikv, void * user_data);
sekv_layer_callback = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_void_p)


# LLAMA_API int32_t sekv_layer_cb_set(struct llama_context * ctx, sekv_layer_callback cb, void * user_data);
@ctypes_function("sekv_layer_cb_set", [llama_context_p, sekv_layer_callback, ctypes.c_void_p], ctypes.c_int32)
def sekv_layer_cb_set(ctx: int, cb: Any, user_data: Any, /) -> int: ...


# LLAMA_API int32_t sekv_kv_layer_on_host(struct llama_context * ctx, int32_t ikv, int32_t * out);
@ctypes_function("sekv_kv_layer_on_host", [llama_context_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)],
                 ctypes.c_int32)
def sekv_kv_layer_on_host(ctx: int, ikv: int, out: Any, /) -> int: ...


# LLAMA_API int32_t sekv_io_counters(struct llama_context * ctx, uint64_t * out, int32_t n);
@ctypes_function("sekv_io_counters", [llama_context_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32],
                 ctypes.c_int32)
def sekv_io_counters(ctx: int, out: Any, n: int, /) -> int: ...
