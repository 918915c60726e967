"""Offline check of a router on captured teacher data (``python -m sekv_gguf train`` caches it): for every captured
query with enough span mass, the share of its span attention mass held by the ``--top`` spans each score ranks
first. Scores: the trained router's alpha; ``cascade@K``, its K best spans ordered by their exact mass (what the
engine does with ``verify_candidates``); training-free scores from the same features (``sekv_gguf.features``) —
the summary logit ``q·k̄ + log|S|`` (the ``summary`` router), the Gaussian estimate ``q·k̄ + v + log|S|``, the
k-means centroid mixture (where training starts), the principal-box and channel-wise (Quest) bounds + log|S|; and
the span mass (the default ``mass`` router's score, exact up to the stored rank). With ``--holdout K`` the router
is also retrained on all but the last K documents and scored on those.

    .venv/bin/python scripts/router_offline.py ~/.cache/sekv_gguf/train/<key> bench/gemma3-270m-router.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from sekv_gguf.adapter import read_adapter
from sekv_gguf.features import features
from sekv_gguf.train.fit import TrainConfig, fit, span_features
from sekv_gguf.train.student import Params, alphas


def recovered(captures: list[dict], r: dict, top: int, min_mass: float) -> dict[str, float]:
    """r: per hooked layer w [H, P, d], b [H] and theta [H, F] (a fit's result or an adapter's fields)."""
    out: dict[str, list[np.ndarray]] = {}
    for c in captures:
        log_len = np.log(c["lengths"])
        for ikv in range(int(c["n_layer"])):
            n_head, n_head_kv = c[f"q{ikv}"].shape[1], c[f"keys{ikv}"].shape[1]
            for h in range(n_head):
                keep = c[f"span_mass{ikv}"][:, h] >= min_mass
                if not keep.any():
                    continue
                sf = span_features(c, ikv, h // (n_head // n_head_kv))
                q = c[f"q{ikv}"][keep, h]
                lt, lr = c[f"l_true{ikv}"][keep, h], c[f"l_rest{ikv}"][keep, h]
                share = np.exp(lt - np.logaddexp(np.logaddexp.reduce(lt, axis=1), lr)[:, None])  # [N, S]
                p = Params(w=np.asarray(r["w"][ikv][h], np.float64), b=np.array([float(r["b"][ikv][h])]),
                           theta=np.asarray(r["theta"][ikv][h], np.float64))
                m, v, box, quest, mix = features(q, sf)  # [N, S] each
                scores = {"trained": alphas(p, q, sf), "summary": m + log_len, "gaussian": m + v + log_len,
                          "box": m + box + log_len, "quest": m + quest + log_len, "mixture": m + mix + log_len,
                          "mass": lt}
                for k in (10, 20):  # the trained score picks k candidates, their exact mass ranks them
                    cand = np.argsort(-scores["trained"], axis=1)[:, :k]
                    cascade = np.full_like(lt, -np.inf)
                    np.put_along_axis(cascade, cand, np.take_along_axis(lt, cand, 1), 1)
                    scores[f"cascade@{k}"] = cascade
                for name, score in scores.items():
                    best = np.argsort(-score, axis=1)[:, :top]
                    out.setdefault(name, []).append(np.take_along_axis(share, best, 1).sum(1) / share.sum(1))
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
    print("in-sample", recovered(caps, vars(a), args.top, args.min_span_mass))
    if args.holdout and len(caps) > args.holdout:
        r = fit(caps[:-args.holdout], TrainConfig(), progress=False)
        print("held-out", recovered(caps[-args.holdout:], r, args.top, args.min_span_mass))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
