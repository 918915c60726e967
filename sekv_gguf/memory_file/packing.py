"""A saved memory's span arrays as a few flat tensors, and the smaller encodings of a compact file — applied to the
plain content on the way out (``pack``) and undone on the way in (``unpack``):

- **both modes**: every array of every span's factors (``Factors``: ``us``, ``vt``, ``raw``, ``q8``, ``scale``,
  ``q4``, ``blocks``) goes into one flat tensor per field and dtype (``memory["span_arrays"]``); the factor keeps
  the tensor's key as a mark and the array's shape (in the layout). Two arrays per span and layer would be ~20K
  tensors at 16K on Qwen2.5-Coder-1.5B, most of a file's read time; the values are unchanged (lossless stays bit
  for bit).
- **compact3, host rows in 3 bits**: every 4-bit code of the host tier (codes 0..15) becomes a 3-bit code
  ``round(c * 7 / 15)``, and its scale ``scale * 15 / 14``; the codes' tensor holds them packed (two codes of a
  byte -> 6 bits, four bytes -> three). Read back they are 4-bit codes ``2 * c3`` (0..14) with that scale: the
  same values, in the layout the native readers take, so a restored memory holds what a memory of 3-bit rows
  would. Zero points and int8 / f16 rows are kept as they are.
- **compact and compact3, device rows as q8_0**: the kept cells' f16 K and V rows (sinks, anchors, summary rows,
  window) as llama.cpp's q8_0 blocks (gguf-py's quantizer, 32 values and one f16 scale a block), widened back to
  f16 on the way in; caches of another type or heads not a whole number of blocks keep their rows.
- **compact and compact3, no routing index**: the store's block index (``blocks``, ``block_scale``,
  ``block_logn``) is left out and computed again from the host K rows on the way in
  (``SpanStore.rebuild_index``): 6% of a compact file on Qwen2.5-Coder-1.5B.
- **compact and compact3, deflated**: the flat span arrays and the device rows of ``DEFLATE_MIN`` bytes or more
  as zlib streams (Python's ``zlib``), the bytes of 2- and 4-byte values first split into planes (the exponent
  bytes of f16 scales repeat: their stream is a quarter smaller; 4-bit codes gain ~3%); inflated on the way in,
  never past the size their entry states.

What they cost is measured in ``scripts/bench_persist.py`` (the conversation's needles and answers after a restore;
3-bit codes lost a needle on Gemma 3 270M that 4-bit ones keep, so they are a mode of their own) and tested
(tests/test_memory_file.py: close to the saving process's next logits)."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .. import kv_codec
from ..span_store import INDEX_FIELDS
from ..spans import Q4_LEVELS
from .fileio import COMPACT_MODES

Q3_LEVELS = 7                                  # the largest 3-bit code
SCALE_FACTOR = Q4_LEVELS / (2 * Q3_LEVELS)     # a 4-bit scale -> the scale of the codes 2 * c3
ARRAYS_KEY = "span_arrays"  # memory[ARRAYS_KEY]: {"<field>.<dtype>": flat array}
Q3_KEY = "q4.3bit"          # compact3: the entry of the codes stored in 3 bits (packed), their bytes under Q3_COUNT
Q3_COUNT = "q4.3bit.n"
CODES = "q4.uint8"          # the 4-bit codes' entry (a factor's mark)
FIELDS = ("us", "vt", "raw", "q8", "scale", "q4", "blocks")   # the array fields of ``Factors``
DEVICE_KEY = "rows_format"  # device[DEVICE_KEY]: "q8_0" when the rows are blocks
Q8_0 = GGMLQuantizationType.Q8_0
Q8_0_BLOCK = GGML_QUANT_SIZES[Q8_0][0]  # values per q8_0 block: a head must be whole blocks
DEFLATE_KEY = "zlib"        # a deflated array: {"zlib": uint8 stream, "dtype": name, "shape": [...]}
DEFLATE_MIN = 1 << 16       # bytes: smaller arrays are stored as they are
DEFLATE_LEVEL = 1           # zlib's fastest level: within 1% of level 6 on these arrays, twice as fast
DEFLATE_DTYPES = ("uint8", "int8", "float16", "float32", "int32")  # what a deflated entry may hold
ZLIB_MAX_RATIO = 1032       # the most a zlib stream inflates per byte: a stated size past it is a lie


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


def deflate(a: np.ndarray) -> dict[str, Any]:
    """An array as a zlib stream of its bytes split into planes (byte 0 of every value, then byte 1, ...)."""
    planes = np.ascontiguousarray(a).view(np.uint8).reshape(-1, a.dtype.itemsize).T
    stream = zlib.compress(np.ascontiguousarray(planes).tobytes(), DEFLATE_LEVEL)
    return {DEFLATE_KEY: np.frombuffer(stream, dtype=np.uint8), "dtype": a.dtype.name, "shape": list(a.shape)}


def inflate(entry: dict[str, Any]) -> np.ndarray:
    """``deflate`` undone; ``ValueError`` naming what does not fit (a stream that is damaged, shorter or longer than
    its stated size, a size no stream of its bytes can hold, a type it may not hold)."""
    stream, dtype, shape = entry.get(DEFLATE_KEY), entry.get("dtype"), entry.get("shape")
    if not (isinstance(stream, np.ndarray) and stream.dtype == np.uint8 and stream.ndim == 1):
        raise ValueError("a deflated array's stream is not a uint8 vector")
    if dtype not in DEFLATE_DTYPES:
        raise ValueError(f"a deflated array of type {dtype!r} (known: {DEFLATE_DTYPES})")
    if not (isinstance(shape, list) and 1 <= len(shape) <= 4
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)):
        raise ValueError(f"a deflated array has the shape {shape!r}")
    item = np.dtype(dtype).itemsize
    size = math.prod(shape) * item                         # Python ints: a hostile shape cannot overflow
    if size > ZLIB_MAX_RATIO * stream.size + 64:
        raise ValueError(f"a deflated array states {size} bytes, more than {stream.size} stream bytes can hold")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(stream.tobytes(), max(size, 1))   # (zlib reads a max_length of 0 as no limit)
    except zlib.error as e:
        raise ValueError(f"a deflated array's stream is damaged ({e})") from e
    if len(raw) != size or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise ValueError(f"a deflated array's stream holds {'more' if len(raw) >= size else 'less'} than its "
                         f"{size} bytes")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(item, -1)
    return np.ascontiguousarray(planes.T).view(np.dtype(dtype)).reshape(shape)


def _inflated(x: Any) -> Any:
    return inflate(x) if isinstance(x, dict) and DEFLATE_KEY in x else x


def _deflated(x: Any) -> Any:
    return deflate(x) if isinstance(x, np.ndarray) and x.nbytes >= DEFLATE_MIN else x


def _factors(memory: Any) -> list[dict[str, Any]]:
    """The factor dicts (K and V) of a plain SeKV memory, in file order (none for another policy's memory)."""
    store = memory.get("store") if isinstance(memory, dict) else None
    if not isinstance(store, dict):
        return []
    return [f for sp in store["spans"] for side in ("k", "v") for f in sp[side] if isinstance(f, dict)]


def pack(content: dict[str, Any], mode: str) -> None:
    """Put ``content`` (a file's plain content, made for it: its dicts are replaced, never the memory's arrays) into
    the flat span arrays, and for the compact modes into the smaller encodings (``compact3``: the codes too)."""
    memory = content["memory"]
    factors = _factors(memory)
    groups: dict[str, list[np.ndarray]] = {}
    for f in factors:
        three = mode == "compact3" and isinstance(f.get("q4"), np.ndarray)
        if three:
            scale = f["scale"].astype(np.float32)                  # [2, ...]: (scale, zero)
            scale[0] *= SCALE_FACTOR
            f["scale"] = scale.astype(np.float16)
        for field in FIELDS:
            x = f.get(field)
            if isinstance(x, np.ndarray):
                key = Q3_KEY if three and field == "q4" else f"{field}.{x.dtype.name}"
                groups.setdefault(key, []).append(x.reshape(-1))
                f[f"shape_{field}"], f[field] = [int(n) for n in x.shape], key    # the shape in the layout
    compact = mode in COMPACT_MODES
    if groups:
        flat = {key: np.concatenate(parts) for key, parts in groups.items()}
        if Q3_KEY in flat:
            flat[Q3_KEY], flat[Q3_COUNT] = pack_codes(flat[Q3_KEY]), int(flat[Q3_KEY].size)
        memory[ARRAYS_KEY] = {key: _deflated(x) for key, x in flat.items()} if compact else flat
    if compact and isinstance(memory, dict) and isinstance(memory.get("store"), dict):
        memory["store"] = {**memory["store"], **dict.fromkeys(INDEX_FIELDS)}
    device = content["device"]
    rows = device.get("rows") if isinstance(device, dict) else None
    if compact and rows:
        if all(x.dtype == np.float16 and x.ndim == 3 and x.shape[2] % Q8_0_BLOCK == 0 for kv in rows for x in kv):
            rows = [[kv_codec.encode(x.astype(np.float32), Q8_0, x.shape[1], x.shape[2]) for x in kv] for kv in rows]
            device[DEVICE_KEY] = "q8_0"
        device["rows"] = [[_deflated(x) for x in kv] for kv in rows]


def unpack(content: dict[str, Any]) -> dict[str, Any]:
    """A file's content with ``pack`` undone (a new top-level structure: ``content`` itself, which a ``SavedMemory``
    may be restored from again, is not changed); ``ValueError`` naming what does not fit. Content of a version-1 or
    -2 file (arrays in place) comes back as it is."""
    out = dict(content)
    memory = content["memory"]
    if isinstance(memory, dict) and ARRAYS_KEY in memory:
        memory = _unpack_arrays(memory)
    elif any(isinstance(f.get(field), str) for f in _factors(memory) for field in FIELDS):
        raise ValueError("span arrays: a span's arrays are marked packed, the memory holds none")
    out["memory"] = memory
    device = content["device"]
    if isinstance(device, dict) and device.get(DEVICE_KEY) is not None:
        if device[DEVICE_KEY] != "q8_0":
            raise ValueError(f"device rows in an unknown format {device[DEVICE_KEY]!r}")
        device = {k: v for k, v in device.items() if k != DEVICE_KEY}
        device["rows"] = [[_widen(_inflated(x)) for x in kv] for kv in content["device"]["rows"]]
    elif isinstance(device, dict) and isinstance(device.get("rows"), list):
        device = {**device, "rows": [[_inflated(x) for x in kv] for kv in device["rows"]]}
    out["device"] = device
    return out


def _widen(blocks: np.ndarray) -> np.ndarray:
    """q8_0 blocks uint8 [n, Hkv, head_bytes] -> f16 [n, Hkv, d]."""
    if blocks.dtype != np.uint8 or blocks.ndim != 3:
        raise ValueError(f"q8_0 device rows must be uint8 [n, heads, bytes], got {blocks.dtype} {blocks.shape}")
    d = kv_codec.head_dim(Q8_0, blocks.shape[2])
    return kv_codec.decode(blocks, Q8_0, blocks.shape[1], d).astype(np.float16)


def _unpack_arrays(memory: dict[str, Any]) -> dict[str, Any]:
    flat = memory[ARRAYS_KEY]
    if not (isinstance(flat, dict) and all(isinstance(k, str) for k in flat)):
        raise ValueError("span arrays: the entry is not a dict of named arrays")
    flat = {key: _inflated(x) for key, x in flat.items()}
    if Q3_KEY in flat:
        n = flat.pop(Q3_COUNT, None)
        if not (isinstance(n, int) and not isinstance(n, bool) and isinstance(flat[Q3_KEY], np.ndarray)):
            raise ValueError("3-bit host codes: the packed codes or their count are missing")
        flat[Q3_KEY] = unpack_codes(flat[Q3_KEY], n)
    if not all(isinstance(a, np.ndarray) and a.ndim == 1 for a in flat.values()):
        raise ValueError("span arrays: an entry is not a flat array")
    memory = {k: v for k, v in memory.items() if k != ARRAYS_KEY}
    store = dict(memory["store"])
    store["spans"] = [{**sp, "k": [dict(f) for f in sp["k"]], "v": [dict(f) for f in sp["v"]]}
                      for sp in store["spans"]]
    memory["store"] = store
    at = dict.fromkeys(flat, 0)
    for f in _factors(memory):
        for field in FIELDS:
            if isinstance(f.get(field), str):
                f[field] = _take(f, field, flat, at)
    for key, arr in flat.items():
        if at[key] != arr.size:
            raise ValueError(f"span arrays: {arr.size} values of {key} saved, the spans take {at[key]}")
    return memory


def _take(f: dict[str, Any], field: str, flat: dict[str, np.ndarray], at: dict[str, int]) -> np.ndarray:
    """The next array of a factor's ``field`` from the flat array its mark names (its shape from the factor's
    ``shape_<field>``), advancing that array's offset in ``at``."""
    key, shape = f[field], f.pop(f"shape_{field}", None)
    if key not in flat or not key.startswith(field + "."):
        raise ValueError(f"span arrays: a span's {field} is marked {key!r}, which holds no {field}")
    if not (isinstance(shape, list) and 1 <= len(shape) <= 4
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)):
        raise ValueError(f"span arrays: a span's {field} has the shape {shape!r}")
    size = math.prod(shape)                                # Python ints: a hostile shape cannot overflow
    if at[key] + size > flat[key].size:
        raise ValueError(f"span arrays: a span's {field} {shape} runs past the {flat[key].size} values of {key}")
    out = flat[key][at[key]:at[key] + size].reshape(shape)
    at[key] += size
    return out
