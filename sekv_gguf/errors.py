"""Exceptions of sekv_gguf. Every error names the argument or limit at fault."""

from __future__ import annotations


class SekvError(RuntimeError):
    """Base class of sekv_gguf errors."""


class HookError(SekvError):
    """A KV hook call failed; ``code`` is the SEKV_ERR_* status, ``function`` the C entry point."""

    def __init__(self, function: str, code: int, message: str):
        self.function = function
        self.code = code
        self.message = message
        super().__init__(f"{function}: {message}")


class UnsupportedModelError(HookError):
    """The context's memory cannot be hooked (recurrent, hybrid, M-RoPE, MLA, shared cells, ...)."""


class HookIndexError(HookError, IndexError):
    """A layer, cell or sequence index is out of range."""


class HookValueError(HookError, ValueError):
    """An argument has a wrong size, value or position, or a cell is in the wrong state."""


class HookStateError(HookError):
    """A hook feature (bias, query capture) is used while switched off."""


class NativeError(SekvError, ValueError):
    """A native-module call was handed a size or index it cannot accept."""


class ModelError(SekvError):
    """A model file cannot be used (missing, corrupt, unsupported architecture)."""


class BudgetError(SekvError, ValueError):
    """The device budget cannot hold what must stay resident; the message says what would fit."""


class AdapterError(SekvError, ValueError):
    """A router adapter file is corrupt, truncated, not a SeKV router adapter, or made for another model."""


class InputFileError(SekvError, ValueError):
    """A file the user handed over (a prompt, a document, a config) cannot be read as what it should be."""


class RequestCancelled(SekvError):
    """A request was cancelled (its client went away, or the server is shutting down) while its prompt was being
    evaluated."""


class RpcError(SekvError):
    """An RPC server (llama.cpp's RPC backend) cannot be used: malformed endpoint, unreachable, not answering, or
    this build has no RPC backend."""


class RpcEndpointError(RpcError, ValueError):
    """An RPC server's address is not ``HOST:PORT``."""


class MemoryFileError(SekvError, ValueError):
    """A saved memory file (``sekv_gguf.memory_file``) is damaged, truncated, not a SeKV memory, or of another
    format version; the message names the file and the problem."""


class MemoryMismatchError(MemoryFileError):
    """A saved memory was made for another model, policy, budget, K/V types, batch sizes or settings than the one it
    is loaded into; the message names every field that differs, with both values."""
