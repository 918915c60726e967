"""``python -m sekv_gguf info``: the hook's view of a model, and one-line errors with a non-zero exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import prose
from sekv_gguf.cli.parser import build_parser
from sekv_gguf.config import SekvConfig, round_cells
from sekv_gguf.tiny_models import TinySpec, write_tiny_llama


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sekv_gguf", *args], capture_output=True, text=True, timeout=120)


def test_info_json_tiny_gemma(tiny_gemma):
    r = _run("info", str(tiny_gemma), "--n-ctx", "512", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["architecture"] == "gemma3"
    assert [layer["il"] for layer in report["hooked_layers"]] == [2, 5]
    assert report["kv"]["kv_size"] == 512 and report["kv"]["is_iswa"]
    assert report["bytes_per_token"] == 2 * 2 * 32 * 2  # 2 global layers x (K+V) x head dim 32 x f16
    assert report["device_kv_bytes"] == report["kv"]["kv_bytes"] + report["kv"]["swa_kv_bytes"]


def test_info_text(tiny_llama):
    r = _run("info", str(tiny_llama), "--n-ctx", "256")
    assert r.returncode == 0, r.stderr
    assert "bytes/token   256" in r.stdout and "layers [0, 1]" in r.stdout


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.gguf", "model file not found"),
    (lambda d: (d / "text.gguf").write_text("not a model") and d / "text.gguf", "is not a GGUF file"),
])
def test_info_bad_model(tmp_path, make, message):
    r = _run("info", str(make(tmp_path)))
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr


def test_info_truncated_and_unsupported(tmp_path, tiny_llama, tiny_mrope):
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(tiny_llama.read_bytes()[:4096])
    r = _run("info", str(trunc))
    assert r.returncode != 0 and "could not load" in r.stderr
    r = _run("info", str(tiny_mrope))
    assert r.returncode != 0 and "unsupported memory" in r.stderr


RUN_KEYS = {"text", "policy", "model", "prompt_tokens", "generated_tokens", "device_kv_bytes", "full_kv_bytes",
            "host_kv_bytes", "prefill_s", "decode_s", "prefill_tok_s", "decode_tok_s"}


@pytest.mark.parametrize("policy", ["sekv", "full"])
def test_run_json_contract(tmp_path, tiny_llama, policy):
    doc = tmp_path / "doc.txt"
    doc.write_text(prose(3000, offset=100))
    r = _run("run", str(tiny_llama), "-f", str(doc), "-n", "5", "--policy", policy, "--kv-budget", "768", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # exactly one JSON object on stdout
    assert RUN_KEYS <= set(out)
    assert out["policy"] == policy and out["generated_tokens"] == 5 and out["prompt_tokens"] > 2000
    if policy == "sekv":
        assert out["sekv"]["router"] == "training-free" and out["sekv"]["spans"] > 0
        assert out["device_kv_bytes"] < out["full_kv_bytes"] and out["host_kv_bytes"] > 0
    else:
        assert "sekv" not in out and out["device_kv_bytes"] == out["full_kv_bytes"]


def test_run_streams_text(tiny_llama):
    r = _run("run", str(tiny_llama), "-p", "the magic number is", "-n", "4", "--policy", "full", "-q")
    assert r.returncode == 0, r.stderr
    assert "policy full: " in r.stderr and "tok/s" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["-p", ""], "the prompt is empty"),
    (["-f", "/nonexistent/prompt.txt"], "prompt file not found"),
    (["--kv-budget", "256", "-n", "30000", "-p", "x"], "kv_budget of 256 cells"),
    (["--kv-budget", "-3", "-p", "x"], "--kv-budget must be > 0"),
    (["-n", "-5", "-p", "x"], "-n takes a number of tokens >= 0, or -1"),
    (["-n", "-2", "-p", "x"], "-n takes a number of tokens >= 0, or -1"),
])
def test_run_bad_input(tiny_llama, args, message):
    r = _run("run", str(tiny_llama), *args)
    assert r.returncode != 0
    assert message in r.stderr
    assert r.stdout == ""


def test_run_unsupported_model(tiny_mrope):
    r = _run("run", str(tiny_mrope), "-p", "hello", "-n", "2")
    assert r.returncode != 0 and "unsupported memory" in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("n", ["-5", "-2"])
def test_run_refuses_negative_n_in_one_line(tiny_llama, n):
    """Only -1 of the negatives means something (llama.cpp's "until the end"): the others are a one-line error."""
    r = _run("run", str(tiny_llama), "-p", "x", "-n", n, "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert [line for line in r.stderr.splitlines() if line.strip()] == [
        f"error: -n takes a number of tokens >= 0, or -1 (until end of text or the context is full); got {n}"]


@pytest.mark.parametrize("policy", ["full", "sekv"])
def test_run_n_minus_one_runs_until_the_context_is_full(tmp_path, policy):
    """``-n -1`` is ``-n N`` with N what the model's training context leaves after the prompt (a random-weight model
    that never ends its text fills it): the same text, context and budget (a fraction of that context)."""
    n_ctx_train = 600
    model = write_tiny_llama(tmp_path / "short.gguf", replace(TinySpec(), n_ctx_train=n_ctx_train))
    args = ("run", str(model), "-p", "the magic number is", "--policy", policy, "--kv-budget", "0.5", "--json", "-q")
    r = _run(*args, "-n", "-1")
    assert r.returncode == 0, r.stderr
    until_full = json.loads(r.stdout)
    assert until_full["prompt_tokens"] + until_full["generated_tokens"] == n_ctx_train
    r = _run(*args, "-n", str(n_ctx_train - until_full["prompt_tokens"]))
    assert r.returncode == 0, r.stderr
    explicit = json.loads(r.stdout)
    for key in ("text", "generated_tokens", "device_kv_bytes", "full_kv_bytes", "host_kv_bytes"):
        assert until_full[key] == explicit[key], key
    if policy == "sekv":
        assert until_full["sekv"]["budget_cells"] == explicit["sekv"]["budget_cells"] == round_cells(0.5 * n_ctx_train)


def test_run_n_minus_one_refuses_a_prompt_over_the_context(tmp_path):
    model = write_tiny_llama(tmp_path / "short.gguf", replace(TinySpec(), n_ctx_train=300))
    r = _run("run", str(model), "-p", prose(3000), "-n", "-1")
    assert r.returncode == 1 and r.stdout == ""
    assert "exceeds the model's training context of 300" in r.stderr


def test_run_step_routing_flags(tmp_path, tiny_llama):
    """``--step-routing`` and ``--route-every`` (a chain followed hop by hop while generating: docs/results.md) are
    run's flags with SekvConfig's defaults; they reach the policy (``--json`` counts the steps routed inside their
    decode) and a bad value is refused by SekvConfig's own message."""
    args = build_parser().parse_args(["run", "--step-routing", "lagged", "--route-every", "1"])
    assert (args.step_routing, args.route_every) == ("lagged", 1)
    defaults = build_parser().parse_args(["run"])
    assert (defaults.step_routing, defaults.route_every, defaults.layer_steps, defaults.zoom_hold) == \
        ("layer", 2, 0, 1.0)
    doc = tmp_path / "doc.txt"
    doc.write_text(prose(3000, offset=100))
    routed = {}
    lagged = ("--step-routing", "lagged")
    every = ("--route-every", "1")
    answer = (*lagged, "--layer-steps", "3", "--zoom-hold", "1")
    for flags in ((), lagged, every, answer):
        r = _run("run", str(tiny_llama), "-f", str(doc), "-n", "9", "--kv-budget", "768", "--json", *flags)
        assert r.returncode == 0, r.stderr
        routed[flags] = json.loads(r.stdout)["sekv"]["layer_routed_steps"]
    assert routed[()] == 4  # the default: every 2nd step inside its decode (steps 2, 4, 6 and 8)
    assert routed[lagged] == 0 and routed[every] >= 8  # none; every step after the first
    assert routed[answer] == 3  # the answer's first steps alone
    r = _run("run", str(tiny_llama), "-p", "x", "-n", "2", "--route-every", "0")
    assert r.returncode != 0 and "route_every must be >= 1, got 0" in r.stderr and r.stdout == ""


def test_sekv_overrides_parse_each_value_as_its_fields_type():
    """``none`` is None for a field that may be None and the word itself in a text field (``chunk_routing=none``,
    a choice, was refused as None)."""
    from sekv_gguf.cli import sekv_overrides
    from sekv_gguf.config import SekvConfig

    got = sekv_overrides(["chunk_routing=none", "energy_v=none", "chunk_probes=4", "zoom_lag_refresh=false",
                          "energy=0.5", "summary_bias_quantile=0.25"])
    assert got == {"chunk_routing": "none", "energy_v": None, "chunk_probes": 4, "zoom_lag_refresh": False,
                   "energy": 0.5, "summary_bias_quantile": 0.25}          # an optional number read as a float
    assert sekv_overrides(["energy_v=0.9"]) == {"energy_v": 0.9}
    assert SekvConfig(**got).chunk_routing == "none"
    with pytest.raises(ValueError, match="--sekv takes KEY=VALUE"):
        sekv_overrides(["no_such_key=1"])


def test_run_lexical_share_flag(tiny_llama):
    """``--lexical-share`` is run's flag with SekvConfig's default (off); a share outside [0, 1] is refused by
    SekvConfig's own message."""
    assert build_parser().parse_args(["run"]).lexical_share == SekvConfig.lexical_share
    assert build_parser().parse_args(["run", "--lexical-share", "0.5"]).lexical_share == 0.5
    r = _run("run", str(tiny_llama), "-p", "x", "-n", "2", "--lexical-share", "1.5")
    assert r.returncode != 0 and "lexical_share must be in [0, 1], got 1.5" in r.stderr and r.stdout == ""
    assert build_parser().parse_args(["run"]).chunk_lexical_share == SekvConfig.chunk_lexical_share
    assert build_parser().parse_args(["run", "--chunk-lexical-share", "0.6"]).chunk_lexical_share == 0.6
    r = _run("run", str(tiny_llama), "-p", "x", "-n", "2", "--chunk-lexical-share", "2")
    assert r.returncode != 0 and "chunk_lexical_share must be in [0, 1], got 2.0" in r.stderr and r.stdout == ""


def test_serve_and_chat_lexical_share(tiny_llama):
    """``serve`` and ``chat`` take ``--lexical-share`` (ServeConfig, SekvConfig's default) into the live memory's
    SekvConfig; a share outside [0, 1] is refused by the settings."""
    from sekv_gguf.serve import ServeConfig, load_llm

    for command in ("serve", "chat"):
        assert build_parser().parse_args([command]).lexical_share == SekvConfig.lexical_share
        assert build_parser().parse_args([command, "--lexical-share", "0.5"]).lexical_share == 0.5
    with pytest.raises(ValueError, match=r"lexical_share must be in \[0, 1\], got 1.5"):
        ServeConfig(lexical_share=1.5)
    llm = load_llm(ServeConfig(model=str(tiny_llama), n_ctx=512, kv_budget=256, lexical_share=0.5))
    try:
        assert llm.memories.live.config.lexical_share == 0.5
    finally:
        llm.close()
