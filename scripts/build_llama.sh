#!/usr/bin/env bash
# Build the patched libllama (+ ggml) from the pinned llama-cpp-python sdist; print the directory of the libraries.
#
#   bash scripts/build_llama.sh            release build (what setup.sh installs; SEKV_CUDA=1 for CUDA), with the RPC
#                                          backend and its server (lib/ggml-rpc-server)
#   bash scripts/build_llama.sh asan       AddressSanitizer + UndefinedBehaviorSanitizer build (only for tests:
#                                          load it with LD_PRELOAD of the sanitizer runtimes, LLAMA_CPP_LIB_PATH=DIR)
#
# Steps: fetch the sdist with pip and check its sha256; apply patches/ (any hunk that does not apply stops the
# build); configure and build the `llama` target with CMake. Cached under $SEKV_CACHE/llama/KEY, KEY a hash of the
# sdist, the patches, the flags and the CPU's instruction sets, so a second run is a no-op; nothing depends on the
# cache being there.
# Environment: SEKV_CACHE, SEKV_JOBS, SEKV_CUDA, SEKV_CUDA_ARCHS, SEKV_CMAKE_ARGS, SEKV_AMX, PYTHON (for pip download).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/pins.sh
source "$ROOT/scripts/pins.sh"

VARIANT="${1:-release}"
PY="${PYTHON:-python3}"
CACHE="${SEKV_CACHE:-$HOME/.cache/sekv_gguf}"
JOBS="${SEKV_JOBS:-$(nproc)}"
CUDA="${SEKV_CUDA:-0}"
CUDA_ARCHS="${SEKV_CUDA_ARCHS:-90}"

log() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

case "$VARIANT" in
    release) BUILD_TYPE=Release ;;
    asan) BUILD_TYPE=None ;;  # its own flags below (-O1 -g1: quicker to build than -O2 -g; reports keep lines)
    *) die "unknown variant $VARIANT (release or asan)" ;;
esac
# shellcheck source=scripts/cpu_flags.sh
source "$ROOT/scripts/cpu_flags.sh"   # CPU_FLAGS: ggml's AMX kernels compiled out (SEKV_AMX=1 keeps them)
CMAKE_FLAGS=(
    -G Ninja
    "-DCMAKE_BUILD_TYPE=$BUILD_TYPE"
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
)
TARGETS=(llama)
case "$VARIANT" in
    release)
        # the RPC backend (layers on other machines) and its server, ggml-rpc-server (in llama.cpp's tools/)
        CMAKE_FLAGS+=(-DGGML_RPC=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON)
        TARGETS+=(ggml-rpc-server)
        if [ "$CUDA" = "1" ]; then
            CMAKE_FLAGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
        fi
        if [ -n "$CPU_FLAGS" ]; then
            CMAKE_FLAGS+=("-DCMAKE_C_FLAGS=$CPU_FLAGS" "-DCMAKE_CXX_FLAGS=$CPU_FLAGS")
        fi
        if [ -n "${SEKV_CMAKE_ARGS:-}" ]; then
            # shellcheck disable=SC2206
            CMAKE_FLAGS+=($SEKV_CMAKE_ARGS)
        fi
        ;;
    asan)
        CMAKE_FLAGS+=(-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF)
        SAN="-O1 -g1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer${CPU_FLAGS:+ $CPU_FLAGS}"
        CMAKE_FLAGS+=(-DGGML_OPENMP=OFF "-DCMAKE_C_FLAGS=$SAN"
                      "-DCMAKE_CXX_FLAGS=$SAN" "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined")
        ;;
esac

command -v cmake >/dev/null || die "cmake not found"
command -v ninja >/dev/null || die "ninja not found"

# the instruction sets -march=native turns on (GGML_NATIVE): a cache shared by machines of other CPUs (a home
# directory on a network drive) must not hand one machine's build to another, where it would stop on SIGILL
NATIVE_ISA="$(uname -m) $("${CC:-cc}" -march=native -Q --help=target 2>/dev/null | awk '/\[enabled\]/ {print $1}' | tr '\n' ' ' || true)"
KEY="$( { echo "$LLAMA_CPP_PYTHON_VERSION $LLAMA_CPP_PYTHON_SHA256"; cat "$ROOT"/patches/*.patch; printf '%s\n' "${CMAKE_FLAGS[@]}"; echo "$NATIVE_ISA"; } \
        | sha256sum | cut -c1-16)"
BUILD="$CACHE/llama/$KEY"
if [ -n "${SEKV_DRY_KEY:-}" ]; then  # only the key (setup.sh's up-to-date check)
    echo "$KEY"
    exit 0
fi
if [ -f "$BUILD/lib/.done" ]; then
    echo "$BUILD/lib"
    exit 0
fi

# the pinned sdist, hash-checked
SDIST_DIR="$CACHE/sdist"
SDIST="$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
mkdir -p "$SDIST_DIR"
if [ ! -f "$SDIST" ] || ! echo "$LLAMA_CPP_PYTHON_SHA256  $SDIST" | sha256sum -c --status; then
    log "fetching llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
    rm -f "$SDIST"
    "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$SDIST_DIR"
fi
echo "$LLAMA_CPP_PYTHON_SHA256  $SDIST" | sha256sum -c --status \
    || die "sha256 of $SDIST does not match the pin in scripts/pins.sh"

# patched sources + native build
SRC="$BUILD/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
log "building libllama ($VARIANT$([ "$CUDA" = 1 ] && [ "$VARIANT" = release ] && echo ", CUDA $CUDA_ARCHS")) in $BUILD"
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
cmake --build "$BUILD/cmake" --target "${TARGETS[@]}" -j "$JOBS" >> "$BUILD/cmake.log" 2>&1 \
    || { tail -30 "$BUILD/cmake.log" >&2; die "build failed (log: $BUILD/cmake.log)"; }
cp -a "$BUILD/cmake/bin/"lib*.so* "$BUILD/lib/"
for t in "${TARGETS[@]:1}"; do  # executables, beside the libraries they load through $ORIGIN
    cp -a "$BUILD/cmake/bin/$t" "$BUILD/lib/"
done
log "libllama ($VARIANT) built in $(( $(date +%s) - start )) s"
touch "$BUILD/lib/.done"
echo "$BUILD/lib"
