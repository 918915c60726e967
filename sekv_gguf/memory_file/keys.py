"""Every key and tensor-name prefix of a saved memory file (docs/memory-files.md), in one place. Generic keys are
gguf-py's (``general.type``, ``general.architecture`` of the model, ``general.name``)."""

from gguf import Keys

GENERAL_TYPE = Keys.General.TYPE                  # TYPE_MEMORY
GENERAL_ARCHITECTURE = Keys.General.ARCHITECTURE  # the model's (gguf-dump shows it)
GENERAL_NAME = Keys.General.NAME                  # the model's name

TYPE_MEMORY = "sekv_memory"
FORMAT_VERSION = 4      # 4: compact files deflated and without the routing index; 3: the spans' arrays as a few
                        # flat tensors, compact files' host codes in 3 bits and device rows q8_0 (``packing``);
                        # 2: the layout zlib-compressed (base64); 1: plain JSON (all read)
READ_VERSIONS = (1, 2, 3, 4)
LAYOUT_MAX_BYTES = 256 << 20  # the most a compressed layout may inflate to (a damaged or hostile file)

VERSION = "sekv.memory.version"            # u32, FORMAT_VERSION of the writer
MODE = "sekv.memory.mode"                  # str, "lossless" or "compact"
CHECKSUM = "sekv.memory.sha256"            # str, hex sha256 over the fingerprint, the layout and every tensor
LAYOUT = "sekv.memory.layout"              # str, JSON (version 2: base64 of its zlib stream): the saved structure,
                                           # arrays as references to tensors

# the fingerprint: what a memory may only be loaded into (``fingerprint.Fingerprint``'s fields, in this order)
FP = "sekv.memory.fp."
FP_MODEL_NAME = FP + "model.name"          # str
FP_MODEL_ARCH = FP + "model.architecture"  # str
FP_MODEL_N_LAYER = FP + "model.n_layer"    # u32
FP_MODEL_N_EMBD = FP + "model.n_embd"      # u32
FP_MODEL_N_VOCAB = FP + "model.n_vocab"    # u32
FP_MODEL_TENSORS = FP + "model.tensor_hash"  # str, sha256 of the model's tensor names, shapes and types
FP_POLICY = FP + "policy"                  # str, the policy's name (POLICIES)
FP_N_CONTEXT = FP + "n_context"            # u32, the most tokens the memory holds
FP_BUDGET_CELLS = FP + "budget_cells"      # u32, device cells of the context
FP_TYPE_K = FP + "type_k"                  # u32, ggml type of the K cache
FP_TYPE_V = FP + "type_v"                  # u32
FP_N_BATCH = FP + "n_batch"                # u32
FP_N_UBATCH = FP + "n_ubatch"              # u32
FP_SETTINGS = FP + "settings"              # str, JSON of the budget and the policy's parameters and router
FP_N_TOKENS = FP + "n_tokens"              # u32, tokens the memory holds
FP_TOKENS_HASH = FP + "tokens_sha256"      # str, sha256 of those tokens (int32 little-endian)

TENSOR_PREFIX = "m."                       # every tensor: "m." + the key path of its array in the layout
TOKENS_TENSOR = TENSOR_PREFIX + "tokens"   # i32 [n_tokens]: the tokens the memory holds
NAME_MAX = 63                              # ggml's GGML_MAX_NAME less the terminating zero
