"""``python -m sekv_gguf chat``: an interactive terminal chat on ``SekvLlama``. Answers stream; the conversation's
memory persists across turns (each turn evaluates only its new tokens). Commands: ``/reset`` (a new conversation),
``/stats`` (device and host bytes, spans, cached tokens), ``/file PATH`` (a document into the conversation, as a
user message), ``/save NAME`` (the conversation's memory and messages into a memory file, docs/memory-files.md),
``/quit``; ``resume`` (``chat --resume NAME``) starts from such a file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, TextIO

from .errors import InputFileError, MemoryFileError
from .sampling import Sampling
from .textfile import read_text

HELP = "commands: /reset  /stats  /file PATH  /save NAME  /quit"
SAVE_SUFFIX = ".sekvmem.gguf"
SAVE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # a name under the saves directory
DIR_MODE = 0o700


def saved_chat_path(name: str, saves: Path) -> Path:
    """Where the chat saved as ``name`` lives: ``saves/NAME.sekvmem.gguf``, or ``name`` itself when it is a path
    (has a ``/`` or ends in ``.gguf``)."""
    if "/" in name or name.endswith(".gguf"):
        return Path(name)
    if not SAVE_NAME.match(name):
        raise InputFileError(f"a saved chat's name is letters, digits, '.', '_' and '-' (or a path): got {name!r}")
    return saves / f"{name}{SAVE_SUFFIX}"


def _messages(extra: Any, path: Path) -> list[dict[str, str]]:
    msgs = extra.get("messages") if isinstance(extra, dict) else None
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and set(m) == {"role", "content"} and
                                             all(isinstance(v, str) for v in m.values()) for m in msgs):
        raise InputFileError(f"{path} holds a memory but no chat messages (saved by SekvLlama.save_state, not by "
                             "chat's /save)")
    return msgs


def save_chat(llm: Any, messages: list[dict[str, str]], name: str, saves: Path) -> str:
    """``/save NAME``: the live memory and the messages into a memory file; the line chat prints."""
    path = saved_chat_path(name, saves)
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    state = llm.save_state(extra={"messages": messages})
    state.save(path)
    return f"(saved {state.n_tokens} tokens, {len(messages)} messages, {state.llama_state_size / 1024:.0f} KiB: {path})"


def resume_chat(llm: Any, name: str, saves: Path) -> tuple[list[dict[str, str]], str]:
    """``--resume NAME``: the saved memory made live; its messages and the line chat prints."""
    from .llm_state import SekvState

    path = saved_chat_path(name, saves)
    state = SekvState.load(path)
    messages = _messages(state.extra, path)
    llm.load_state(state)
    return messages, f"(resumed {path}: {state.n_tokens} tokens, {len(messages)} messages)"


def _stats_line(llm: Any) -> str:
    s = llm.stats()
    mib = 1024 * 1024
    spans = getattr(s.live.own, "spans", 0)
    return (f"{s.policy}: {s.tokens} tokens in memory (logical context {s.n_ctx}), device KV "
            f"{s.live.device_kv_bytes / mib:.1f} MiB in {s.device_cells} cells, host "
            f"{s.memories_host_bytes / mib:.1f} MiB, spans {spans}; last turn: {s.request.cached_tokens} cached, "
            f"{s.request.evaluated_tokens} evaluated of {s.request.prompt_tokens} prompt tokens")


def run_chat(llm: Any, stdin: TextIO, stdout: TextIO, max_tokens: int, system: str | None = None,
             prompt: Callable[[], None] | None = None, sampler: Sampling = Sampling(),
             saves: Path | None = None, resume: str | None = None) -> int:
    """Read user lines from ``stdin`` until EOF or /quit; stream each answer to ``stdout`` (sampled with
    ``sampler``). ``saves``: the directory of ``/save NAME``; ``resume``: a saved chat to start from (1 when it
    cannot be loaded)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    start = list(messages)
    saves = saves or Path(".")
    if resume:
        try:
            messages, line = resume_chat(llm, resume, saves)
        except (InputFileError, MemoryFileError, OSError) as e:
            stdout.write(f"cannot resume {resume}: {e}\n")
            return 1
        stdout.write(line + "\n")
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
        if text.startswith("/save"):
            try:
                stdout.write(save_chat(llm, messages, text[len("/save"):].strip(), saves) + "\n")
            except (InputFileError, OSError) as e:
                stdout.write(f"cannot save: {e}\n")
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
