"""The wheel ships every subpackage: pyproject's explicit package list matches the package tree (an editable install
hides a missing entry)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sekv_gguf").rglob("__init__.py")}
    assert listed == tree
