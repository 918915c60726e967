"""What an evaluation's runs add up to: mean scores per policy@budget and task, paired differences of each sekv run
against the others with their standard error (task scores per prompt, teacher-forced KL and top-1 agreement per
document), and pooled teacher-forced fidelity per corpus."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .fidelity import KL_LARGE, token_spread


def summarize(cases: list[dict[str, Any]], fidelity: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean score per (policy, budget, task) and per (policy, budget) over all tasks; mean KL / agreement."""
    def key(r: dict[str, Any]) -> str:
        return r["policy"] if r["budget"] is None else f"{r['policy']}@{r['budget']:g}"

    acc: dict[str, dict[str, list[float]]] = {}
    for r in cases:
        acc.setdefault(key(r), {}).setdefault(r["task"], []).append(0.0 if r["score"] is None else r["score"])
    out: dict[str, Any] = {"accuracy": {}, "fidelity": {}, "paired": _paired(cases, key),
                           "paired_fidelity": _paired_fidelity(fidelity, key)}
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
    """Per sekv run (``key``: policy@budget) against full KV, every other policy at its budget and every sekv run
    before it at its budget (a ``--sekv-variant`` against the runs it varies): the mean score difference over the
    cases both ran (the same prompt: task, haystack, length, seed, depth), its standard error (the differences'
    sample standard deviation / sqrt(n); 0 with one case) and n — whether a difference exceeds its standard error is
    what a grid can claim."""
    scores: dict[str, dict[tuple[Any, ...], float]] = {}
    for r in cases:
        if r["score"] is not None:
            prompt = (r["task"], r["haystack"], r["length"], r["seed"], r["depth"])
            scores.setdefault(key(r), {})[prompt] = r["score"]
    out: dict[str, dict[str, Any]] = {}
    for k, other in _pairs(list(scores), with_full=True):
        d = _difference(scores[k], scores[other])
        if d is not None:
            out.setdefault(k, {})[other] = {"diff": d[0], "se": d[1], "n": d[2]}
    return out


def _paired_fidelity(fidelity: list[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """Per corpus and sekv run, against every other policy and every earlier sekv run at its budget: the mean
    teacher-forced KL difference and top-1 agreement difference over the documents both scored (length, document),
    each with its standard error, and n."""
    rows: dict[str, dict[str, dict[tuple[Any, ...], dict[str, Any]]]] = {}  # corpus -> run -> document -> row
    for r in fidelity:
        if r.get("kl_mean") is not None:
            rows.setdefault(r.get("corpus", "prose"), {}).setdefault(key(r), {})[(r["length"], r["doc"])] = r
    out: dict[str, Any] = {}
    for corpus, runs in rows.items():
        for k, other in _pairs(list(runs), with_full=False):
            d_kl, d_top1 = (_difference(*({doc: r[m] for doc, r in runs[x].items()} for x in (k, other)))
                            for m in ("kl_mean", "top1_agreement"))
            if d_kl is not None and d_top1 is not None:
                out.setdefault(corpus, {}).setdefault(k, {})[other] = {
                    "kl_diff": d_kl[0], "kl_se": d_kl[1], "top1_diff": d_top1[0], "top1_se": d_top1[1], "n": d_kl[2]}
    return out


def _pairs(runs: list[str], with_full: bool) -> list[tuple[str, str]]:
    """(sekv run, the run it is compared with) for ``runs`` (policy@budget keys in the order they ran): every other
    policy at the sekv run's budget, every sekv run before it at that budget, and full KV ``with_full``."""
    out = []
    for i, k in enumerate(runs):
        if not k.startswith("sekv"):
            continue
        budget = k.partition("@")[2]
        for j, other in enumerate(runs):
            same_budget = "@" in other and other.partition("@")[2] == budget
            if other == "full" and with_full or same_budget and (not other.startswith("sekv") or j < i):
                out.append((k, other))
    return out


def _difference(a: dict[Any, float], b: dict[Any, float]) -> tuple[float, float, int] | None:
    """The mean of a - b over their common keys, its standard error (ddof 1 / sqrt(n); 0 for one) and n; None
    without common keys."""
    both = sorted(set(a) & set(b), key=repr)
    if not both:
        return None
    d = np.array([a[c] - b[c] for c in both])  # [n]
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else 0.0
    return float(d.mean()), se, int(d.size)


def _pooled(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per (policy, budget, corpus): mean KL and agreement over documents (as before), and the median and tail of
    the per-token KL pooled over every scored token, Δp's mean and root mean square and the mean ln(PPL ratio)
    pooled the same way (as llama-perplexity reports them), and the mean share of steps whose top token is the text's
    own next token, the policy's and full KV's; of the steps whose KL exceeds ``KL_LARGE``, how many there are, the
    share of all KL they carry and the share where the policy gives the text's next token the higher probability
    (full KV wrong, the policy right) (rows without these values, from earlier files, give none)."""
    kls = np.concatenate([r["kls"] for r in rows if r.get("kls")] or [np.zeros(0)])  # [tokens]
    dps = np.concatenate([r["delta_ps"] for r in rows if r.get("delta_ps")] or [np.zeros(0)])  # [tokens]
    pooled: dict[str, float] = {**token_spread(kls, dps), **({"n_tokens": int(kls.size)} if kls.size else {})}
    lns = np.concatenate([r["ln_ppl_ratios"] for r in rows if r.get("ln_ppl_ratios")] or [np.zeros(0)])  # [tokens]
    if lns.size:
        texts = [r for r in rows if "top1_text" in r]
        pooled.update(ln_ppl_ratio=float(lns.mean()), top1_text=float(np.mean([r["top1_text"] for r in texts])),
                      ref_top1_text=float(np.mean([r["ref_top1_text"] for r in texts])))
        both = [r for r in rows if r.get("kls") and r.get("ln_ppl_ratios")]  # the same steps in each row
        if both:
            b_kls = np.concatenate([r["kls"] for r in both])  # [tokens]
            b_lns = np.concatenate([r["ln_ppl_ratios"] for r in both])  # [tokens]
            large = b_kls > KL_LARGE  # [tokens]
            pooled.update(large_kl_steps=int(large.sum()),
                          large_kl_share=float(b_kls[large].sum() / b_kls.sum()) if b_kls.sum() > 0 else 0.0,
                          large_kl_policy_likelier=float(np.mean(b_lns[large] < 0)) if large.any() else 0.0)
    return {"kl_mean": float(np.mean([r["kl_mean"] for r in rows])),
            "top1_agreement": float(np.mean([r["top1_agreement"] for r in rows])), **pooled}
