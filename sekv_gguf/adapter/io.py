"""Writing (gguf-py's ``GGUFWriter``) and reading (gguf-py's mmap ``GGUFReader``) SeKV router adapters."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFWriter

from ..errors import AdapterError
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
    anchor_alpha: float = 1.0
    energy: float = 0.999
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

    @property
    def param_share(self) -> float:
        """Router parameters as a share of the base model's."""
        return self.n_params / max(self.base.n_params, 1)

    def check_model(self, identity: ModelIdentity, path: str = "") -> None:
        """Refuse a base model other than the one the adapter was trained for, naming both."""
        if identity.tensor_hash != self.base.tensor_hash or identity.architecture != self.base.architecture:
            raise AdapterError(f"router adapter {path or ''} was trained for {self.base.describe()}, not for "
                               f"{identity.describe()}")


def write_adapter(path: str | Path, a: RouterAdapter) -> Path:
    path = Path(path)
    w = GGUFWriter(str(path), a.base.architecture)
    w.add_string(K.GENERAL_TYPE, K.TYPE_ADAPTER)
    w.add_string(K.GENERAL_NAME, f"sekv router for {a.base.name or a.base.architecture}")
    w.add_string(K.ADAPTER_TYPE, K.TYPE_SEKV_ROUTER)
    w.add_uint32(K.VERSION, K.FORMAT_VERSION)
    w.add_uint32(K.PROJ_DIM, a.proj_dim)
    w.add_uint32(K.SPREAD_RANK, a.spread_rank)
    w.add_uint32(K.N_CENTROIDS, a.n_centroids)
    w.add_uint32(K.KMEANS_ITERS, a.kmeans_iters)
    w.add_array(K.FEATURES, list(NAMES))
    w.add_array(K.LAYERS, [int(x) for x in a.layers])
    w.add_uint32(K.N_HEAD, a.n_head)
    w.add_uint32(K.N_HEAD_KV, a.n_head_kv)
    w.add_uint32(K.HEAD_DIM, a.head_dim)
    w.add_float32(K.ANCHOR_ALPHA, float(a.anchor_alpha))
    w.add_float32(K.ENERGY, float(a.energy))
    w.add_string(K.BASE_NAME, a.base.name)
    w.add_uint32(K.BASE_N_LAYER, a.base.n_layer)
    w.add_uint32(K.BASE_N_EMBD, a.base.n_embd)
    w.add_uint32(K.BASE_N_VOCAB, a.base.n_vocab)
    w.add_string(K.BASE_TENSOR_HASH, a.base.tensor_hash)
    w.add_uint64(K.BASE_N_PARAMS, a.base.n_params)
    for k, v in a.train.items():
        key = K.TRAIN_PREFIX + k
        if isinstance(v, bool) or isinstance(v, str):
            w.add_string(key, str(v))
        elif isinstance(v, int):
            w.add_int64(key, v)
        else:
            w.add_float64(key, float(v))
    for i, layer in enumerate(a.layers):
        for name, x in _tensors(a, i, layer):
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensors(a: RouterAdapter, i: int, layer: int) -> list[tuple[str, np.ndarray]]:
    """(name, array) of hooked layer ``i`` (model layer ``layer``), in file order."""
    return [(K.tensor_w(layer), a.w[i]), (K.tensor_b(layer), a.b[i]), (K.tensor_tau(layer), a.tau[i]),
            (K.tensor_theta(layer), a.theta[i])]


def _get(reader: GGUFReader, key: str, path: Path) -> Any:
    f = reader.get_field(key)
    if f is None:
        raise AdapterError(f"{path}: missing key {key!r} (not a complete SeKV router adapter)")
    return f.contents()


def read_adapter(path: str | Path) -> RouterAdapter:
    """Read an adapter (mmap); corrupt, truncated or foreign files raise ``AdapterError`` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"router adapter not found: {path}")
    try:
        reader = GGUFReader(str(path), "r")
    except Exception as e:  # gguf-py raises ValueError, IndexError, struct errors ... on damaged files
        raise AdapterError(f"{path} is not a readable GGUF file (corrupt or truncated): {e}") from e
    kind, atype = reader.get_field(K.GENERAL_TYPE), reader.get_field(K.ADAPTER_TYPE)
    if kind is None or kind.contents() != K.TYPE_ADAPTER or atype is None or atype.contents() != K.TYPE_SEKV_ROUTER:
        raise AdapterError(f"{path} is not a SeKV router adapter (general.type "
                           f"{kind.contents() if kind else None!r}, adapter.type {atype.contents() if atype else None!r})")
    version = int(_get(reader, K.VERSION, path))
    if version != K.FORMAT_VERSION:
        raise AdapterError(f"{path}: adapter format version {version}, this sekv_gguf reads {K.FORMAT_VERSION}")
    base = ModelIdentity(name=str(_get(reader, K.BASE_NAME, path)),
                         architecture=str(_get(reader, K.GENERAL_ARCHITECTURE, path)),
                         n_layer=int(_get(reader, K.BASE_N_LAYER, path)), n_embd=int(_get(reader, K.BASE_N_EMBD, path)),
                         n_vocab=int(_get(reader, K.BASE_N_VOCAB, path)),
                         tensor_hash=str(_get(reader, K.BASE_TENSOR_HASH, path)),
                         n_params=int(_get(reader, K.BASE_N_PARAMS, path)))
    layers = [int(x) for x in _get(reader, K.LAYERS, path)]
    tensors = {t.name: t for t in reader.tensors}
    names = [str(x) for x in _get(reader, K.FEATURES, path)]
    if names != list(NAMES):
        raise AdapterError(f"{path}: router features {names}, this sekv_gguf computes {list(NAMES)}")
    ws, bs, taus, thetas = [], [], [], []
    for layer in layers:
        for name, out in ((K.tensor_w(layer), ws), (K.tensor_b(layer), bs), (K.tensor_tau(layer), taus),
                          (K.tensor_theta(layer), thetas)):
            if name not in tensors:
                raise AdapterError(f"{path}: missing tensor {name!r}")
            out.append(np.array(tensors[name].data, dtype=np.float32))  # a copy: the mmap may close
    train = {f.name[len(K.TRAIN_PREFIX):]: f.contents() for f in reader.fields.values()
             if f.name.startswith(K.TRAIN_PREFIX)}
    n_head, head_dim, proj = int(_get(reader, K.N_HEAD, path)), int(_get(reader, K.HEAD_DIM, path)), \
        int(_get(reader, K.PROJ_DIM, path))
    # gguf stores shapes innermost-first; the reader's data comes back in numpy order
    ws = [w.reshape(n_head, proj, head_dim) for w in ws]
    return RouterAdapter(base=base, layers=layers, n_head=n_head, n_head_kv=int(_get(reader, K.N_HEAD_KV, path)),
                         head_dim=head_dim, proj_dim=proj, w=ws, b=[b.reshape(-1) for b in bs],
                         tau=[t.reshape(-1) for t in taus], theta=[t.reshape(n_head, N_FEATURES) for t in thetas],
                         spread_rank=int(_get(reader, K.SPREAD_RANK, path)),
                         n_centroids=int(_get(reader, K.N_CENTROIDS, path)),
                         kmeans_iters=int(_get(reader, K.KMEANS_ITERS, path)),
                         anchor_alpha=float(_get(reader, K.ANCHOR_ALPHA, path)),
                         energy=float(_get(reader, K.ENERGY, path)), train=train)
