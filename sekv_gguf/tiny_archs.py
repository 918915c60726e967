"""Tiny random-weight GGUF models of many llama.cpp architectures: the architecture matrix (tests/test_arch_matrix.py).

``ARCHS`` maps an architecture's llama.cpp name to an ``ArchSpec``: its gguf-py ``MODEL_ARCH``, its top-level and
per-block tensors (gguf-py ``MODEL_TENSOR`` kinds with symbolic shapes), the hyperparameter keys it adds to or
overrides in the common ones (``gguf.Keys`` templates), and whether SeKV is expected to serve it. ``write_tiny_arch``
writes one with the SPM vocabulary of ``tiny_models``. Tensor names come from ``gguf.TENSOR_NAMES`` and must be in
``gguf.MODEL_TENSORS`` for the architecture; weights are float32 and seeded, so a name gives the same file each time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Union

import gguf
import numpy as np

from .tiny_models import TinySpec, add_vocab, finish, vocab

T = gguf.MODEL_TENSOR
K = gguf.Keys

Init = Literal["auto", "negative"]
Blocks = Literal["all", "attention", "recurrent"]


@dataclass(frozen=True)
class Dim:
    """A key value taken from the architecture's dimensions (``dims``), so that keys and shapes cannot disagree."""

    name: str


KeyValue = Union[bool, int, float, tuple, Dim]


@dataclass(frozen=True)
class Tensor:
    """One tensor: ``shape`` names dimensions in numpy order, outermost first ((out, in) for a matrix, (expert, out,
    in) for stacked experts); gguf-py stores it reversed, as ggml's [in, out, expert]."""

    kind: gguf.MODEL_TENSOR
    shape: tuple[str, ...]
    suffix: str = "weight"  # "weight", "bias", or "" (ssm_a / ssm_d carry none)
    init: Init = "auto"     # auto: embedding, norm (near 1), bias (small) or matrix (1/sqrt(fan-in)) by kind and rank
    blocks: Blocks = "all"  # in a hybrid model: every block, attention blocks only or recurrent blocks only


@dataclass(frozen=True)
class ArchSpec:
    """A tiny model of one llama.cpp architecture.

    ``keys`` are added to (or override) the common hyperparameters; ``dims`` name the extra sizes the shapes and keys
    use; ``recurrent_blocks`` are the blocks without attention in a hybrid model (head_count_kv 0 there).
    ``refusal`` is None for an architecture SeKV serves, else a regular expression the refusal's reason must match.
    """

    arch: gguf.MODEL_ARCH
    special: str
    blocks: tuple[Tensor, ...]
    top: tuple[Tensor, ...]
    keys: tuple[tuple[str, KeyValue], ...] = ()
    dims: tuple[tuple[str, int], ...] = ()
    norm: Literal["rms", "layer"] = "rms"
    shape: TinySpec = field(default_factory=TinySpec)
    recurrent_blocks: frozenset[int] = frozenset()
    refusal: str | None = None

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]

    @property
    def supported(self) -> bool:
        return self.refusal is None


def _w(kind: gguf.MODEL_TENSOR, *shape: str, **kw: object) -> Tensor:
    return Tensor(kind, shape, **kw)  # type: ignore[arg-type]


def _b(kind: gguf.MODEL_TENSOR, *shape: str, **kw: object) -> Tensor:
    return Tensor(kind, shape, suffix="bias", **kw)  # type: ignore[arg-type]


def _wb(kind: gguf.MODEL_TENSOR, out: str, *inp: str) -> tuple[Tensor, Tensor]:
    """Weight and bias of a layer with ``out`` outputs."""
    return _w(kind, out, *inp), _b(kind, out)


# -- building blocks (shapes in numpy order) ---------------------------------------------------------------------

EMBED = _w(T.TOKEN_EMBD, "vocab", "embd")
OUT_NORM = _w(T.OUTPUT_NORM, "embd")
OUTPUT = _w(T.OUTPUT, "vocab", "embd")
TOP = (EMBED, OUT_NORM, OUTPUT)
TOP_TIED = (EMBED, OUT_NORM)  # the output layer is the token embedding
TOP_LAYERNORM = (EMBED, *_wb(T.OUTPUT_NORM, "embd"), OUTPUT)

QKV = (_w(T.ATTN_Q, "q", "embd"), _w(T.ATTN_K, "kv", "embd"), _w(T.ATTN_V, "kv", "embd"))
QKV_BIASES = (_b(T.ATTN_Q, "q"), _b(T.ATTN_K, "kv"), _b(T.ATTN_V, "kv"))
ATTN_OUT = _w(T.ATTN_OUT, "embd", "q")
ATTN = (*QKV, ATTN_OUT)
QK_HEAD_NORMS = (_w(T.ATTN_Q_NORM, "head"), _w(T.ATTN_K_NORM, "head"))
GATED_FFN = (_w(T.FFN_GATE, "ff", "embd"), _w(T.FFN_UP, "ff", "embd"), _w(T.FFN_DOWN, "embd", "ff"))
PRE_NORMS = (_w(T.ATTN_NORM, "embd"), _w(T.FFN_NORM, "embd"))
POST_NORMS = (_w(T.ATTN_POST_NORM, "embd"), _w(T.FFN_POST_NORM, "embd"))
LLAMA_BLOCK = (*PRE_NORMS, *ATTN, *GATED_FFN)
GEMMA_BLOCK = (_w(T.ATTN_NORM, "embd"), _w(T.FFN_PRE_NORM, "embd"), *ATTN, *GATED_FFN, *POST_NORMS)

ISWA = TinySpec(n_layer=4, swa_window=32)
GEMMA3_SHAPE = TinySpec(n_layer=6, n_head_kv=1, head_dim=32)
ROPE_PARTIAL = 4  # StableLM's rotary share of a head: 1/4 of its dimensions
# general.name of every tiny model: llama.cpp sets token attributes by model name ("phi3" in it: Phi-3's special
# tokens, which the tiny vocabulary lacks), so the name carries no architecture
MODEL_NAME = "tiny random-weight model"


@dataclass(frozen=True)
class MoeShape:
    """A mixture-of-experts FFN: ``n_expert`` experts of ``n_ff`` hidden units, ``n_used`` of them per token."""

    n_expert: int = 4
    n_used: int = 2
    n_ff: int = 32

    def dims(self) -> tuple[tuple[str, int], ...]:
        return ("experts", self.n_expert), ("ff_exp", self.n_ff)


@dataclass(frozen=True)
class MlaShape:
    """DeepSeek-V2's multi-head latent attention: the cached row is the KV latent (rank ``kv_lora``) and the rotary
    key part (``rope``); per head, q/k carry ``nope`` plain and ``rope`` rotary dimensions, v ``v_head``."""

    kv_lora: int = 32
    rope: int = 8
    nope: int = 16
    v_head: int = 16

    def dims(self, n_head: int) -> tuple[tuple[str, int], ...]:
        k_head = self.nope + self.rope
        return (("kv_lora", self.kv_lora), ("kv_a", self.kv_lora + self.rope), ("nope", self.nope),
                ("rope", self.rope), ("k_mla", k_head), ("v_mla", self.v_head), ("q_mla", n_head * k_head),
                ("o_mla", n_head * self.v_head))


@dataclass(frozen=True)
class SsmShape:
    """Mamba's selective state space block (llama.cpp supports an inner size of 2 x n_embd only)."""

    d_inner: int = 2 * TinySpec().n_embd
    d_conv: int = 4
    d_state: int = 16
    dt_rank: int = 4

    def dims(self) -> tuple[tuple[str, int], ...]:
        return (("d_inner", self.d_inner), ("in_proj", 2 * self.d_inner), ("d_conv", self.d_conv),
                ("d_state", self.d_state), ("dt_rank", self.dt_rank), ("x_proj", self.dt_rank + 2 * self.d_state))


@dataclass(frozen=True)
class HybridShape:
    """LFM2's hybrid stack: ``recurrent`` blocks are short convolutions over the last ``conv_cache`` tokens."""

    n_layer: int = 3
    recurrent: frozenset[int] = frozenset({0, 2})
    conv_cache: int = 3

    def dims(self) -> tuple[tuple[str, int], ...]:
        return ("conv_cache", self.conv_cache), ("embd3", 3 * TinySpec().n_embd)


MOE, MLA, SSM, HYBRID = MoeShape(), MlaShape(), SsmShape(), HybridShape()
T5_REL_BUCKETS = 32  # T5's relative-position buckets

T5_ENCODER = (_w(T.ENC_ATTN_NORM, "embd"), _w(T.ENC_ATTN_REL_B, "rel_buckets", "n_head"),
              _w(T.ENC_ATTN_Q, "q", "embd"), _w(T.ENC_ATTN_K, "kv", "embd"), _w(T.ENC_ATTN_V, "kv", "embd"),
              _w(T.ENC_ATTN_OUT, "embd", "kv"), _w(T.ENC_FFN_NORM, "embd"), _w(T.ENC_FFN_UP, "ff", "embd"),
              _w(T.ENC_FFN_DOWN, "embd", "ff"))
T5_DECODER = (_w(T.DEC_ATTN_NORM, "embd"), _w(T.DEC_ATTN_REL_B, "rel_buckets", "n_head"),
              _w(T.DEC_ATTN_Q, "q", "embd"), _w(T.DEC_ATTN_K, "kv", "embd"), _w(T.DEC_ATTN_V, "kv", "embd"),
              _w(T.DEC_ATTN_OUT, "embd", "kv"),
              _w(T.DEC_CROSS_ATTN_NORM, "embd"), _w(T.DEC_CROSS_ATTN_Q, "q", "embd"),
              _w(T.DEC_CROSS_ATTN_K, "kv", "embd"), _w(T.DEC_CROSS_ATTN_V, "kv", "embd"),
              _w(T.DEC_CROSS_ATTN_OUT, "embd", "kv"),
              _w(T.DEC_FFN_NORM, "embd"), _w(T.DEC_FFN_UP, "ff", "embd"), _w(T.DEC_FFN_DOWN, "embd", "ff"))


_SPECS = (
    ArchSpec(gguf.MODEL_ARCH.LLAMA, "standard GQA, RoPE on the whole head", LLAMA_BLOCK, TOP),
    ArchSpec(gguf.MODEL_ARCH.QWEN2, "q/k/v projection biases", (*LLAMA_BLOCK, *QKV_BIASES), TOP),
    ArchSpec(gguf.MODEL_ARCH.QWEN3, "per-head RMS norm of q and k before RoPE", (*LLAMA_BLOCK, *QK_HEAD_NORMS),
             TOP),
    ArchSpec(gguf.MODEL_ARCH.QWEN3MOE, f"mixture of experts FFN ({MOE.n_expert} experts, {MOE.n_used} used), q/k norms",
             (*PRE_NORMS, *ATTN, *QK_HEAD_NORMS, _w(T.FFN_GATE_INP, "experts", "embd"),
              _w(T.FFN_GATE_EXP, "experts", "ff_exp", "embd"), _w(T.FFN_UP_EXP, "experts", "ff_exp", "embd"),
              _w(T.FFN_DOWN_EXP, "experts", "embd", "ff_exp")), TOP,
             keys=((K.LLM.EXPERT_COUNT, Dim("experts")), (K.LLM.EXPERT_USED_COUNT, MOE.n_used),
                   (K.LLM.EXPERT_FEED_FORWARD_LENGTH, Dim("ff_exp"))), dims=MOE.dims()),
    ArchSpec(gguf.MODEL_ARCH.PHI3, "fused qkv projection, fused gate+up FFN",
             (*PRE_NORMS, _w(T.ATTN_QKV, "qkv", "embd"), ATTN_OUT, _w(T.FFN_UP, "ff2", "embd"),
              _w(T.FFN_DOWN, "embd", "ff")), TOP),
    ArchSpec(gguf.MODEL_ARCH.GEMMA2, "attention and final logit softcapping; iSWA (sliding window on every other "
             "layer): the global layers' cache is hooked", GEMMA_BLOCK, TOP_TIED,
             keys=((K.Attention.SLIDING_WINDOW, ISWA.swa_window), (K.LLM.ATTN_LOGIT_SOFTCAPPING, 50.0),
                   (K.LLM.FINAL_LOGIT_SOFTCAPPING, 30.0)), shape=ISWA),
    ArchSpec(gguf.MODEL_ARCH.GEMMA3, "iSWA (5 sliding-window layers per global one), q/k norms, one KV head of 32",
             (*GEMMA_BLOCK, *QK_HEAD_NORMS), TOP_TIED,
             keys=((K.Attention.SLIDING_WINDOW, GEMMA3_SHAPE.swa_window),
                   (K.Attention.SLIDING_WINDOW_PATTERN, GEMMA3_SHAPE.swa_pattern)), shape=GEMMA3_SHAPE),
    ArchSpec(gguf.MODEL_ARCH.GRANITE, "embedding, residual, attention and logit scale factors", LLAMA_BLOCK, TOP,
             keys=((K.LLM.LOGIT_SCALE, 4.0), (K.LLM.RESIDUAL_SCALE, 0.5), (K.LLM.EMBEDDING_SCALE, 2.0),
                   (K.Attention.SCALE, 0.2))),
    ArchSpec(gguf.MODEL_ARCH.OLMO2, "RMS norm of the whole q and k projections, norms after attention and FFN only",
             (*ATTN, _w(T.ATTN_Q_NORM, "q"), _w(T.ATTN_K_NORM, "kv"), *GATED_FFN, *POST_NORMS), TOP),
    ArchSpec(gguf.MODEL_ARCH.STARCODER2, "LayerNorm with biases, biases everywhere, non-gated GELU FFN",
             (*_wb(T.ATTN_NORM, "embd"), *ATTN, *QKV_BIASES, _b(T.ATTN_OUT, "embd"), *_wb(T.FFN_NORM, "embd"),
              *_wb(T.FFN_UP, "ff", "embd"), *_wb(T.FFN_DOWN, "embd", "ff")), TOP_LAYERNORM, norm="layer"),
    ArchSpec(gguf.MODEL_ARCH.COMMAND_R, "parallel attention and FFN from one LayerNorm, logit scale, tied output",
             (_w(T.ATTN_NORM, "embd"), *ATTN, *GATED_FFN), TOP_TIED, keys=((K.LLM.LOGIT_SCALE, 0.5),),
             norm="layer"),
    ArchSpec(gguf.MODEL_ARCH.MISTRAL3, "Mistral 3 text model (llama-like GQA)", LLAMA_BLOCK, TOP),
    ArchSpec(gguf.MODEL_ARCH.STABLELM, f"partial RoPE (1/{ROPE_PARTIAL} of each head rotated), LayerNorm with "
             "biases", (*_wb(T.ATTN_NORM, "embd"), *ATTN, *QKV_BIASES, *_wb(T.FFN_NORM, "embd"), *GATED_FFN),
             TOP_LAYERNORM, keys=((K.Rope.DIMENSION_COUNT, TinySpec().head_dim // ROPE_PARTIAL),), norm="layer"),
    # refused
    ArchSpec(gguf.MODEL_ARCH.DEEPSEEK2, f"MLA: one latent K row per token (rank {MLA.kv_lora} + RoPE {MLA.rope}), V "
             "read from it",
             (*PRE_NORMS, _w(T.ATTN_KV_A_NORM, "kv_lora"), _w(T.ATTN_Q, "q_mla", "embd"),
              _w(T.ATTN_KV_A_MQA, "kv_a", "embd"), _w(T.ATTN_K_B, "n_head", "kv_lora", "nope"),
              _w(T.ATTN_V_B, "n_head", "v_mla", "kv_lora"), _w(T.ATTN_OUT, "embd", "o_mla"), *GATED_FFN), TOP,
             keys=((K.Attention.Q_LORA_RANK, 0), (K.Attention.KV_LORA_RANK, Dim("kv_lora")),
                   (K.Attention.KEY_LENGTH_MLA, Dim("k_mla")), (K.Attention.VALUE_LENGTH_MLA, Dim("v_mla")),
                   (K.Attention.KEY_LENGTH, Dim("kv_a")), (K.Attention.VALUE_LENGTH, Dim("kv_lora")),
                   (K.Attention.HEAD_COUNT_KV, 1), (K.Rope.DIMENSION_COUNT, Dim("rope")),
                   (K.LLM.LEADING_DENSE_BLOCK_COUNT, TinySpec().n_layer),  # every block dense: no experts to write
                   (K.LLM.EXPERT_FEED_FORWARD_LENGTH, MOE.n_ff), (K.LLM.EXPERT_SHARED_COUNT, 1)),
             dims=MLA.dims(TinySpec().n_head), refusal=r"no separate V \(MLA\)"),
    ArchSpec(gguf.MODEL_ARCH.MAMBA, "recurrent: a fixed-size SSM state per sequence, no per-token K/V",
             (_w(T.ATTN_NORM, "embd"), _w(T.SSM_IN, "in_proj", "embd"), *_wb(T.SSM_CONV1D, "d_inner", "d_conv"),
              _w(T.SSM_X, "x_proj", "d_inner"), *_wb(T.SSM_DT, "d_inner", "dt_rank"),
              _w(T.SSM_A, "d_inner", "d_state", suffix="", init="negative"), _w(T.SSM_D, "d_inner", suffix=""),
              _w(T.SSM_OUT, "embd", "d_inner")), TOP,
             keys=((K.SSM.CONV_KERNEL, Dim("d_conv")), (K.SSM.INNER_SIZE, Dim("d_inner")),
                   (K.SSM.STATE_SIZE, Dim("d_state")), (K.SSM.TIME_STEP_RANK, Dim("dt_rank"))),
             dims=SSM.dims(), refusal=r"not an attention KV cache.*recurrent"),
    ArchSpec(gguf.MODEL_ARCH.LFM2, "hybrid: short-convolution blocks (recurrent state) between attention blocks",
             (*PRE_NORMS, *GATED_FFN, *(replace(t, blocks="attention") for t in (*QKV, ATTN_OUT, *QK_HEAD_NORMS)),
              _w(T.SHORTCONV_CONV, "embd", "conv_cache", blocks="recurrent"),
              _w(T.SHORTCONV_INPROJ, "embd3", "embd", blocks="recurrent"),
              _w(T.SHORTCONV_OUTPROJ, "embd", "embd", blocks="recurrent")),
             (EMBED, _w(T.TOKEN_EMBD_NORM, "embd"), OUTPUT),  # LFM2's final norm is stored as token_embd_norm
             keys=((K.ShortConv.L_CACHE, Dim("conv_cache")),),
             dims=HYBRID.dims(), shape=TinySpec(n_layer=HYBRID.n_layer), recurrent_blocks=HYBRID.recurrent,
             refusal=r"not an attention KV cache.*hybrid"),
    ArchSpec(gguf.MODEL_ARCH.T5, "encoder-decoder: the decoder's cross-attention reads the encoder's output, "
             "which is outside the KV cache", (*T5_ENCODER, *T5_DECODER),
             (EMBED, _w(T.ENC_OUTPUT_NORM, "embd"), _w(T.DEC_OUTPUT_NORM, "embd"), OUTPUT),
             keys=((K.Attention.REL_BUCKETS_COUNT, Dim("rel_buckets")),),
             dims=(("rel_buckets", T5_REL_BUCKETS),),
             shape=TinySpec(n_head_kv=TinySpec().n_head), refusal=r"encoder-decoder"),
)

ARCHS: dict[str, ArchSpec] = {s.name: s for s in _SPECS}
SUPPORTED = [name for name, s in ARCHS.items() if s.supported]
REFUSED = [name for name, s in ARCHS.items() if not s.supported]


# -- writing -----------------------------------------------------------------------------------------------------

def _dims(a: ArchSpec, n_vocab: int) -> dict[str, int]:
    s = a.shape
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    return {"vocab": n_vocab, "embd": s.n_embd, "n_head": s.n_head, "head": s.head_dim, "q": q, "kv": kv,
            "qkv": q + 2 * kv, "ff": s.n_ff, "ff2": 2 * s.n_ff, **dict(a.dims)}


def _keys(a: ArchSpec, dims: dict[str, int]) -> dict[str, KeyValue]:
    """Every hyperparameter key (templates with ``{arch}``): the common ones, then the architecture's."""
    s = a.shape
    head_count_kv: KeyValue = s.n_head_kv
    if a.recurrent_blocks:
        head_count_kv = tuple(0 if il in a.recurrent_blocks else s.n_head_kv for il in range(s.n_layer))
    eps = K.Attention.LAYERNORM_RMS_EPS if a.norm == "rms" else K.Attention.LAYERNORM_EPS
    keys: dict[str, KeyValue] = {
        K.LLM.CONTEXT_LENGTH: s.n_ctx_train, K.LLM.EMBEDDING_LENGTH: s.n_embd, K.LLM.BLOCK_COUNT: s.n_layer,
        K.LLM.FEED_FORWARD_LENGTH: s.n_ff, K.Attention.HEAD_COUNT: s.n_head, K.Attention.HEAD_COUNT_KV: head_count_kv,
        K.Attention.KEY_LENGTH: s.head_dim, K.Attention.VALUE_LENGTH: s.head_dim,
        K.Rope.DIMENSION_COUNT: s.head_dim, K.Rope.FREQ_BASE: s.rope_base, eps: s.rms_eps}
    keys.update(a.keys)
    return {k: dims[v.name] if isinstance(v, Dim) else v for k, v in keys.items()}


def _add_key(w: gguf.GGUFWriter, key: str, value: KeyValue) -> None:
    if isinstance(value, bool):  # before int: a bool is an int
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, tuple):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"hyperparameter {key}: cannot write a {type(value).__name__}")


def _array(t: Tensor, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 [shape]: seeded values of the right scale for the tensor's role."""
    noise = rng.standard_normal(shape)
    if t.init == "negative":  # an SSM's A: decay rates, -exp(.) < 0
        return (-np.exp(0.1 * noise)).astype(np.float32)
    if t.kind == T.TOKEN_EMBD:
        return noise.astype(np.float32)
    if t.suffix == "bias":
        return (0.1 * noise).astype(np.float32)
    if len(shape) == 1:  # norm weights (and an SSM's D): near 1
        return (1.0 + 0.1 * noise).astype(np.float32)
    return (noise / np.sqrt(shape[-1])).astype(np.float32)  # [..., out, in] / sqrt(fan-in)


def _tensor_name(a: ArchSpec, t: Tensor, bid: int | None) -> str:
    if t.kind not in gguf.MODEL_TENSORS[a.arch]:
        raise ValueError(f"{a.name}: gguf-py has no tensor {t.kind.name} for this architecture")
    base = gguf.TENSOR_NAMES[t.kind] if bid is None else gguf.TENSOR_NAMES[t.kind].format(bid=bid)
    return f"{base}.{t.suffix}" if t.suffix else base


def arch_tensors(a: ArchSpec) -> dict[str, np.ndarray]:
    """The tensors ``write_arch(path, a)`` stores: GGUF name -> float32 array in numpy order."""
    dims = _dims(a, len(vocab()[0]))
    rng = np.random.default_rng(a.shape.seed)
    out = {_tensor_name(a, t, None): _array(t, tuple(dims[d] for d in t.shape), rng) for t in a.top}
    for il in range(a.shape.n_layer):
        kind = "recurrent" if il in a.recurrent_blocks else "attention"
        for t in a.blocks:
            if t.blocks in ("all", kind):
                out[_tensor_name(a, t, il)] = _array(t, tuple(dims[d] for d in t.shape), rng)
    return out


def arch_spec(name: str) -> ArchSpec:
    """``ARCHS[name]``, or a ValueError listing the names there are."""
    if name not in ARCHS:
        raise ValueError(f"no tiny model of architecture {name!r}; choose from {sorted(ARCHS)}")
    return ARCHS[name]


def write_arch(path: str | Path, a: ArchSpec) -> Path:
    """The tiny model ``a`` as a GGUF file at ``path``."""
    tensors = arch_tensors(a)  # first: a tensor gguf-py does not know for the architecture fails before any file
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(p), a.name)
    w.add_name(MODEL_NAME)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = add_vocab(w)
    for key, value in _keys(a, _dims(a, n_vocab)).items():
        _add_key(w, key.format(arch=a.name), value)
    finish(w, tensors)
    return p


def write_tiny_arch(path: str | Path, name: str) -> Path:
    """The tiny ``ARCHS[name]`` model as a GGUF file at ``path``."""
    return write_arch(path, arch_spec(name))
