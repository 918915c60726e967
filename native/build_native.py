"""Out-of-line API-mode cffi build of the native module ``sekv_gguf._native``.

Used by setup.py (``cffi_modules``); the C sources live beside this file. Run directly to build in place.
"""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "sekv_native.h"
SOURCES = ["sekv_native.c"]


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
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
