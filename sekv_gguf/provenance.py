"""Where a result came from: the git commit of this checkout and the machine it ran on (saved with every benchmark,
evaluation and trained adapter)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor()}


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(path: str | Path, key: str, value: dict[str, Any], command: str) -> Path:
    """Set ``key`` of the JSON object at ``path`` (created if missing) to ``value`` with its command, commit and
    machine; the other keys stay (``bench/reliability.json`` collects several harnesses' figures this way)."""
    import json

    path = Path(path)
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[key] = {**value, "command": command, "commit": commit(), "machine": machine()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
