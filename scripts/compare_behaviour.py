"""What a refactor must not change, recorded so that two commits can be compared: every policy on a tiny llama and a
tiny Gemma-3-like model (tokens, a checksum of every returned logits vector, the statistics without timings) through
prefill, greedy steps, a second turn, a truncation and a snapshot/restore; eval rows on a fixed seed; with
``--gemma`` the default job (``run --json`` on the bundled document).

    .venv/bin/python scripts/compare_behaviour.py --out /tmp/before.json [--gemma]
    .venv/bin/python scripts/compare_behaviour.py --compare /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.decode import decode_loop
from sekv_gguf.documents import stdlib_prose
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.eval.suite import EvalConfig, run_suite
from sekv_gguf.policies import POLICIES
from sekv_gguf.session import load_model
from sekv_gguf.tiny_models import TinySpec, write_tiny_gemma3, write_tiny_llama

TIMING_SUFFIXES = ("_s", "_tok_s", "_ms_per_step", "_per_s")


def plain(x: Any) -> Any:
    """Statistics as plain data without timings (typed or dict)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        x = x.to_json() if hasattr(x, "to_json") else dataclasses.asdict(x)
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items() if not k.endswith(TIMING_SUFFIXES)}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return round(float(x), 9)
    if isinstance(x, np.integer):
        return int(x)
    return x


def checksum(logits: np.ndarray) -> list[Any]:
    return [int(np.argmax(logits)), round(float(np.asarray(logits, dtype=np.float64).sum()), 6)]


def lifecycle(model: Any, name: str, prompt: list[int], turn: list[int], sekv: dict[str, Any]) -> dict[str, Any]:
    """Prefill, 8 greedy steps, a second turn and 4 steps, a snapshot, 2 steps, restore, 2 steps, a truncation."""
    n_context = len(prompt) + len(turn) + 32
    params = SekvConfig(**sekv) if name == "sekv" else None
    ctx = ContextConfig(n_threads=2)
    policy = make_policy(name, model, n_context, ctx, BudgetConfig(kv_budget=0.25), params)
    out: dict[str, Any] = {"sums": [], "tokens": []}
    try:
        def greedy(logits: np.ndarray, n: int) -> np.ndarray:
            done = decode_loop(policy.step, logits, n, after_step=lambda k, x: out["sums"].append(checksum(x)))
            out["tokens"].extend(done.tokens)
            return done.logits

        logits = policy.prefill(prompt)
        out["sums"].append(checksum(logits))
        logits = greedy(logits, 8)
        logits = policy.append(turn)
        out["sums"].append(checksum(logits))
        logits = greedy(logits, 4)
        snap = policy.snapshot()
        greedy(logits, 2)
        policy.restore(snap)
        logits = greedy(logits, 2)
        out["stats"] = plain(policy.stats())
        n = len(prompt) + 4
        out["truncated"] = bool(policy.truncate(n))
        if out["truncated"]:
            logits = policy.step(prompt[n]) if n < len(prompt) else policy.append(turn[:1])
            out["sums"].append(checksum(logits))
            greedy(logits, 3)
        out["stats_end"] = plain(policy.stats())
    finally:
        policy.close()
    return out


def tiny_runs(tmp: Path) -> dict[str, Any]:
    models = {"tiny-llama": write_tiny_llama(tmp / "tiny-llama.gguf", TinySpec()),
              "tiny-gemma": write_tiny_gemma3(tmp / "tiny-gemma3.gguf")}
    text = stdlib_prose()
    out: dict[str, Any] = {}
    for label, path in models.items():
        model = load_model(path)
        prompt = model.tokenize(text[:6000].encode(), add_bos=True, special=False)[:1400]
        turn = model.tokenize(text[9000:9400].encode(), add_bos=False, special=False)[:60]
        for name in POLICIES:
            variants = ({"": {}, "-streaming": {"prefill": "streaming"}, "-exact": {"prefill": "exact"}}
                        if name == "sekv" else {"": {}})
            for suffix, sekv in variants.items():
                out[f"{label}/{name}{suffix}"] = lifecycle(model, name, prompt, turn, sekv)
                print(f"{label}/{name}{suffix}", file=sys.stderr)
        run = generate(make_policy("sekv", model, len(prompt) + 16, ContextConfig(n_threads=2),
                                   BudgetConfig(kv_budget=0.25)), prompt, 16, stop_at_eos=False)
        out[f"{label}/generate"] = plain(run.to_json() | {"tokens": run.tokens})
    return out


def eval_rows(tmp: Path) -> dict[str, Any]:
    model = load_model(write_tiny_llama(tmp / "tiny-llama-eval.gguf", TinySpec()))
    cfg = EvalConfig(policies=("full", "sekv", "snapkv", "streaming"), budgets=(0.2,), tasks=("niah_number",),
                     lengths=(1024,), samples=2, haystacks=("prose",), n_predict=8, fidelity_docs=1, fidelity_steps=16)
    res = run_suite(model, cfg, ContextConfig(n_threads=2), progress=False)
    return {"cases": plain(res["cases"]), "fidelity": plain(res["fidelity"])}


def default_job() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "sekv_gguf", "run", "--json", "-q", "--threads", "2"],
                          capture_output=True, text=True)
    if proc.returncode != 0:  # older CLIs without --threads
        proc = subprocess.run([sys.executable, "-m", "sekv_gguf", "run", "--json", "-q"], capture_output=True,
                              text=True, check=True)
    return plain(json.loads(proc.stdout))


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in the first" for k in a.keys() - b.keys()]
        out += [f"{path}/{k}: only in the second" for k in b.keys() - a.keys()]
        for k in a.keys() & b.keys():
            out += diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:120]} != {str(b)[:120]}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--gemma", action="store_true", help="also the default job on Gemma 3 270M (~40 s)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        problems = diff(a, b)
        print("\n".join(problems) if problems else "identical")
        return 1 if problems else 0
    if args.out is None:
        ap.error("--out or --compare")
    with tempfile.TemporaryDirectory() as tmp:
        doc = {"tiny": tiny_runs(Path(tmp)), "eval": eval_rows(Path(tmp))}
    if args.gemma:
        doc["default_job"] = default_job()
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
