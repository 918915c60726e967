"""Where a result came from: the command that made it, the git commit of this checkout (and the code files that
differed from it) and the machine it ran on (saved with every benchmark, evaluation and trained adapter).
``envelope()`` is those together, the fields every ``bench/`` JSON carries; ``record`` adds them to one key of a
shared JSON file."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor()}


def _git(*args: str) -> str | None:
    """The stdout of ``git -C ROOT ARGS`` (None outside a git checkout or without git)."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def head() -> str:
    """The checkout's HEAD now ("unknown" outside a git checkout)."""
    out = _git("rev-parse", "HEAD")
    return "unknown" if out is None else out.strip()


CODE_PATHS = ("sekv_gguf", "native", "patches", "scripts")  # what a result's code is made of (docs, bench/ are not)


def uncommitted_now() -> list[str]:
    """The code files (``CODE_PATHS``) that differ from HEAD now, changed or new and not ignored, sorted ([] outside a
    git checkout): a result made with any of them is not its commit's."""
    out = _git("status", "--porcelain", "--", *CODE_PATHS) or ""
    return sorted(line[3:] for line in out.splitlines() if len(line) > 3)


# read once, when a result writer (evaluation report, training, a benchmark script) imports this module: a run of
# hours records the code it started with, not a commit made while it ran
_STARTED_AT = head()
_UNCOMMITTED_AT_START = uncommitted_now()


def commit() -> str:
    """The checkout's HEAD when this process started writing results (this module's import)."""
    return _STARTED_AT


def uncommitted() -> list[str]:
    """``uncommitted_now()`` when this process started writing results: the files in which its code was not
    ``commit()``'s (empty: it was)."""
    return list(_UNCOMMITTED_AT_START)


def command_line() -> str:
    """This process's command, as it was run (``python scripts/x.py --flag ...``)."""
    return " ".join(["python", *sys.argv])


def envelope(command: str | None = None) -> dict[str, Any]:
    """``command`` (default: this process's), ``commit``, ``uncommitted`` and ``machine``: where a result came
    from."""
    return {"command": command_line() if command is None else command, "commit": commit(),
            "uncommitted": uncommitted(), "machine": machine()}


def record(path: str | Path, key: str, value: dict[str, Any], command: str | None = None) -> Path:
    """Set ``key`` of the JSON object at ``path`` (created if missing) to ``value`` with its ``envelope(command)``;
    the other keys stay (``bench/reliability.json`` collects several harnesses' figures this way)."""
    import json

    path = Path(path)
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[key] = {**value, **envelope(command)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
