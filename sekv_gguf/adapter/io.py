"""Writing (gguf-py's ``GGUFWriter``) and reading (gguf-py's mmap ``GGUFReader``) SeKV router adapters."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from ..errors import AdapterError
from ..gguf_strict import StrictGGUFReader
from ..features import N_FEATURES, NAMES
from . import keys as K
from .identity import ModelIdentity


@dataclass
class RouterAdapter:
    """Trained router weights for the hooked layers of one base model (see ``sekv_gguf.train.student``)."""

    base: ModelIdentity
    layers: list[int]             # model layer index of each hooked layer
    n_head: int
    n_head_kv: int
    head_dim: int
    proj_dim: int
    w: list[np.ndarray]           # per hooked layer f32 [n_head, proj_dim, head_dim]
    b: list[np.ndarray]           # per hooked layer f32 [n_head]
    tau: list[np.ndarray]         # per hooked layer f32 [n_head]
    theta: list[np.ndarray]       # per hooked layer f32 [n_head, len(features.NAMES)]
    spread_rank: int              # the key sketch the router reads (spans.sketches)
    n_centroids: int
    kmeans_iters: int
    train: dict[str, Any] = field(default_factory=dict)  # provenance (str / int / float values)

    def __post_init__(self) -> None:
        n = len(self.layers)
        groups = (self.w, self.b, self.tau, self.theta)
        if any(len(x) != n for x in groups):
            raise AdapterError(f"{n} layers but {[len(x) for x in groups]} weight sets")
        if self.spread_rank < 1 or self.n_centroids < 1 or self.kmeans_iters < 0:
            raise AdapterError(f"bad key sketch: spread rank {self.spread_rank}, {self.n_centroids} centroids, "
                               f"{self.kmeans_iters} k-means steps")
        for i in range(n):
            shapes = [x[i].shape for x in groups]
            if shapes != [(self.n_head, self.proj_dim, self.head_dim), (self.n_head,), (self.n_head,),
                          (self.n_head, N_FEATURES)]:
                raise AdapterError(f"layer {self.layers[i]}: weights {shapes} do not match n_head {self.n_head}, "
                                   f"proj_dim {self.proj_dim}, head_dim {self.head_dim}")

    @property
    def n_params(self) -> int:
        return int(sum(x.size for group in (self.w, self.b, self.tau, self.theta) for x in group))

    @staticmethod
    def params_for(n_layers: int, n_head: int, head_dim: int, proj_dim: int) -> int:
        """``n_params`` of an adapter of this shape: per hooked layer and query head W [P, d], b, tau and theta."""
        return n_layers * n_head * (proj_dim * head_dim + 2 + N_FEATURES)

    @property
    def param_share(self) -> float:
        """Router parameters as a share of the base model's."""
        return self.n_params / max(self.base.n_params, 1)

    def check_model(self, identity: ModelIdentity, path: str = "") -> None:
        """Refuse a base model other than the one the adapter was trained for, naming both."""
        if identity.tensor_hash != self.base.tensor_hash or identity.architecture != self.base.architecture:
            raise AdapterError(f"router adapter {path or ''} was trained for {self.base.describe()}, not for "
                               f"{identity.describe()}")


_U32, _U64, _STR, _ARRAY = GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.STRING, GGUFValueType.ARRAY
# plain Python values per type (the one array is the layer indices: ints, stored as i32)
_AS = {_U32: int, _U64: int, _STR: str, _ARRAY: lambda xs: [int(x) for x in xs]}

# (key, gguf value type, attribute) of the RouterAdapter and of its base model's ModelIdentity (whose architecture is
# general.architecture: GGUFWriter writes it)
_FIELDS = ((K.PROJ_DIM, _U32, "proj_dim"), (K.SPREAD_RANK, _U32, "spread_rank"),
           (K.N_CENTROIDS, _U32, "n_centroids"), (K.KMEANS_ITERS, _U32, "kmeans_iters"), (K.LAYERS, _ARRAY, "layers"),
           (K.N_HEAD, _U32, "n_head"), (K.N_HEAD_KV, _U32, "n_head_kv"), (K.HEAD_DIM, _U32, "head_dim"))
_BASE_FIELDS = ((K.BASE_NAME, _STR, "name"), (K.BASE_N_LAYER, _U32, "n_layer"), (K.BASE_N_EMBD, _U32, "n_embd"),
                (K.BASE_N_VOCAB, _U32, "n_vocab"), (K.BASE_TENSOR_HASH, _STR, "tensor_hash"),
                (K.BASE_N_PARAMS, _U64, "n_params"))


def adapter_metadata(a: RouterAdapter) -> list[tuple[str, Any, GGUFValueType]]:
    """The adapter's keys and values (its fields, base model identity, feature names, provenance), as written into
    an adapter file and into a model that carries its router (``embed``)."""
    kv: list[tuple[str, Any, GGUFValueType]] = [(K.VERSION, K.FORMAT_VERSION, _U32),
                                                 (K.FEATURES, list(NAMES), _ARRAY)]
    for obj, fields in ((a, _FIELDS), (a.base, _BASE_FIELDS)):
        kv += [(key, _AS[vtype](getattr(obj, attr)), vtype) for key, vtype, attr in fields]
    for k, v in a.train.items():
        vtype = (_STR if isinstance(v, (bool, str)) else GGUFValueType.INT64 if isinstance(v, int)
                 else GGUFValueType.FLOAT64)
        kv.append((K.TRAIN_PREFIX + k, str(v) if vtype == _STR else v if vtype != GGUFValueType.FLOAT64 else float(v),
                   vtype))
    return kv


def write_adapter(path: str | Path, a: RouterAdapter) -> Path:
    path = Path(path)
    w = GGUFWriter(str(path), a.base.architecture)
    w.add_string(K.GENERAL_TYPE, K.TYPE_ADAPTER)
    w.add_string(K.GENERAL_NAME, f"sekv router for {a.base.name or a.base.architecture}")
    w.add_string(K.ADAPTER_TYPE, K.TYPE_SEKV_ROUTER)
    for key, value, vtype in adapter_metadata(a):
        w.add_key_value(key, value, vtype)
    for i, layer in enumerate(a.layers):
        for attr, template in K.TENSORS.items():
            w.add_tensor(template.format(layer=layer), np.ascontiguousarray(getattr(a, attr)[i], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _get(reader: StrictGGUFReader, key: str, path: Path) -> Any:
    f = reader.get_field(key)
    if f is None:
        raise AdapterError(f"{path}: missing key {key!r} (not a complete SeKV router adapter)")
    return f.contents()


def _read(reader: StrictGGUFReader, fields: tuple[tuple[str, GGUFValueType, str], ...], path: Path) -> dict[str, Any]:
    return {attr: _AS[vtype](_get(reader, key, path)) for key, vtype, attr in fields}


def read_adapter(path: str | Path) -> RouterAdapter:
    """Read an adapter (mmap); corrupt, truncated or foreign files raise ``AdapterError`` naming the problem. Keys it
    does not know are ignored."""
    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"router adapter not found: {path}")
    try:
        reader = StrictGGUFReader(str(path), "r")
    except Exception as e:  # gguf-py raises ValueError, IndexError, struct errors ... on damaged files
        raise AdapterError(f"{path} is not a readable GGUF file (corrupt or truncated): {e}") from e
    try:
        return _parse(reader, path)
    except AdapterError as e:  # RouterAdapter's own shape checks do not know the file: name it
        if str(path) in str(e):
            raise
        raise AdapterError(f"{path}: {e}") from e
    except Exception as e:  # wrong field types, absurd counts and shapes, data past the end of the file, ...
        raise AdapterError(f"{path} is a damaged router adapter ({type(e).__name__}: {e})") from e


def _parse(reader: StrictGGUFReader, path: Path) -> RouterAdapter:
    kind, atype = reader.get_field(K.GENERAL_TYPE), reader.get_field(K.ADAPTER_TYPE)
    if kind is None or kind.contents() != K.TYPE_ADAPTER or atype is None or atype.contents() != K.TYPE_SEKV_ROUTER:
        raise AdapterError(f"{path} is not a SeKV router adapter (general.type "
                           f"{kind.contents() if kind else None!r}, adapter.type {atype.contents() if atype else None!r})")
    tensors = {t.name: t for t in reader.tensors}

    def weight(attr: str, layer: int) -> np.ndarray:
        name = K.TENSORS[attr].format(layer=layer)
        if name not in tensors:
            raise AdapterError(f"{path}: missing tensor {name!r}")
        return np.array(tensors[name].data, dtype=np.float32)  # a copy: the mmap may close

    return parse_router(reader, path, weight)


def parse_router(reader: StrictGGUFReader, path: Path,
                 weight: Callable[[str, int], np.ndarray]) -> RouterAdapter:
    """The adapter whose keys ``reader`` holds, its weights from ``weight(attribute, layer)`` (any shape with the
    right number of values: reshaped here)."""
    version = int(_get(reader, K.VERSION, path))
    if version != K.FORMAT_VERSION:
        raise AdapterError(f"{path}: adapter format version {version}, this sekv_gguf reads {K.FORMAT_VERSION}")
    base = ModelIdentity(architecture=str(_get(reader, K.GENERAL_ARCHITECTURE, path)),
                         **_read(reader, _BASE_FIELDS, path))
    fields = _read(reader, _FIELDS, path)
    names = [str(x) for x in _get(reader, K.FEATURES, path)]
    if names != list(NAMES):
        raise AdapterError(f"{path}: router features {names}, this sekv_gguf computes {list(NAMES)}")
    # gguf stores shapes innermost-first; the weights come back in numpy order
    n_head, proj, head_dim = fields["n_head"], fields["proj_dim"], fields["head_dim"]
    shapes = {"w": (n_head, proj, head_dim), "b": (-1,), "tau": (-1,), "theta": (n_head, N_FEATURES)}
    weights = {attr: [weight(attr, layer).reshape(shape) for layer in fields["layers"]]
               for attr, shape in shapes.items()}
    train = {f.name[len(K.TRAIN_PREFIX):]: f.contents() for f in reader.fields.values()
             if f.name.startswith(K.TRAIN_PREFIX)}
    return RouterAdapter(base=base, **fields, **weights, train=train)
