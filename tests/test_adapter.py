"""The router adapter: GGUF round trip (bit-identical, readable by gguf-py), wrong-model and corrupt-file refusals,
parameter share, the committed Gemma adapter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from sekv_gguf.adapter import RouterAdapter, model_identity, read_adapter, write_adapter
from sekv_gguf.errors import AdapterError
from sekv_gguf.features import N_FEATURES


def _adapter(identity, rng, layers=(1,), n_head=4, n_head_kv=2, head_dim=16, proj=8) -> RouterAdapter:
    return RouterAdapter(base=identity, layers=list(layers), n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                         proj_dim=proj, w=[rng.standard_normal((n_head, proj, head_dim)).astype(np.float32)
                                           for _ in layers],
                         b=[rng.standard_normal(n_head).astype(np.float32) for _ in layers],
                         tau=[rng.random(n_head).astype(np.float32) for _ in layers],
                         theta=[rng.standard_normal((n_head, N_FEATURES)).astype(np.float32) for _ in layers],
                         spread_rank=4, n_centroids=3, kmeans_iters=2,
                         train={"docs": 12, "seed": 0, "loss": 0.125, "commit": "abc"})


def test_round_trip_is_bit_identical_and_gguf_readable(tiny_llama, tmp_path):
    ident = model_identity(tiny_llama)
    assert ident.architecture == "llama" and ident.n_layer == 2 and len(ident.tensor_hash) == 64
    a = _adapter(ident, np.random.default_rng(0), layers=(0, 1))
    path = write_adapter(tmp_path / "r.gguf", a)
    b = read_adapter(path)
    assert b.base == ident and b.layers == [0, 1] and (b.n_head, b.n_head_kv, b.head_dim, b.proj_dim) == (4, 2, 16, 8)
    assert (b.spread_rank, b.n_centroids, b.kmeans_iters) == (4, 3, 2)
    for x, y in zip(a.w + a.b + a.tau + a.theta, b.w + b.b + b.tau + b.theta):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    assert b.train == {"docs": 12, "seed": 0, "loss": 0.125, "commit": "abc"}
    r = GGUFReader(str(path))  # plain gguf-py reads it
    assert r.get_field("general.type").contents() == "adapter"
    assert r.get_field("adapter.type").contents() == "sekv_router"
    assert r.get_field("general.architecture").contents() == "llama"
    assert all(len(t.name.encode()) <= 64 for t in r.tensors)
    b.check_model(ident)


def test_wrong_model_is_refused_naming_both(tiny_llama, tiny_gemma, tmp_path):
    a = read_adapter(write_adapter(tmp_path / "r.gguf", _adapter(model_identity(tiny_llama), np.random.default_rng(1))))
    with pytest.raises(AdapterError, match=r"trained for tiny-llama \(llama.*not for tiny-gemma3 \(gemma3"):
        a.check_model(model_identity(tiny_gemma))


def test_corrupt_truncated_and_foreign_files_are_refused(tiny_llama, tmp_path):
    path = write_adapter(tmp_path / "r.gguf", _adapter(model_identity(tiny_llama), np.random.default_rng(2)))
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="corrupt or truncated|missing"):
        read_adapter(tmp_path / "cut.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(AdapterError, match="not a readable GGUF"):
        read_adapter(tmp_path / "junk.gguf")
    with pytest.raises(AdapterError, match="is not a SeKV router adapter"):
        read_adapter(tiny_llama)  # a model, not an adapter
    with pytest.raises(AdapterError, match="not found"):
        read_adapter(tmp_path / "missing.gguf")


@pytest.mark.gemma
def test_parameter_share_of_the_default_model_is_under_0_05_percent(gemma_path):
    """Gemma 3 270M: one (32 x head_dim) projection, bias and threshold per query head of each global layer."""
    ident = model_identity(gemma_path)
    assert ident.architecture == "gemma3" and ident.n_params > 200_000_000
    a = _adapter(ident, np.random.default_rng(3), layers=(5, 11, 17), n_head=4, n_head_kv=1, head_dim=256, proj=32)
    assert a.param_share < 0.0005, a.param_share


def test_the_engine_router_computes_what_the_student_trained(tiny_llama):
    """TrainedRouter (the decode-time scorer: all heads, grouped KV heads, f32 inputs from a SpanStore) and the
    student's alphas (training: one head, f64) agree."""
    from sekv_gguf.config import SekvConfig
    from sekv_gguf.features import SpanFeatures
    from sekv_gguf.router import TrainedRouter
    from sekv_gguf.span_store import SpanStore
    from sekv_gguf.train.student import Params, alphas

    rng = np.random.default_rng(5)
    a = _adapter(model_identity(tiny_llama), rng, layers=(0, 1))
    s, r, c = 9, 4, 3
    query = rng.standard_normal((4, 16)).astype(np.float32)
    keys = rng.standard_normal((s, 2, 16)).astype(np.float32)
    sketch = {"dirs": rng.standard_normal((s, 2, r, 16)), "var": rng.random((s, 2, r)),
              "lo": -rng.random((s, 2, r)), "hi": rng.random((s, 2, r)), "mu": rng.standard_normal((s, 2, c, 16)),
              "logw": np.log(rng.dirichlet(np.ones(c), (s, 2)))}
    sketch = {k: v.astype(np.float32) for k, v in sketch.items()}
    bounds = (keys - rng.random((s, 2, 16)).astype(np.float32), keys + rng.random((s, 2, 16)).astype(np.float32))
    lengths = rng.integers(4, 64, s).astype(np.float32)
    store = SpanStore(2, 2, 16, SekvConfig(), sketch_shape=(r, c, 1))  # routing data as the store stacks it
    store.keys[1], (store.kmin[1], store.kmax[1]), store.lengths = keys, bounds, lengths
    store.sketch[1] = {k: v.astype(np.float64) for k, v in sketch.items()}
    got = TrainedRouter(a).alphas(1, query, store)  # [S, H]
    for h in range(4):
        kv = h // 2
        f64 = lambda x: x[:, kv].astype(np.float64)  # noqa: E731
        sf = SpanFeatures(keys=f64(keys), kmin=f64(bounds[0]), kmax=f64(bounds[1]), lengths=lengths.astype(np.float64),
                          **{k: f64(v) for k, v in sketch.items()})
        p = Params(w=a.w[1][h].astype(np.float64), b=a.b[1][h:h + 1].astype(np.float64),
                   theta=a.theta[1][h].astype(np.float64))
        np.testing.assert_allclose(got[:, h], alphas(p, query[h:h + 1].astype(np.float64), sf)[0], rtol=1e-12)
    assert not np.allclose(got[:, 0], got[:, 2])  # heads of different KV groups see different spans


def test_trained_proposals_are_ordered_by_exact_mass(tiny_llama):
    """verify_candidates: the trained router's top spans come first, in the order of their exact attention mass from
    the host rows; the other spans follow in trained order."""
    from sekv_gguf import native
    from sekv_gguf.config import SekvConfig
    from sekv_gguf.router import TrainedRouter
    from sekv_gguf.span_store import SpanStore

    rng = np.random.default_rng(6)
    a = _adapter(model_identity(tiny_llama), rng, layers=(0,))
    mats = [rng.standard_normal((int(n), 2, 16)).astype(np.float32) for n in rng.integers(4, 20, 10)]
    store = SpanStore(1, 2, 16, SekvConfig(), (a.spread_rank, a.n_centroids, a.kmeans_iters))
    rows = np.concatenate(mats)  # [sum L, Hkv, d]
    store.add([np.arange(m.shape[0]) for m in mats], [np.ones(m.shape[0]) for m in mats], lambda ikv: (rows, rows))
    query = rng.standard_normal((4, 16)).astype(np.float32)
    trained = TrainedRouter(a, candidates=0).score(0, query, store)
    got = np.argsort(-TrainedRouter(a, candidates=4).score(0, query, store), kind="stable")
    first = np.argsort(-trained, kind="stable")
    table = native.SpanTable(2, 16)  # the host rows, tabled again outside the store
    for s in store.spans:
        table.append(s.length, s.k[0].raw, s.k[0].us, s.k[0].vt, s.k[0].q8, s.k[0].scale, s.k[0].q4)
    mass = native.span_mass(query, table).max(axis=1)
    assert set(got[:4]) == set(first[:4]) and list(got[4:]) == list(first[4:])
    assert list(got[:4]) == sorted(first[:4], key=lambda s: -mass[s]) != list(first[:4])  # the order changed


def test_an_adapter_of_another_format_version_is_refused(tiny_llama, tmp_path, monkeypatch):
    import sekv_gguf.adapter.keys as K

    monkeypatch.setattr(K, "FORMAT_VERSION", 1)  # written as the format-1 files of the first router were
    path = write_adapter(tmp_path / "old.gguf", _adapter(model_identity(tiny_llama), np.random.default_rng(7)))
    monkeypatch.undo()
    with pytest.raises(AdapterError, match="format version 1, this sekv_gguf reads 2"):
        read_adapter(path)


def test_the_committed_gemma_adapter_still_reads():
    """bench/gemma3-270m-router.gguf was written with sekv.anchor_alpha and sekv.energy (never applied, no longer
    written or read): the reader ignores them."""
    path = Path(__file__).resolve().parents[1] / "bench" / "gemma3-270m-router.gguf"
    assert GGUFReader(str(path)).get_field("sekv.energy") is not None
    a = read_adapter(path)
    assert a.base.architecture == "gemma3" and a.layers == [5, 11, 17] and (a.n_head, a.n_head_kv) == (4, 1)
    assert all(w.shape == (a.n_head, a.proj_dim, a.head_dim) for w in a.w) and a.train["commit"]


def test_weights_that_do_not_match_the_header_are_refused_naming_the_file(tiny_llama, tmp_path):
    """A bias tensor of the wrong length (found by the fuzz test): the shape check inside ``RouterAdapter`` does not
    know the file; ``read_adapter`` names it."""
    a = _adapter(model_identity(tiny_llama), np.random.default_rng(3))
    a.b = [np.zeros(0, np.float32)]  # after construction: the writer does not check, the reader must
    path = write_adapter(tmp_path / "r.gguf", a)
    with pytest.raises(AdapterError, match=f"^{path}: layer 1: weights .* do not match n_head 4"):
        read_adapter(path)
