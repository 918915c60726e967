"""1,000 requests against ``serve`` (``sekv_gguf.reliability.storm``): valid chats and completions mixed with
malformed JSON, wrong types, huge max_tokens, over-long prompts, unknown models, invalid UTF-8, unknown routes and
clients that hang up mid-stream, from 4 threads. Starts the server itself (SmolLM2, 512 device cells, logical
context 4096), records every response's status, the malformed ones, server errors and the server's resident memory
after the warm-up and at the end into the ``api`` object of bench/reliability.json. Exit status 1 on any failure.

    .venv/bin/python scripts/api_storm.py --requests 1000
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from sekv_gguf.provenance import record
from sekv_gguf.reliability.storm import run_storm

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--port", type=int, default=8931)
    ap.add_argument("--out", default="bench/reliability.json")
    args = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-m", "sekv_gguf", "serve", "--port", str(args.port), "--kv-budget",
                             "512", "--n-ctx", "4096", "--max-tokens", "48"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        bar = tqdm(total=args.requests, desc="storm", unit="req")
        t0 = time.perf_counter()
        out = run_storm(base, args.requests, workers=args.workers, pid=proc.pid,
                        progress=lambda n: bar.update(n - bar.n))
        bar.close()
        out["seconds"] = round(time.perf_counter() - t0, 1)
        out["server_alive"] = proc.poll() is None and httpx.get(base + "/health", timeout=30).status_code == 200
    finally:
        proc.terminate()
        out["server_exit"] = proc.wait(timeout=120)
    record(args.out, "api", out)
    print({k: v for k, v in out.items() if k not in ("by_kind", "malformed")})
    ok = (out["well_formed"] == out["requests"] and not out["server_errors"] and out["server_alive"]
          and out["server_exit"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
