"""Offline check of a router on captured teacher data (``python -m sekv_gguf train`` caches it): for every captured
query with enough span mass, the share of its span attention mass held by the ``--top`` spans each score ranks
first — the trained router's alpha, the summary logit ``q·k̄ + log|S|``, and the span mass (the default router's
score, exact up to the stored rank). With ``--holdout K`` the router is also retrained on all but the last K
documents and scored on those.

    .venv/bin/python scripts/router_offline.py ~/.cache/sekv_gguf/train/<key> bench/gemma3-270m-router.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sekv_gguf.adapter import read_adapter  # noqa: E402
from sekv_gguf.train.fit import TrainConfig, fit  # noqa: E402
from sekv_gguf.train.student import alphas  # noqa: E402


def recovered(captures: list[dict], w: list, b: list, top: int, min_mass: float) -> dict[str, float]:
    out: dict[str, list[np.ndarray]] = {"trained": [], "summary": [], "mass": []}
    for c in captures:
        lengths = c["lengths"]
        for ikv in range(int(c["n_layer"])):
            n_head, n_head_kv = c[f"q{ikv}"].shape[1], c[f"keys{ikv}"].shape[1]
            for h in range(n_head):
                keep = c[f"span_mass{ikv}"][:, h] >= min_mass
                if not keep.any():
                    continue
                q, keys = c[f"q{ikv}"][keep, h], c[f"keys{ikv}"][:, h // (n_head // n_head_kv)]
                lt, ls, lr = c[f"l_true{ikv}"][keep, h], c[f"l_sum{ikv}"][keep, h], c[f"l_rest{ikv}"][keep, h]
                share = np.exp(lt - np.logaddexp(np.logaddexp.reduce(lt, axis=1), lr)[:, None])  # [N, S]
                a = alphas(np.asarray(w[ikv][h], np.float64), float(b[ikv][h]), q, keys, lengths)
                for name, score in (("trained", a), ("summary", ls), ("mass", lt)):
                    best = np.argsort(-score, axis=1)[:, :top]
                    out[name].append(np.take_along_axis(share, best, 1).sum(1) / share.sum(1))
    return {k: round(float(np.mean(np.concatenate(v))), 3) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("captures", type=Path)
    ap.add_argument("adapter", type=Path)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--min-span-mass", type=float, default=0.2)
    ap.add_argument("--holdout", type=int, default=3)
    args = ap.parse_args()
    caps = [dict(np.load(f)) for f in sorted(args.captures.glob("doc-*.npz"))]
    a = read_adapter(args.adapter)
    print("in-sample", recovered(caps, a.w, a.b, args.top, args.min_span_mass))
    if args.holdout and len(caps) > args.holdout:
        r = fit(caps[:-args.holdout], TrainConfig(), progress=False)
        print("held-out", recovered(caps[-args.holdout:], r["w"], r["b"], args.top, args.min_span_mass))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
