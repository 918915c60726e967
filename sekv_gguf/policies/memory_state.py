"""``PolicyMemory``: the base of what a policy remembers about its context (its memory object). A policy's
snapshot copies it (never the policy's attributes), ``reset`` returns to a copy of the empty one, and ``to_plain`` /
``load_plain`` turn it into plain data (numbers, lists, dicts, numpy arrays) and back — what a saved conversation
writes. A dataclass of plain fields needs nothing more; SeKV's (``sekv_memory.SekvMemory``) shares its fixed parts
and immutable span data between copies."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any

import numpy as np


@dataclass
class PolicyMemory:
    """A memory with nothing in it beyond what llama.cpp's cache holds (full KV). Subclasses add fields."""

    def copy(self) -> "PolicyMemory":
        return copy.deepcopy(self)

    def to_plain(self) -> dict[str, Any]:
        return asdict(self)  # nested dataclasses (a ``Window``) become dicts

    def load_plain(self, data: dict[str, Any]) -> None:
        for f in fields(self):
            value, now = data[f.name], getattr(self, f.name)
            if is_dataclass(now):
                value = type(now)(**{k: np.array(v) for k, v in value.items()})
            setattr(self, f.name, value.copy() if isinstance(value, np.ndarray) else copy.deepcopy(value))
