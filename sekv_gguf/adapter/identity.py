"""The identity of a base model, read from its GGUF metadata with gguf-py's mmap reader: what an adapter records so
that loading it on another model fails with a message naming both."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from gguf import GGUFReader

from ..config import cache_root
from ..errors import ModelError
from ..gguf_strict import StrictGGUFReader


@dataclass(frozen=True)
class ModelIdentity:
    name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_vocab: int
    tensor_hash: str  # sha256 over every tensor's name, shape and type
    n_params: int = 0  # elements of all tensors

    def describe(self) -> str:
        return (f"{self.name or '?'} ({self.architecture}, {self.n_layer} layers, n_embd {self.n_embd}, "
                f"tensors {self.tensor_hash[:12]})")


def _field(reader: GGUFReader, key: str) -> object:
    f = reader.get_field(key)
    if f is None:
        return None
    return f.contents()


def _cache_file(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return cache_root() / "identity" / f"{key}.json"


def model_identity(path: str | Path) -> ModelIdentity:
    """The identity of the GGUF model at ``path``; cached per file (path, size, mtime): reading a large vocabulary
    with gguf-py takes seconds."""
    path = Path(path)
    try:
        cache = _cache_file(path)
    except OSError as e:
        raise ModelError(f"cannot read GGUF metadata of {path}: {e}") from e
    if cache.exists():
        try:
            return ModelIdentity(**json.loads(cache.read_text()))
        except (ValueError, TypeError):
            pass  # a damaged cache entry: read the model again
    ident = read_identity(path)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(ident)))
        tmp.replace(cache)
    except OSError:
        pass  # no cache directory: fine, just slower next time
    return ident


def read_identity(path: str | Path) -> ModelIdentity:
    """The identity of the GGUF model at ``path``, uncached; a damaged file raises ``ModelError`` naming it."""
    path = Path(path)
    try:
        reader = StrictGGUFReader(str(path), "r")
    except OSError as e:
        raise ModelError(f"cannot read GGUF metadata of {path}: {e.strerror or e}") from e
    except Exception as e:  # gguf-py raises ValueError, IndexError, struct errors ... on damaged files
        raise ModelError(f"{path} is not a readable GGUF file (corrupt or truncated): {type(e).__name__}: {e}") from e
    try:
        return _identity(reader)
    except Exception as e:  # wrong field types, absurd counts and shapes
        raise ModelError(f"{path} has damaged GGUF metadata ({type(e).__name__}: {e})") from e


def _identity(reader: GGUFReader) -> ModelIdentity:
    arch = str(_field(reader, "general.architecture") or "")
    h = hashlib.sha256()
    n_params = 0
    for t in reader.tensors:
        n_params += int(t.n_elements)
        h.update(f"{t.name}:{list(map(int, t.shape))}:{int(t.tensor_type)};".encode())
    tokens = reader.get_field("tokenizer.ggml.tokens")
    return ModelIdentity(
        name=str(_field(reader, "general.name") or ""), architecture=arch,
        n_layer=int(_field(reader, f"{arch}.block_count") or 0),
        n_embd=int(_field(reader, f"{arch}.embedding_length") or 0),
        n_vocab=int(len(tokens.data)) if tokens is not None else 0, tensor_hash=h.hexdigest(),
        n_params=n_params)
