"""Add runs saved by earlier ``eval`` invocations to another evaluation's JSON (same tasks, lengths, haystacks and
pinned depths; other policies, budgets or seeds), e.g. full-KV runs of the same prompts made by an earlier commit:

    .venv/bin/python scripts/merge_evals.py bench/eval-long-28k-grid.json bench/eval-long-28k.json \\
        bench/eval-long-28k-full-s3.json --policies full

Rows are taken only for the named policies; a case present in both keeps the target's run. The target's JSON and
PNG are rewritten (``sekv_gguf.eval.report.merge`` rules; the sources are listed under ``merged_from``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sekv_gguf.eval.report import merge, plot


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path, help="eval JSON to add the runs to")
    ap.add_argument("sources", type=Path, nargs="+", help="eval JSONs to take runs from")
    ap.add_argument("--policies", nargs="+", required=True, help="policy labels whose runs are taken")
    args = ap.parse_args()
    doc = json.loads(args.target.read_text())
    for src in args.sources:
        old = json.loads(src.read_text())
        taken = {**old, "cases": [c for c in old["cases"] if c["policy"] in args.policies],
                 "fidelity": [f for f in old["fidelity"] if f["policy"] in args.policies]}
        if not taken["cases"] and not taken["fidelity"]:
            raise SystemExit(f"{src}: no runs of {', '.join(args.policies)}")
        taken["params"] = {**old["params"], "policies": [p for p in old["params"]["policies"] if p in args.policies]}
        # the target's runs win: merge(taken, target) keeps the target's row of a case both hold
        merged = merge(taken, doc)
        doc = {**doc, **merged, "commits": doc.get("commits", [doc.get("commit")]),
               "merged_from": doc.get("merged_from", []) + [{"file": src.name, "commit": old.get("commit"),
                                                              "policies": list(args.policies)}]}
        doc["params"]["policies"] = list(dict.fromkeys(taken["params"]["policies"] + doc["params"]["policies"]))
    args.target.write_text(json.dumps(doc, indent=1))
    plot(doc, args.target.with_suffix(".png"))
    print(f"wrote {args.target} ({len(doc['cases'])} cases) and {args.target.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
