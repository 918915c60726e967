"""Teacher capture, the train command and the trained router in the engine, on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.adapter import RouterAdapter, read_adapter
from sekv_gguf.cli import main
from sekv_gguf.config import BudgetConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.session import load_model
from sekv_gguf.train.capture import CaptureConfig, capture
from sekv_gguf.train.pipeline import MAX_PROJ_DIM, TrainRun, sized_proj_dim


def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


def test_capture_shapes_masses_and_labels(tiny_llama):
    model = load_model(tiny_llama)
    tokens = model.tokenize(prose(9000).encode(), add_bos=True, special=False)[:1500]
    cap = CaptureConfig(n_queries=6)
    c = capture(model, tokens, SekvConfig(), cap)
    n_layer, s = int(c["n_layer"]), c["lengths"].size
    assert n_layer == 2 and s > 10
    for ikv in range(n_layer):
        q, l_true, l_rest, y = c[f"q{ikv}"], c[f"l_true{ikv}"], c[f"l_rest{ikv}"], c[f"y{ikv}"]
        assert q.shape[:2] == (6, 4) and l_true.shape == (6, 4, s) and c[f"keys{ikv}"].shape[0] == s
        dirs, var = c[f"dirs{ikv}"], c[f"var{ikv}"]  # the spans' principal directions of spread, largest first
        assert dirs.shape == (s, 2, cap.spread_rank, q.shape[2]) and var.shape == (s, 2, cap.spread_rank)
        assert (var >= 0).all() and (np.diff(var, axis=2) <= 1e-6).all()
        np.testing.assert_allclose(np.linalg.norm(dirs, axis=3)[var > 1e-9], 1.0, rtol=1e-5)
        share = np.exp(l_true - _lse(np.concatenate([l_true, l_rest[..., None]], axis=2))[..., None])
        np.testing.assert_allclose(share.sum(axis=2), c[f"span_mass{ikv}"], rtol=1e-9)
        covered = (share * y).sum(axis=2) / share.sum(axis=2)  # labelled spans hold >= 90% of the span mass
        assert (covered >= cap.label_mass - 1e-9).all()
        # a minimal label set: dropping the smallest labelled span falls below 90%
        smallest = np.where(y > 0, share, np.inf).min(axis=2)
        assert ((covered * share.sum(axis=2) - smallest) / share.sum(axis=2) < cap.label_mass + 1e-9).all()


def test_capture_cuts_the_spans_the_engine_cuts(tiny_llama):
    """The router's teacher data is cut as the engine cuts: the same budget over the same document gives the spans
    an exact prefill of the document's first part makes (positions and lengths), anchors capped by the budget."""
    model = load_model(tiny_llama)
    tokens = model.tokenize(prose(9000, offset=1000).encode(), add_bos=True, special=False)[:1500]
    sekv, budget = SekvConfig(prefill="exact"), BudgetConfig(kv_budget=0.25, chunk=128)
    c = capture(model, tokens, sekv, CaptureConfig(n_queries=6), budget=budget)
    policy = make_policy("sekv", model, len(tokens), budget=budget, params=sekv)
    try:
        policy.prefill(tokens[:-6])
        spans = policy.memory.store.spans
        assert len(spans) > 10 and policy.memory.anchors
        assert [int(s.positions[0]) for s in spans] == c["span_starts"].tolist()
        assert [s.length for s in spans] == c["lengths"].astype(int).tolist()
    finally:
        policy.close()


def test_the_router_is_sized_within_its_share_of_the_model():
    """proj_dim 0: the largest P <= MAX_PROJ_DIM whose adapter stays within max_param_share of the model (Qwen2.5-
    Coder-1.5B's shape: 28 hooked layers x 12 heads x head_dim 128 of 1,777,088,000 parameters -> P 20, 0.049%;
    Gemma 3 270M's 3 global layers x 4 heads x 256 -> the full 32); an explicit proj_dim is kept; a model too small
    for even P = 1 is refused naming the sizes."""
    auto = TrainRun()
    assert sized_proj_dim(auto, 1_777_088_000, 28, 12, 128) == 20
    cap = 0.0005 * 1_777_088_000
    assert RouterAdapter.params_for(28, 12, 128, 20) <= cap < RouterAdapter.params_for(28, 12, 128, 21)
    assert sized_proj_dim(auto, 268_098_176, 3, 4, 256) == MAX_PROJ_DIM
    assert sized_proj_dim(TrainRun(max_param_share=0.01), 1_777_088_000, 28, 12, 16) == 16  # at most head_dim
    assert sized_proj_dim(TrainRun(proj_dim=32), 1_777_088_000, 28, 12, 128) == 32
    with pytest.raises(ValueError, match=r"184 parameters even at proj_dim 1, 0\.151% of the model's 121536"):
        sized_proj_dim(auto, 121_536, 2, 4, 16)
    with pytest.raises(ValueError, match="max_param_share"):
        TrainRun(max_param_share=0)


def test_train_command_writes_an_adapter_the_engine_uses(tiny_llama, tiny_gemma, tmp_path, capsys):
    out = tmp_path / "router.gguf"
    rc = main(["train", str(tiny_llama), "--docs", "2", "--tokens", "2048", "--epochs", "3", "--proj-dim", "8",
               "--out", str(out), "--captures", str(tmp_path / "cap"), "-q"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["param_share"] > 0 and summary["loss_after"] <= summary["loss_before"]
    adapter = read_adapter(out)
    assert summary["proj_dim"] == 8 and summary["params"] == adapter.n_params == RouterAdapter.params_for(
        len(adapter.layers), adapter.n_head, adapter.head_dim, 8)
    assert adapter.proj_dim == 8 and adapter.layers == [0, 1] and adapter.train["docs"] == 2
    # a rerun finds the captures and the finished checkpoint: no model work, same weights
    assert main(["train", str(tiny_llama), "--docs", "2", "--tokens", "2048", "--epochs", "3", "--proj-dim", "8",
                 "--out", str(tmp_path / "again.gguf"), "--captures", str(tmp_path / "cap"), "-q"]) == 0
    capsys.readouterr()
    assert read_adapter(tmp_path / "again.gguf").w[0].tobytes() == adapter.w[0].tobytes()

    text = prose(6000)
    assert main(["run", str(tiny_llama), "-p", text, "-n", "4", "--kv-budget", "1024", "--adapter", str(out),
                 "--json", "-q"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["sekv"]["router"] == "trained:router.gguf" and run["sekv"]["spans"] > 0
    assert main(["run", str(tiny_gemma), "-p", text, "-n", "4", "--adapter", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert "trained for tiny-llama" in err and "not for tiny-gemma3" in err
