"""What each command does (``python -m sekv_gguf run|eval|train|serve|chat|info``), given its parsed flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable

import llama_cpp
from tqdm import tqdm

from .. import auto_budget, rpc, sampling, support
from ..config import BudgetConfig, ContextConfig, SekvConfig, cache_root
from ..documents import default_prompt
from ..engine import RunResult, generate, make_policy
from ..hook import report_lines
from ..progress import Progress
from ..router import TrainedRouter
from ..session import Session, apply_chat_template, load_model
from ..textfile import read_text
from .flags import CHAT_FIELDS, device_config, sekv_overrides
from .parser import build_parser


def _model_path(arg: str | None) -> str:
    if arg:
        return arg
    from ..models import default_model_path

    return str(default_model_path())


def cmd_info(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    config = ContextConfig(n_ctx=args.n_ctx, verbose=args.verbose, **device_config(args))
    with Session.open(path, config) as session:
        why = support.refusal(session.model, session.ctx)
        report: dict[str, Any] = {"model": path, "architecture": support.architecture(session.model),
                                  "n_layer": int(llama_cpp.llama_model_n_layer(session.model.model)),
                                  "support": support.support_line(why)}
        if why is None:
            report |= session.hook.report()
        if config.rpc_servers:
            report["devices"] = rpc.describe(rpc.devices(config.rpc_servers, config.rpc_timeout_s))
        if why is None and args.kv_budget == "auto":
            chosen = auto_budget.resolve(session.model, config, args.n_ctx)
            report["kv_budget_auto"] = {"kv_budget": chosen.kv_budget, "reason": chosen.reason}
    print(json.dumps(report) if args.json else "\n".join(report_lines(report)))
    if why is not None:  # what could be read is printed; the refusal is also the exit status
        print(f"error: architecture {report['architecture']!r} is not supported: {why}", file=sys.stderr)
        return 1
    return 0


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
    from ..train.pipeline import TrainRun, train

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
    ctx_config = ContextConfig(verbose=args.verbose, **device_config(args))
    model = load_model(path, ctx_config)
    text = _prompt(args, model)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=args.chat)
    n_predict = _n_predict(args.n_predict, len(tokens), model.n_ctx_train())
    n_context = len(tokens) + n_predict
    kv_budget = args.kv_budget
    if kv_budget == "auto":
        chosen = auto_budget.resolve(model, ctx_config, n_context)
        kv_budget = chosen.kv_budget
        if not args.quiet:
            print(f"kv budget (auto): {chosen.reason}", file=sys.stderr)
    budget = BudgetConfig(kv_budget=kv_budget)
    params = (SekvConfig(prefill=args.prefill, chunk_routing=args.chunk_routing, chunk_probes=args.chunk_probes,
                         step_routing=args.step_routing, route_every=args.route_every,
                         layer_steps=args.layer_steps, zoom_hold=args.zoom_hold, signal=args.signal,
                         host_format=args.host_format, lexical_share=args.lexical_share,
                         chunk_lexical_share=args.chunk_lexical_share,
                         summary_calibration=args.summary_calibration)
              if args.policy == "sekv" else None)
    if args.adapter and args.policy != "sekv":
        raise ValueError(f"--adapter is a router for the sekv policy, not for {args.policy}")
    # --adapter, else the router the model file carries (adapter.embed), for sekv
    router = TrainedRouter.of_model(args.adapter, path, model.metadata()) if args.policy == "sekv" else None
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
                     f"{k.mean_rank:.1f}, {k.zooms_per_step:.2f} zooms per routing ({k.chunk_routes} routings inside "
                     "prompt chunks)")
    for line in lines:
        print(line, file=sys.stderr)


def _serve_config(args: argparse.Namespace) -> Any:
    """``--config`` file settings, overridden by the flags given on the command line."""
    from ..serve import ServeConfig

    defaults = vars(build_parser().parse_args(["serve"]))
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServeConfig)
             if hasattr(args, f.name) and getattr(args, f.name) != defaults.get(f.name)}
    base = ServeConfig.from_file(args.config) if args.config else ServeConfig()
    return ServeConfig(**{**vars(base), **given})


def cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import serve

    return serve(_serve_config(args), log=lambda line: print(line, file=sys.stderr))


def cmd_chat(args: argparse.Namespace) -> int:
    from ..chat import run_chat
    from ..serve import ServeConfig, load_llm

    cfg = ServeConfig(model=args.model, **{name: getattr(args, name) for name in CHAT_FIELDS})
    llm = load_llm(cfg)
    try:
        sampler = sampling.for_model(llm.metadata, **{f.name: getattr(args, f.name)
                                                      for f in dataclasses.fields(sampling.Sampling)})
        prompt = (lambda: print("> ", end="", file=sys.stderr, flush=True)) if sys.stdin.isatty() else None
        saves = Path(args.saves) if args.saves else cache_root() / "chats"
        return run_chat(llm, sys.stdin, sys.stdout, cfg.max_tokens, args.system, prompt, sampler, saves, args.resume)
    finally:
        llm.close()


def cmd_eval(args: argparse.Namespace) -> int:
    from ..eval.report import output_path, table, write
    from ..eval.suite import EvalConfig, run_suite

    output_path(Path(args.out), args.name)  # a bad name or directory is refused now, not after the run

    cfg = EvalConfig(policies=tuple(args.policies), budgets=tuple(args.budgets), tasks=tuple(args.tasks),
                     lengths=tuple(args.lengths), samples=args.samples, haystacks=tuple(args.haystacks),
                     n_predict=args.n_predict, fidelity_docs=args.fidelity_docs, fidelity_steps=args.fidelity_steps,
                     fidelity_corpora=tuple(args.fidelity_corpora),
                     seed=args.seed, depths=tuple(args.depths), adapter=args.adapter, equal_total=args.equal_total,
                     chunk=args.chunk,
                     sekv=({"router": args.router} if args.router else {}) | sekv_overrides(args.sekv or []),
                     sekv_variants=tuple(sekv_overrides(v.split(",")) for v in args.sekv_variant or []))
    path = _model_path(args.model)
    ctx_config = ContextConfig(verbose=args.verbose, n_threads=args.threads, **device_config(args))
    router = TrainedRouter.from_file(args.adapter, path, args.verify_candidates) if args.adapter else None
    model = load_model(path, ctx_config)
    log = None if args.quiet else (lambda line: tqdm.write(line, file=sys.stderr))
    result = run_suite(model, cfg, ctx_config, progress=not args.quiet, log=log, router=router)
    result["params"]["threads"] = ctx_config.threads
    result["params"]["type_k"], result["params"]["type_v"] = ctx_config.type_k, ctx_config.type_v
    result["params"]["router"] = router.label if router is not None else "training-free"
    if router is not None:
        result["params"]["verify_candidates"] = router.candidates
    out = write(result, Path(args.out), args.name, Path(path).name, merge_into=args.merge)
    print(table(json.loads(out.read_text())))
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run, "eval": cmd_eval, "train": cmd_train, "serve": cmd_serve, "chat": cmd_chat, "info": cmd_info}
