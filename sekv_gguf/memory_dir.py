"""A directory of saved conversation memories for a server (``serve --memory-dir``): memory files
(``memory_file``; directory 0700, files 0600) indexed in RAM by the tokens each holds, written by one background
thread, a size cap with the least recently used files removed first. A conversation that goes on replaces its
own older file (one whose tokens are a prefix of the new one's)."""

from __future__ import annotations

import hashlib
import queue
import sys
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .config import setting
from .errors import MemoryFileError
from .memory_file import MODES, SavedMemory, read_memory_file, read_tokens, write_memory_file

SUFFIX = ".sekvmem.gguf"
DIR_MODE = 0o700


@dataclass(frozen=True)
class MemoryDirConfig:
    """Where and how conversations are saved (each field's ``help`` metadata says what it sets)."""

    path: str = setting("", "directory of the saved conversations (created, mode 0700)")
    max_bytes: int = setting(4 << 30, "most bytes the saved files may take; the least recently used go first")
    mode: str = setting("lossless", "lossless (the next turn exactly as before), compact (smaller: spans at "
                                    "summary resolution, q8_0 device rows) or compact3 (compact with 3-bit host "
                                    "rows: smallest)", choices=MODES)
    close_timeout_s: float = setting(60.0, "at close, how long the saves still queued may take")

    def __post_init__(self) -> None:
        if not self.path or self.max_bytes < 0 or self.mode not in MODES or not self.close_timeout_s >= 0:
            raise ValueError(f"need a path, max_bytes >= 0, a mode in {MODES} and close_timeout_s >= 0; got {self}")


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    size: int


@dataclass
class DirCounts:
    """What the directory did: files written, background write failures (their messages, the latest last)."""

    written: int = 0
    removed: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DirMatch:
    """The saved conversation sharing the longest prefix with a prompt: its file, the shared tokens, its tokens."""

    path: Path | None
    shared: int
    n_tokens: int


def file_name(tokens: Sequence[int], suffix: str = SUFFIX) -> str:
    """The file a memory of ``tokens`` is saved in: a hash of the tokens."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:32] + suffix


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class MemoryDir:
    """See the module docstring. ``submit`` queues a memory for the writer thread; ``write`` writes at once (in the
    caller's thread); ``flush`` waits for the queue; ``close`` drains it and stops the thread."""

    def __init__(self, config: MemoryDirConfig, log: Callable[[str], None] | None = None):
        self.config = config
        self.dir = Path(config.path)
        self.dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        self.log = log or (lambda line: warnings.warn(line, stacklevel=3))
        self.counts = DirCounts()
        self._lock = threading.Lock()
        self._index: OrderedDict[Path, _Entry] = OrderedDict()  # least recently used first
        for path in sorted(self.dir.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime_ns):
            try:
                self._index[path] = _Entry(tuple(read_tokens(path)), path.stat().st_size)
            except (MemoryFileError, OSError) as e:
                self.log(f"memory dir: skipping {path}: {e}")
        self._jobs: queue.Queue[SavedMemory | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sekv-memory-dir", daemon=True)
        self._thread.start()

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._index.values())

    def best(self, prompt: Sequence[int]) -> DirMatch:
        """The saved conversation sharing the longest prefix with ``prompt`` (path None: none shares a token)."""
        with self._lock:
            found = DirMatch(None, 0, 0)
            for path, entry in self._index.items():
                k = common_prefix(entry.tokens, prompt)
                if k > found.shared:
                    found = DirMatch(path, k, len(entry.tokens))
            return found

    def read(self, path: Path) -> SavedMemory:
        """The memory at ``path`` (now the most recently used); a damaged file leaves the index and raises
        ``MemoryFileError``."""
        try:
            saved = read_memory_file(path)
        except MemoryFileError:
            self.forget(path)
            raise
        with self._lock:
            if path in self._index:
                self._index.move_to_end(path)
        return saved

    def forget(self, path: Path) -> None:
        """Leave ``path`` out of the index (the file stays: a memory of other settings, or one to inspect)."""
        with self._lock:
            self._index.pop(path, None)

    def submit(self, saved: SavedMemory) -> None:
        self._jobs.put(saved)

    def write(self, saved: SavedMemory) -> Path:
        """Write ``saved`` now: its file replaces the older files of the same conversation, then the least recently
        used files go while the directory is over ``max_bytes`` (never the one just written)."""
        tokens = tuple(saved.tokens)
        path = self.dir / file_name(tokens)
        write_memory_file(path, saved)
        gone = []
        with self._lock:
            self._index.pop(path, None)
            self._index[path] = _Entry(tokens, path.stat().st_size)
            self.counts.written += 1
            for other, entry in list(self._index.items()):
                if other != path and len(entry.tokens) < len(tokens) and tokens[:len(entry.tokens)] == entry.tokens:
                    gone.append(other)
                    del self._index[other]
            total = sum(e.size for e in self._index.values())
            while total > self.config.max_bytes and len(self._index) > 1:
                oldest = next(iter(self._index))
                total -= self._index.pop(oldest).size
                gone.append(oldest)
            self.counts.removed += len(gone)
        for other in gone:
            other.unlink(missing_ok=True)
        return path

    def _run(self) -> None:
        while True:
            saved = self._jobs.get()
            try:
                if saved is None:
                    return
                self.write(saved)
            except Exception as e:  # noqa: BLE001 - a failed save (disk full, ...) must not end the server
                self.counts.failures.append(f"{type(e).__name__}: {e}")
                self.log(f"memory dir: could not save a conversation: {type(e).__name__}: {e}")
            finally:
                self._jobs.task_done()

    def flush(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        """Stop the writer thread once the queued saves are written (at most ``close_timeout_s``; not waited for
        while the interpreter shuts down, when the thread may be stopped already). ``write`` works after it."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._jobs.put(None)
            if not sys.is_finalizing():
                self._thread.join(self.config.close_timeout_s)
            if self._thread.is_alive():
                self.log(f"memory dir: {self._jobs.qsize()} saves still queued at close were not written")
