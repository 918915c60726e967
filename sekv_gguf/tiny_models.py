"""Tiny random-weight GGUF models written with gguf-py, for fast tests and benchmarks.

``write_tiny_llama`` writes a full-attention llama; ``write_tiny_gemma3`` a Gemma-3-like iSWA model (sliding-window
layers with a global layer every ``swa_pattern`` layers). Both carry an SPM vocabulary with the 256 byte-fallback
tokens, so any UTF-8 text tokenizes. Weights are float32 and seeded, so a model is the same file for the same spec.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

# SPM token types (gguf.TokenType)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny model. ``swa_window``/``swa_pattern`` apply to the gemma3 architecture only."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_ctx_train: int = 65536
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    swa_window: int = 32
    swa_pattern: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_ctx_train", "swa_window",
                     "swa_pattern"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinySpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


def vocab() -> tuple[list[str], list[float], list[int]]:
    """SPM vocabulary: <unk>, <s>, </s>, 256 byte tokens, then single characters and a few words."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    pieces = ["\u2581"] + list(string.ascii_letters + string.digits + ".,:;!?'\"()-")
    words = ["the", "of", "and", "to", "in", "is", "that", "number", "magic", "city", "special", "what"]
    pieces += [f"\u2581{w}" for w in words] + [f"\u2581{c}" for c in string.ascii_lowercase]
    tokens += pieces
    types += [_NORMAL] * len(pieces)
    scores = [0.0] * (3 + 256) + [-float(len(p)) for p in pieces]
    return tokens, scores, types


def add_vocab(w: gguf.GGUFWriter) -> int:
    """Write the ``vocab()`` SPM tokenizer (with <unk> / <s> / </s> and BOS added); the number of tokens."""
    tokens, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    return len(tokens)


def _weights(spec: TinySpec, n_vocab: int, gemma: bool) -> dict[str, np.ndarray]:
    """name -> float32 array in numpy (out, in) order; gguf-py stores it as ggml [in, out]."""
    rng = np.random.default_rng(spec.seed)
    d, dh = spec.n_embd, spec.head_dim
    nq, nkv = spec.n_head * dh, spec.n_head_kv * dh

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # gemma stores (1 + w) folded by the converter: weights near 1 in both cases
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "token_embd.weight": rng.standard_normal((n_vocab, d)).astype(np.float32),
        "output_norm.weight": norm(d),
    }
    if not gemma:
        t["output.weight"] = mat(n_vocab, d)
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = norm(d)
        t[b + "attn_q.weight"] = mat(nq, d)
        t[b + "attn_k.weight"] = mat(nkv, d)
        t[b + "attn_v.weight"] = mat(nkv, d)
        t[b + "attn_output.weight"] = mat(d, nq)
        t[b + "ffn_norm.weight"] = norm(d)
        t[b + "ffn_gate.weight"] = mat(spec.n_ff, d)
        t[b + "ffn_up.weight"] = mat(spec.n_ff, d)
        t[b + "ffn_down.weight"] = mat(d, spec.n_ff)
        if gemma:
            t[b + "attn_q_norm.weight"] = norm(dh)
            t[b + "attn_k_norm.weight"] = norm(dh)
            t[b + "post_attention_norm.weight"] = norm(d)
            t[b + "post_ffw_norm.weight"] = norm(d)
    return t


def _write(path: Path, arch: str, spec: TinySpec, gemma: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    if arch == "qwen2vl":
        # M-RoPE: the rotary pairs are split between (time, height, width, extra) position sections
        half = spec.head_dim // 2
        w.add_rope_dimension_sections([half - half // 2, half // 2, 0, 0])
    if gemma:
        w.add_sliding_window(spec.swa_window)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", spec.swa_pattern)
    n_vocab = add_vocab(w)
    finish(w, _weights(spec, n_vocab, gemma))
    return path


def finish(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    """Add ``tensors`` (name -> array) to ``w`` and write the whole file."""
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_llama(path: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """A tiny full-attention llama GGUF at ``path``."""
    return _write(Path(path), "llama", spec, gemma=False)


def write_tiny_gemma3(path: str | Path, spec: TinySpec = TinySpec(n_layer=6, n_head_kv=1, head_dim=32)) -> Path:
    """A tiny Gemma-3-like iSWA GGUF at ``path``: layer il is global when (il + 1) % swa_pattern == 0."""
    return _write(Path(path), "gemma3", spec, gemma=True)


def write_tiny_mrope(path: str | Path, spec: TinySpec = TinySpec(n_head_kv=4)) -> Path:
    """A tiny Qwen2-VL-like GGUF (M-RoPE positions): a model whose KV cells carry extra data, which the hook refuses."""
    return _write(Path(path), "qwen2vl", spec, gemma=False)


def tiny_weights(spec: TinySpec, gemma: bool = False) -> dict[str, np.ndarray]:
    """The weights ``write_tiny_*`` store for ``spec`` (for reference computations in numpy)."""
    return _weights(spec, len(vocab()[0]), gemma)


# Random-weight models with the attention and layer shapes of real ones (their vocabulary stays the tiny one): what
# the GPU check and scaling benchmarks run where the real files cannot travel. KV bytes per token and attention cost
# are the real models'; the output layer is smaller, so prefill is a little faster than theirs.
SHAPED = {
    # Gemma 3 270M: 18 layers (5 sliding-window per global), 4 query heads, 1 KV head x 256, window 512
    "gemma3-270m": ("gemma3", TinySpec(n_layer=18, n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048,
                                       n_ctx_train=131072, rope_base=1e6, rms_eps=1e-6, swa_window=512,
                                       swa_pattern=6)),
    # Llama 3.2 1B: 16 layers, 32 query heads, 8 KV heads x 64, full attention
    "llama-1b": ("llama", TinySpec(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                                   n_ctx_train=131072, rope_base=5e5)),
}


def write_shaped(path: str | Path, name: str) -> Path:
    """The ``SHAPED[name]`` random-weight model at ``path``."""
    if name not in SHAPED:
        raise ValueError(f"unknown shape {name!r}; choose from {sorted(SHAPED)}")
    arch, spec = SHAPED[name]
    return _write(Path(path), arch, spec, gemma=arch == "gemma3")
