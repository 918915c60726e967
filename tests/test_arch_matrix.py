"""The architecture matrix: a tiny random-weight model of each llama.cpp architecture in ``tiny_archs.ARCHS``.

Supported ones must be exact (full rank, every span rebuilt in every layer -> full KV's logits) and run a streamed
SeKV generation that compresses; refused ones must be refused when a policy is made, with a message that names the
architecture and the reason read from the cache layout (docs/architectures.md).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest

from helpers import ROOT, prose
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.errors import ModelError, UnsupportedModelError
from sekv_gguf.session import Session, load_model
from sekv_gguf.tiny_archs import ARCHS, REFUSED, SUPPORTED, Tensor, arch_spec, write_arch, write_tiny_arch

EXACT_CHARS, STREAM_CHARS, STREAM_BUDGET, STREAM_CHUNK, N_GENERATE = 700, 2000, 512, 64, 4
EXACT_BUDGET, EXACT_CHUNK, EXACT_RTOL = 2048, 128, 1e-5


@pytest.fixture(scope="session")
def arch_path(model_dir: Path) -> Callable[[str], Path]:
    """The tiny model of an architecture, written once per session."""
    paths: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in paths:
            paths[name] = write_tiny_arch(model_dir / f"tiny-arch-{name}.gguf", name)
        return paths[name]

    return get


@pytest.fixture(scope="session")
def arch_model(arch_path: Callable[[str], Path]) -> Callable[[str], Any]:
    """The tiny model of an architecture, loaded once per session."""
    models: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in models:
            models[name] = load_model(arch_path(name))
        return models[name]

    return get


def _tokens(model: Any, n_chars: int, offset: int) -> list[int]:
    return model.tokenize(prose(n_chars, offset).encode(), add_bos=True, special=False)


def test_the_matrix_covers_what_the_issue_asks():
    assert {"llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "granite", "olmo2", "starcoder2",
            "command-r", "mistral3", "stablelm"} == set(SUPPORTED)
    assert {"deepseek2", "mamba", "lfm2", "t5"} == set(REFUSED)
    partial = arch_spec("stablelm")
    assert dict(partial.keys)[gguf.Keys.Rope.DIMENSION_COUNT] < partial.shape.head_dim  # partial RoPE


def test_docs_table_has_a_row_per_architecture_with_its_status():
    rows = [line.split("|") for line in (ROOT / "docs" / "architectures.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| architecture")]
    status = {cells[1].strip(): cells[3].strip() for cells in rows}
    for name, spec in ARCHS.items():
        assert status[name].startswith("supported" if spec.supported else "refused"), name


def test_unknown_architecture_and_bad_tensor_are_named(tmp_path):
    with pytest.raises(ValueError, match="no tiny model of architecture 'gpt5'.*llama"):
        write_tiny_arch(tmp_path / "x.gguf", "gpt5")
    bad = replace(ARCHS["llama"], blocks=(Tensor(gguf.MODEL_TENSOR.SSM_IN, ("embd", "embd")),))
    with pytest.raises(ValueError, match="llama: gguf-py has no tensor SSM_IN"):
        write_arch(tmp_path / "bad.gguf", bad)
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize("name", SUPPORTED)
def test_full_rank_all_zoomed_equals_full(arch_model, name):
    """The exactness anchor per architecture (tests/test_engine.py): exact prefill at full rank with f16 host rows,
    spans compressed to the host and every span rebuilt in every hooked layer -> full KV's logits (F32 softmax)."""
    model = arch_model(name)
    toks = _tokens(model, EXACT_CHARS, offset=3000)
    cc = ContextConfig(flash_attn=False)
    full = make_policy("full", model, len(toks) + 1, cc, BudgetConfig(chunk=EXACT_CHUNK))
    want = full.prefill(toks)
    full.close()
    cfg = SekvConfig(prefill="exact", energy=1.0, zoom_share=0.6, compress_when_fits=True, elastic_window=False,
                     host_format="f16")
    policy = make_policy("sekv", model, len(toks) + 1, cc, BudgetConfig(kv_budget=EXACT_BUDGET, chunk=EXACT_CHUNK),
                         cfg)
    try:
        got = policy.prefill(toks)
        st = asdict(policy.stats().sekv)
        assert st["spans"] > 3 and st["span_tokens"] > len(toks) / 3
        for ikv in range(policy.memory.store.n_layer):  # every span is zoomed in every hooked layer
            assert len(policy.memory.zoom.resident[ikv]) == st["spans"]
    finally:
        policy.close()
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=EXACT_RTOL * np.abs(want).max())


@pytest.mark.parametrize("name", SUPPORTED)
def test_streamed_run_compresses(arch_model, name):
    """A default SeKV run over a prompt longer than the device cells: spans go to the host, tokens come out."""
    model = arch_model(name)
    toks = _tokens(model, STREAM_CHARS, offset=500)
    assert len(toks) > STREAM_BUDGET
    policy = make_policy("sekv", model, len(toks) + N_GENERATE,
                         budget=BudgetConfig(kv_budget=STREAM_BUDGET, chunk=STREAM_CHUNK))
    try:
        run = generate(policy, toks, N_GENERATE, stop_at_eos=False)
        assert policy.session.hook.info.kv_size == STREAM_BUDGET
    finally:
        policy.close()
    assert run.generated_tokens == N_GENERATE
    assert all(0 <= t < model.n_vocab() for t in run.tokens)
    assert run.sekv.spans > 0 and run.host_kv_bytes > 0
    assert run.device_kv_bytes < run.full_kv_bytes


@pytest.mark.parametrize("name", REFUSED)
def test_refused_when_a_policy_is_made(arch_model, name):
    """The refusal names the architecture and the reason the cache layout (or, for encoder-decoder, the model's
    encoder) gives."""
    with pytest.raises(UnsupportedModelError,
                       match=rf"architecture '{name}' is not supported: .*{arch_spec(name).refusal}"):
        make_policy("sekv", arch_model(name), 256)


@pytest.mark.parametrize("name", REFUSED)
def test_refused_by_sekv_llama(arch_path, name):
    from sekv_gguf.llm import SekvLlama

    with pytest.raises(UnsupportedModelError, match=rf"architecture '{name}' is not supported"):
        SekvLlama(str(arch_path(name)), n_ctx=512, kv_budget=256)


def test_encoder_decoder_decode_is_an_error_not_an_abort(arch_path):
    """llama.cpp aborts a T5 decode that no llama_encode preceded; the session refuses it first."""
    with Session.open(arch_path("t5"), ContextConfig(n_ctx=256)) as s:
        with pytest.raises(ModelError, match="architecture 't5' cannot be decoded here: encoder-decoder"):
            s.decode(s.tokenize("hello"))


def _info(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sekv_gguf", "info", str(path), "--n-ctx", "256"],
                          capture_output=True, text=True, timeout=120)


def test_info_says_supported(arch_path):
    r = _info(arch_path("qwen3"))
    assert r.returncode == 0, r.stderr
    assert "architecture  qwen3, 2 layers" in r.stdout and "support       supported" in r.stdout
    assert "hooked cache  attention cache: 2 layers [0, 1]" in r.stdout


def test_info_says_refused_and_why(arch_path):
    """A refused model's info prints what it can and the refusal, then exits 1 with the refusal on stderr."""
    r = _info(arch_path("deepseek2"))
    assert r.returncode == 1
    assert "architecture  deepseek2, 2 layers" in r.stdout
    assert "support       refused: unsupported memory: layer 0 has no separate V (MLA)" in r.stdout
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
        "error: architecture 'deepseek2' is not supported: unsupported memory: layer 0 has no separate V (MLA)"]
