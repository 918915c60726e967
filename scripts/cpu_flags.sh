# Sourced by build_llama.sh and gpu_check.sh: CPU_FLAGS, the C/C++ flags that compile ggml's AMX kernels out (Intel
# Xeon 4th gen+, where -march=native turns them on: with this pin they crash on quantized weights in the first decode
# on some of these machines — SIGSEGV in ggml_backend_amx_mul_mat, llama.cpp issue 20824; the AVX-512 kernels do the
# work). Only flags the compiler ($CC or cc) knows; none with SEKV_AMX=1.
CPU_FLAGS=""
if [ "${SEKV_AMX:-0}" != "1" ]; then
    for f in -mno-amx-tile -mno-amx-int8 -mno-amx-bf16; do
        if echo 'int main(void){return 0;}' | "${CC:-cc}" "$f" -x c -fsyntax-only - 2>/dev/null; then
            CPU_FLAGS="${CPU_FLAGS:+$CPU_FLAGS }$f"
        fi
    done
fi
