"""``llama_model_params`` from a ``ContextConfig``: offloaded layers, the RPC servers' devices, weight repacking.

``load_model`` fills the params it builds; ``llama_cpp.Llama`` (under ``SekvLlama``) builds its own from
``llama_model_default_params()`` and has no device or repacking argument (its struct marks ``devices`` unused), so
``for_llama`` makes that call return ours while a ``Llama`` is constructed."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator

import llama_cpp.llama_cpp as _llama

from . import rpc
from .config import ContextConfig

_lock = threading.Lock()


@contextlib.contextmanager
def params(config: ContextConfig) -> Iterator[_llama.llama_model_params]:
    """Model params for ``config``, valid inside the block (llama.cpp copies the device list while loading).
    Connects the RPC servers first: ``RpcError`` names one that cannot be used."""
    p = _llama.llama_model_default_params()
    p.n_gpu_layers = config.n_gpu_layers
    p.use_extra_bufts = config.repack_weights
    devices = None
    if config.rpc_servers:  # the servers' devices (then this machine's GPUs) take the offloaded layers
        devices = rpc.device_array(rpc.devices(config.rpc_servers, config.rpc_timeout_s))
        p.devices = ctypes.addressof(devices)
        rpc.install_abort_handler()
    yield p
    del devices


@contextlib.contextmanager
def for_llama(config: ContextConfig) -> Iterator[None]:
    """While inside, ``llama_model_default_params()`` returns ``config``'s params (``Llama`` then sets
    ``n_gpu_layers`` and the rest of its own arguments on top)."""
    with params(config) as p, _lock:
        orig = _llama.llama_model_default_params
        _llama.llama_model_default_params = lambda: p
        try:
            yield
        finally:
            _llama.llama_model_default_params = orig
