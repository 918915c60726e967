"""Plain data (what ``PolicyMemory.to_plain`` returns, plus the device cells: numbers, strings, lists, tuples, dicts,
numpy arrays and scalars, None) <-> a JSON layout and a set of named arrays. Arrays become tensors named by their key
path (``m.store.spans.3.k.0.q4``; a counter when the path is longer than a tensor name may be); the layout keeps
everything else and, for each array, its tensor, dtype and shape. Decoding is strict: a tag, dtype, shape or
reference that the encoder could not have written raises ``ValueError`` naming the path."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .keys import NAME_MAX, TENSOR_PREFIX

# numpy dtypes an array may have, and the GGUF tensor type each is stored as (same width; signedness by the layout)
STORED_AS = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int8": np.int8,
             "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.int8, "uint16": np.int16,
             "uint32": np.int32, "uint64": np.int64, "bool": np.int8}
SCALARS = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "bool"}
MAX_DEPTH = 64  # nesting a layout may have (the memory objects use fewer than 10)

ARRAY, SCALAR, TUPLE, DICT = "$a", "$n", "$t", "$d"


@dataclass
class Encoded:
    """A plain structure as its layout (JSON-able) and its arrays (tensor name -> 1-D array in its stored type)."""

    layout: Any
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def _name(path: str, arrays: dict[str, np.ndarray]) -> str:
    name = TENSOR_PREFIX + path
    if len(name.encode()) > NAME_MAX or name in arrays:
        name = f"{TENSOR_PREFIX}#{len(arrays)}"
    return name


def encode(plain: Any) -> Encoded:
    out = Encoded(layout=None)
    out.layout = _enc(plain, "", out.arrays, 0)
    return out


def _enc(x: Any, path: str, arrays: dict[str, np.ndarray], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH}")
    sub = lambda v, key: _enc(v, f"{path}.{key}" if path else str(key), arrays, depth + 1)  # noqa: E731
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, np.generic):
        return x
    if isinstance(x, np.generic):
        dt = x.dtype.name
        if dt not in SCALARS:
            raise ValueError(f"{path}: numpy scalar of type {dt} cannot be saved")
        return {SCALAR: dt, "v": x.item()}
    if isinstance(x, bytes):
        x = np.frombuffer(x, dtype=np.uint8)
    if isinstance(x, np.ndarray):
        dt = x.dtype.name
        if dt not in STORED_AS:
            raise ValueError(f"{path}: an array of {dt} cannot be saved (types: {sorted(STORED_AS)})")
        name = None
        if x.size:
            name = _name(path, arrays)
            arrays[name] = np.ascontiguousarray(x).reshape(-1).view(STORED_AS[dt])
        return {ARRAY: name, "dtype": dt, "shape": [int(s) for s in x.shape]}
    if isinstance(x, list):
        return [sub(v, i) for i, v in enumerate(x)]
    if isinstance(x, tuple):
        return {TUPLE: [sub(v, i) for i, v in enumerate(x)]}
    if isinstance(x, dict):
        items = []
        for k, v in x.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise ValueError(f"{path}: dict key {k!r} is not a string or an integer")
            items.append([int(k) if isinstance(k, (int, np.integer)) else k, sub(v, k)])
        return {DICT: items}
    raise ValueError(f"{path}: a {type(x).__name__} is not plain data")


def decode(layout: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The plain structure of ``layout`` with its arrays (copies, in their saved dtypes and shapes); every tensor
    must be referenced exactly once."""
    used: set[str] = set()
    out = _dec(layout, arrays, "", used, 0)
    unused = set(arrays) - used
    if unused:
        raise ValueError(f"tensors not in the layout: {sorted(unused)[:5]}")
    return out


def _dec(x: Any, arrays: dict[str, np.ndarray], path: str, used: set[str], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH}")
    sub = lambda v, key: _dec(v, arrays, f"{path}.{key}" if path else str(key), used, depth + 1)  # noqa: E731
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, float):
        return x
    if isinstance(x, list):
        return [sub(v, i) for i, v in enumerate(x)]
    if not isinstance(x, dict) or len(x) < 1:
        raise ValueError(f"{path}: unexpected {type(x).__name__} in the layout")
    if TUPLE in x and len(x) == 1 and isinstance(x[TUPLE], list):
        return tuple(sub(v, i) for i, v in enumerate(x[TUPLE]))
    if DICT in x and len(x) == 1 and isinstance(x[DICT], list):
        out: dict[Any, Any] = {}
        for item in x[DICT]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                    and not isinstance(item[0], bool)):
                raise ValueError(f"{path}: a dict item is not [key, value]")
            out[item[0]] = sub(item[1], item[0])
        return out
    if SCALAR in x and set(x) == {SCALAR, "v"}:
        dt = x[SCALAR]
        if dt not in SCALARS or not isinstance(x["v"], (bool, int, float)):
            raise ValueError(f"{path}: bad scalar {x!r}")
        return np.dtype(dt).type(x["v"])
    if ARRAY in x and set(x) == {ARRAY, "dtype", "shape"}:
        return _array(x, arrays, path, used)
    raise ValueError(f"{path}: unknown layout entry with keys {sorted(x)[:4]}")


def _array(x: dict, arrays: dict[str, np.ndarray], path: str, used: set[str]) -> np.ndarray:
    dt, shape, name = x["dtype"], x["shape"], x[ARRAY]
    if dt not in STORED_AS:
        raise ValueError(f"{path}: array dtype {dt!r} is not one a memory file stores")
    if not (isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                            for s in shape) and len(shape) <= MAX_DEPTH):
        raise ValueError(f"{path}: bad array shape {shape!r}")
    n = math.prod(shape)
    if name is None:
        if n:
            raise ValueError(f"{path}: {n} elements but no tensor")
        return np.zeros(shape, dtype=dt)
    if not isinstance(name, str) or name not in arrays or name in used:
        raise ValueError(f"{path}: tensor {name!r} is missing or referenced twice")
    data = arrays[name]
    if data.dtype != np.dtype(STORED_AS[dt]) or data.size != n:
        raise ValueError(f"{path}: tensor {name} holds {data.size} x {data.dtype.name}, the layout wants "
                         f"{shape} x {dt}")
    used.add(name)
    out = data.view(dt).reshape(shape).copy()
    if dt == "bool" and out.size and out.view(np.uint8).max() > 1:
        raise ValueError(f"{path}: a bool array holds values other than 0 and 1")
    return out
