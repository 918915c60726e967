"""Control for the trained router's evaluation: the summary score's proposals ordered by exact span mass, exactly as
``TrainedRouter`` does with ``verify_candidates`` (the same count), on the needle task of ``eval`` — does the
training or the verification find the needles? Writes bench/router-control-<length>.json.

    .venv/bin/python scripts/router_control.py --length 4096 --samples 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sekv_gguf.config import ContextConfig, SekvConfig  # noqa: E402
from sekv_gguf.eval.report import commit, machine  # noqa: E402
from sekv_gguf.eval.suite import EvalConfig, run_suite  # noqa: E402
from sekv_gguf.models import default_model_path  # noqa: E402
from sekv_gguf.router import LowRankMassRouter, SummaryRouter  # noqa: E402
from sekv_gguf.session import load_model  # noqa: E402


class VerifiedSummaryRouter(SummaryRouter):
    """``q·k̄ + log|S|`` proposes ``candidates`` spans per layer; their exact mass orders them, ahead of the rest."""

    name = "summary+verify"

    def __init__(self, candidates: int):
        self.candidates, self._verify = candidates, LowRankMassRouter()

    def score(self, ikv, query, keys, lengths, spans, bounds=None):
        proposed = super().score(ikv, query, keys, lengths, spans, bounds)  # [n_spans]
        return self._verify.verify(ikv, query, keys, spans, proposed, self.candidates)


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
    acc = {k.replace("sekv-trained", "sekv-summary+verify"): v for k, v in res["summary"]["accuracy"].items()}
    print(json.dumps(acc))
    out = Path(f"bench/router-control-{args.length // 1024}k.json")
    out.write_text(json.dumps({"machine": machine(), "commit": commit(), "params": res["params"], "accuracy": acc,
                               "cases": res["cases"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
