"""The native build compiles ggml's AMX kernels out (they crash on quantized weights on some Intel Xeon machines:
docs/build.md), unless ``SEKV_AMX=1`` asks for them."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _key(**env: str) -> str:
    run = subprocess.run(["bash", str(ROOT / "scripts/build_llama.sh"), "release"], capture_output=True, text=True,
                         env={**os.environ, "SEKV_DRY_KEY": "1", **env}, check=True, timeout=60)
    return run.stdout.strip()


@pytest.mark.skipif(not X86, reason="AMX is an x86 extension")
def test_amx_flags_change_the_build_key():
    assert _key(SEKV_AMX="0") != _key(SEKV_AMX="1")


@pytest.mark.skipif(not X86 or os.environ.get("SEKV_AMX") == "1", reason="AMX is an x86 extension / asked for")
def test_installed_library_has_no_amx_kernels():
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    assert "AVX" in info            # the line lists the CPU features the library was built with
    assert "AMX" not in info, info
