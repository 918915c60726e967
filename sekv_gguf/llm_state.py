"""What ``SekvLlama.save_state`` returns and ``load_state`` takes (``SekvState``: the fields of llama-cpp-python's
``LlamaState``, its ``llama_state`` the bytes of a saved memory file), and ``SekvDiskCache``, a prompt cache with
``LlamaDiskCache``'s semantics (longest-prefix lookup, a capacity in bytes, least recently used out first) whose
files are memory files (``sekv_gguf.memory_file``), never pickles."""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from llama_cpp.llama_cache import BaseLlamaCache

from .errors import MemoryFileError
from .memory_dir import common_prefix, file_name
from .memory_file import memory_from_bytes, read_tokens, write_bytes_atomically

CACHE_SUFFIX = ".sekvmem.gguf"
DIR_MODE = 0o700


@dataclass
class SekvState:
    """A saved memory, usable where llama-cpp-python uses a ``LlamaState``: ``input_ids`` (int [n_tokens], the
    tokens the memory holds), ``scores`` (empty [0, n_vocab]: a compressed memory keeps no logits rows),
    ``n_tokens``, ``llama_state`` (the memory file's bytes), ``llama_state_size`` (its length), ``seed`` (the
    sampler seed when saved; None: leave the model's). ``save`` / ``load`` put it in and take it from a file."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int | None = None

    @classmethod
    def of(cls, tokens: Sequence[int], data: bytes, n_vocab: int, seed: int | None) -> "SekvState":
        ids = np.asarray(tokens, dtype=np.intc)
        return cls(input_ids=ids, scores=np.zeros((0, n_vocab), dtype=np.float32), n_tokens=int(ids.size),
                   llama_state=data, llama_state_size=len(data), seed=seed)

    def save(self, path: str | Path) -> Path:
        """Write the memory file (atomically, mode 0600)."""
        return write_bytes_atomically(path, self.llama_state)

    extra: Any = None  # plain data saved with the memory (``save_state(extra=...)``), read back by ``load``

    @classmethod
    def load(cls, path: str | Path, n_vocab: int = 0) -> "SekvState":
        """A state from a memory file (checked whole: ``MemoryFileError`` when damaged)."""
        path = Path(path)
        data = path.read_bytes()
        saved = memory_from_bytes(data, str(path))
        state = cls.of(saved.tokens, data, n_vocab, None)
        state.extra = saved.extra
        return state


class SekvDiskCache(BaseLlamaCache):
    """A directory of memory files (mode 0700, files 0600), indexed by the tokens each memory holds (read from
    the files when the cache opens; a damaged file is skipped with a warning). ``cache[tokens]`` is the state whose
    tokens share the longest prefix with ``tokens`` (``KeyError``: none shares any); ``cache[key] = state`` writes
    ``state`` under its own tokens (the key's last sampled token is never in the memory) and removes the least
    recently used files while the directory holds more than ``capacity_bytes``."""

    def __init__(self, cache_dir: str | Path = ".cache/sekv_cache", capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.dir = Path(cache_dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        self._index: OrderedDict[Path, tuple[int, ...]] = OrderedDict()  # least recently used first
        files = sorted(self.dir.glob("*" + CACHE_SUFFIX), key=lambda p: p.stat().st_mtime_ns)
        for path in files:
            try:
                self._index[path] = tuple(read_tokens(path))
            except MemoryFileError as e:
                warnings.warn(f"SekvDiskCache: skipping {e}", stacklevel=2)

    def __bool__(self) -> bool:  # llama-cpp-python tests ``if self.cache:``; an empty cache is still a cache
        return True

    def __len__(self) -> int:
        return len(self._index)

    @property
    def cache_size(self) -> int:
        return int(sum(p.stat().st_size for p in self._index if p.exists()))

    def _find_longest_prefix_key(self, key: Sequence[int]) -> Path | None:  # type: ignore[override]
        best, best_n = None, 0
        for path, tokens in self._index.items():
            n = common_prefix(tokens, key)
            if n > best_n:
                best, best_n = path, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    def __getitem__(self, key: Sequence[int]) -> SekvState:
        path = self._find_longest_prefix_key(tuple(key))
        if path is None:
            raise KeyError("no saved memory shares a prefix with these tokens")
        try:
            data = path.read_bytes()
        except OSError as e:
            del self._index[path]
            raise KeyError(f"saved memory {path} is gone: {e}") from e
        self._index.move_to_end(path)
        os.utime(path)  # the order survives a restart
        return SekvState.of(self._index[path], data, 0, None)

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        if not isinstance(value, SekvState):
            raise TypeError(f"SekvDiskCache holds SekvLlama states (SekvState), not {type(value).__name__}")
        tokens = tuple(int(t) for t in value.input_ids[:value.n_tokens])
        path = self.dir / file_name(tokens, CACHE_SUFFIX)
        write_bytes_atomically(path, value.llama_state)
        self._index.pop(path, None)
        self._index[path] = tokens
        while self._index and self.cache_size > self.capacity_bytes:
            old, _ = self._index.popitem(last=False)
            old.unlink(missing_ok=True)
