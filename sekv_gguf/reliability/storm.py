"""A storm of requests against a running ``serve``: valid chats and completions (streamed and not) mixed with
malformed JSON, wrong types, huge ``max_tokens``, over-long prompts, unknown models, invalid UTF-8, unknown routes,
wrong methods and clients that hang up mid-stream. Every response must be well-formed: a 2xx with a JSON body (or an
SSE stream ending in ``[DONE]``), or a 4xx whose body is an OpenAI-shaped error; never a 5xx, never a dropped
connection. ``run_storm`` sends them from a few threads and samples the server's resident memory."""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from . import rss_bytes

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class Request:
    kind: str
    method: str
    path: str
    body: bytes | None = None
    hang_up: bool = False  # read the first event of a stream, then close the connection
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON_HEADERS))


def _chat(text: str, **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}], **extra}).encode()


QUESTIONS = ("Say hi.", "Name a colour.", "What is 2+2?", "Reply with one word: yes.", "Count to three.")

# every kind of request: a builder from a seeded Random
KINDS: dict[str, Callable[[random.Random], Request]] = {
    "chat": lambda r: Request("chat", "POST", CHAT, _chat(r.choice(QUESTIONS), max_tokens=r.randint(1, 6),
                                                        temperature=r.choice([0, 0.7]), seed=r.randint(0, 9))),
    "chat_stream": lambda r: Request("chat_stream", "POST", CHAT, _chat(r.choice(QUESTIONS), max_tokens=4,
                                                                      stream=True)),
    "completion": lambda r: Request("completion", "POST", COMPLETIONS, json.dumps(
        {"prompt": "The capital of France is", "max_tokens": r.randint(1, 4)}).encode()),
    "hang_up": lambda r: Request("hang_up", "POST", CHAT, _chat("Tell a long story.", max_tokens=64, stream=True),
                                 hang_up=True),
    "malformed_json": lambda r: Request("malformed_json", "POST", CHAT, r.choice(
        [b"{not json", b"", b"[", b'{"messages": [}', b"null", b"42", b'"text"'])),
    "wrong_types": lambda r: Request("wrong_types", "POST", CHAT, json.dumps(r.choice([
        {"messages": "hello"}, {"messages": [1, 2]}, {"messages": [{"role": "user", "content": "x"}],
                                                     "max_tokens": "many"},
        {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
        {"messages": [{"role": "wizard", "content": "x"}]}, {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": "x"}], "stop": 5},
        {"messages": [{"role": "user", "content": "x"}], "n": 3}, {"prompt": {"a": 1}}])).encode()),
    "huge_max_tokens": lambda r: Request("huge_max_tokens", "POST", CHAT, _chat(
        "Reply with one word: yes.", max_tokens=r.choice([10**9, 2**31 - 1, 2**63 - 1]), temperature=0,
        stop=["\n", "."])),
    "negative_max_tokens": lambda r: Request("negative_max_tokens", "POST", CHAT, _chat("Hi.", max_tokens=-5)),
    "over_long_prompt": lambda r: Request("over_long_prompt", "POST", CHAT, _chat("word " * r.choice([6000, 20000]),
                                                                                max_tokens=4)),
    "unknown_model": lambda r: Request("unknown_model", "POST", CHAT, json.dumps(
        {"model": "gpt-9-ultra", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}).encode()),
    "invalid_utf8": lambda r: Request("invalid_utf8", "POST", CHAT,
                                      b'{"messages": [{"role": "user", "content": "caf\xe9 \xff\xfe"}]}'),
    "unknown_route": lambda r: Request("unknown_route", "POST", "/v1/engines/davinci/completions", _chat("Hi.")),
    "wrong_method": lambda r: Request("wrong_method", "GET", CHAT),
    "models": lambda r: Request("models", "GET", "/v1/models"),
}


@dataclass
class Result:
    kind: str
    status: int  # 0: the connection failed
    well_formed: bool
    note: str = ""
    seconds: float = 0.0


def _openai_error(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
        return isinstance(err, dict) and isinstance(err.get("message"), str) and bool(err["message"])
    except (ValueError, KeyError, TypeError):
        return False


def _sse_done(body: bytes) -> bool:
    events = [line[6:] for line in body.decode("utf-8", "replace").splitlines() if line.startswith("data: ")]
    return bool(events) and events[-1].strip() == "[DONE]" and all(
        e.strip() == "[DONE]" or _json_object(e.encode()) for e in events)


def _json_object(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    except ValueError:
        return False


def send(client: httpx.Client, base: str, req: Request) -> Result:
    """Send ``req``; whether what came back is well-formed."""
    t0 = time.perf_counter()
    try:
        with client.stream(req.method, base + req.path, content=req.body, headers=req.headers) as r:
            if req.hang_up and r.status_code == 200:
                for _ in r.iter_lines():
                    break
                return Result(req.kind, r.status_code, True, "hung up", time.perf_counter() - t0)
            body = r.read()
    except httpx.HTTPError as e:
        return Result(req.kind, 0, False, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
    status, kind = r.status_code, r.headers.get("content-type", "")
    if 200 <= status < 300:
        ok = _sse_done(body) if "text/event-stream" in kind else _json_object(body)
    else:
        ok = 400 <= status < 500 and _openai_error(body)
    note = "" if ok else body[:300].decode("utf-8", "replace")
    return Result(req.kind, status, ok, note, time.perf_counter() - t0)


def run_storm(base: str, n: int, seed: int = 0, workers: int = 4, pid: int | None = None,
              warm: int = 100, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``n`` requests of every kind in a seeded order from ``workers`` threads; the tally, the malformed responses,
    and (with ``pid``) the server's resident memory after ``warm`` requests and at the end."""
    rng = random.Random(seed)
    names = sorted(KINDS)
    requests = [KINDS[names[i % len(names)]](rng) for i in range(n)]
    rng.shuffle(requests)
    results: list[Result] = []
    lock = threading.Lock()
    rss: dict[str, int] = {}
    samples: list[tuple[int, int]] = []  # (requests done, server RSS)

    def one(req: Request, client: httpx.Client) -> None:
        res = send(client, base, req)
        with lock:
            results.append(res)
            if pid is not None and len(results) == min(warm, n):
                rss["warm"] = rss_bytes(pid)
            if pid is not None and len(results) % max(1, n // 10) == 0:
                samples.append((len(results), rss_bytes(pid)))
            if progress:
                progress(len(results))

    local = threading.local()

    def task(req: Request) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=600)
        one(req, local.client)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(task, requests))
    if pid is not None:
        rss["end"] = rss_bytes(pid)
    by_kind: dict[str, dict[str, int]] = {}
    for r in results:
        k = by_kind.setdefault(r.kind, {})
        k[str(r.status)] = k.get(str(r.status), 0) + 1
    bad = [vars(r) for r in results if not r.well_formed]
    out = {"requests": len(results), "well_formed": sum(r.well_formed for r in results),
           "server_errors": sum(r.status >= 500 for r in results),
           "failed_connections": sum(r.status == 0 for r in results), "by_kind": by_kind,
           "malformed": bad[:10], "max_seconds": round(max((r.seconds for r in results), default=0.0), 2)}
    if rss:
        out["rss_warm_bytes"], out["rss_end_bytes"] = rss.get("warm", 0), rss["end"]
        out["rss_growth"] = round(rss["end"] / max(rss.get("warm", 1), 1) - 1, 4)
        out["rss_samples"] = samples
    return out
