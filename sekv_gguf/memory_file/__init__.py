"""Saved memories: a policy's memory (device cells, span store, anchors, window, logs, zoom state, the SWA cache of
iSWA models) in a versioned GGUF file with a fingerprint of the model and settings it belongs to
(docs/memory-files.md). ``keys`` (every key name), ``codec`` (plain data <-> layout + tensors), ``fileio`` (atomic
writer, strict reader), ``fingerprint``, ``policy_state`` (a policy <-> a ``SavedMemory``)."""

from .fileio import (COMPACT_MODES, MODES, SavedMemory, memory_bytes, memory_from_bytes, read_memory_file,
                     read_tokens, write_bytes_atomically, write_memory_file)
from .fingerprint import Fingerprint
from .policy_state import capture, capture_snapshot, load_memory, restore_into, save_memory

__all__ = ["COMPACT_MODES", "MODES", "Fingerprint", "SavedMemory", "capture", "capture_snapshot", "load_memory",
           "memory_bytes", "memory_from_bytes", "read_memory_file", "read_tokens", "restore_into", "save_memory",
           "write_bytes_atomically", "write_memory_file"]
