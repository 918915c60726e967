"""K/V cache rows as numbers: what the hook's rows of each cache element type mean, and how numbers go back.

f16 and f32 rows are numbers already ([n, n_head_kv, head_dim]); q8_0 and q4_0 rows are ggml blocks (per head,
``head_dim / block`` blocks of an f16 scale and the codes), which the hook hands over as bytes [n, row_bytes].
``decode`` widens blocks to f32 with gguf-py's dequantizer, ``encode`` quantizes numbers into blocks with gguf-py's
quantizer (the layout ggml reads). Dequantising and quantising again is not byte-stable in general, so whoever must
put rows back exactly keeps the blocks themselves (``Factors.blocks``, ``policies/snapshot.py``, ``transfer.py``).

A quantized cache of head size a multiple of 64 stores K and V Hadamard-rotated (llama.cpp's ``attn_rot_k`` /
``attn_rot_v``; ``KVInfo.rot_k`` / ``rot_v``), and the query the hook captures is rotated with K, so the decoded rows
and the captured query share one basis: every score ``query @ k_row`` is the attention logit, every mean or
factorisation of rows is one in that basis and goes back into it (docs/quantized-kv.md).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants

# element types whose rows are numbers (the hook hands them over as these dtypes)
NUMBER_DTYPES = {GGMLQuantizationType.F32: np.dtype(np.float32), GGMLQuantizationType.F16: np.dtype(np.float16)}


def is_block(type_id: int) -> bool:
    """Whether rows of ggml type ``type_id`` are blocks (bytes) rather than numbers."""
    return GGMLQuantizationType(type_id) not in NUMBER_DTYPES


def block_values(type_id: int) -> int:
    """Values per block of ggml type ``type_id`` (1 for f16 / f32)."""
    return GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][0]


def head_bytes(type_id: int, head_dim: int) -> int:
    """Bytes of one head's ``head_dim`` values in ggml type ``type_id`` (a whole number of blocks)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    if head_dim % block:
        raise ValueError(f"head size {head_dim} is not a multiple of the {block}-value blocks of "
                         f"{GGMLQuantizationType(type_id).name.lower()}")
    return head_dim // block * size


def head_dim(type_id: int, n_bytes: int) -> int:
    """Values of one head whose blocks of ggml type ``type_id`` take ``n_bytes`` (``head_bytes`` inverted)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    return n_bytes // size * block


def decode(rows: np.ndarray, type_id: int, n_head_kv: int, head_dim: int) -> np.ndarray:
    """Rows as the hook returns them for type ``type_id`` -> numbers [n, n_head_kv, head_dim]: f16 / f32 rows
    unchanged (reshaped), blocks [n, row_bytes] (or [n, n_head_kv, head_bytes]) dequantized to f32."""
    n = rows.shape[0]
    if not is_block(type_id):
        return rows.reshape(n, n_head_kv, head_dim)
    blocks = np.ascontiguousarray(rows, dtype=np.uint8).reshape(n, n_head_kv, head_bytes(type_id, head_dim))
    return quants.dequantize(blocks, GGMLQuantizationType(type_id))            # f32 [n, Hkv, d]


def encode(values: np.ndarray, type_id: int, n_head_kv: int, head_dim: int) -> np.ndarray:
    """Numbers [n, n_head_kv, head_dim] (or [n, n_head_kv * head_dim]) -> rows as the hook's ``set_rows`` takes them
    for type ``type_id``: f16 / f32 [n, Hkv, d], or blocks uint8 [n, Hkv, head_bytes] quantized per head."""
    n = values.shape[0]
    x = values.reshape(n, n_head_kv, head_dim)
    if not is_block(type_id):
        return np.ascontiguousarray(x, dtype=NUMBER_DTYPES[GGMLQuantizationType(type_id)])
    head_bytes(type_id, head_dim)  # a head must be whole blocks
    return quants.quantize(np.ascontiguousarray(x, dtype=np.float32), GGMLQuantizationType(type_id))
