"""Every key and tensor name of a SeKV router adapter (docs/design.md §4), in one place. The generic keys are gguf-py's
(``general.type = adapter``, ``general.architecture`` of the base model, ``general.name``, ``adapter.type``)."""

from gguf import GGUFType, Keys

GENERAL_TYPE = Keys.General.TYPE                  # GGUFType.ADAPTER
GENERAL_ARCHITECTURE = Keys.General.ARCHITECTURE  # copied from the base model
GENERAL_NAME = Keys.General.NAME
ADAPTER_TYPE = Keys.Adapter.TYPE                  # TYPE_SEKV_ROUTER

TYPE_ADAPTER = GGUFType.ADAPTER
TYPE_SEKV_ROUTER = "sekv_router"

VERSION = "sekv.version"                       # u32, this format's version
PROJ_DIM = "sekv.proj_dim"                     # u32, P
SPREAD_RANK = "sekv.spread_rank"               # u32, r: principal directions of each span's keys the router reads
N_CENTROIDS = "sekv.n_centroids"               # u32, k-means centroids per span (spans.centroids)
KMEANS_ITERS = "sekv.kmeans_iters"             # u32, their Lloyd steps
FEATURES = "sekv.features"                     # [str] names of the span features theta weighs (features.NAMES)
LAYERS = "sekv.layers"                         # [i32] model layer index of each hooked layer
N_HEAD = "sekv.n_head"                         # u32
N_HEAD_KV = "sekv.n_head_kv"                   # u32
HEAD_DIM = "sekv.head_dim"                     # u32
# older format-2 files (bench/gemma3-270m-router.gguf) also hold sekv.anchor_alpha and sekv.energy (f32, SekvConfig's
# defaults, never applied); the reader ignores them

BASE_N_LAYER = "sekv.base.n_layer"             # u32
BASE_N_EMBD = "sekv.base.n_embd"               # u32
BASE_N_VOCAB = "sekv.base.n_vocab"             # u32
BASE_N_PARAMS = "sekv.base.n_params"           # u64
BASE_TENSOR_HASH = "sekv.base.tensor_hash"     # str, sha256 of the base model's tensor names, shapes and types
BASE_NAME = "sekv.base.name"                   # str

TRAIN_PREFIX = "sekv.train."                   # provenance: sekv.train.<name> (strings and numbers)

FORMAT_VERSION = 2  # 2: span features (theta) from key sketches

# per hooked layer (model layer index ``layer``), by RouterAdapter attribute, in file order
TENSORS = {
    "w": "blk.{layer}.sekv_router_w",          # f32 [n_head, P, head_dim] projections
    "b": "blk.{layer}.sekv_router_b",          # f32 [n_head] biases
    "tau": "blk.{layer}.sekv_router_tau",      # f32 [n_head] zoom thresholds
    "theta": "blk.{layer}.sekv_router_theta",  # f32 [n_head, n_features] weights of the span features
}

# a model that carries its router (``embed``): the adapter's keys above in the model's own metadata, and per hooked
# layer its weights as f32 arrays under these keys (llama.cpp ignores keys it does not know; an extra tensor it
# would refuse)
EMBEDDED = {attr: "sekv.router.blk.{layer}." + attr for attr in TENSORS}
