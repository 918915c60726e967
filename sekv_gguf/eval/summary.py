"""What an evaluation's runs add up to: mean scores per policy@budget and task, paired differences of each sekv run
against the others with their standard error, and pooled teacher-forced fidelity per corpus."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .fidelity import KL_TAIL


def summarize(cases: list[dict[str, Any]], fidelity: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean score per (policy, budget, task) and per (policy, budget) over all tasks; mean KL / agreement."""
    def key(r: dict[str, Any]) -> str:
        return r["policy"] if r["budget"] is None else f"{r['policy']}@{r['budget']:g}"

    acc: dict[str, dict[str, list[float]]] = {}
    for r in cases:
        acc.setdefault(key(r), {}).setdefault(r["task"], []).append(0.0 if r["score"] is None else r["score"])
    out: dict[str, Any] = {"accuracy": {}, "fidelity": {}, "paired": _paired(cases, key)}
    for k, per_task in acc.items():
        out["accuracy"][k] = {t: float(np.mean(v)) for t, v in per_task.items()}
        out["accuracy"][k]["all"] = float(np.mean([x for v in per_task.values() for x in v]))
    fid: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in fidelity:
        if r.get("kl_mean") is not None:
            fid.setdefault(r.get("corpus", "prose"), {}).setdefault(key(r), []).append(r)
    out["fidelity_by_corpus"] = {c: {k: _pooled(rows) for k, rows in per.items()} for c, per in fid.items()}
    # the first corpus run (prose unless left out) keeps the place earlier reports read
    out["fidelity"] = next(iter(out["fidelity_by_corpus"].values()), {})
    return out


def _paired(cases: list[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> dict[str, dict[str, Any]]:
    """Per sekv run (``key``: policy@budget) against full KV and every other policy at its budget: the mean score
    difference over the cases both ran (the same prompt: task, haystack, length, seed, depth), its standard error
    (the differences' sample standard deviation / sqrt(n); 0 with one case) and n — whether a difference exceeds
    its standard error is what a grid can claim."""
    scores: dict[str, dict[tuple[Any, ...], float]] = {}
    for r in cases:
        if r["score"] is not None:
            prompt = (r["task"], r["haystack"], r["length"], r["seed"], r["depth"])
            scores.setdefault(key(r), {})[prompt] = r["score"]
    out: dict[str, dict[str, Any]] = {}
    for k in (k for k in scores if k.startswith("sekv")):
        budget = k.partition("@")[2]
        for other in (o for o in scores if not o.startswith("sekv") and (o == "full" or o.partition("@")[2] == budget)):
            both = sorted(set(scores[k]) & set(scores[other]), key=repr)
            if not both:
                continue
            d = np.array([scores[k][c] - scores[other][c] for c in both])  # [n]
            se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else 0.0
            out.setdefault(k, {})[other] = {"diff": float(d.mean()), "se": se, "n": int(d.size)}
    return out


def _pooled(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per (policy, budget, corpus): mean KL and agreement over documents (as before), and the median and tail of
    the per-token KL pooled over every scored token (as llama-perplexity reports them; rows without per-token KL,
    from earlier files, give none)."""
    kls = np.concatenate([r["kls"] for r in rows if r.get("kls")] or [np.zeros(0)])
    pooled = {"kl_median": float(np.median(kls)), "kl_p99": float(np.percentile(kls, KL_TAIL)),
              "n_tokens": int(kls.size)} if kls.size else {}
    return {"kl_mean": float(np.mean([r["kl_mean"] for r in rows])),
            "top1_agreement": float(np.mean([r["top1_agreement"] for r in rows])), **pooled}
