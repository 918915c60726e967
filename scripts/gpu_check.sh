#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, CUDA, CMake and Python 3.12, and no network, build the patched
# libllama with CUDA, run the hook and engine tests with every layer and its KV cache on the GPU, and benchmark
# full vs sekv at long contexts; print one JSON summary (and write it to $OUT/gpu.json, or bench/gpu.json).
#
#   here:        bash scripts/gpu_pack.sh          # .gpu/: trimmed patched sources + wheels (< 64 MiB, git-ignored)
#   on the GPU:  bash scripts/gpu_check.sh build   # one command (~6-7 min on 16 cores: docs/gpu.md), then
#                bash scripts/gpu_check.sh check   # a second one on the same (warm) machine: tests + benchmark
#                bash scripts/gpu_check.sh         # both in one command, if the build is quick enough there
# from the repository root, with .gpu/ carried; the build is kept in .gpu-work/ (git-ignored) between the two.
#
# Stages, each timed and each under its own time limit (`build` <= 7 minutes, `check` <= 4; sizes measured with
# this machine's nvcc: docs/gpu.md); $OUT/gpu.json is written after every stage:
#   0 preflight  every tool and Python module the stages use, checked in seconds; missing ones named, then exit 2
#   1 build      libllama + ggml-cuda for SEKV_CUDA_ARCHS (default 90: Hopper), Release, Ninja, all cores
#   2 native     sekv_gguf's cffi module, in place
#   3 tests      the hook tests (rows, relocation, bias, query capture on device buffers) and the engine tests
#                (exactness with every span zoomed; budget >= context equals full) — tiny random-weight models,
#                every layer offloaded (n_gpu_layers -1); the real Gemma file does not travel (-m "not gemma")
#   4 offload    the proof: a head-size-64 tiny model (the CUDA flash-attention kernels run) with every layer and its
#                KV cache on the GPU (llama.cpp's log must say CUDA), SeKV all-zoomed = full KV at a GPU tolerance
#   5 bench      scripts/bench_engine.py, full vs sekv side by side: a Gemma-3-270M-shaped model at 32K and a
#                Llama-3.2-1B-shaped one at 32K and 128K (random weights with the real attention shapes; the real
#                files, 250 MB+, cannot travel); each length in its own process, skipped when time runs short
# Environment: SEKV_CUDA_ARCHS (90), GPU_CHECK_BUDGET_S (seconds the command may take: build 420, check 240, all
# 660), OUT; for a dry run of the plumbing on a CPU machine: GPU_CHECK_CMAKE_ARGS (default: CUDA on; without it the
# offload proof accepts the CPU), GPU_CHECK_PYTHON, GPU_CHECK_WHEELS, GPU_CHECK_SHAPES (default: "gemma3-270m=32768
# llama-1b=32768 llama-1b=131072").
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/pins.sh
source "$ROOT/scripts/pins.sh"
T0=$(date +%s)
ARCHS="${SEKV_CUDA_ARCHS:-90}"
RESULTS="${OUT:-$ROOT/bench}"
WORK="$ROOT/.gpu-work"  # git-ignored, not carried: a warm machine keeps it between calls
WHAT="${1:-all}"
case "$WHAT" in build|check|all) ;; *) echo "usage: gpu_check.sh [build|check|all]" >&2; exit 2 ;; esac
DEFAULT_BUDGET=660
[ "$WHAT" = build ] && DEFAULT_BUDGET=420
[ "$WHAT" = check ] && DEFAULT_BUDGET=240
BUDGET="${GPU_CHECK_BUDGET_S:-$DEFAULT_BUDGET}"
PY="${GPU_CHECK_PYTHON:-python3}"
WHEELS="${GPU_CHECK_WHEELS:-.gpu/wheels}"
CMAKE_ARGS="${GPU_CHECK_CMAKE_ARGS--DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS}"
SHAPES="${GPU_CHECK_SHAPES:-gemma3-270m=32768 llama-1b=32768 llama-1b=131072}"
EXPECT_GPU=""
case "$CMAKE_ARGS" in *GGML_CUDA=ON*) EXPECT_GPU=1 ;; esac
mkdir -p "$RESULTS" "$WORK/log"
SUMMARY="$WORK/stages.jsonl"
[ "$WHAT" = check ] || : > "$SUMMARY"

log() { printf '[gpu-check %4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# stage NAME LIMIT_S CMD...: run CMD under min(LIMIT_S, time left), record its status and seconds
stage() {
    local name="$1" limit="$2"; shift 2
    local l; l=$(left)
    if [ "$l" -lt 20 ]; then
        log "$name: skipped ($l s left)"
        printf '{"stage": "%s", "status": "skipped", "seconds": 0}\n' "$name" >> "$SUMMARY"
        return 1
    fi
    [ "$limit" -gt "$l" ] && limit=$l
    local s; s=$(date +%s)
    log "$name: start (limit $limit s)"
    # (bash -c: the stage may be one of the functions below, exported)
    timeout --kill-after=10 "$limit" bash -c '"$@"' stage "$@" > "$WORK/log/$name.log" 2>&1
    local rc=$?
    local took=$(( $(date +%s) - s ))
    local status=ok
    [ $rc -ne 0 ] && status=failed
    [ $rc -eq 124 ] && status=timeout
    log "$name: $status in $took s (log $WORK/log/$name.log)"
    tail -5 "$WORK/log/$name.log" >&2
    printf '{"stage": "%s", "status": "%s", "rc": %d, "seconds": %d}\n' "$name" "$status" "$rc" "$took" >> "$SUMMARY"
    summary > /dev/null
    return $rc
}
# the one JSON, rewritten after every stage (a cut run still leaves it)
summary() { "$PY" scripts/gpu_summary.py "$WORK" "$RESULTS/gpu.json" "$(( $(date +%s) - T0 ))"; }

[ -f .gpu/llama-src.tar.gz ] || { log "error: .gpu/llama-src.tar.gz missing: run scripts/gpu_pack.sh first"; exit 2; }
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$WORK/gpu.txt" 2>&1
else
    echo "no nvidia-smi" > "$WORK/gpu.txt"
fi
log "GPU: $(cat "$WORK/gpu.txt"); $(nproc) cores; $($PY --version 2>&1)"

# Python packages the image may lack (pure or cp312 wheels), then our sources on the path
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" "$WHEELS"/*.whl \
    || { log "error: wheel install failed"; exit 2; }
if [ "$WHAT" != check ]; then
    rm -rf "$WORK/src" "$WORK/build" && mkdir -p "$WORK/src" && tar xzf .gpu/llama-src.tar.gz -C "$WORK/src"
fi
PKG="$WORK/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
LLAMA="$PKG/vendor/llama.cpp"
export PYTHONPATH="$ROOT:$PKG:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export SEKV_THREADS="$(nproc)"

# shellcheck source=scripts/cpu_flags.sh
source scripts/cpu_flags.sh   # CPU_FLAGS: ggml's AMX kernels compiled out, as build_llama.sh does
build() {
    cmake -S "$LLAMA" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        "-DCMAKE_C_FLAGS=$CPU_FLAGS" "-DCMAKE_CXX_FLAGS=$CPU_FLAGS" \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
        $CMAKE_ARGS \
        "-DCMAKE_INSTALL_RPATH=\$ORIGIN" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON &&
    cmake --build "$WORK/build" --target llama -j "$(nproc)" &&
    mkdir -p "$PKG/llama_cpp/lib" && cp -a "$WORK/build/bin/"lib*.so* "$PKG/llama_cpp/lib/"
}
native() { $PY native/build_native.py && $PY -c "import sekv_gguf._native"; }
tests() {
    $PY -m pytest -q -p no:cacheprovider -m "not gemma" tests/test_hook_rows.py tests/test_hook_bias.py \
        tests/test_hook_query.py tests/test_hook_positions.py tests/test_engine.py
}
offload() {
    $PY scripts/gpu_offload_proof.py "$WORK" ${EXPECT_GPU:+--expect-gpu} &&
    { [ -z "$EXPECT_GPU" ] || grep -q "dev = CUDA" "$WORK/log/offload.log" || { echo "KV cache not on CUDA"; false; }; }
}
# every tool and module the stages use, named when missing (seconds, before the build)
preflight() {
    local missing=()
    for tool in cmake ninja; do command -v "$tool" > /dev/null || missing+=("$tool"); done
    if [ -n "$EXPECT_GPU" ]; then
        for tool in nvcc nvidia-smi; do command -v "$tool" > /dev/null || missing+=("$tool"); done
    fi
    $PY -c '
import importlib.util, sys
need = ["numpy", "scipy", "threadpoolctl", "typing_extensions", "jinja2", "diskcache", "gguf", "cffi", "pycparser",
        "pytest", "tqdm", "matplotlib", "yaml"]
bad = [m for m in need if importlib.util.find_spec(m) is None]
print("python", sys.version.split()[0] + "; missing modules:", bad or "none")
sys.exit(1 if bad else 0)' || missing+=("python modules (above)")
    [ ${#missing[@]} -eq 0 ] || { echo "missing: ${missing[*]}"; return 1; }
}

export LLAMA WORK CMAKE_ARGS PKG PY EXPECT_GPU
export -f build native tests offload preflight
stage preflight 30 preflight || { log "preflight failed: see $WORK/log/preflight.log"; summary; exit 2; }
BUILD_OK=0
if [ "$WHAT" != check ]; then
    stage build 400 build
    BUILD_OK=$?
elif [ ! -f "$PKG/llama_cpp/lib/libllama.so" ]; then
    log "error: no build in $WORK: run 'gpu_check.sh build' first"; exit 2
fi
if [ "$WHAT" != build ] && [ $BUILD_OK -eq 0 ]; then
    stage native 30 native && { stage tests 90 tests; stage offload 40 offload; }
    grep -o "dev = [A-Za-z0-9]*" "$WORK/log/offload.log" | sort | uniq -c >&2 || true
    # longest contexts last: each length its own process and JSON, so a timeout loses one case only
    for spec in $SHAPES; do
        name="bench-${spec/=/-}"
        stage "$name" 120 $PY scripts/bench_engine.py --gemma --tiny --shaped "$spec" --n-predict 32 \
            --out "$WORK/$name" || true
    done
fi
summary
