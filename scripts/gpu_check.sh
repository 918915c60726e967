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
# Stages, each timed and each under its own time limit so that the whole fits one 10-minute command on a 16-core
# machine (sizes measured with this machine's nvcc: docs/gpu.md):
#   1 build    libllama + ggml-cuda for SEKV_CUDA_ARCHS (default 90: Hopper), Release, Ninja, all cores
#   2 native   sekv_gguf's cffi module, in place
#   3 tests    the hook tests (rows, relocation, bias, query capture on device buffers) and the engine tests
#              (exactness with every span zoomed; budget >= context equals full) — tiny random-weight models,
#              every layer offloaded (n_gpu_layers -1); the real Gemma file does not travel (-m "not gemma")
#   4 bench    scripts/bench_engine.py, full vs sekv side by side: a Gemma-3-270M-shaped model at 32K and a
#              Llama-3.2-1B-shaped one at 32K, 64K and 128K (random weights with the real attention shapes; the real
#              files, 250 MB+, cannot travel); each length in its own process, skipped when time runs short
# Environment: SEKV_CUDA_ARCHS (90), GPU_CHECK_BUDGET_S (540: seconds the whole script may take), OUT; for a dry run
# of the plumbing on a CPU machine: GPU_CHECK_CMAKE_ARGS (default: CUDA on), GPU_CHECK_PYTHON, GPU_CHECK_WHEELS,
# GPU_CHECK_SHAPES (default: "gemma3-270m=32768 llama-1b=32768 llama-1b=65536 llama-1b=131072").
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
DEFAULT_BUDGET=540
[ "$WHAT" = build ] && DEFAULT_BUDGET=580
BUDGET="${GPU_CHECK_BUDGET_S:-$DEFAULT_BUDGET}"
PY="${GPU_CHECK_PYTHON:-python3}"
WHEELS="${GPU_CHECK_WHEELS:-.gpu/wheels}"
CMAKE_ARGS="${GPU_CHECK_CMAKE_ARGS--DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS}"
SHAPES="${GPU_CHECK_SHAPES:-gemma3-270m=32768 llama-1b=32768 llama-1b=65536 llama-1b=131072}"
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
    return $rc
}

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

build() {
    cmake -S "$LLAMA" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
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
        tests/test_hook_query.py tests/test_hook_positions.py tests/test_engine.py &&
    # the KV cache really is on the GPU
    $PY - <<'EOF'
import sys, tempfile
from pathlib import Path
import llama_cpp
from sekv_gguf.config import ContextConfig
from sekv_gguf.session import Session
from sekv_gguf.tiny_models import write_tiny_llama
assert llama_cpp.llama_supports_gpu_offload(), "this libllama cannot offload"
p = write_tiny_llama(Path(tempfile.mkdtemp()) / "t.gguf")
with Session.open(p, ContextConfig(n_ctx=256, verbose=True)) as s:
    s.decode(s.tokenize("hello"))
EOF
}

export LLAMA WORK CMAKE_ARGS PKG PY
export -f build native tests
BUILD_OK=0
if [ "$WHAT" != check ]; then
    limit=420
    [ "$WHAT" = build ] && limit=570
    stage build "$limit" build
    BUILD_OK=$?
elif [ ! -f "$PKG/llama_cpp/lib/libllama.so" ]; then
    log "error: no build in $WORK: run 'gpu_check.sh build' first"; exit 2
fi
if [ "$WHAT" != build ] && [ $BUILD_OK -eq 0 ]; then
    stage native 60 native && stage tests 150 tests
    grep -o "dev = [A-Za-z0-9]*" "$WORK/log/tests.log" | sort | uniq -c >&2 || true
    # longest contexts last: each length its own process and JSON, so a timeout loses one case only
    for spec in $SHAPES; do
        name="bench-${spec/=/-}"
        stage "$name" 240 $PY scripts/bench_engine.py --gemma --tiny --shaped "$spec" --n-predict 32 \
            --out "$WORK/$name" || true
    done
fi

# one JSON summary
$PY - "$WORK" "$RESULTS/gpu.json" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, re, sys
from pathlib import Path
work, out, total = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
stages = [json.loads(line) for line in (work / "stages.jsonl").read_text().splitlines() if line.strip()]
tests = work / "log" / "tests.log"
text = tests.read_text(errors="replace") if tests.exists() else ""
m = re.findall(r"^=*\s*(\d+ passed.*?|\d+ failed.*?)\s*=*$", text, re.M)
cases = []
for f in sorted(work.glob("bench-*.json")):
    for c in json.loads(f.read_text())["cases"]:
        keep = {k: c.get(k) for k in ("model", "policy", "n_tokens", "prompt_tokens", "prefill_tok_s", "decode_tok_s",
                                      "device_kv_bytes", "full_kv_bytes", "host_kv_bytes", "wall_s")}
        if c.get("sekv"):
            keep["sekv"] = {k: c["sekv"].get(k) for k in ("spans", "zooms_per_step", "zoom_s", "compress_s",
                                                          "route_ms_per_step", "host_rows_read_per_route")}
        cases.append(keep)
placement = sorted(set(re.findall(r"dev = (\w+)", text)))
summary = {"gpu": (work / "gpu.txt").read_text().strip(), "total_s": total, "stages": stages,
           "tests": m[-1] if m else None, "kv_devices_seen": placement, "cases": cases}
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
EOF
