"""A 10-turn conversation over a ~6K-token document, served by ``python -m sekv_gguf serve`` (SeKV at 25% of an
8K logical context, the stock server's n_ctx) and by
llama-cpp-python's own server (``python -m llama_cpp.server``, same model, flash attention, ``logits_all`` off), one
server at a time, each in a fresh process: time to first token and prompt tokens evaluated per turn, with and
without a title request between turns (as Open WebUI sends them), and device KV bytes. Then a soak of the SeKV
server: concurrent clients, errors, resident memory. Writes bench/serve.json and bench/serve.png.

    .venv/bin/python scripts/bench_serve.py [--models smollm2 gemma qwen-coder] [--turns 10] [--soak 200]
                                            [--reuse-stock-titles bench/serve.json]
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from sekv_gguf.eval.conversation import MODELS, SYSTEM, document, question
from sekv_gguf.provenance import envelope
from sekv_gguf.reliability import rss_bytes

TITLE = ("### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n"
         "### Chat History:\n<chat_history>\nUSER: {q}\nASSISTANT: {a}\n</chat_history>")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process; its stderr goes to a file that the stock server's token counts are read from."""

    def __init__(self, kind: str, model: str, chat_format: str | None, threads: int, log: Path):
        self.port, self.kind, self.log = _port(), kind, log
        if kind == "sekv":
            cmd = [sys.executable, "-m", "sekv_gguf", "serve", model, "--kv-budget", "0.25", "--n-ctx", "8192",
                   "--max-tokens", "48"]
            cmd += ["--threads", str(threads)] if threads else []
            cmd += ["--chat-format", chat_format] if chat_format else []
        else:
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", "8192", "--flash_attn",
                   "True", "--logits_all", "False", "--verbose", "True", "--n_gpu_layers", "0"]
            cmd += ["--n_threads", str(threads), "--n_threads_batch", str(threads)] if threads else []
            cmd += ["--chat_format", chat_format] if chat_format else []
        cmd += ["--port", str(self.port)]
        self.err = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.err, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                if httpx.get(self.base + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} server exited: {log.read_text()[-2000:]}")
        raise RuntimeError(f"{kind} server did not start")

    def evaluated_since(self, offset: int) -> tuple[int | None, int]:
        """Prompt tokens the stock server evaluated in its last request (llama.cpp's timing lines), and the log's end."""
        text = self.log.read_text(errors="replace")
        hits = re.findall(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", text[offset:])
        return (int(hits[-1]) if hits else None), len(text)

    def kv_bytes(self) -> int:
        """Device KV bytes llama.cpp allocated (every cache, SWA included), from its log."""
        return int(sum(float(m) for m in re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB", self.log.read_text()))
                   * 2**20)

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.err.close()


def stream_chat(base: str, messages: list[dict], max_tokens: int) -> tuple[str, float, float]:
    """The reply, time to its first content token and total time of one streamed chat request."""
    t0 = time.perf_counter()
    ttft, parts = None, []
    with httpx.stream("POST", base + "/v1/chat/completions", timeout=3600, json={
            "model": "m", "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            piece = delta[0]["delta"].get("content") if delta else None
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(piece)
    return "".join(parts), ttft or (time.perf_counter() - t0), time.perf_counter() - t0


def conversation(server: Server, doc: str, turns: int, titles: bool, max_tokens: int) -> list[dict]:
    msgs = [{"role": "system", "content": SYSTEM}]
    rows = []
    for i in range(turns):
        q = question(i)
        msgs.append({"role": "user", "content": f"{doc}\n\n{q}" if i == 0 else q})
        offset = len(server.log.read_text(errors="replace"))
        reply, ttft, total = stream_chat(server.base, msgs, max_tokens)
        row = {"turn": i + 1, "ttft_s": ttft, "total_s": total}
        if server.kind == "sekv":
            s = httpx.get(server.base + "/sekv/stats", timeout=60).json()
            row.update({"prompt_tokens": s["prompt_tokens"], "evaluated_tokens": s["evaluated_tokens"],
                        "cached_tokens": s["cached_tokens"], "device_kv_bytes": s["device_kv_bytes"],
                        "host_bytes": s["host_bytes"], "spans": (s.get("sekv") or {}).get("spans", 0)})
        else:
            row["evaluated_tokens"], _ = server.evaluated_since(offset)
        rows.append(row)
        msgs.append({"role": "assistant", "content": reply})
        if titles and i + 1 < turns:
            stream_chat(server.base, [{"role": "user", "content": TITLE.format(q=q, a=reply[:200])}], 16)
        print(json.dumps({"server": server.kind, "titles": titles, **row}), flush=True)
    return rows


def soak(server: Server, n: int, workers: int) -> dict:
    """``n`` short chat requests from ``workers`` concurrent clients: errors and the server's resident memory."""
    errors, done, rss = [], [0], {}
    lock = threading.Lock()

    def client(w: int) -> None:
        while True:
            with lock:
                if done[0] >= n:
                    return
                done[0] += 1
                k = done[0]
            try:
                stream_chat(server.base, [{"role": "user", "content": f"Say something about the number {k}."}], 12)
            except Exception as e:  # noqa: BLE001 - counted
                errors.append(repr(e))
            with lock:
                if k in (20, n):
                    rss[k] = server.rss()

    threads = [threading.Thread(target=client, args=(w,)) for w in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    growth = (rss.get(n, 0) - rss.get(20, 0)) / max(rss.get(20, 1), 1)
    return {"requests": n, "workers": workers, "errors": len(errors), "error_examples": errors[:3],
            "rss_at_20": rss.get(20), "rss_at_end": rss.get(n), "rss_growth": growth,
            "wall_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma"], choices=sorted(MODELS))
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--modes", nargs="+", default=["titles", "plain"], choices=["titles", "plain"],
                    help="with title requests between turns (as Open WebUI sends them) and/or without")
    ap.add_argument("--doc-chars", type=int, default=26000, help="document characters (~6K tokens)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--soak", type=int, default=200)
    ap.add_argument("--out", default="bench/serve")
    ap.add_argument("--reuse-stock-titles", metavar="JSON",
                    help="take the stock server's runs with title requests from an earlier result (they do not "
                         "depend on this package: the stock server re-prefills after every title; ~20 min a model)")
    args = ap.parse_args()
    reused = json.loads(Path(args.reuse_stock_titles).read_text()) if args.reuse_stock_titles else None
    doc = document(args.doc_chars)
    models = {name: (str(MODELS[name][0]()), MODELS[name][1]) for name in {*args.models, "smollm2"}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"name": "serve", **envelope(), "params": vars(args), "models": {}}
    for name in args.models:
        path, fmt = models[name]
        per: dict = {}
        for kind in ("stock", "sekv"):
            for titles in [mode == "titles" for mode in args.modes]:
                if reused and kind == "stock" and titles:
                    per["stock/titles"] = {**reused["models"][name]["stock/titles"], "reused_from": reused["commit"]}
                    continue
                server = Server(kind, path, fmt, args.threads, Path(f"/tmp/bench-serve-{name}-{kind}.log"))
                try:
                    rows = conversation(server, doc, args.turns, titles, args.max_tokens)
                    kv = server.kv_bytes() if kind == "stock" else rows[-1]["device_kv_bytes"]
                finally:
                    server.close()
                per[f"{kind}/{'titles' if titles else 'plain'}"] = {"turns": rows, "device_kv_bytes": kv}
        result["models"][name] = per
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    if args.soak and "smollm2" in models:
        server = Server("sekv", models["smollm2"][0], None, args.threads, Path("/tmp/bench-serve-soak.log"))
        try:
            result["soak"] = soak(server, args.soak, 4)
        finally:
            server.close()
        print(json.dumps(result["soak"]))
    result["summary"] = summary(result)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["summary"], indent=1))
    return 0


def summary(result: dict) -> dict:
    """Per model: device KV sekv / stock, and the mean time to first token of turns 2.. as sekv / stock."""
    out = {}
    for name, per in result["models"].items():
        modes = [m for m in ("titles", "plain") if f"sekv/{m}" in per and f"stock/{m}" in per]
        first = modes[0]
        row = {"device_kv_ratio": per[f"sekv/{first}"]["device_kv_bytes"] / per[f"stock/{first}"]["device_kv_bytes"]}
        for mode in modes:
            s = [t["ttft_s"] for t in per[f"sekv/{mode}"]["turns"][1:]]
            k = [t["ttft_s"] for t in per[f"stock/{mode}"]["turns"][1:]]
            row[f"ttft_ratio_{mode}"] = (sum(s) / len(s)) / (sum(k) / len(k))
            row[f"ttft_turn1_{mode}"] = {"sekv": per[f"sekv/{mode}"]["turns"][0]["ttft_s"],
                                         "stock": per[f"stock/{mode}"]["turns"][0]["ttft_s"]}
        out[name] = row
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["models"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for key, rows in result["models"][name].items():
            ax.plot([r["turn"] for r in rows["turns"]], [r["ttft_s"] for r in rows["turns"]], "o-", label=key)
        ax.set(yscale="log", xlabel="turn", ylabel="time to first token (s)", title=name)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
