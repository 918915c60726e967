"""Control for the trained router's evaluation: the summary score's proposals ordered by exact span mass, exactly as
``TrainedRouter`` does with ``verify_candidates`` (the same count), on the needle task of ``eval`` — does the
training or the verification find the needles? Writes bench/router-control-<length>.json.

    .venv/bin/python scripts/router_control.py --length 4096 --samples 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sekv_gguf.config import ContextConfig, SekvConfig
from sekv_gguf.eval.suite import EvalConfig, run_suite
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.router import Ranking, Resident, SummaryRouter, verify
from sekv_gguf.session import load_model
from sekv_gguf.span_store import SpanStore


class VerifiedSummaryRouter(SummaryRouter):
    """``q·k̄ + log|S|`` proposes ``candidates`` spans per layer; their exact mass orders them, ahead of the rest."""

    name = "summary+verify"

    def __init__(self, candidates: int):
        self.candidates = candidates

    def score(self, ikv: int, query: np.ndarray, store: SpanStore) -> np.ndarray:
        return self.rank(ikv, query, store).scores

    def rank(self, ikv: int, query: np.ndarray, store: SpanStore, resident: Resident | None = None) -> Ranking:
        proposed = super().score(ikv, query, store)  # [n_spans]
        return verify(ikv, query, store, proposed, self.candidates, resident)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    ctx = ContextConfig(n_threads=args.threads)
    model = load_model(str(default_model_path()), ctx)
    cfg = EvalConfig(policies=("sekv",), tasks=("niah_number",), lengths=(args.length,), samples=args.samples,
                     haystacks=("prose",), fidelity_docs=0)
    res = run_suite(model, cfg, ctx, progress=False, router=VerifiedSummaryRouter(SekvConfig.verify_candidates))
    acc = res["summary"]["accuracy"]  # runs named sekv-summary+verify@<budget>
    print(json.dumps(acc))
    out = Path(f"bench/router-control-{args.length // 1024}k.json")
    out.write_text(json.dumps({**envelope(), "params": res["params"], "accuracy": acc,
                               "cases": res["cases"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
