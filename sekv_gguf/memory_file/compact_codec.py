"""The lossy encodings of a compact memory file (``mode="compact"``), applied to the plain content on the way out
and undone on the way in:

- **host rows in 3 bits**: every 4-bit code of the host tier (``Factors.q4``, codes 0..15) becomes a 3-bit code
  ``round(c * 7 / 15)``, and its scale ``scale * 15 / 14``; the file holds all codes in one packed tensor (two
  codes of a byte -> 6 bits, four bytes -> three) and all scales in another (not two tensors per span and layer).
  Read back they are 4-bit codes ``2 * c3`` (0..14) with that
  scale: the same values, in the layout the native readers take, so a restored memory holds what a memory of 3-bit
  rows would. Zero points and int8 / f16 rows are kept as they are.
- **device rows as q8_0**: the kept cells' f16 K and V rows (sinks, anchors, summary rows, window) as llama.cpp's
  q8_0 blocks (gguf-py's quantizer, 32 values and one f16 scale a block), widened back to f16 on the way in; caches
  of another type or heads not a whole number of blocks keep their rows.

What it costs is measured in ``scripts/bench_persist.py`` (the conversation's needles and answers after a compact
restore) and tested (tests/test_memory_file.py: close to the saving process's next logits)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from .. import kv_codec
from ..spans import Q4_LEVELS

Q3_LEVELS = 7                                  # the largest 3-bit code
SCALE_FACTOR = Q4_LEVELS / (2 * Q3_LEVELS)     # a 4-bit scale -> the scale of the codes 2 * c3
HOST_KEY = "host_q3"   # memory[HOST_KEY]: {"codes": uint8 packed, "n": bytes of 4-bit codes, "scales": f16 [all]}
PLACEHOLDER = "q3"     # a factor's "q4" and "scale" in the file: their arrays are in memory[HOST_KEY]
DEVICE_KEY = "rows_format"                     # device[DEVICE_KEY]: "q8_0" when the rows are blocks
Q8_0 = GGMLQuantizationType.Q8_0


def _luts() -> tuple[np.ndarray, np.ndarray]:
    """A byte of two 4-bit codes -> their 3-bit codes in 6 bits; and 6 bits -> a byte of the codes ``2 * c3``."""
    b = np.arange(256)
    down = lambda c: np.rint(c * Q3_LEVELS / Q4_LEVELS).astype(np.uint8)  # noqa: E731  (no ties: 14c = 15(2k+1))
    to6 = down(b & 0x0F) | (down(b >> 4) << 3)
    s = np.arange(64)
    to8 = (2 * (s & 7)) | ((2 * (s >> 3)) << 4)
    return to6.astype(np.uint8), to8.astype(np.uint8)


TO6, TO8 = _luts()


def pack_codes(q4: np.ndarray) -> np.ndarray:
    """uint8 bytes of 4-bit code pairs [n] -> their 3-bit codes packed, uint8 [3 * ceil(n / 4)]."""
    six = np.zeros(-(-q4.size // 4) * 4, dtype=np.uint8)
    six[:q4.size] = TO6[q4.reshape(-1)]
    a, b, c, d = six.reshape(-1, 4).T                              # four 6-bit values -> 24 bits
    out = np.empty((a.size, 3), dtype=np.uint8)
    out[:, 0] = a | (b << 6)
    out[:, 1] = (b >> 2) | (c << 4)
    out[:, 2] = (c >> 4) | (d << 2)
    return out.reshape(-1)


def unpack_codes(packed: np.ndarray, n: int) -> np.ndarray:
    """``pack_codes`` undone: uint8 [n] bytes of the 4-bit codes ``2 * c3``."""
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != 3 * -(-n // 4):
        raise ValueError(f"3-bit host codes: {packed.size} bytes for {n} code pairs (want {3 * -(-n // 4)})")
    o = packed.reshape(-1, 3)
    six = np.empty((o.shape[0], 4), dtype=np.uint8)
    six[:, 0] = o[:, 0] & 0x3F
    six[:, 1] = (o[:, 0] >> 6) | ((o[:, 1] & 0x0F) << 2)
    six[:, 2] = (o[:, 1] >> 4) | ((o[:, 2] & 0x03) << 4)
    six[:, 3] = o[:, 2] >> 2
    return TO8[six.reshape(-1)[:n]]


def _q4_factors(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """The factor dicts of a plain SeKV memory whose rows are 4-bit codes (or their placeholders), in file order."""
    store = memory.get("store") if isinstance(memory, dict) else None
    if not isinstance(store, dict):
        return []
    return [f for sp in store["spans"] for side in ("k", "v") for f in sp[side]
            if isinstance(f, dict) and f.get("q4") is not None]


def pack(content: dict[str, Any]) -> None:
    """Put ``content`` (a compact file's plain content, made for it: its dicts are replaced, never the memory's
    arrays) into the compact encodings."""
    memory = content["memory"]
    factors = _q4_factors(memory)
    if factors:
        codes = np.concatenate([f["q4"].reshape(-1) for f in factors])
        scales = []
        for f in factors:
            scale = f["scale"].astype(np.float32)                  # [2, ...]: (scale, zero)
            scale[0] *= SCALE_FACTOR
            scales.append(scale.astype(np.float16).reshape(-1))
            # shapes in the layout; the arrays in two tensors (not two per span and layer: 20K at 16K on Qwen)
            f["shape_q4"], f["shape_scale"] = [int(x) for x in f["q4"].shape], [int(x) for x in f["scale"].shape]
            f["q4"] = f["scale"] = PLACEHOLDER
        memory[HOST_KEY] = {"codes": pack_codes(codes), "n": int(codes.size), "scales": np.concatenate(scales)}
    device = content["device"]
    rows = device.get("rows") if isinstance(device, dict) else None
    if rows and all(x.dtype == np.float16 and x.ndim == 3 and x.shape[2] % 32 == 0 for kv in rows for x in kv):
        device["rows"] = [[kv_codec.encode(x.astype(np.float32), Q8_0, x.shape[1], x.shape[2]) for x in kv]
                          for kv in rows]
        device[DEVICE_KEY] = "q8_0"


def unpack(content: dict[str, Any]) -> dict[str, Any]:
    """A compact file's content with its encodings undone (a new top-level structure: ``content`` itself, which a
    ``SavedMemory`` may be restored from again, is not changed); ``ValueError`` naming what does not fit."""
    out = dict(content)
    memory = content["memory"]
    if isinstance(memory, dict) and HOST_KEY in memory:
        memory = _unpack_host(memory)
    out["memory"] = memory
    device = content["device"]
    if isinstance(device, dict) and device.get(DEVICE_KEY) is not None:
        if device[DEVICE_KEY] != "q8_0":
            raise ValueError(f"device rows in an unknown format {device[DEVICE_KEY]!r}")
        device = {k: v for k, v in device.items() if k != DEVICE_KEY}
        device["rows"] = [[_widen(x) for x in kv] for kv in content["device"]["rows"]]
    out["device"] = device
    return out


def _widen(blocks: np.ndarray) -> np.ndarray:
    """q8_0 blocks uint8 [n, Hkv, head_bytes] -> f16 [n, Hkv, d]."""
    if blocks.dtype != np.uint8 or blocks.ndim != 3:
        raise ValueError(f"q8_0 device rows must be uint8 [n, heads, bytes], got {blocks.dtype} {blocks.shape}")
    d = kv_codec.head_dim(Q8_0, blocks.shape[2])
    return kv_codec.decode(blocks, Q8_0, blocks.shape[1], d).astype(np.float16)


def _unpack_host(memory: dict[str, Any]) -> dict[str, Any]:
    host = memory[HOST_KEY]
    if not (isinstance(host, dict) and isinstance(host.get("n"), int) and isinstance(host.get("codes"), np.ndarray)
            and isinstance(host.get("scales"), np.ndarray) and host["scales"].dtype == np.float16):
        raise ValueError("3-bit host codes: the entry is not {codes, n, scales}")
    codes, scales = unpack_codes(host["codes"], host["n"]), host["scales"].reshape(-1)
    memory = {k: v for k, v in memory.items() if k != HOST_KEY}
    store = dict(memory["store"])
    store["spans"] = [{**sp, "k": [dict(f) for f in sp["k"]], "v": [dict(f) for f in sp["v"]]}
                      for sp in store["spans"]]
    memory["store"] = store
    at = {"q4": 0, "scale": 0}
    flat = {"q4": codes, "scale": scales}
    for f in _q4_factors(memory):
        for key, ndim in (("q4", 3), ("scale", (3, 4))):
            f[key] = _take(f, key, ndim, flat[key], at)
    for key, arr in flat.items():
        if at[key] != arr.size:
            raise ValueError(f"3-bit host codes: {arr.size} {key} values packed, the spans take {at[key]}")
    return memory


def _take(f: dict[str, Any], key: str, ndim: int | tuple[int, ...], flat: np.ndarray, at: dict[str, int]) -> np.ndarray:
    """The next array of a factor's ``key`` from ``flat`` (its shape from the factor's ``shape_<key>``), advancing
    ``at[key]``."""
    shape = f.pop(f"shape_{key}", None)
    if not (isinstance(f.get(key), str) and f[key] == PLACEHOLDER and isinstance(shape, list)):
        raise ValueError(f"3-bit host codes: a span's {key} is neither packed nor marked")
    if not (len(shape) in ((ndim,) if isinstance(ndim, int) else ndim)
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)):
        raise ValueError(f"3-bit host codes: a span's {key} has the shape {shape!r}")
    size = math.prod(shape)                                # Python ints: a hostile shape cannot overflow
    if at[key] + size > flat.size:
        raise ValueError(f"3-bit host codes: a span's {key} {shape} runs past the {flat.size} packed")
    out = flat[at[key]:at[key] + size].reshape(shape)
    at[key] += size
    return out
