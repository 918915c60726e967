"""``SekvLlama`` in llama-cpp-python's own server: ``python -m llama_cpp.server`` (stock entry point, patched by
``scripts/setup.sh`` with ``patches/python/``) with ``--kv_policy`` flags or a ``--config_file`` model entry, driven
by the real ``openai`` client, on SmolLM2-135M-Instruct with 512 device cells. Threads: the server's default (half
the cores; more threads than free cores spin and are ten times slower on a busy machine).

That server has no ``/sekv/stats`` and its responses drop fields it does not know (``usage`` keeps three counts), so
what SeKV did is read from the line ``sekv_gguf.llama_server.ServedSekvLlama`` prints on stderr after each request
(with ``verbose``, the server's default): ``sekv: policy sekv, 512 device cells, n_ctx 4096: request N, prompt P
tokens, R reused, E evaluated; memory dir: D restores, S saves``. A stock ``Llama`` prints no such line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from pydantic import ValidationError

from helpers import ROOT, free_port, prose, wait_until_up
from sekv_gguf.llama_server import SEKV_SETTINGS
from sekv_gguf.memory_dir import SUFFIX
from sekv_gguf.models import smollm2_path

pytestmark = pytest.mark.serve

DOC = prose(6000, 300)  # ~1300 tokens of natural text: more than the 512 device cells
LINE = re.compile(r"sekv: policy (\S+), (\d+) device cells, n_ctx (\d+): request (\d+), prompt (\d+) tokens, "
                  r"(\d+) reused, (\d+) evaluated; memory dir: (\d+) restores, (\d+) saves")


def _start(log: Path, *args: str) -> tuple[subprocess.Popen, str, int]:
    """``python -m llama_cpp.server ARGS`` (stdout and stderr into ``log``), up and answering ``/v1/models``."""
    port = int(args[args.index("--port") + 1]) if "--port" in args else free_port()
    if "--port" not in args and "--config_file" not in args:
        args = (*args, "--port", str(port))
    env = {k: v for k, v in os.environ.items() if k.lower() not in (*SEKV_SETTINGS, "config_file", "model", "port")}
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT, text=True, env=env)
    out.close()
    base = f"http://127.0.0.1:{port}"
    wait_until_up(proc, base + "/v1/models", "llama_cpp.server", lambda: log.read_text()[-3000:])
    return proc, base, port


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _lines(log: Path, n: int) -> list[tuple]:
    """The ``sekv:`` lines of ``log`` once there are ``n`` (at most a few seconds after the response)."""
    deadline = time.time() + 10
    while True:
        found = [m.groups() for m in LINE.finditer(log.read_text())]
        if len(found) >= n or time.time() > deadline:
            assert len(found) == n, found
            return [(g[0], *map(int, g[1:])) for g in found]
        time.sleep(0.2)


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300, max_retries=0)


def _ask(document: str) -> list[dict]:
    return [{"role": "system", "content": "You answer questions about a document."},
            {"role": "user", "content": f"Document:\n{document}\n\nWhat is the document about?"}]


def test_patched_settings_keep_stock_defaults_and_refuse_what_sekv_cannot_honour():
    from llama_cpp.server.settings import ModelSettings

    plain = ModelSettings(model="m.gguf")
    assert all(getattr(plain, name) is None for name in SEKV_SETTINGS)  # stock behaviour: llama_cpp.Llama
    ok = ModelSettings(model="m.gguf", kv_policy="sekv", kv_budget=0.25, memory_dir="/tmp/x")
    assert ok.logits_all  # llama-cpp-python's default, left alone (SekvLlama gets False), not refused
    for bad, named in [({"kv_budget": 512}, "set kv_policy"), ({"memory_dir": "d"}, "set kv_policy"),
                       ({"kv_policy": "nope"}, "kv_policy='nope' is not a KV policy"),
                       ({"kv_policy": "sekv", "embedding": True}, "embedding=True"),
                       ({"kv_policy": "sekv", "lora_path": "l.gguf"}, "lora_path="),
                       ({"kv_policy": "sekv", "logits_all": True}, "logits_all=True"),
                       ({"kv_policy": "sekv", "n_ubatch": 128}, "n_ubatch=128"),
                       ({"kv_policy": "sekv", "rope_freq_base": 5e5}, "rope_freq_base="),
                       ({"kv_policy": "sekv", "chat_format": "llava-1-5"}, "chat_format='llava-1-5'"),
                       ({"kv_policy": "sekv", "cache": True, "cache_type": "disk"}, "use memory_dir"),
                       ({"kv_policy": "full", "prefill": "exact"}, "only for kv_policy sekv"),
                       ({"kv_policy": "full", "lexical_share": 0.5}, "lexical_share is a parameter of SeKV"),
                       ({"kv_policy": "sekv", "lexical_share": 1.5}, "lexical_share must be in [0, 1]"),
                       ({"kv_policy": "sekv", "prefill": "fast"}, "prefill='fast'"),
                       ({"lexical_share": 0.5}, "set kv_policy"),
                       ({"kv_policy": "sekv", "memory_dir_bytes": 10}, "set memory_dir too")]:
        with pytest.raises(ValidationError, match=re.escape(named)):
            ModelSettings(model="m.gguf", **bad)


def test_sekv_parameters_reach_the_live_memory(tiny_llama):
    """``prefill`` and ``lexical_share`` (SekvConfig's fields among the settings) become the loaded memory's
    SekvConfig; unset, SekvConfig's defaults."""
    from llama_cpp.server.settings import ModelSettings

    from sekv_gguf.config import SekvConfig
    from sekv_gguf.llama_server import load_sekv_llama

    for extra, want in [({}, SekvConfig()), ({"lexical_share": 0.0}, SekvConfig(lexical_share=0.0)),
                        ({"prefill": "exact", "lexical_share": 0.5}, SekvConfig(prefill="exact", lexical_share=0.5))]:
        llm = load_sekv_llama(ModelSettings(model=str(tiny_llama), kv_policy="sekv", kv_budget=256, n_ctx=512,
                                            verbose=False, **extra))
        try:
            assert llm.memories.live.config == want
        finally:
            llm.close()


def test_without_the_settings_sekv_gguf_is_not_even_imported():
    r = subprocess.run([sys.executable, "-c", "import sys; from llama_cpp.server.settings import ModelSettings; "
                        "import llama_cpp.server.model; ModelSettings(model='m.gguf'); "
                        "print(sorted(m for m in sys.modules if m.startswith('sekv_gguf')))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_a_refused_setting_stops_the_server_at_start_naming_it(tmp_path):
    """A flag, and the second model of a config file (checked at start-up, not at its first swap)."""
    model = str(smollm2_path())
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"models": [{"model": model}, {"model": model, "kv_policy": "sekv",
                                                                  "lora_path": "x.gguf"}]}))
    for args, named in [(["--model", model, "--kv_policy", "sekv", "--embedding", "true"], "embedding=True"),
                        (["--config_file", str(config)], "lora_path='x.gguf'")]:
        r = subprocess.run([sys.executable, "-m", "llama_cpp.server", *args, "--port", str(free_port())], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and f"{named} cannot be used with kv_policy" in r.stderr, r.stderr[-2000:]
        assert "Uvicorn running" not in r.stderr + r.stdout


def test_flags_load_a_sekv_llama_that_streams_and_reuses_its_memory(tmp_path):
    """``--kv_policy sekv --kv_budget 512 --n_ctx 4096``: a ~1300-token conversation (more than the 512 device cells)
    is answered, streamed; the second turn reuses the first one's memory (its line: reused >= the first prompt,
    evaluated only the new turn)."""
    log = tmp_path / "server.log"
    proc, base, _ = _start(log, "--model", str(smollm2_path()), "--kv_policy", "sekv", "--kv_budget", "512",
                           "--n_ctx", "4096", "--host", "127.0.0.1")
    try:
        client = _client(base)
        msgs = _ask(DOC)
        parts = list(client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24,
                                                    stream=True))
        first = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        assert first.strip() and sum(bool(p.choices and p.choices[0].delta.content) for p in parts) > 3  # streamed
        [one] = _lines(log, 1)
        assert one[:4] == ("sekv", 512, 4096, 1) and one[4] > 1000 and one[5] == 0  # a fresh memory, past 512 cells
        msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "Say it in five words."}]
        parts = list(client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=16,
                                                    stream=True))
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices).strip()
        _, two = _lines(log, 2)
        assert two[3] == 2 and two[5] >= one[4] and two[6] < two[4] - one[4] + 40  # turn 1 reused, the new turn evaluated
        r = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=6, temperature=0)
        assert r.choices[0].text and r.usage.completion_tokens > 0
    finally:
        _stop(proc)


def test_a_config_file_conversation_survives_a_swap_through_its_memory_dir(tmp_path):
    """A config file with two entries of the same GGUF: ``smol-sekv`` (kv_policy sekv, memory_dir) and ``smol-plain``
    (a stock ``Llama``). A conversation on ``smol-sekv``, a request on ``smol-plain`` (the server closes the SekvLlama:
    its conversation is on disk), then the conversation's next turn on ``smol-sekv``: a new SekvLlama (its line says
    request 1) that restored the conversation from the memory dir (1 restore) and reused at least turn 1's prompt —
    a model loaded afresh can only have those tokens from the directory. No timing is involved."""
    mem = tmp_path / "memories"
    port = free_port()
    model = str(smollm2_path())
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"host": "127.0.0.1", "port": port, "models": [
        {"model": model, "model_alias": "smol-sekv", "kv_policy": "sekv", "kv_budget": 512, "n_ctx": 4096,
         "memory_dir": str(mem)},
        {"model": model, "model_alias": "smol-plain", "n_ctx": 2048}]}))
    log = tmp_path / "server.log"
    proc, base, _ = _start(log, "--config_file", str(config), "--port", str(port))
    try:
        client = _client(base)
        assert {m.id for m in client.models.list().data} == {"smol-sekv", "smol-plain"}
        msgs = _ask(DOC)
        r1 = client.chat.completions.create(model="smol-sekv", messages=msgs, temperature=0, max_tokens=24)
        [one] = _lines(log, 1)
        assert one[3] == 1 and one[4] > 1000 and one[7] == 0 and one[8] == 1  # saved after the request
        plain = client.chat.completions.create(model="smol-plain", messages=[{"role": "user", "content": "Hi"}],
                                               temperature=0, max_tokens=8)
        assert plain.choices[0].message.content is not None
        _lines(log, 1)  # the stock Llama printed no sekv line
        files = list(mem.glob("*" + SUFFIX))
        assert files and all(f.stat().st_size > 0 for f in files)  # the closed SekvLlama's conversation is on disk
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
                 {"role": "user", "content": "Say it in five words."}]
        parts = list(client.chat.completions.create(model="smol-sekv", messages=msgs, temperature=0, max_tokens=16,
                                                    stream=True))
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices).strip()
        _, two = _lines(log, 2)
        assert two[3] == 1  # a new SekvLlama: the server swapped it out and loaded it again
        assert two[7] == 1 and two[5] >= one[4] and two[6] < two[4] - one[4] + 40  # restored from the memory dir, not prefilled
    finally:
        _stop(proc)
