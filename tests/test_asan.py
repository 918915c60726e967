"""The KV hook under AddressSanitizer + UndefinedBehaviorSanitizer: ``scripts/build_llama.sh asan`` builds the patched
libllama with both (cached by its own key; the first build takes minutes), and the hook's property test, its
bad-input tests, its row tests and its layer-callback tests run again in a child process that loads it
(``LLAMA_CPP_LIB_PATH``, the sanitizer runtimes preloaded). Any report fails the test. The native module's own
harness is ``test_native.py``'s."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ["tests/test_hook_property.py", "tests/test_hook_errors.py", "tests/test_hook_rows.py",
         "tests/test_hook_layer_callback.py", "tests/test_hook_bias.py"]


def _runtime(cc: str, name: str) -> str:
    path = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else ""


@pytest.fixture(scope="module")
def asan_lib() -> Path:
    if not (shutil.which("cmake") and shutil.which("ninja")):
        pytest.fail("cmake and ninja are needed to build the sanitized libllama")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build_llama.sh"), "asan"], capture_output=True, text=True,
                         timeout=3600, env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr[-3000:]
    return Path(out.stdout.strip().splitlines()[-1])


def test_hook_suite_under_asan_and_ubsan(asan_lib: Path):
    cc = shutil.which("gcc") or shutil.which("cc") or "cc"
    preload = [_runtime(cc, "libasan.so"), _runtime(cc, "libubsan.so")]
    assert all(preload), f"sanitizer runtimes not found with {cc}: {preload}"
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(asan_lib), "LD_PRELOAD": " ".join(preload),
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:verify_asan_link_order=0",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1", "SEKV_HOOK_EXAMPLES": "25"}
    probe = subprocess.run([sys.executable, "-c", "from sekv_gguf import _hook_api as a; import llama_cpp.llama_cpp "
                            "as l; print(l._lib._name); print(a.sekv_api_version())"], env=env, capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 0 and str(asan_lib) in probe.stdout, probe.stdout + probe.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    report = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, report
    assert "AddressSanitizer" not in run.stderr and "runtime error:" not in run.stderr, report
    assert " passed" in run.stdout and " failed" not in run.stdout, report
