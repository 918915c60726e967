"""Saving an evaluation: ``bench/eval-<name>.json`` (every parameter, per-case raw output, machine, commit) and PNG
plots (accuracy vs budget per policy and task; KL vs budget)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..provenance import commit, envelope
from .summary import summarize


def _case_key(c: dict[str, Any]) -> tuple[Any, ...]:
    """What a case row is a run of: the policy and budget on one task prompt (task, haystack, length, seed)."""
    return (c["policy"], c["budget"], c["task"], c["haystack"], c["length"], c["seed"])


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` runs added to an earlier result of the same tasks, lengths and depths (other policies, budgets or
    seeds); a case run again (same policy, budget and prompt) replaces its earlier run, a (policy, budget) pair's
    fidelity run again replaces the earlier one."""
    for key in ("tasks", "lengths", "haystacks", "depths"):
        if json.loads(json.dumps(old["params"].get(key))) != json.loads(json.dumps(new["params"].get(key))):
            raise ValueError(f"cannot merge: {key} differ ({old['params'].get(key)} vs {new['params'].get(key)})")
    ran = {_case_key(c) for c in new["cases"]}
    cases = [c for c in old["cases"] if _case_key(c) not in ran] + new["cases"]
    ran_fid = {(f["policy"], f["budget"]) for f in new["fidelity"]}
    fidelity = [f for f in old["fidelity"] if (f["policy"], f["budget"]) not in ran_fid] + new["fidelity"]
    params = dict(old["params"])
    params["policies"] = list(dict.fromkeys(list(old["params"]["policies"]) + list(new["params"]["policies"])))
    params["budgets"] = sorted(set(old["params"]["budgets"]) | set(new["params"]["budgets"]))
    seeds = sorted({c["seed"] for c in cases})
    if seeds:  # the seeds now covered (each run's own seed/samples are in its commit's command)
        params["seed"], params["samples"] = seeds[0], len(seeds)
    commits = old.get("commits", [old.get("commit")])
    return {"params": params, "cases": cases, "fidelity": fidelity, "summary": summarize(cases, fidelity),
            "commits": commits}


def output_path(out_dir: Path, name: str) -> Path:
    """``out_dir/eval-<name>.json``, checked before a run that may take hours: ``name`` a plain file-name part (no
    directory in it), ``out_dir`` created if missing and writable."""
    if not name or any(c in name for c in ("/", "\\", "\0")) or name in (".", ".."):
        raise ValueError(f"--name must be a plain name (results go to OUT/eval-NAME.json; use --out for the "
                         f"directory), got {name!r}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output directory {str(out_dir)!r}: {e.strerror}") from None
    if not os.access(out_dir, os.W_OK):
        raise ValueError(f"the output directory {str(out_dir)!r} is not writable")
    return out_dir / f"eval-{name}.json"


def write(result: dict[str, Any], out_dir: Path, name: str, model: str, merge_into: bool = False) -> Path:
    """Save ``result`` (with ``merge_into``: added to the runs already saved under this name)."""
    path = output_path(out_dir, name)
    if merge_into and path.exists():
        result = merge(json.loads(path.read_text()), result)
        result["commits"] = result["commits"] + [commit()]
    doc = {"name": name, "model": model, **envelope(), **result}  # command, commit, uncommitted, machine
    path.write_text(json.dumps(doc, indent=1))
    plot(doc, out_dir / f"eval-{name}.png")
    return path


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = doc["summary"]["accuracy"]
    fid = doc["summary"]["fidelity"]
    tasks = list(doc["params"]["tasks"]) + ["all"]
    policies = [p for p in doc["params"]["policies"]]
    budgets = sorted(doc["params"]["budgets"])
    n = len(tasks) + 1
    cols = 4
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for p in policies:
            if p == "full":
                if "full" in acc and task in acc["full"]:
                    ax.axhline(acc["full"][task], color="k", ls="--", label="full")
                continue
            ys = [acc.get(f"{p}@{b:g}", {}).get(task) for b in budgets]
            ax.plot([b for b, y in zip(budgets, ys) if y is not None], [y for y in ys if y is not None], "o-",
                    label=p)
        ax.set_title(task)
        ax.set_xlabel("budget (share of context)")
        ax.set_ylim(-0.05, 1.05)
    ax = axes.flat[len(tasks)]
    for p in policies:
        if p == "full":
            continue
        ys = [fid.get(f"{p}@{b:g}", {}).get("kl_mean") for b in budgets]
        ax.plot([b for b, y in zip(budgets, ys) if y is not None], [y for y in ys if y is not None], "o-", label=p)
    ax.set_title("teacher-forced KL(full ‖ policy)")
    ax.set_xlabel("budget (share of context)")
    ax.set_yscale("log")
    for extra in list(axes.flat)[n:]:
        extra.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{doc['model']} — lengths {doc['params']['lengths']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(doc: dict[str, Any]) -> str:
    """A markdown table: per policy@budget, accuracy per task and overall, KL, top-1 agreement, RMS Δp and
    ln(PPL(policy) / PPL(full))."""
    acc, fid = doc["summary"]["accuracy"], doc["summary"]["fidelity"]
    tasks = list(doc["params"]["tasks"])
    head = "| policy | " + " | ".join(tasks) + " | all | KL | KL median | KL p99 | top-1 | RMS Δp | ln PPL ratio |"
    lines = [head, "|" + "---|" * (len(tasks) + 8)]
    order = {p: i for i, p in enumerate(doc["params"]["policies"])}

    def rank(k: str) -> tuple[int, float]:
        name, _, budget = k.partition("@")
        return order.get(name, len(order)), float(budget or 0)

    for k in sorted(set(acc) | set(fid), key=rank):  # a fidelity-only run (no task cases) has rows too
        row, f = acc.get(k, {}), fid.get(k, {})
        kl, med, p99 = (f"{f[n]:.3f}" if n in f else "—" for n in ("kl_mean", "kl_median", "kl_p99"))
        top1 = f"{f['top1_agreement']:.2f}" if f else "—"
        rms_dp = f"{f['delta_p_rms']:.3f}" if "delta_p_rms" in f else "—"
        ln_ppl = f"{f['ln_ppl_ratio']:+.4f}" if "ln_ppl_ratio" in f else "—"
        scores = [f"{row[t]:.2f}" if t in row else "—" for t in [*tasks, "all"]]
        lines.append(f"| {k} | " + " | ".join(scores) + f" | {kl} | {med} | {p99} | {top1} | {rms_dp} | {ln_ppl} |")
    paired = doc["summary"].get("paired", {})  # absent from files written before it
    if paired:
        lines += ["", "| sekv run | against | score difference ± s.e. | cases |", "|---|---|---|---|"]
        lines += [f"| {k} | {o} | {d['diff']:+.2f} ± {d['se']:.2f} | {d['n']} |"
                  for k, against in paired.items() for o, d in against.items()]
    paired_fid = doc["summary"].get("paired_fidelity", {})
    if paired_fid:
        lines += ["", "| sekv run | against | corpus | KL difference ± s.e. | top-1 difference ± s.e. | documents |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {k} | {o} | {corpus} | {d['kl_diff']:+.4f} ± {d['kl_se']:.4f} | "
                  f"{d['top1_diff']:+.3f} ± {d['top1_se']:.3f} | {d['n']} |"
                  for corpus, per in paired_fid.items() for k, against in per.items() for o, d in against.items()]
    return "\n".join(lines)
