"""Writing a ``SavedMemory`` as a GGUF file (gguf-py's ``GGUFWriter``; atomically, mode 0600) and reading one back
with the strict reader (``gguf_strict``). A sha256 over the fingerprint, the layout and every tensor is checked
before anything is decoded, so a damaged byte anywhere that matters is refused, never loaded; damaged, truncated,
foreign files and other format versions raise ``MemoryFileError`` naming the file and the problem."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import tempfile
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from ..errors import MemoryFileError
from ..gguf_strict import StrictGGUFReader
from . import codec
from . import keys as K
from .fingerprint import Fingerprint

FILE_MODE = 0o600  # a memory holds the conversation's content
MODES = ("lossless", "compact", "compact3")  # compact3: compact with the host codes in 3 bits (``packing``)
COMPACT_MODES = ("compact", "compact3")
REQUIRED = {"tokens", "device", "memory"}  # the content of every memory file; "extra" is the caller's (chat messages)

_U32, _STR = GGUFValueType.UINT32, GGUFValueType.STRING
# the fingerprint's keys, in its fields' order, with their GGUF type
_FP_KEYS = ((K.FP_MODEL_NAME, _STR), (K.FP_MODEL_ARCH, _STR), (K.FP_MODEL_N_LAYER, _U32), (K.FP_MODEL_N_EMBD, _U32),
            (K.FP_MODEL_N_VOCAB, _U32), (K.FP_MODEL_TENSORS, _STR), (K.FP_POLICY, _STR), (K.FP_N_CONTEXT, _U32),
            (K.FP_BUDGET_CELLS, _U32), (K.FP_TYPE_K, _U32), (K.FP_TYPE_V, _U32), (K.FP_N_BATCH, _U32),
            (K.FP_N_UBATCH, _U32), (K.FP_SETTINGS, _STR), (K.FP_N_TOKENS, _U32), (K.FP_TOKENS_HASH, _STR))
_PY = {_U32: int, _STR: str}


@dataclass
class SavedMemory:
    """A policy's memory as a file holds it: the fingerprint, the mode, and ``content`` — plain data with
    ``tokens`` (int32 [n]), ``device`` (the device cells, or llama.cpp's sequence state for ``full``),
    ``memory`` (``PolicyMemory.to_plain``) and optionally ``extra`` (plain data of the caller's: a chat's messages)."""

    fingerprint: Fingerprint
    mode: str
    content: dict[str, Any]

    @property
    def tokens(self) -> list[int]:
        return [int(t) for t in self.content["tokens"]]

    @property
    def extra(self) -> Any:
        return self.content.get("extra")


def _checksum(fp: Fingerprint, mode: str, layout: str, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for part in (fp.canonical(), mode, layout):
        h.update(part.encode())
        h.update(b"\0")
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}:{a.dtype.name}:{a.size}\0".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _temp_beside(path: Path) -> Path:
    """A new empty file (mode 0600) in ``path``'s directory, to be renamed over ``path``."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    return tmp


def _commit(tmp: Path, path: Path) -> None:
    """fsync ``tmp``, rename it over ``path``, fsync the directory."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_bytes_atomically(path: str | Path, data: bytes) -> Path:
    """Write ``data`` (a memory file's bytes) to ``path`` as ``write_memory_file`` does: temporary file, rename."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        tmp.write_bytes(data)
        _commit(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_memory_file(path: str | Path, saved: SavedMemory) -> Path:
    """Write ``saved`` to ``path`` atomically: a temporary file (mode 0600) in the same directory, fsync, rename."""
    if saved.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {saved.mode!r}")
    path = Path(path)
    enc = codec.encode(saved.content)
    layout = _pack_layout(json.dumps(enc.layout, allow_nan=True))
    fp = saved.fingerprint
    tmp = _temp_beside(path)
    try:
        w = GGUFWriter(str(tmp), fp.model_architecture or "unknown")
        w.add_string(K.GENERAL_TYPE, K.TYPE_MEMORY)
        w.add_string(K.GENERAL_NAME, fp.model_name)
        w.add_uint32(K.VERSION, K.FORMAT_VERSION)
        w.add_string(K.MODE, saved.mode)
        for (key, vtype), f in zip(_FP_KEYS, fields(fp)):
            w.add_key_value(key, _PY[vtype](getattr(fp, f.name)), vtype)
        w.add_string(K.LAYOUT, layout)
        w.add_string(K.CHECKSUM, _checksum(fp, saved.mode, layout, enc.arrays))
        for name, a in enc.arrays.items():
            w.add_tensor(name, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        _commit(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _pack_layout(text: str) -> str:
    """The layout as stored (version 2): base64 of its zlib stream. Its JSON repeats every key of every span and
    layer, a twentieth of a compact file at 28K uncompressed."""
    return base64.b64encode(zlib.compress(text.encode(), 6)).decode("ascii")


def _unpack_layout(stored: str, version: int, name: str) -> str:
    if version == 1:
        return stored
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(stored, validate=True), K.LAYOUT_MAX_BYTES)
    except (binascii.Error, zlib.error, ValueError) as e:
        raise MemoryFileError(f"{name}: its layout is not a zlib stream in base64 ({e})") from e
    if inflate.unconsumed_tail or not inflate.eof:
        raise MemoryFileError(f"{name}: its layout is truncated or inflates past {K.LAYOUT_MAX_BYTES} bytes")
    return raw.decode("utf-8")


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory
    finally:
        os.close(fd)


def memory_bytes(saved: SavedMemory) -> bytes:
    """The file ``write_memory_file`` writes, as bytes (a temporary file in a private directory)."""
    with tempfile.TemporaryDirectory(prefix="sekv-memory-") as d:
        return write_memory_file(Path(d) / "memory.gguf", saved).read_bytes()


def memory_from_bytes(data: bytes, source: str = "saved state") -> SavedMemory:
    """``read_memory_file`` of bytes (written to a private temporary file, mode 0600); errors name ``source``."""
    with tempfile.TemporaryDirectory(prefix="sekv-memory-") as d:
        path = Path(d) / "memory.gguf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return read_memory_file(path, source=source)


def read_memory_file(path: str | Path, source: str | None = None) -> SavedMemory:
    """Read a saved memory; a damaged, truncated or foreign file or another format version raises
    ``MemoryFileError`` naming ``source`` (the path by default) and the problem."""
    path = Path(path)
    name = source or str(path)
    if not path.is_file():
        raise MemoryFileError(f"saved memory not found: {name}")
    try:
        reader = StrictGGUFReader(str(path), "r")
    except Exception as e:  # gguf-py raises ValueError, IndexError, struct errors ... on damaged files
        raise MemoryFileError(f"{name} is not a readable GGUF file (corrupt or truncated): {type(e).__name__}: "
                              f"{e}") from e
    try:
        return _parse(reader, name)
    except MemoryFileError:
        raise
    except RecursionError as e:
        raise MemoryFileError(f"{name}: the layout is nested too deeply (a damaged memory file)") from e
    except Exception as e:  # wrong field types, absurd shapes, a layout that does not match its tensors, ...
        raise MemoryFileError(f"{name} is a damaged memory file ({type(e).__name__}: {e})") from e


def _field(reader: StrictGGUFReader, key: str, want: GGUFValueType, name: str) -> Any:
    f = reader.get_field(key)
    if f is None:
        raise MemoryFileError(f"{name}: missing key {key!r} (not a complete SeKV memory file)")
    if f.types != [want]:
        raise MemoryFileError(f"{name}: key {key!r} has type {[t.name for t in f.types]}, expected {want.name}")
    return _PY[want](f.contents())


def read_tokens(path: str | Path) -> list[int]:
    """The tokens a memory file holds, without checking or decoding the rest (an index of saved memories; a full
    ``read_memory_file`` checks everything before the memory is used)."""
    path = Path(path)
    try:
        reader = StrictGGUFReader(str(path), "r")
        if _field(reader, K.GENERAL_TYPE, _STR, str(path)) != K.TYPE_MEMORY:
            raise MemoryFileError(f"{path} is not a SeKV memory file")
        n = _field(reader, K.FP_N_TOKENS, _U32, str(path))
        found = [t for t in reader.tensors if t.name == K.TOKENS_TENSOR]
        tokens = [int(t) for t in np.asarray(found[0].data).view(np.int32)] if found else []
    except MemoryFileError:
        raise
    except Exception as e:
        raise MemoryFileError(f"{path} is a damaged memory file ({type(e).__name__}: {e})") from e
    if len(tokens) != n:
        raise MemoryFileError(f"{path}: {len(tokens)} tokens, the fingerprint says {n}")
    return tokens


def _parse(reader: StrictGGUFReader, name: str) -> SavedMemory:
    kind = reader.get_field(K.GENERAL_TYPE)
    if kind is None or kind.types != [_STR] or kind.contents() != K.TYPE_MEMORY:
        raise MemoryFileError(f"{name} is not a SeKV memory file (general.type "
                              f"{kind.contents() if kind is not None else None!r})")
    version = _field(reader, K.VERSION, _U32, name)
    if version not in K.READ_VERSIONS:
        raise MemoryFileError(f"{name}: memory file format version {version}, this sekv_gguf reads versions "
                              f"{', '.join(map(str, K.READ_VERSIONS))}")
    mode = _field(reader, K.MODE, _STR, name)
    if mode not in MODES:
        raise MemoryFileError(f"{name}: unknown mode {mode!r} (known: {MODES})")
    fp = Fingerprint(*(_field(reader, key, vtype, name) for key, vtype in _FP_KEYS))
    layout = _field(reader, K.LAYOUT, _STR, name)
    want = _field(reader, K.CHECKSUM, _STR, name)
    arrays: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if not t.name.startswith(K.TENSOR_PREFIX):
            raise MemoryFileError(f"{name}: unexpected tensor {t.name!r}")
        arrays[t.name] = np.array(t.data).reshape(-1)  # a copy: the memory map closes with the reader
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=int(reader.data_offset))
    end = -(-end // reader.alignment) * reader.alignment if reader.tensors else end
    if len(reader.data) != end:
        raise MemoryFileError(f"{name} is {len(reader.data)} bytes, its header says {end}: truncated or damaged")
    if _checksum(fp, mode, layout, arrays) != want:
        raise MemoryFileError(f"{name} is damaged: its sha256 does not match its contents")
    content = codec.decode(json.loads(_unpack_layout(layout, version, name)), arrays)
    if not isinstance(content, dict) or not REQUIRED <= set(content) <= REQUIRED | {"extra"}:
        raise MemoryFileError(f"{name}: the layout holds {sorted(content) if isinstance(content, dict) else content!r}"
                              ", not tokens, device, memory (and extra)")
    tokens = content["tokens"]
    if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32 or tokens.ndim != 1:
        raise MemoryFileError(f"{name}: tokens are not an int32 vector")
    if tokens.size != fp.n_tokens or fp.tokens_sha256 != hashlib.sha256(tokens.astype("<i4").tobytes()).hexdigest():
        raise MemoryFileError(f"{name}: the tokens do not match the fingerprint")
    return SavedMemory(fingerprint=fp, mode=mode, content=content)
