"""The command line's flags, built from the configuration dataclasses' fields (as llama-cpp-python's server builds
its flags from its settings model): ``option`` makes one flag of one field (default, type, help and choices from
the field); the tables here say which fields each command takes and the help of those without metadata."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from ..config import ContextConfig, SekvConfig
from ..policies import POLICIES

RUN_N_PREDICT = 32  # tokens ``run`` generates unless told (the default question's answer needs a few)


def budget_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--kv-budget must be a number of cells or a fraction, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--kv-budget must be > 0, got {text!r}")
    return value


def budget_or_auto(text: str) -> float | str:
    """``--kv-budget`` of ``run`` and ``info``: cells, a fraction, or "auto" (sized by the devices' free memory)."""
    return "auto" if text == "auto" else budget_arg(text)


def option(p: argparse.ArgumentParser, cls: type, name: str, *flags: str, **kwargs: Any) -> None:
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


# llama.cpp's flags of the K/V cache element types (``ContextConfig.type_k`` / ``type_v``), long and short
CACHE_TYPE_FLAGS = {"type_k": ("-ctk", "--cache-type-k"), "type_v": ("-ctv", "--cache-type-v")}


def device_args(p: argparse.ArgumentParser) -> None:
    """Where the layers run and what their KV cache holds (``ContextConfig``): llama.cpp RPC servers, how many layers
    are offloaded, the K/V cache element types (llama.cpp's flags)."""
    option(p, ContextConfig, "rpc_servers", "--rpc", nargs=None, default=None, metavar="HOST:PORT[,...]")
    option(p, ContextConfig, "n_gpu_layers", "-ngl", "--n-gpu-layers")
    option(p, ContextConfig, "rpc_timeout_s", "--rpc-timeout", metavar="SECONDS")
    for name, flags in CACHE_TYPE_FLAGS.items():
        option(p, ContextConfig, name, *flags, dest=name)


def device_config(args: argparse.Namespace) -> dict:
    """The ``ContextConfig`` fields of ``device_args``."""
    return {"rpc_servers": args.rpc or (), "n_gpu_layers": args.n_gpu_layers, "rpc_timeout_s": args.rpc_timeout,
            "type_k": args.type_k, "type_v": args.type_v}


# ``ServeConfig`` fields that are no flag of ``serve``: the model is its positional argument, the grace period a
# setting of the --config file only
SERVE_NO_FLAG = ("model", "shutdown_grace_s")


# the ``ServeConfig`` fields ``chat`` takes as flags (besides the model)
CHAT_FIELDS = ("policy", "kv_budget", "n_ctx", "prefill", "lexical_share", "adapter", "chat_format", "threads", "rpc",
               "n_gpu_layers", "rpc_timeout", "cache_type_k", "cache_type_v", "max_tokens")


def serve_option(p: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """The flag of ``ServeConfig``'s field ``name`` (``serve`` and ``chat``)."""
    from ..serve import ServeConfig

    flags = {"n_gpu_layers": ("-ngl", "--n-gpu-layers"), "cache_type_k": CACHE_TYPE_FLAGS["type_k"],
             "cache_type_v": CACHE_TYPE_FLAGS["type_v"]}.get(name, ())
    extra: dict[str, Any] = {"policy": {"choices": sorted(POLICIES)}, "kv_budget": {"type": budget_arg},
                             "rpc": {"metavar": "HOST:PORT[,...]"}, "rpc_timeout": {"metavar": "SECONDS"}}.get(name, {})
    option(p, ServeConfig, name, *flags, **{**extra, **kwargs})


def field_help(cls: type, name: str) -> str:
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
    "haystacks": {"choices": ["prose", "filler", "code"], "help": "prose (natural text), filler (RULER's repeated "
                                                                  "sentences) and/or code (standard-library source; "
                                                                  "table_lookup brings its own table)"},
    "n_predict": {"flags": ("-n", "--n-predict"), "help": "tokens generated per case"},
    "fidelity_docs": {"help": "natural-text documents per length"},
    "fidelity_steps": {"help": "teacher-forced tokens per document"},
    "fidelity_corpora": {"choices": ["prose", "code", "tables"],
                         "help": "running text of the fidelity documents: prose, code and/or tables (all shipped with "
                                 "Python: docstrings, module sources, the Unicode database as CSV/Markdown)"},
    "seed": {"help": "first task seed"},
    "depths": {"metavar": "FRACTION", "help": "pin the needle depth: sample s at DEPTHS[s %% len(DEPTHS)] (default: "
                                              "each seed draws one)"},
    "adapter": {"help": "trained router adapter for sekv (its runs are reported as sekv-trained)"},
    "chunk": {"help": "prompt tokens per llama_decode, every policy (a streamed sekv prompt: a routing each)"},
    "equal_total": {"help": "also run every baseline at the device + host bytes of the sekv run at each budget (on a "
                            "CPU the same RAM), reported as <policy>=total@<budget>"},
}


# train's flags: every ``TrainRun`` field, with its help (TrainRun has no descriptions of its own)
TRAIN_HELP = {"out": "adapter file to write", "docs": "training documents", "tokens": "tokens per document",
              "budget_weight": "weight of the loss's budget term (share of span tokens zoomed)",
              "epochs": "passes over the documents per head",
              "proj_dim": "router projection size P (0: the largest up to 32 within --max-param-share)",
              "max_param_share": "the router's parameters as a share of the model's, at most (sizes P when "
                                 "--proj-dim is 0)", "seed": "",
              "captures": "directory for the captured teacher data (default: under ~/.cache)",
              "threads": "llama.cpp threads (0: half the logical cores)",
              "embed": "also write a copy of the model that carries the router in its metadata (run, serve and "
                       "SekvLlama then use it without --adapter)"}


def sekv_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` pairs -> SekvConfig overrides, each value parsed as the field's type (``none`` for None, except
    in a text field, where it is the word: ``chunk_routing=none``)."""
    fields = {f.name: f for f in dataclasses.fields(SekvConfig)}
    out: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--sekv takes KEY=VALUE with KEY one of {', '.join(fields)}, got {item!r}")
        default = getattr(SekvConfig, key)
        if isinstance(default, str):
            out[key] = text
        elif text.lower() == "none":
            out[key] = None
        elif isinstance(default, bool):
            out[key] = text.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, (int, float)):
            out[key] = type(default)(text)
        elif default is None and "float" in str(fields[key].type):          # an optional number: float | None
            out[key] = float(text)
        else:
            out[key] = text
    return out
