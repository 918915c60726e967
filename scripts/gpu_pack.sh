#!/usr/bin/env bash
# Pack what scripts/gpu_check.sh needs on a GPU machine with no network into .gpu/ (git-ignored; < 64 MiB):
#   .gpu/llama-src.tar.gz   the pinned llama-cpp-python sdist with patches/ applied, trimmed to what a CUDA build of
#                           libllama needs (llama_cpp/ Python package; llama.cpp's CMake files, ggml with its CPU
#                           and CUDA backends, src/, include/, vendor/) — no docs, models, tests, tools or other
#                           backends
#   .gpu/wheels/            Python 3.12 wheels of the packages such a machine may lack (gguf, cffi, pycparser,
#                           diskcache); numpy, scipy, tqdm, jinja2, PyYAML, matplotlib, pytest, hypothesis are
#                           expected there
#
#   bash scripts/gpu_pack.sh        (here, where pip reaches PyPI; then the device runs scripts/gpu_check.sh)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pins.sh
source "$ROOT/scripts/pins.sh"
PY="${PYTHON:-python3}"
OUTDIR="$ROOT/.gpu"
WHEELS=(gguf==0.19.0 cffi==2.1.1 pycparser==3.12 diskcache==5.6.3)

log() { printf '[gpu-pack] %s\n' "$*" >&2; }

# the patched sources of the release build (scripts/build_llama.sh fetches, hash-checks and patches them; cached)
LIB="$(PYTHON="$PY" bash "$ROOT/scripts/build_llama.sh" release)"
NAME="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR/wheels"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cp -a "$(dirname "$LIB")/src/$NAME" "$TMP/"
KEEP_GGML_SRC=(CMakeLists.txt ggml-cpu ggml-cuda ggml-blas '*.c' '*.cpp' '*.h' '*.in')
(
    cd "$TMP/$NAME"
    find vendor/llama.cpp -mindepth 1 -maxdepth 1 \
        ! -name CMakeLists.txt ! -name cmake ! -name ggml ! -name src ! -name include ! -name vendor \
        ! -name LICENSE -exec rm -rf {} +
    cd vendor/llama.cpp/ggml/src
    for d in */; do
        d="${d%/}"
        case " ${KEEP_GGML_SRC[*]} " in *" $d "*) ;; *) rm -rf "$d" ;; esac
    done
)
tar czf "$OUTDIR/llama-src.tar.gz" -C "$TMP" "$NAME/llama_cpp" "$NAME/vendor"
log "sources: $(du -h "$OUTDIR/llama-src.tar.gz" | cut -f1)"

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUTDIR/wheels" "${WHEELS[@]}"
log "wheels: $(ls "$OUTDIR/wheels" | tr '\n' ' ')"
log "total: $(du -sh "$OUTDIR" | cut -f1) (the device call carries .gpu: run scripts/gpu_check.sh there)"
