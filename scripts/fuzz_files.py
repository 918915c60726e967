"""The long fuzz campaign over every file sekv_gguf parses itself (``sekv_gguf.reliability.fuzz``): INPUTS damaged files spread
over the targets, each parsed once; counts crashes (an exception other than the target's typed error), hangs (a
parse over ``FuzzConfig.hang_s``) and parses over the memory bound. Writes the ``fuzz`` object of
bench/reliability.json (``inputs``, ``crashes``, ``hangs``, ``over_memory``, per target, the first failures to
replay). Exit status 1 if anything failed.

    .venv/bin/python scripts/fuzz_files.py --inputs 100000
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from sekv_gguf.reliability.fuzz import FuzzConfig, Tally, mutate, random_mutations, run_one, targets
from sekv_gguf.provenance import record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/reliability.json")
    args = ap.parse_args()
    cfg = FuzzConfig()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ts = targets(work, cfg)
        tallies = {t.name: Tally() for t in ts}
        for i in tqdm(range(args.inputs), desc="fuzz", unit="input", mininterval=2):
            t = ts[i % len(ts)]
            muts = random_mutations(rng)
            tallies[t.name].add(t, muts, run_one(t, mutate(t.seed, muts, t.head), work, cfg), cfg)
    per = {name: {"inputs": x.inputs, **x.counts, "over_memory": x.over_memory, "max_seconds": round(x.max_seconds, 4),
                  "max_peak_bytes_per_file_byte": round(x.max_peak_per_byte, 2), "failures": x.failures}
           for name, x in tallies.items()}
    total = {"inputs": sum(x.inputs for x in tallies.values()),
             "crashes": sum(x.counts["crash"] for x in tallies.values()),
             "hangs": sum(x.counts["hang"] for x in tallies.values()),
             "over_memory": sum(x.over_memory for x in tallies.values()),
             "rejected": sum(x.counts["rejected"] for x in tallies.values()),
             "parsed": sum(x.counts["ok"] for x in tallies.values()),
             "limits": vars(cfg), "seconds": round(time.perf_counter() - t0, 1), "targets": per}
    record(args.out, "fuzz", total)
    print({k: v for k, v in total.items() if k != "targets"})
    return 1 if total["crashes"] or total["hangs"] or total["over_memory"] else 0


if __name__ == "__main__":
    sys.exit(main())
