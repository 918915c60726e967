"""Typed ctypes mirror of the ggml calls llama-cpp-python 0.3.36 leaves unbound, found in the ggml libraries beside
the loaded libllama (libggml-base: devices, abort callback, thread-pool parameters; libggml: the backend registry;
libggml-cpu: thread pools). One binding per C function, its declaration above it; higher layers
(``sekv_gguf.rpc``, ``sekv_gguf._threadpool``) turn results into exceptions."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp.llama_cpp as _llama

ggml_backend_reg_t = ctypes.c_void_p
ggml_backend_dev_t = ctypes.c_void_p

# enum ggml_backend_dev_type
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3
GGML_BACKEND_DEVICE_TYPE_META = 4

# typedef void (*ggml_abort_callback_t)(const char * error_message);
ggml_abort_callback_t = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
# typedef ggml_backend_reg_t (*ggml_backend_rpc_add_server_t)(const char * endpoint);  (ggml-rpc.h, by proc address)
ggml_backend_rpc_add_server_t = ctypes.CFUNCTYPE(ggml_backend_reg_t, ctypes.c_char_p)

_libs: dict[str, ctypes.CDLL] = {}


def lib(stem: str) -> ctypes.CDLL:
    """A ggml library (``ggml``, ``ggml-base``, ``ggml-cpu``) from the directory of the loaded libllama."""
    if stem not in _libs:
        base = Path(_llama._lib._name).parent
        _libs[stem] = ctypes.CDLL(str(base / f"lib{stem}.so"))
    return _libs[stem]


def _bind(stem: str, name: str, argtypes: list, restype) -> ctypes._CFuncPtr:
    fn = getattr(lib(stem), name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


# GGML_API ggml_backend_reg_t ggml_backend_reg_by_name(const char * name);
def ggml_backend_reg_by_name(name: bytes) -> int | None:
    return _bind("ggml", "ggml_backend_reg_by_name", [ctypes.c_char_p], ggml_backend_reg_t)(name)


# GGML_API void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
def ggml_backend_reg_get_proc_address(reg: int, name: bytes) -> int | None:
    return _bind("ggml-base", "ggml_backend_reg_get_proc_address", [ggml_backend_reg_t, ctypes.c_char_p],
                 ctypes.c_void_p)(reg, name)


# GGML_API size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
def ggml_backend_reg_dev_count(reg: int) -> int:
    return _bind("ggml-base", "ggml_backend_reg_dev_count", [ggml_backend_reg_t], ctypes.c_size_t)(reg)


# GGML_API ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
def ggml_backend_reg_dev_get(reg: int, index: int) -> int | None:
    return _bind("ggml-base", "ggml_backend_reg_dev_get", [ggml_backend_reg_t, ctypes.c_size_t],
                 ggml_backend_dev_t)(reg, index)


# GGML_API size_t ggml_backend_dev_count(void);
def ggml_backend_dev_count() -> int:
    return _bind("ggml", "ggml_backend_dev_count", [], ctypes.c_size_t)()


# GGML_API ggml_backend_dev_t ggml_backend_dev_get(size_t index);
def ggml_backend_dev_get(index: int) -> int | None:
    return _bind("ggml", "ggml_backend_dev_get", [ctypes.c_size_t], ggml_backend_dev_t)(index)


# GGML_API const char * ggml_backend_dev_name(ggml_backend_dev_t device);
def ggml_backend_dev_name(dev: int) -> bytes:
    return _bind("ggml-base", "ggml_backend_dev_name", [ggml_backend_dev_t], ctypes.c_char_p)(dev)


# GGML_API const char * ggml_backend_dev_description(ggml_backend_dev_t device);
def ggml_backend_dev_description(dev: int) -> bytes:
    return _bind("ggml-base", "ggml_backend_dev_description", [ggml_backend_dev_t], ctypes.c_char_p)(dev)


# GGML_API enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
def ggml_backend_dev_type(dev: int) -> int:
    return _bind("ggml-base", "ggml_backend_dev_type", [ggml_backend_dev_t], ctypes.c_int)(dev)


# GGML_API void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
def ggml_backend_dev_memory(dev: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _bind("ggml-base", "ggml_backend_dev_memory",
          [ggml_backend_dev_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None)(
        dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


# GGML_API ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback);
def ggml_set_abort_callback(callback) -> None:
    _bind("ggml-base", "ggml_set_abort_callback", [ggml_abort_callback_t], ctypes.c_void_p)(callback)
