"""The GPU check's offload proof: a tiny random-weight llama with head size 64 (so that the CUDA flash-attention
kernels, not a fallback, run), every layer and its KV cache offloaded: where llama.cpp put the KV cache, and SeKV
with full rank and every span zoomed against full KV, flash attention on, at a GPU tolerance (f16 accumulation).
Writes WORK/offload.json (llama.cpp's log, with each KV layer's device, goes to the stage's log); exits non-zero
when a GPU build cannot offload, or the logits differ beyond the tolerance.

    python scripts/gpu_offload_proof.py WORK_DIR [--expect-gpu]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.session import load_model
from sekv_gguf.tiny_models import TinySpec, write_tiny_llama

SPEC = TinySpec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)
RTOL = 2e-2  # of the largest logit: f16 accumulation in the flash-attention kernels, rebuilt spans in other cells
PROMPT_TOKENS = 700


def main(work: Path, expect_gpu: bool) -> int:
    path = write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny-hd64.gguf", SPEC)
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    cc = ContextConfig(flash_attn=True, n_gpu_layers=-1, verbose=True)  # llama.cpp logs each KV layer's device
    model = load_model(str(path), cc)
    rng = np.random.default_rng(0)
    toks = [1] + rng.integers(260, 300, PROMPT_TOKENS).tolist()
    full = make_policy("full", model, len(toks) + 1, cc, BudgetConfig(chunk=128))
    want = full.prefill(toks)
    full.close()
    cfg = SekvConfig(prefill="exact", energy=1.0, zoom_share=0.6, compress_when_fits=True, elastic_window=False,
                     host_format="f16")
    policy = make_policy("sekv", model, len(toks) + 1, cc, BudgetConfig(kv_budget=2048, chunk=128), cfg)
    try:
        got = policy.prefill(toks)
        spans = len(policy.memory.store)
        zoomed = all(len(r) == spans for r in policy.memory.zoom.resident)
    finally:
        policy.close()
    err = float(np.abs(got - want).max() / np.abs(want).max())
    result = {"gpu_offload_supported": offload, "expect_gpu": expect_gpu, "head_dim": SPEC.head_dim,
              "spans": spans, "all_zoomed": zoomed, "max_rel_err": err, "rtol": RTOL}
    (work / "offload.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    ok = spans > 3 and zoomed and err <= RTOL and (offload or not expect_gpu)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), "--expect-gpu" in sys.argv[2:]))
