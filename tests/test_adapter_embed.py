"""A router carried in the model's own GGUF (``adapter.embed``): the copy loads in llama.cpp as the model it copies
(same logits), the router reads back bit-identical, ``run`` uses it without ``--adapter``, a foreign adapter is
refused, embedding again replaces the router."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from test_adapter import _adapter
from sekv_gguf.adapter import model_identity
from sekv_gguf.adapter.embed import carries_router, embed_adapter, read_embedded
from sekv_gguf.errors import AdapterError
from sekv_gguf.session import Session, load_model
from sekv_gguf.config import ContextConfig


def _logits(path, tokens: list[int]) -> np.ndarray:
    model = load_model(str(path))
    with Session(model, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64)) as s:
        return s.decode(tokens, logits="all")


def test_the_copy_is_the_model_and_carries_the_router(tiny_llama, tmp_path):
    a = _adapter(model_identity(tiny_llama), np.random.default_rng(0), layers=(0, 1))
    out = embed_adapter(tiny_llama, a, tmp_path / "with-router.gguf")
    b = read_embedded(out)
    assert b.base == a.base and b.layers == [0, 1] and b.train == a.train
    for x, y in zip(a.w + a.b + a.tau + a.theta, b.w + b.b + b.tau + b.theta):
        assert x.shape == y.shape and x.tobytes() == y.tobytes()
    assert model_identity(out).tensor_hash == model_identity(tiny_llama).tensor_hash
    assert carries_router(load_model(str(out)).metadata()) and not carries_router(load_model(str(tiny_llama)).metadata())
    tokens = load_model(str(tiny_llama)).tokenize(b"The special magic number is 42.", add_bos=True, special=False)
    assert np.array_equal(_logits(out, tokens), _logits(tiny_llama, tokens))  # llama.cpp ignores the router keys


def test_run_uses_the_router_the_model_carries(tiny_llama, tmp_path):
    a = _adapter(model_identity(tiny_llama), np.random.default_rng(1), layers=(0, 1))
    out = embed_adapter(tiny_llama, a, tmp_path / "with-router.gguf")
    runs = {}
    for name, path in (("plain", tiny_llama), ("embedded", out)):
        r = subprocess.run([sys.executable, "-m", "sekv_gguf", "run", str(path), "-p", "word " * 900, "-n", "4",
                            "--kv-budget", "512", "--json", "-q"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout)["sekv"]["router"]
    assert runs["plain"] == "training-free" and runs["embedded"] != "training-free"


def test_a_foreign_adapter_is_refused_and_embedding_again_replaces(tiny_llama, tiny_gemma, tmp_path):
    foreign = _adapter(model_identity(tiny_gemma), np.random.default_rng(2))
    with pytest.raises(AdapterError, match="trained for tiny-gemma3"):
        embed_adapter(tiny_llama, foreign, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists() and not list(tmp_path.glob("*.part"))
    first = embed_adapter(tiny_llama, _adapter(model_identity(tiny_llama), np.random.default_rng(3), layers=(0, 1)),
                          tmp_path / "one.gguf")
    again = embed_adapter(first, _adapter(model_identity(tiny_llama), np.random.default_rng(4), layers=(1,)),
                          tmp_path / "two.gguf")
    assert read_embedded(again).layers == [1]
    from gguf import GGUFReader
    assert not [f for f in GGUFReader(str(again)).fields if f.startswith("sekv.router.blk.0.")]
    with pytest.raises(AdapterError, match="carries no SeKV router"):
        read_embedded(tiny_llama)
    with pytest.raises(AdapterError, match="another file"):
        embed_adapter(first, read_embedded(first), first)
