"""Engine benchmark: ``full`` and ``sekv`` side by side in one process per length.

Writes bench/engine.json (machine, commit, every parameter, per-case raw numbers) and bench/engine.png.

    .venv/bin/python scripts/bench_engine.py                       # Gemma 3 270M 2K-32K + tiny llama 8K-64K
    .venv/bin/python scripts/bench_engine.py --gemma 2048 --tiny 8192 --depths 0.5
    .venv/bin/python scripts/bench_engine.py --gemma 8192 --tiny --sekv step_routing=layer   # a third run, sekv-...
    .venv/bin/python scripts/bench_engine.py --gemma 32000 --tiny --variant route_every=2,zoom_hold=1 \
        --variant route_every=1,zoom_hold=1                       # one more run per --variant, side by side
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from sekv_gguf.cli import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.models import default_model_path, qwen_coder_path
from sekv_gguf.provenance import envelope
from sekv_gguf.ruler_tasks import needle_prompt
from sekv_gguf.session import load_model
from sekv_gguf.tiny_models import SHAPED, TinySpec, write_shaped, write_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("full", "sekv")


def runs(variants: list[dict]) -> list[tuple[str, str, SekvConfig | None]]:
    """(label, policy, parameters): full, sekv, and one sekv run per non-empty override dict of ``variants``."""
    out = [(name, name, None) for name in POLICIES]
    for overrides in (v for v in variants if v):
        out.append(("-".join(["sekv", *(f"{k}={v}" for k, v in overrides.items())]), "sekv", SekvConfig(**overrides)))
    return out


def run_case(model, model_name: str, n_tokens: int, depth: float, n_predict: int, budget: float, min_budget: int,
             seed: int, ctx_config: ContextConfig, variants: list[dict]) -> list[dict]:
    count = lambda text: len(model.tokenize(text.encode(), add_bos=True, special=False))  # noqa: E731
    needle = needle_prompt(count, n_tokens, depth, seed)
    tokens = model.tokenize(needle.prompt.encode(), add_bos=True, special=False)
    out = []
    cells = max(int(budget * (len(tokens) + n_predict)), min_budget)  # short contexts need a floor of cells
    for label, name, params in runs(variants):
        policy = make_policy(name, model, len(tokens) + n_predict, ctx_config, BudgetConfig(kv_budget=cells), params)
        t0 = time.perf_counter()
        r = generate(policy, tokens, n_predict, model_name=model_name, stop_at_eos=False)
        wall = time.perf_counter() - t0
        policy.close()
        row = r.to_json()
        row.update({"policy": label, "n_tokens": n_tokens, "depth": depth, "budget_cells_asked": cells, "answer": needle.answer,
                    "correct": needle.answer in r.text, "wall_s": wall})
        out.append(row)
        print(f"{model_name} {n_tokens:>6} depth {depth:.2f} {label:>5}: kv {row['device_kv_bytes'] / 2**20:7.2f} MiB"
              f" host {row['host_kv_bytes'] / 2**20:7.2f} MiB prefill {row['prefill_tok_s']:7.1f} tok/s decode "
              f"{row['decode_tok_s']:6.1f} tok/s correct {row['correct']} {r.text.strip()[:24]!r}", flush=True)
    return out


def plot(cases: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({c["model"] for c in cases})
    fig, axes = plt.subplots(len(models), 3, figsize=(14, 4 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        sub = [c for c in cases if c["model"] == model]
        lengths = sorted({c["n_tokens"] for c in sub})

        def series(policy: str, key: str) -> list[float]:
            vals = []
            for n in lengths:
                xs = [c[key] for c in sub if c["n_tokens"] == n and c["policy"] == policy]
                vals.append(sum(xs) / len(xs))
            return vals

        for policy in sorted({c["policy"] for c in sub}, key=lambda p: (len(p), p)):
            row[0].plot(lengths, [v / 2**20 for v in series(policy, "device_kv_bytes")], "o-", label=f"{policy} device")
            row[1].plot(lengths, series(policy, "prefill_tok_s"), "o-", label=policy)
            row[2].plot(lengths, series(policy, "decode_tok_s"), "o-", label=policy)
        row[0].plot(lengths, [v / 2**20 for v in series("sekv", "host_kv_bytes")], "s--", label="sekv host")
        for ax, title in zip(row, ("KV memory (MiB)", "prefill tok/s", "decode tok/s")):
            ax.set_title(f"{model}: {title}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context tokens")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gemma", type=int, nargs="*", default=[2048, 8192, 16384, 32000])
    ap.add_argument("--tiny", type=int, nargs="*", default=[8192, 16384, 32768, 65000])
    ap.add_argument("--depths", type=float, nargs="*", default=[0.5])
    ap.add_argument("--budget", type=float, default=0.1, help="device budget as a share of the context")
    ap.add_argument("--min-budget", type=int, default=1024, help="but at least this many cells")
    ap.add_argument("--n-predict", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads per context (0: half the logical cores)")
    ap.add_argument("--shaped", action="append", default=[], metavar="NAME=LEN[,LEN...]",
                    help=f"random-weight models shaped like real ones ({', '.join(SHAPED)}) at these lengths")
    ap.add_argument("--qwen", type=int, nargs="*", default=[],
                    help="lengths on Qwen2.5-Coder-1.5B-Instruct (fetched once: python -m sekv_gguf.models qwen-coder)")
    ap.add_argument("--sekv", action="append", metavar="KEY=VALUE",
                    help="a SekvConfig override for a third run beside full and sekv (repeatable)")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one more sekv run with these SekvConfig overrides (repeatable: one run each)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "engine"))
    args = ap.parse_args()
    variants = [sekv_overrides(args.sekv or [])] + [sekv_overrides(v.split(",")) for v in args.variant]

    ctx_config = ContextConfig(n_threads=args.threads)
    cases: list[dict] = []
    if args.gemma:
        path = default_model_path()
        model = load_model(path, ctx_config)
        for n in args.gemma:
            for d in args.depths:
                cases += run_case(model, "gemma3-270m", n, d, args.n_predict, args.budget, args.min_budget, args.seed,
                                  ctx_config, variants)
    if args.qwen:
        model = load_model(qwen_coder_path(), ctx_config)
        for n in args.qwen:
            for d in args.depths:
                cases += run_case(model, "qwen2.5-coder-1.5b", n, d, args.n_predict, args.budget, args.min_budget,
                                  args.seed, ctx_config, variants)
        del model
    if args.tiny:
        with tempfile.TemporaryDirectory() as tmp:
            spec = TinySpec(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_ff=256)
            model = load_model(write_tiny_llama(Path(tmp) / "tiny.gguf", spec), ctx_config)
            for n in args.tiny:
                cases += run_case(model, "tiny-llama", n, 0.5, args.n_predict, args.budget, args.min_budget, args.seed,
                                  ctx_config, variants)

    for item in args.shaped:
        name, _, lengths = item.partition("=")
        with tempfile.TemporaryDirectory() as tmp:
            model = load_model(write_shaped(Path(tmp) / f"{name}.gguf", name), ctx_config)
            for n in (int(x) for x in lengths.split(",") if x):
                cases += run_case(model, f"{name}-shaped", n, 0.5, args.n_predict, args.budget, args.min_budget,
                                  args.seed, ctx_config, variants)
            del model

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"name": "engine", **envelope(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "params": vars(args) | {"context": ctx_config.__dict__, "budget": BudgetConfig(kv_budget=args.budget).__dict__,
                                      "sekv": SekvConfig().__dict__},
              "cases": cases}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(cases, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
