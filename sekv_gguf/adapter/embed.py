"""A model that carries its router: a copy of a GGUF model whose metadata also holds a trained router adapter
(``keys.EMBEDDED``), written with gguf-py's metadata copier; and reading that router back. llama.cpp loads such a
file as the model it copies (unknown keys are ignored); ``run``, ``serve`` and ``SekvLlama`` use the router it
carries when no ``--adapter`` is given, with the same identity check as a separate adapter file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from ..errors import AdapterError
from ..gguf_strict import StrictGGUFReader
from . import keys as K
from .identity import model_identity
from .io import RouterAdapter, adapter_metadata, parse_router


def _weight_arrays(a: RouterAdapter) -> dict[str, MetadataDetails]:
    """The adapter's weights as f32 array keys, one per hooked layer and attribute."""
    out = {}
    for i, layer in enumerate(a.layers):
        for attr, template in K.EMBEDDED.items():
            values = np.ascontiguousarray(getattr(a, attr)[i], dtype=np.float32).ravel()
            out[template.format(layer=layer)] = MetadataDetails(GGUFValueType.ARRAY, values.tolist(),
                                                                sub_type=GGUFValueType.FLOAT32)
    return out


def embed_adapter(model_path: str | Path, adapter: RouterAdapter, out_path: str | Path) -> Path:
    """Write ``out_path``: the model at ``model_path`` with ``adapter`` in its metadata (a router it already carries
    is replaced). Refused (``AdapterError``) when the adapter was trained for another model. Written to a temporary
    file beside ``out_path`` and renamed when whole."""
    model_path, out_path = Path(model_path), Path(out_path)
    adapter.check_model(model_identity(model_path), "being embedded")
    if out_path.resolve() == model_path.resolve():
        raise AdapterError(f"{out_path}: write the model with its router to another file than the model itself")
    reader = StrictGGUFReader(str(model_path), "r")
    new = {key: MetadataDetails(vtype, value) for key, value, vtype in adapter_metadata(adapter)}
    new |= _weight_arrays(adapter)
    old_router = [name for name in reader.fields if name.startswith("sekv.") and name not in new]
    tmp = out_path.with_name(out_path.name + ".part")
    try:
        writer = GGUFWriter(str(tmp), adapter.base.architecture, endianess=reader.endianess)
        copy_with_new_metadata(reader, writer, new, old_router)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def carries_router(metadata: dict[str, str]) -> bool:
    """Whether a loaded model's metadata (llama_cpp's ``Llama.metadata`` / ``LlamaModel.metadata()``) holds a
    router (its format version key); reading it needs ``read_embedded``."""
    return K.VERSION in metadata


def read_embedded(model_path: str | Path) -> RouterAdapter:
    """The router the model at ``model_path`` carries, checked against the model itself; ``AdapterError`` naming the
    file when it carries none or a damaged one."""
    path = Path(model_path)
    try:
        reader = StrictGGUFReader(str(path), "r")
    except Exception as e:  # gguf-py raises ValueError, IndexError, struct errors ... on damaged files
        raise AdapterError(f"{path} is not a readable GGUF file (corrupt or truncated): {e}") from e
    if reader.get_field(K.VERSION) is None:
        raise AdapterError(f"{path} carries no SeKV router (no {K.VERSION} key)")

    def weight(attr: str, layer: int) -> np.ndarray:
        f = reader.get_field(K.EMBEDDED[attr].format(layer=layer))
        if f is None:
            raise AdapterError(f"{path}: missing key {K.EMBEDDED[attr].format(layer=layer)!r}")
        return np.asarray(f.contents(), dtype=np.float32)

    try:
        a = parse_router(reader, path, weight)
    except AdapterError:
        raise
    except Exception as e:  # wrong field types, wrong counts of values
        raise AdapterError(f"{path} carries a damaged router ({type(e).__name__}: {e})") from e
    a.check_model(model_identity(path), str(path))
    return a


def main(argv: list[str] | None = None) -> int:
    """``python -m sekv_gguf.adapter.embed ADAPTER.gguf MODEL.gguf OUT.gguf``: the model with the adapter's router in
    its metadata."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m sekv_gguf.adapter.embed ADAPTER.gguf MODEL.gguf OUT.gguf", file=sys.stderr)
        return 2
    from .io import read_adapter

    try:
        print(embed_adapter(args[1], read_adapter(args[0]), args[2]))
    except AdapterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
