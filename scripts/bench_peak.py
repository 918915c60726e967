"""Peak memory of a prompt, as a user sees it: ``python -m sekv_gguf run`` on a long natural-text document (Python's
own documentation prose, a question at the end) in one process per setting, its max RSS read from the kernel
(``wait4``), minus the same command's on a 6-token prompt (what the context costs at its peak, weights and
libraries taken out). Each setting's processes run one after another, alone. Writes bench/<out>.json and .png.

    .venv/bin/python scripts/bench_peak.py --tokens 28000 --budget 0.1 --out bench/peak-28k
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sekv_gguf.models import default_model_path, smollm2_path
from sekv_gguf.provenance import envelope
from sekv_gguf.ruler_tasks import stdlib_prose
from sekv_gguf.session import load_model

QUESTION = "\n\nQuestion: What is the main topic of the text above?\nAnswer:"
# the default sekv prefill streams (rarity signal, sliding-window refresh); "exact" is the full-size reference
SETTINGS = {"full": ["--policy", "full"], "sekv": [], "sekv-exact": ["--prefill", "exact"],
            "sekv-routed": ["--chunk-routing", "layer"], "sekv-surprisal": ["--signal", "surprisal"],
            "sekv-q8": ["--host-format", "q8"]}


def document(model_path: str, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of prose and the question."""
    model = load_model(model_path)
    prose = stdlib_prose()
    text = (prose * (1 + 6 * n_tokens // len(prose)))
    ids = model.tokenize(text.encode(), add_bos=True, special=False)[: n_tokens]
    return model.detokenize(ids[1:]).decode("utf-8", "replace") + QUESTION


def run_alone(args: list[str]) -> dict:
    """One ``run`` process, its own rusage read with ``wait4`` (RUSAGE_CHILDREN would keep the largest child so
    far): its JSON result, max RSS (bytes) and wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sekv_gguf", "run", "--json", "-q", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_chunks, err_chunks = [], []
    _, status, usage = os.wait4(proc.pid, 0)
    out_chunks.append(proc.stdout.read())
    err_chunks.append(proc.stderr.read())
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"run {' '.join(args)} failed: {''.join(err_chunks).strip().splitlines()[-1:]}")
    return {"result": json.loads("".join(out_chunks)), "max_rss_bytes": usage.ru_maxrss * 1024,
            "wall_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=28000)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=8)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--model", help="GGUF model (default: Gemma 3 270M; \"smollm2\": the chat default)")
    ap.add_argument("--out", default="bench/peak-28k")
    args = ap.parse_args()
    model = str(smollm2_path() if args.model == "smollm2" else args.model or default_model_path())
    os.environ["SEKV_THREADS"] = str(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        long_doc, short = Path(tmp) / "long.txt", Path(tmp) / "short.txt"
        long_doc.write_text(document(model, args.tokens))
        short.write_text("The capital of France is")
        for name in args.settings:
            flags = [model, "--kv-budget", str(args.budget), "-n", str(args.n_predict), *SETTINGS[name]]
            base = run_alone([*flags, "-f", str(short)])
            big = run_alone([*flags, "-f", str(long_doc)])
            r = big["result"]
            row = {"setting": name, "prompt_tokens": r["prompt_tokens"], "max_rss_bytes": big["max_rss_bytes"],
                   "short_prompt_max_rss_bytes": base["max_rss_bytes"],
                   "context_cost_bytes": big["max_rss_bytes"] - base["max_rss_bytes"],
                   "device_kv_bytes": r["device_kv_bytes"], "host_kv_bytes": r["host_kv_bytes"],
                   "full_kv_bytes": r["full_kv_bytes"], "prefill_tok_s": r["prefill_tok_s"],
                   "decode_tok_s": r["decode_tok_s"], "wall_s": big["wall_s"], "text": r["text"],
                   "sekv": r.get("sekv"),
                   # what the memory holds after the prompt (device cells + host tier), as a share of full KV
                   "kv_after_prompt_over_full": (r["device_kv_bytes"] + r["host_kv_bytes"]) / r["full_kv_bytes"]}
            rows.append(row)
            print(f"{name:>15}: max RSS {row['max_rss_bytes'] / 2**20:7.1f} MiB, context cost "
                  f"{row['context_cost_bytes'] / 2**20:7.1f} MiB, prefill {row['prefill_tok_s']:6.1f} tok/s, device + "
                  f"host {row['kv_after_prompt_over_full']:.2f} of full KV", flush=True)
    full = next((r for r in rows if r["setting"] == "full"), None)
    for r in rows:
        r["context_cost_over_full"] = r["context_cost_bytes"] / full["context_cost_bytes"] if full else None
    doc = {**envelope(), "params": vars(args), "model": Path(model).name, "rows": rows}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, out.with_suffix(".png"), args)
    return 0


def plot(rows: list[dict], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["setting"] for r in rows]
    ax.bar(names, [r["context_cost_bytes"] / 2**20 for r in rows], label="max RSS − short prompt's")
    ax.bar(names, [r["device_kv_bytes"] / 2**20 for r in rows], width=0.4, label="device KV")
    ax.set_ylabel("MiB")
    ax.tick_params(axis="x", labelrotation=15)
    ax.set_title(f"peak memory of a {args.tokens}-token prompt, budget {args.budget:g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
