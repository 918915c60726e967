"""``python -m sekv_gguf``: command-line entry points.

``info [MODEL.gguf]`` loads the model (default: Gemma 3 270M from its PyPI package), creates a context the way
sekv_gguf does, and prints the hook's view of it: hooked layers, cache sizes, bytes per token.
Errors end the process with a one-line message on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any, Sequence

from .config import ContextConfig
from .errors import SekvError
from .session import Session

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sekv_gguf", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print the KV hook's view of a model's context")
    info.add_argument("model", nargs="?", help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    info.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache (default 4096)")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SekvError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
