"""The GPU check's one JSON (scripts/gpu_check.sh runs it after every stage, so a cut run still leaves one): the
GPU, stage times and statuses, the pytest summary, the KV devices seen, the offload proof and per-case benchmark
figures.

    python scripts/gpu_summary.py WORK_DIR OUT.json TOTAL_SECONDS
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CASE_KEYS = ("model", "policy", "n_tokens", "prompt_tokens", "prefill_tok_s", "decode_tok_s", "device_kv_bytes",
             "full_kv_bytes", "host_kv_bytes", "wall_s")
SEKV_KEYS = ("spans", "zooms_per_step", "zoom_s", "compress_s", "route_ms_per_step", "host_rows_read_per_route")


def main(work: Path, out: Path, total: int) -> dict:
    stages_file = work / "stages.jsonl"
    stages = [json.loads(line) for line in stages_file.read_text().splitlines() if line.strip()] \
        if stages_file.exists() else []
    logs = {name: (work / "log" / f"{name}.log") for name in ("tests", "offload")}
    text = {name: p.read_text(errors="replace") if p.exists() else "" for name, p in logs.items()}
    passed = re.findall(r"^=*\s*(\d+ passed.*?|\d+ failed.*?)\s*=*$", text["tests"], re.M)
    offload = work / "offload.json"
    cases = []
    for f in sorted(work.glob("bench-*.json")):
        for c in json.loads(f.read_text())["cases"]:
            keep = {k: c.get(k) for k in CASE_KEYS}
            if c.get("sekv"):
                keep["sekv"] = {k: c["sekv"].get(k) for k in SEKV_KEYS}
            cases.append(keep)
    gpu = work / "gpu.txt"
    summary = {"gpu": gpu.read_text().strip() if gpu.exists() else None, "total_s": total, "stages": stages,
               "tests": passed[-1] if passed else None,
               "kv_devices_seen": sorted(set(re.findall(r"dev = (\w+)", text["tests"] + text["offload"]))),
               "offload": json.loads(offload.read_text()) if offload.exists() else None, "cases": cases}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])), indent=1))
