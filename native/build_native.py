"""Out-of-line API-mode cffi build of the native module ``sekv_gguf._native``.

Used by setup.py (``cffi_modules``); the C sources live beside this file. Run directly to build in place.
"""

import platform
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "sekv_native.h"
SOURCES = ["sekv_native.c"]
# glibc's vector math (libmvec) serves the vectorised expf of the surprisal sum; elsewhere it stays scalar
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _cdef() -> str:
    text = HEADER.read_text()
    return text.split("/* CDEF-BEGIN */", 1)[1].split("/* CDEF-END */", 1)[0]


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "sekv_gguf._native",
    '#include "sekv_native.h"',
    # relative to the repository root, where setuptools (and ``python native/build_native.py``) run
    sources=[f"native/{s}" for s in SOURCES],
    include_dirs=["native"],
    # -ffast-math (with -fopenmp-simd) lets the surprisal sum call glibc's vector expf; nothing here tests for NaN
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-ffast-math"] + (["-fopenmp-simd"] if GLIBC else []),
    libraries=["m", "mvec"] if GLIBC else ["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
