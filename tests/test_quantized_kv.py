"""Quantized K/V caches (llama.cpp's -ctk / -ctv q8_0, q4_0): the exactness anchor at full rank, a streamed SeKV
run, every policy, device bytes, the shared basis of rotated caches, and refusals (docs/quantized-kv.md).

The fixture llama here has head size 64, so llama.cpp Hadamard-rotates its quantized K and V (``KVInfo.rot_k``); the
tiny Gemma (head size 32) is quantized without rotation. The shared tiny llama (head size 16) cannot hold q8_0 blocks
of 32 values at all: that is the refusal test's model."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from helpers import prose
from sekv_gguf.adapter import RouterAdapter
from sekv_gguf.adapter.identity import ModelIdentity
from sekv_gguf.cli import main
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import generate, make_policy
from sekv_gguf.errors import AdapterError, SekvError
from sekv_gguf.features import N_FEATURES
from sekv_gguf.policies import POLICIES
from sekv_gguf.router import TrainedRouter
from sekv_gguf.serve import ServeConfig
from sekv_gguf.session import Session, load_model
from sekv_gguf.spans import host_format_of
from sekv_gguf.tiny_models import TinySpec, write_tiny_llama

ROTATED_SPEC = TinySpec(n_embd=128, head_dim=64)  # head size a multiple of 64: llama.cpp rotates quantized K and V
EXACT = SekvConfig(prefill="exact", energy=1.0, zoom_share=0.6, compress_when_fits=True, elastic_window=False,
                   host_format="f16")  # full rank, rows kept as the device holds them, every span zoomed


@pytest.fixture(scope="module")
def rotated_llama(tmp_path_factory: pytest.TempPathFactory):
    return load_model(write_tiny_llama(tmp_path_factory.mktemp("qkv") / "llama-hd64.gguf", ROTATED_SPEC))


def _tokens(model, n_chars: int, offset: int = 0) -> list[int]:
    return model.tokenize(prose(n_chars, offset).encode(), add_bos=True, special=False)


def _cache(kv_type: str, **config: object) -> ContextConfig:
    return ContextConfig(type_k=kv_type, type_v=kv_type, **config)  # type: ignore[arg-type]


@pytest.mark.parametrize("which, kv_type", [("llama", "q8_0"), ("gemma", "q8_0"), ("llama", "q4_0")])
def test_full_rank_all_zoomed_copies_the_blocks_and_equals_full_kv(rotated_llama, gemma_model, which, kv_type):
    """The exactness anchor on a quantized cache: exact prefill, full rank, every span zoomed in every layer. The
    host tier keeps the cache's own blocks, so every zoomed row is byte for byte the row full KV holds for that
    token (asserted), and the logits equal full KV's at the same cache type up to float32 rounding: with a
    quantized V the CPU flash-attention kernel accumulates in f32 in cell order, and the rebuilt spans sit in other
    cells than in the full run (an f16 V accumulates in f16: test_engine's 5e-3). Not bit-identical for that order
    alone; the tolerance is 1e-5 of the largest logit (measured: ~3e-7)."""
    model = rotated_llama if which == "llama" else gemma_model
    toks = _tokens(model, 700, offset=3000)
    cc = _cache(kv_type)
    full = make_policy("full", model, len(toks) + 1, cc, BudgetConfig(chunk=128))
    policy = make_policy("sekv", model, len(toks) + 1, cc, BudgetConfig(kv_budget=2048, chunk=128), EXACT)
    try:
        want = full.prefill(toks)
        got = policy.prefill(toks)
        st = asdict(policy.stats().sekv)
        assert st["spans"] > 3 and st["span_tokens"] > len(toks) / 3 and st["raw_share"] == 1.0
        store, zoom, hook = policy.memory.store, policy.memory.zoom, policy.session.hook
        full_cells = full.session.hook.cells_of(len(toks))
        for ikv in range(store.n_layer):
            assert len(zoom.resident[ikv]) == st["spans"]  # every span zoomed in every layer
            for sid, idx in zoom.resident[ikv].items():
                k, v = hook.get_rows(ikv, zoom.slots[idx])                     # uint8 [L, row_bytes]
                k_full, v_full = full.session.hook.get_rows(ikv, full_cells[store.spans[sid].positions])
                assert k.dtype == np.uint8 and np.array_equal(k, k_full) and np.array_equal(v, v_full)
    finally:
        full.close()
        policy.close()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_streamed_sekv_at_q8_0_compresses_zooms_and_writes_quantized_summaries(rotated_llama):
    """SeKV as by default (streamed prefill; on a q8_0 cache int8 host rows from the dequantized blocks: ``auto``, no
    coarser than the cache's own rows) but for the summary router
    (whose span mean keys the store keeps), with a budget of a quarter of the prompt: spans compressed, zoomed back,
    finite logits; each summary row on the device is its span's mean key quantized into q8_0 blocks (read back
    within q8_0's error)."""
    toks = _tokens(rotated_llama, 12000)[:2000]
    policy = make_policy("sekv", rotated_llama, len(toks) + 8, _cache("q8_0"), BudgetConfig(kv_budget=512),
                         SekvConfig(router="summary"))
    try:
        run = generate(policy, toks, 8, stop_at_eos=False)
        hook, store = policy.session.hook, policy.memory.store
        assert hook.info.type_k == GGMLQuantizationType.Q8_0 and hook.info.rot_k
        assert run.sekv.spans > 5 and run.sekv.zooms_per_step > 0 and len(run.tokens) == 8
        kept = [f for span in store.spans for f in span.k + span.v if f.raw is None and f.us is None]
        assert kept and all(f.q8 is not None and f.q4 is None for f in kept)  # the default host rows on q8_0
        assert np.isfinite(policy.memory.prev_logits).all()
        cells = np.array([span.summary_cell for span in store.spans])
        for ikv in range(store.n_layer):
            k_dev, _ = hook.get_values(ikv, cells)                              # f32 [S, Hkv, d], dequantized
            want = store.keys[ikv].astype(np.float32)                           # f16 [S, Hkv, d] span mean keys
            np.testing.assert_allclose(k_dev, want, rtol=0, atol=0.02 * np.abs(want).max())
    finally:
        policy.close()


def test_the_default_host_format_follows_the_cache():
    """``host_format="auto"``: 4-bit rows on an f16 or q4_0 cache, int8 on a q8_0 one; an explicit format stands."""
    assert host_format_of("auto", None) == "q4" and host_format_of("auto", GGMLQuantizationType.Q4_0) == "q4"
    assert host_format_of("auto", GGMLQuantizationType.Q8_0) == "q8"
    assert host_format_of("q4", GGMLQuantizationType.Q8_0) == "q4" and host_format_of("f16", None) == "f16"
    assert SekvConfig().host_format == "auto"


# what each policy's statistics show it did with the cache's rows at a budget below the prompt
EVIDENCE = {"full": None, "streaming": "evicted", "h2o": "evicted", "snapkv": "evicted", "pyramidkv": "evicted",
            "chunkkv": "evicted", "semanticache": "cores", "sentencekv": "spans", "quest": "spans", "sekv": "spans"}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_on_a_q8_0_cache(rotated_llama, name):
    assert set(EVIDENCE) == set(POLICIES)
    toks = _tokens(rotated_llama, 9000)[:1200]
    policy = make_policy(name, rotated_llama, len(toks) + 8, _cache("q8_0"), BudgetConfig(kv_budget=512, chunk=128))
    try:
        run = generate(policy, toks, 8, stop_at_eos=False)
        logits = policy.step(run.tokens[-1])
        assert len(run.tokens) == 8 and np.isfinite(logits).all()
        assert policy.session.hook.info.type_v == GGMLQuantizationType.Q8_0
        if EVIDENCE[name] is not None:
            assert policy.session.hook.info.kv_size == 512
            stats = run.sekv or run.stats.baseline  # quest and sentencekv: SeKV's statistics as a baseline's
            assert getattr(stats, EVIDENCE[name]) > 0
        if name == "h2o":  # its scores are attention over the dequantized keys
            assert policy.memory.score.sum() > 0
    finally:
        policy.close()


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_device_kv_bytes_at_q8_0_and_q4_0_against_f16(rotated_llama, gemma_model, which):
    """Device KV bytes as llama.cpp allocated them (the hook's ``kv_bytes`` + ``swa_kv_bytes``): q8_0 is 34 bytes per
    32 values against f16's 64, q4_0 18 — for full KV and for SeKV's budget context alike (Gemma's SWA cache too)."""
    model = rotated_llama if which == "llama" else gemma_model
    n = 3000
    got = {}
    for kv_type in ("f16", "q8_0", "q4_0"):
        for name, budget in (("full", BudgetConfig()), ("sekv", BudgetConfig(kv_budget=0.25))):
            policy = make_policy(name, model, n, _cache(kv_type), budget)
            got[kv_type, name] = policy.device_kv_bytes
            policy.close()
    for name in ("full", "sekv"):
        assert 0.5 < got["q8_0", name] / got["f16", name] <= 34 / 64
        assert 0.25 < got["q4_0", name] / got["f16", name] <= 18 / 64
    assert got["q8_0", "sekv"] < got["q8_0", "full"] / 2


def test_captured_query_and_decoded_keys_share_the_rotated_basis(rotated_llama):
    """A rotated quantized cache holds K Hadamard-rotated, and the captured query is rotated with it: its logits
    over the decoded keys are the f16 cache's logits (within q8_0's error) although the keys themselves differ."""
    toks = _tokens(rotated_llama, 900)[:200]
    keys, logits = {}, {}
    for kv_type in ("f16", "q8_0"):
        s = Session(rotated_llama, _cache(kv_type, n_ctx=256))
        try:
            s.hook.enable_query_capture()
            s.decode(toks)
            assert s.hook.info.rot_k == (kv_type == "q8_0")
            q = s.hook.query(0)                                                   # f32 [n_head, d]
            k, _ = s.hook.get_values(0, s.hook.cells_of(len(toks)))               # [n, Hkv, d]
            group = q.shape[0] // k.shape[1]
            keys[kv_type] = k.astype(np.float32)
            # [n_head, d] x [n, n_head, d] (each KV head serving its query heads) -> [n_head, n]
            logits[kv_type] = np.einsum("hd,nhd->hn", q, np.repeat(keys[kv_type], group, axis=1))
        finally:
            s.close()
    scale = np.abs(logits["f16"]).max()
    np.testing.assert_allclose(logits["q8_0"], logits["f16"], rtol=0, atol=0.02 * scale)
    assert np.abs(keys["q8_0"] - keys["f16"]).max() > 0.5 * np.abs(keys["f16"]).max()  # another basis


def test_a_trained_router_is_refused_on_a_rotated_k_cache(rotated_llama):
    rng = np.random.default_rng(0)
    layers, n_head, proj, d = [0, 1], ROTATED_SPEC.n_head, 4, ROTATED_SPEC.head_dim
    base = ModelIdentity(name="tiny", architecture="llama", n_layer=2, n_embd=128, n_vocab=300, tensor_hash="0" * 64,
                         n_params=1)
    adapter = RouterAdapter(base=base, layers=layers, n_head=n_head, n_head_kv=ROTATED_SPEC.n_head_kv, head_dim=d,
                            proj_dim=proj, w=[rng.standard_normal((n_head, proj, d)).astype(np.float32) for _ in layers],
                            b=[np.zeros(n_head, np.float32) for _ in layers],
                            tau=[np.zeros(n_head, np.float32) for _ in layers],
                            theta=[np.zeros((n_head, N_FEATURES), np.float32) for _ in layers],
                            spread_rank=2, n_centroids=2, kmeans_iters=1, train={})
    with pytest.raises(AdapterError, match="Hadamard-rotated.*type_k f16"):
        make_policy("sekv", rotated_llama, 2000, _cache("q8_0"), BudgetConfig(kv_budget=512),
                    router=TrainedRouter(adapter))
    policy = make_policy("sekv", rotated_llama, 2000, _cache("f16"), BudgetConfig(kv_budget=512),
                         router=TrainedRouter(adapter))  # the same adapter on an f16 cache
    policy.close()


def test_bad_cache_types_are_refused_with_the_reason(llama_model, tiny_llama: Path, capsys):
    with pytest.raises(ValueError, match="type_k must be one of the K/V cache types f32, f16, q8_0, q4_0, got 'q5_1'"):
        ContextConfig(type_k="q5_1")
    with pytest.raises(ValueError, match="type_v q8_0 .* needs flash_attn=True"):
        ContextConfig(type_v="q8_0", flash_attn=False)
    ContextConfig(type_k="q8_0", flash_attn=False)  # a quantized K alone needs no flash attention
    with pytest.raises(SekvError, match="K head size 16 is not a multiple of 32"):
        Session(llama_model, _cache("q8_0"))
    with pytest.raises(ValueError, match="cache_type_k must be one of"):
        ServeConfig(cache_type_k="q5_1")
    from sekv_gguf.llm import SekvLlama

    with pytest.raises(ValueError, match=r"type_k=7 is not a K/V cache type.*q8_0 \(8\)"):
        SekvLlama(str(tiny_llama), type_k=int(GGMLQuantizationType.Q5_1))
    with pytest.raises(SystemExit):
        main(["run", str(tiny_llama), "-p", "hi", "-ctk", "q5_1"])
    assert "invalid choice: 'q5_1'" in capsys.readouterr().err
    assert main(["run", str(tiny_llama), "-p", "hi", "-n", "1", "-ctk", "q8_0", "-q"]) == 1
    assert "K head size 16 is not a multiple of 32" in capsys.readouterr().err


def test_sekv_llama_and_run_take_q8_0(rotated_llama, tmp_path: Path, capsys):
    """``SekvLlama(type_k=..., type_v=...)`` (a ggml id or a name) and ``run -ctk/-ctv`` run on a q8_0 cache."""
    import json

    from sekv_gguf.llm import SekvLlama

    path = write_tiny_llama(tmp_path / "llama-hd64.gguf", ROTATED_SPEC)
    llm = SekvLlama(str(path), kv_budget=512, n_ctx=4096, type_k=int(GGMLQuantizationType.Q8_0), type_v="q8_0")
    try:
        out = llm.create_completion(prose(2500), max_tokens=4)
        assert out["usage"]["completion_tokens"] >= 1
        assert llm.memories.active.session.hook.info.type_k == GGMLQuantizationType.Q8_0
    finally:
        llm.close()
    assert main(["run", str(path), "-p", prose(2000), "-n", "2", "--kv-budget", "512", "-ctk", "q8_0", "-ctv",
                 "q8_0", "--json", "-q"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 < result["device_kv_bytes"] < result["full_kv_bytes"]
