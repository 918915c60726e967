"""The native module: f32 -> f16 rounding equal to numpy, surprisal and span / attention mass equal to numpy,
bad sizes and indices refused, and the C sources clean under AddressSanitizer + UBSan."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sekv_gguf import native
from sekv_gguf._native import ffi, lib
from sekv_gguf.errors import NativeError

ROOT = Path(__file__).resolve().parents[1]


def test_f32_to_f16_matches_numpy_rounding():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(100_000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 100_000),
        np.array([0.0, -0.0, 65504, 65519.99, 65520, 1e30, -1e30, np.inf, -np.inf, 2.0 ** -24, 2.0 ** -25,
                  3 * 2.0 ** -26, 2.0 ** -26, 6.1e-5, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11], dtype=np.float32),
    ])
    got = native.f32_to_f16(x)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.isnan(native.f32_to_f16(np.array([np.nan], dtype=np.float32))).all()
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[~np.isnan(h)]  # every non-NaN half comes back bit-exact (signed zeros, subnormals, infinities)
    np.testing.assert_array_equal(native.f32_to_f16(h.astype(np.float32)).view(np.uint16), h.view(np.uint16))


def test_c_checks_without_the_python_layer():
    """The C functions refuse bad sizes and indices on their own (the Python checks are not the only guard)."""
    logits = np.zeros((3, 4), dtype=np.float32)
    out = np.zeros(3, dtype=np.float32)
    nxt = np.array([0, 9, 1], dtype=np.int32)
    p = lambda a, t="float *": ffi.cast(t, a.ctypes.data)  # noqa: E731
    assert lib.sekv_surprisal(p(logits), 3, 4, p(nxt, "int32_t *"), p(out)) == lib.SEKV_N_ERR_INDEX
    assert lib.sekv_surprisal(p(logits), 3, 0, p(nxt, "int32_t *"), p(out)) == lib.SEKV_N_ERR_SIZE
    assert lib.sekv_surprisal(p(logits), 3, 4, ffi.NULL, p(out)) == lib.SEKV_N_ERR_NULL
    assert lib.sekv_f32_to_f16(p(logits), ffi.NULL, 4) == lib.SEKV_N_ERR_NULL
    assert lib.sekv_f32_to_f16(ffi.NULL, ffi.NULL, -3) == lib.SEKV_N_ERR_SIZE


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


def test_surprisal_equals_numpy_log_softmax():
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((7, 50_003)) * 4).astype(np.float32)
    nxt = rng.integers(0, 50_003, 7)
    want = _logsumexp(logits.astype(np.float64)) - logits[np.arange(7), nxt]
    np.testing.assert_allclose(native.surprisal(logits, nxt), want, rtol=1e-5, atol=1e-4)
    got = native.surprisal_at(logits.ctypes.data, 7, 50_003, nxt)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    with pytest.raises(NativeError, match="out of range"):
        native.surprisal(logits, [0, 1, 2, 3, 4, 5, 50_003])
    with pytest.raises(NativeError, match="NULL"):
        native.surprisal_at(0, 1, 5, [0])


@pytest.mark.parametrize("n_head, n_head_kv, d", [
    (4, 2, 32),    # two query heads per KV head
    (6, 1, 36),    # a group of four and two more; a head size past the vector loops' multiples of 8 and 16
    (12, 2, 72),   # Qwen2.5's grouping
    (64, 1, 258),  # 4-bit rows too wide to fold into the query (group * d > SEKV_MAX_QV): dequantised per row
])
def test_span_mass_equals_numpy_attention_logsumexp(n_head, n_head_kv, d):
    """Raw and factorised spans, grouped query heads: per query head, logsumexp_t q·k_t of the rebuilt rows."""
    from sekv_gguf.config import SekvConfig
    from sekv_gguf.spans import factorize

    rng = np.random.default_rng(3)
    mats = []
    for i in range(9):
        length = int(rng.integers(3, 40))
        rank = 3 if i % 2 else d  # low-rank spans factorise, full-rank ones stay raw
        m = rng.standard_normal((length, n_head_kv, rank)) @ rng.standard_normal((rank, d))
        mats.append(m.astype(np.float32))
    factors = factorize(mats, SekvConfig(energy=0.9999, r_max=16, host_format="f16"))
    assert any(f.raw is None for f in factors) and any(f.raw is not None for f in factors)
    q8 = factorize(mats[:4], SekvConfig(energy=0.9999, r_max=16, host_format="q8"))  # int8 rows with scales
    assert any(f.q8 is not None for f in q8)
    q4 = factorize(mats[:4], SekvConfig(energy=0.9999, r_max=16, host_format="q4"))  # 4-bit rows, scale + zero
    assert any(f.q4 is not None for f in q4)
    factors += q8 + q4
    table = native.SpanTable(n_head_kv, d)
    for m, f in zip(mats + mats[:4] + mats[:4], factors):
        table.append(m.shape[0], f.raw, f.us, f.vt, f.q8, f.scale, f.q4)
    q = (rng.standard_normal((n_head, d)) * 0.3).astype(np.float32)
    got = native.span_mass(q, table)
    want = []
    for f in factors:
        k = f.rebuild()  # [L, Hkv, d]
        logits = np.einsum("lhd,hgd->hgl", k, q.reshape(n_head_kv, -1, d))  # [Hkv, group, L]
        want.append(_logsumexp(logits.astype(np.float64)).reshape(n_head))  # [n_head]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    sub = np.array([7, 2, 2])
    np.testing.assert_array_equal(native.span_mass(q, table, sub), got[sub])
    with pytest.raises(NativeError, match="subset"):
        native.span_mass(q, table, np.array([len(factors)]))
    raw = [f.raw for f in factors if f.raw is not None]
    one_pass = native.SpanTable.of_rows(raw, n_head_kv, d)
    each = native.SpanTable(n_head_kv, d)
    for r in raw:
        each.append(r.shape[0], r, None, None)
    np.testing.assert_array_equal(native.span_mass(q, one_pass), native.span_mass(q, each))
    with pytest.raises(NativeError, match="raw span rows must be"):
        native.SpanTable.of_rows([raw[0][:, :, :1]], n_head_kv, d)
    with pytest.raises(NativeError, match="4-bit span rows"):
        table.append(3, None, None, None, None, np.ones(2 * n_head_kv * d, np.float32),
                     np.zeros((3, n_head_kv, d // 2), np.uint8))  # parameters must be f16
    with pytest.raises(NativeError, match="int8 span rows"):
        table.append(3, None, None, None, np.zeros((3, n_head_kv, d), np.int8), np.ones(n_head_kv * d + 1, np.float32))
    with pytest.raises(NativeError, match="query must be"):
        native.span_mass(q[:, :d // 2], table)
    with pytest.raises(NativeError, match="factors have shapes"):
        table.append(5, None, np.zeros((2, 5, 6), np.float16), np.zeros((2, 7, d), np.float16))


def test_span_mass_widens_every_finite_half_exactly():
    """Raw rows are widened 8 halves at a time (F16C where the CPU has it, a table else): one-row spans of d = 8
    scored by one-hot query heads give back each half as f32, for every finite half (AddressSanitizer's build
    checks the table path on every half, infinities and NaNs included)."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    h = np.concatenate([h, np.zeros(-h.size % 8, dtype=np.float16)]).reshape(-1, 1, 1, 8)  # [S, L=1, Hkv=1, d=8]
    table = native.SpanTable(1, 8)
    for rows in h:
        table.append(1, rows, None, None)
    got = native.span_mass(np.eye(8, dtype=np.float32), table)                         # [S, 8 heads]: head j reads k[j]
    np.testing.assert_array_equal(got, h.reshape(-1, 8).astype(np.float32))


def test_attn_mass_equals_numpy_softmax():
    rng = np.random.default_rng(4)
    n_head, n_head_kv, d, n = 4, 2, 16, 37
    q = rng.standard_normal((n_head, d)).astype(np.float32)
    k = rng.standard_normal((n, n_head_kv, d)).astype(np.float16)
    logits = np.einsum("nhd,hgd->hgn", k.astype(np.float64), q.reshape(n_head_kv, -1, d).astype(np.float64))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)).sum(axis=(0, 1))  # [n]
    base = np.ones(n, dtype=np.float32)
    np.testing.assert_allclose(native.attn_mass(q, k, base), 1 + want, rtol=1e-5, atol=1e-6)
    assert abs(native.attn_mass(q, k).sum() - n_head) < 1e-4  # each head's probabilities sum to 1
    with pytest.raises(NativeError, match="keys must be float16"):
        native.attn_mass(q, k.astype(np.float32))


@pytest.mark.native_sanitizer
def test_native_sources_under_address_sanitizer(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler found to build the sanitizer harness")
    exe = tmp_path / "asan_harness"
    subprocess.run([cc, "-std=c11", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                    "-fno-sanitize-recover=all", "-I", str(ROOT / "native"),
                    str(ROOT / "native" / "sekv_native.c"), str(ROOT / "tests" / "native" / "asan_harness.c"),
                    "-lm", "-o", str(exe)], check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True,
                         env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks passed" in run.stdout


@pytest.mark.parametrize("per_token", [False, True])
def test_int8_rows_widen_as_numpy_and_keep_their_error_bound(per_token):
    """q8_to_f16 is codes * scale rounded to f16; quantize's error is at most half a scale step per element."""
    from sekv_gguf.spans import quantize

    rng = np.random.default_rng(5)
    m = (rng.standard_normal((40, 2, 64)) * rng.uniform(0.1, 8, 64)).astype(np.float32)  # outlier channels
    f = quantize(m, per_token=per_token)
    assert f.q8.dtype == np.int8 and f.per_token == per_token
    assert f.scale.shape == ((40, 2) if per_token else (2, 64))
    scale = f.scale[:, :, None] if per_token else f.scale[None]
    np.testing.assert_array_equal(native.q8_to_f16(f.q8, f.scale, per_token),
                                  (f.q8.astype(np.float32) * scale).astype(np.float16))
    assert (np.abs(f.rebuild() - m) <= scale / 2 + 1e-3 * np.abs(m) + 1e-6).all()
    assert f.nbytes < 0.6 * m.astype(np.float16).nbytes  # int8 codes + f32 scales (per channel: 4 B / 40 rows)
    with pytest.raises(NativeError, match="scales"):
        native.q8_to_f16(f.q8, f.scale[:1], per_token)
    with pytest.raises(NativeError, match="int8"):
        native.q8_to_f16(f.q8.astype(np.int16), f.scale, per_token)


@pytest.mark.parametrize("values", [False, True])
def test_4bit_rows_widen_as_numpy_and_keep_their_error_bound(values):
    """q4_to_f16 is zero + code * scale rounded to f16 (codes unpacked low nibble first); quantize4's error is at
    most half a scale step per element (plus f16 rounding of the parameters), in about 0.3 of the f16 bytes."""
    from sekv_gguf.spans import Q4_LEVELS, q4_group, quantize4, stored_rows

    rng = np.random.default_rng(6)
    m = (rng.standard_normal((40, 2, 64)) * rng.uniform(0.1, 8, 64) + rng.uniform(-3, 3, 64)).astype(np.float32)
    group = q4_group(64) if values else 0
    f = quantize4(m, group)
    assert f.q4.dtype == np.uint8 and f.q4.shape == (40, 2, 32) and f.group == group
    assert f.scale.dtype == np.float16 and f.scale.shape == ((2, 40, 2, 2) if values else (2, 2, 64))
    codes = np.empty((40, 2, 64), dtype=np.float32)
    codes[..., 0::2], codes[..., 1::2] = f.q4 & 0x0F, f.q4 >> 4
    assert codes.max() <= Q4_LEVELS
    scale, zero = (np.repeat(x.astype(np.float32), group, axis=-1) if values else x.astype(np.float32)[None]
                   for x in f.scale)
    np.testing.assert_array_equal(native.q4_to_f16(f.q4, f.scale, group), (zero + codes * scale).astype(np.float16))
    span = m.reshape(40, 2, -1, group).max(-1) - m.reshape(40, 2, -1, group).min(-1) if values else np.ptp(m, 0)
    step = np.repeat(span, group, axis=-1) / Q4_LEVELS if values else span[None] / Q4_LEVELS
    assert (np.abs(f.rebuild() - m) <= step / 2 + 2e-3 * (np.abs(m) + step)).all()
    assert f.nbytes < 0.35 * m.astype(np.float16).nbytes
    assert stored_rows(m[:, :, :63], "q4", values).q8 is not None  # an odd head size keeps int8 rows
    with pytest.raises(NativeError, match="parameters"):
        native.q4_to_f16(f.q4, f.scale[:, :1], group)
    with pytest.raises(NativeError, match="does not divide"):
        native.q4_to_f16(f.q4, f.scale, 24)
    with pytest.raises(NativeError, match="uint8"):
        native.q4_to_f16(f.q4.astype(np.int8), f.scale, group)
