"""SeKV's device path over loopback RPC: a turn routed inside its one decode (the layer callback) against the two-pass
fallback, and the hook's host<->device traffic per decode step (counts, not times: loopback is no PCIe).

One process, Gemma 3 270M by default, one compute thread in every placement:
- ``local-plain``: this process's CPU without weight repacking (the kernels an RPC server's CPU runs);
- ``rpc``: every layer and its KV cache on a ``ggml-rpc-server`` child on 127.0.0.1 (buffers that are not host
  memory, as a GPU's).
Per placement and turn routing (``layer``, ``refresh``): the document is prefilled, then one question is appended
as a turn (its time and transfers), then ``--n-predict`` greedy steps routed inside their decodes every
``route_every`` steps (``SekvStats``' transfers per step).

Writes bench/device-path.json (machine, commit, parameters, raw numbers).

    .venv/bin/python scripts/bench_device_path.py
    .venv/bin/python scripts/bench_device_path.py --model tiny   # the tests' tiny llama (seconds)
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.models import default_model_path
from sekv_gguf.provenance import envelope
from sekv_gguf.rpc import RpcServer
from sekv_gguf.ruler_tasks import needle_prompt
from sekv_gguf.session import load_model

ROOT = Path(__file__).resolve().parents[1]
IO = ("h2d_bytes", "h2d_calls", "d2h_bytes", "d2h_calls")


def run_case(model, cc: ContextConfig, doc: list[int], turn: list[int], args, turn_routing: str) -> dict:
    cfg = SekvConfig(turn_routing=turn_routing, step_routing="layer", route_every=args.route_every)
    budget = BudgetConfig(kv_budget=args.budget)
    policy = make_policy("sekv", model, len(doc) + len(turn) + args.n_predict + 8, cc, budget, cfg)
    try:
        hook = policy.session.hook
        t0 = time.perf_counter()
        policy.prefill(doc)
        prefill_s = time.perf_counter() - t0
        io0 = hook.io_counters()
        decoded = policy.session.decoded_tokens
        t0 = time.perf_counter()
        logits = policy.append(turn)
        turn_s = time.perf_counter() - t0
        io1 = hook.io_counters()
        turn_decoded = policy.session.decoded_tokens - decoded
        tokens = []
        t0 = time.perf_counter()
        for _ in range(args.n_predict):
            tokens.append(int(np.argmax(logits)))
            logits = policy.step(tokens[-1])
        steps_s = time.perf_counter() - t0
        st = policy.stats().sekv
        return {"turn_routing": turn_routing, "prefill_s": prefill_s, "turn_s": turn_s,
                "turn_tokens": len(turn), "turn_decoded_tokens": turn_decoded,
                "layer_routed_turns": policy.memory.counters.layer_routed_turns,
                "layer_routed_steps": policy.memory.counters.layer_routed_steps,
                "turn_io": dict(zip(IO, (b - a for a, b in zip(io0, io1)))),
                "step_io": {k: getattr(st, f"{k}_per_step") for k in IO},
                "step_ms": 1e3 * steps_s / max(args.n_predict, 1), "tokens": tokens,
                "stats": asdict(st)}
    finally:
        policy.close()
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma", help="gemma (Gemma 3 270M), tiny (the tests' tiny llama) or a path")
    ap.add_argument("--length", type=int, default=2048, help="document tokens")
    ap.add_argument("--budget", type=int, default=512, help="device cells")
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--route-every", type=int, default=SekvConfig.route_every, help="decode steps between routings")
    ap.add_argument("--out", default=str(ROOT / "bench" / "device-path.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "gemma":
            path = default_model_path()
        elif args.model == "tiny":
            from sekv_gguf.tiny_models import write_tiny_llama

            path = write_tiny_llama(Path(tmp) / "tiny-llama.gguf")
        else:
            path = Path(args.model)
        results = []
        with RpcServer(threads=1) as server:
            for placement in ("local-plain", "rpc"):
                cc = ContextConfig(n_threads=1, repack_weights=False,
                                   rpc_servers=(server.endpoint,) if placement == "rpc" else ())
                model = load_model(path, cc)
                try:
                    def count(text: str) -> int:
                        return len(model.tokenize(text.encode(), add_bos=True, special=False))

                    text = needle_prompt(count, args.length, 0.5, seed=3).prompt
                    cut = text.rindex("\n\nWhat is")  # the document, then the question as a turn
                    doc = model.tokenize(text[:cut].encode(), add_bos=True, special=False)
                    turn = model.tokenize(text[cut:].encode(), add_bos=False, special=False)[-48:]  # a turn: <= 64
                    for routing in ("layer", "refresh"):
                        r = run_case(model, cc, doc, turn, args, routing)
                        r["placement"] = placement
                        results.append(r)
                        print(f"{placement:11s} turn={routing:7s} "
                              f"turn {1e3 * r['turn_s']:7.1f} ms ({r['turn_decoded_tokens']} tokens decoded)  "
                              f"step {r['step_ms']:6.1f} ms  per step: h2d {r['step_io']['h2d_bytes']:9.0f} B "
                              f"in {r['step_io']['h2d_calls']:5.1f} calls, d2h {r['step_io']['d2h_bytes']:9.0f} B in "
                              f"{r['step_io']['d2h_calls']:5.1f} calls", flush=True)
                finally:
                    model.close()
                    gc.collect()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    params = {"model": str(args.model), "length": args.length, "budget": args.budget, "n_predict": args.n_predict,
              "route_every": args.route_every}
    out.write_text(json.dumps({**envelope(), "params": params, "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
