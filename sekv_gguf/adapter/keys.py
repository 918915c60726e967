"""Every key and tensor name of a SeKV router adapter (DESIGN.md §4), in one place (as gguf-py's constants)."""

GENERAL_TYPE = "general.type"                  # "adapter"
GENERAL_ARCHITECTURE = "general.architecture"  # copied from the base model
GENERAL_NAME = "general.name"
ADAPTER_TYPE = "adapter.type"                  # "sekv_router"

TYPE_ADAPTER = "adapter"
TYPE_SEKV_ROUTER = "sekv_router"

VERSION = "sekv.version"                       # u32, this format's version
PROJ_DIM = "sekv.proj_dim"                     # u32, P
SPREAD_RANK = "sekv.spread_rank"               # u32, r: principal directions of each span's keys the router reads
N_CENTROIDS = "sekv.n_centroids"               # u32, k-means centroids per span (spans.centroids)
KMEANS_ITERS = "sekv.kmeans_iters"             # u32, their Lloyd steps
FEATURES = "sekv.features"                     # [str] names of the span features theta weighs (features.NAMES)
LAYERS = "sekv.layers"                         # [u32] model layer index of each hooked layer
N_HEAD = "sekv.n_head"                         # u32
N_HEAD_KV = "sekv.n_head_kv"                   # u32
HEAD_DIM = "sekv.head_dim"                     # u32
ANCHOR_ALPHA = "sekv.anchor_alpha"             # f32, tuned anchor threshold
ENERGY = "sekv.energy"                         # f32, tuned rank energy threshold

BASE_N_LAYER = "sekv.base.n_layer"             # u32
BASE_N_EMBD = "sekv.base.n_embd"               # u32
BASE_N_VOCAB = "sekv.base.n_vocab"             # u32
BASE_N_PARAMS = "sekv.base.n_params"           # u64
BASE_TENSOR_HASH = "sekv.base.tensor_hash"     # str, sha256 of the base model's tensor names, shapes and types
BASE_NAME = "sekv.base.name"                   # str

TRAIN_PREFIX = "sekv.train."                   # provenance: sekv.train.<name> (strings and numbers)

FORMAT_VERSION = 2  # 2: span features (theta) from key sketches


def tensor_w(layer: int) -> str:
    """f32 [n_head, P, head_dim] projections of model layer ``layer``."""
    return f"blk.{layer}.sekv_router_w"


def tensor_b(layer: int) -> str:
    """f32 [n_head] biases."""
    return f"blk.{layer}.sekv_router_b"


def tensor_tau(layer: int) -> str:
    """f32 [n_head] zoom thresholds."""
    return f"blk.{layer}.sekv_router_tau"



def tensor_theta(layer: int) -> str:
    """f32 [n_head, n_features] weights of the span features."""
    return f"blk.{layer}.sekv_router_theta"
