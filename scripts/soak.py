"""Soak runs (``sekv_gguf.reliability.soak``) on the tiny random-weight llama: 10,000 decode steps of sekv at a 10%
budget with routing every step, twice (same tokens?), resident memory sampled; then 200 open/close cycles of a
policy in one process (memory, file descriptors). Writes the ``soak`` object of bench/reliability.json; exit status
1 if a target is missed (growth outside the host tier or over the cycles > 2%, a descriptor leak, other tokens).

    .venv/bin/python scripts/soak.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from sekv_gguf.provenance import record
from sekv_gguf.reliability.soak import SoakConfig, decode_soak, open_close_soak
from sekv_gguf.session import load_model
from sekv_gguf.tiny_models import write_tiny_llama


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=SoakConfig.steps)
    ap.add_argument("--cycles", type=int, default=SoakConfig.cycles)
    ap.add_argument("--budget", type=float, default=SoakConfig.budget)
    ap.add_argument("--out", default="bench/reliability.json")
    args = ap.parse_args()
    cfg = SoakConfig(steps=args.steps, cycles=args.cycles, budget=args.budget)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(write_tiny_llama(Path(tmp) / "tiny-llama.gguf"))
        bar = tqdm(total=2 * cfg.steps, desc="decode soak", unit="step")
        done = [0]

        def step(n: int) -> None:
            bar.update(n - done[0] if n > done[0] else n)
            done[0] = n

        decode = decode_soak(model, cfg, step)
        bar.close()
        bar = tqdm(total=cfg.cycles, desc="open/close", unit="cycle")
        cycles = open_close_soak(model, cfg, lambda n: bar.update(1))
        bar.close()
    out = {"model": "tiny random-weight llama (sekv_gguf.tiny_models)", "decode": decode, "open_close": cycles}
    record(args.out, "soak", out)
    print({k: v for k, v in decode.items() if k != "samples"}, cycles)
    ok = (decode["same_tokens_on_rerun"] and decode["rss_growth_outside_host_tier"] <= 0.02
          and cycles["rss_growth"] <= 0.02 and cycles["fds_end"] == cycles["fds_warm"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
