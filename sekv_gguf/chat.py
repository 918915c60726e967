"""``python -m sekv_gguf chat``: an interactive terminal chat on ``SekvLlama``. Answers stream; the conversation's
memory persists across turns (each turn evaluates only its new tokens). Commands: ``/reset`` (a new conversation),
``/stats`` (device and host bytes, spans, cached tokens), ``/file PATH`` (a document into the conversation, as a
user message), ``/quit``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TextIO

from .errors import InputFileError
from .sampling import Sampling
from .textfile import read_text

HELP = "commands: /reset  /stats  /file PATH  /quit"


def _stats_line(llm: Any) -> str:
    s = llm.stats()
    mib = 1024 * 1024
    spans = getattr(s.live.own, "spans", 0)
    return (f"{s.policy}: {s.tokens} tokens in memory (logical context {s.n_ctx}), device KV "
            f"{s.live.device_kv_bytes / mib:.1f} MiB in {s.device_cells} cells, host "
            f"{s.memories_host_bytes / mib:.1f} MiB, spans {spans}; last turn: {s.request.cached_tokens} cached, "
            f"{s.request.evaluated_tokens} evaluated of {s.request.prompt_tokens} prompt tokens")


def run_chat(llm: Any, stdin: TextIO, stdout: TextIO, max_tokens: int, system: str | None = None,
             prompt: Callable[[], None] | None = None, sampler: Sampling = Sampling()) -> int:
    """Read user lines from ``stdin`` until EOF or /quit; stream each answer to ``stdout`` (sampled with
    ``sampler``)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    start = list(messages)
    stdout.write(HELP + "\n")
    while True:
        if prompt:
            prompt()
        line = stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            messages = list(start)
            llm.reset()
            stdout.write("(new conversation)\n")
            continue
        if text == "/stats":
            stdout.write(_stats_line(llm) + "\n")
            continue
        if text.startswith("/file"):
            path = Path(text[len("/file"):].strip())
            try:
                doc = read_text(path, "document")
            except InputFileError as e:
                stdout.write(f"{e}\n")
                continue
            messages.append({"role": "user", "content": f"Here is the document {path.name}:\n\n{doc}"})
            messages.append({"role": "assistant", "content": f"I have read {path.name}."})
            stdout.write(f"(added {path.name}: {len(doc)} characters)\n")
            continue
        if text.startswith("/"):
            stdout.write(HELP + "\n")
            continue
        messages.append({"role": "user", "content": text})
        reply = []
        try:
            for chunk in llm.create_chat_completion(messages, stream=True, max_tokens=max_tokens,
                                                    **sampler.kwargs()):
                piece = chunk["choices"][0]["delta"].get("content") or ""
                reply.append(piece)
                stdout.write(piece)
                stdout.flush()
        except ValueError as e:  # e.g. the conversation outgrew the logical context
            messages.pop()
            stdout.write(f"\nerror: {e}\n")
            continue
        stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0
