"""Print the README table of bench/engine*.json files: per model and length, sekv as ratios to full from the same run.

    .venv/bin/python scripts/bench_table.py bench/engine.json bench/engine-32k.json
"""

import json
import sys
from collections import defaultdict


def main(paths: list[str]) -> None:
    rows = defaultdict(dict)
    for path in paths:
        for c in json.load(open(path))["cases"]:
            rows[(c["model"], c["n_tokens"], c["depth"])][c["policy"]] = c
    print("| model | tokens | device KV sekv / full | host / full KV | prefill tok/s (ratio) | decode tok/s (ratio) "
          "| needle full / sekv |")
    print("|---|---|---|---|---|---|---|")
    for (model, n, depth), p in sorted(rows.items()):
        f, s = p["full"], p["sekv"]
        needle = "n/a (random weights)" if model.startswith("tiny") else f"{'✓' if f['correct'] else '✗'} / " \
                                                                         f"{'✓' if s['correct'] else '✗'}"
        print(f"| {model} | {n} | {s['device_kv_bytes'] / 2**20:.1f} / {f['device_kv_bytes'] / 2**20:.1f} MiB "
              f"({s['device_kv_bytes'] / f['device_kv_bytes']:.2f}) | {s['host_kv_bytes'] / f['full_kv_bytes']:.2f} "
              f"| {s['prefill_tok_s']:.0f} / {f['prefill_tok_s']:.0f} ({s['prefill_tok_s'] / f['prefill_tok_s']:.2f}) "
              f"| {s['decode_tok_s']:.1f} / {f['decode_tok_s']:.1f} ({s['decode_tok_s'] / f['decode_tok_s']:.2f}) "
              f"| {needle} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["bench/engine.json"])
