"""Saved memories (``sekv_gguf.memory_file``): a memory written to a GGUF file and loaded into a NEW policy gives the
next turn's logits bit for bit and the same greedy continuation (tiny llama, tiny Gemma-3 iSWA); the compact modes
are smaller (q8_0 device rows; compact3: 3-bit host codes) and give the next turn close to the saver's; a wrong
model, settings, version, damaged span arrays or a damaged file is refused naming the problem; files are written
atomically with mode 0600."""

from __future__ import annotations

import base64
import stat
import zlib
from pathlib import Path

import numpy as np
import pytest

from helpers import prose
from sekv_gguf.config import INDEX_Q8_MAX, BudgetConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.errors import MemoryFileError, MemoryMismatchError
from sekv_gguf.memory_file import capture, load_memory, read_memory_file, restore_into, save_memory
from sekv_gguf.memory_file import packing
from sekv_gguf.memory_file import keys as K
from sekv_gguf.policies import POLICIES
from sekv_gguf.spans import Q4_LEVELS

BUDGET = BudgetConfig(kv_budget=512, chunk=128)
PROMPT, TURN, STEPS = 1500, 120, 8


def _tokens(model, n: int, offset: int = 0) -> list[int]:
    return model.tokenize(prose(6 * n, offset).encode(), add_bos=True, special=False)[:n]


def _make(model, name: str = "sekv", params=None, budget: BudgetConfig = BUDGET, n: int = 2000):
    if params is None and name == "sekv":
        params = SekvConfig(route_every=2)
    return make_policy(name, model, n, budget=budget, params=params)


def _continue(policy, turn: list[int], n: int = STEPS) -> tuple[np.ndarray, list[int], list[np.ndarray]]:
    """The next turn's logits, then a greedy continuation (tokens and each step's logits)."""
    first = logits = policy.append(turn)
    out, rows = [], []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = policy.step(t)
        rows.append(logits)
    return first, out, rows


@pytest.fixture(params=["llama", "gemma"])
def model(request, llama_model, gemma_model):
    return llama_model if request.param == "llama" else gemma_model


def test_a_lossless_memory_file_gives_the_next_turn_bit_for_bit(model, tmp_path):
    """Saved after a prompt three times the budget (spans compressed, zoomed) and a few generated tokens; loaded
    into a new policy: the next turn's logits and every step of a greedy continuation equal the original's."""
    toks = _tokens(model, PROMPT, 500)
    turn = _tokens(model, TURN, 7000)[1:]
    first, second = _make(model), _make(model)
    try:
        logits = first.append(toks)
        for _ in range(3):
            logits = first.step(int(np.argmax(logits)))
        assert len(first.memory.store) > 10 and any(first.memory.zoom.resident)
        path = save_memory(first, tmp_path / "m.gguf")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert not [p for p in tmp_path.iterdir() if p.name != "m.gguf"]  # no temporary file left
        saved = load_memory(second, path)
        assert saved.mode == "lossless" and second.tokens == first.tokens
        want = _continue(first, turn)
        got = _continue(second, turn)
        assert np.array_equal(got[0], want[0])
        assert got[1] == want[1]
        for a, b in zip(got[2], want[2]):
            assert np.array_equal(a, b)
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"sekv"}))
def test_every_baseline_saves_and_loads_losslessly(llama_model, tmp_path, name):
    """Every baseline's memory object and device cells (``full``: llama.cpp's own sequence state) round-trip."""
    toks = _tokens(llama_model, 1200, 900)
    turn = _tokens(llama_model, 40, 5000)[1:]
    first, second = _make(llama_model, name), _make(llama_model, name)
    try:
        first.append(toks)
        load_memory(second, save_memory(first, tmp_path / f"{name}.gguf"))
        want, got = _continue(first, turn, 3), _continue(second, turn, 3)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    finally:
        first.close()
        second.close()


def test_the_full_policy_saves_through_llama_cpp_state_bit_for_bit(gemma_model, tmp_path):
    """``full`` on the iSWA model: llama.cpp's sequence state of both caches, the next turn bit for bit."""
    toks = _tokens(gemma_model, 1200, 900)
    turn = _tokens(gemma_model, 60, 5000)[1:]
    first, second = _make(gemma_model, "full"), _make(gemma_model, "full")
    try:
        first.append(toks)
        for _ in range(3):
            first.step(7)
        path = save_memory(first, tmp_path / "full.gguf")
        assert "llama_seq" in read_memory_file(path).content["device"]
        load_memory(second, path)
        want, got = _continue(first, turn, 4), _continue(second, turn, 4)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]
        for a, b in zip(got[2], want[2]):
            assert np.array_equal(a, b)
    finally:
        first.close()
        second.close()


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p, q = (np.exp(x - x.max()) for x in (p_logits.astype(np.float64), q_logits.astype(np.float64)))
    p, q = p / p.sum(), q / q.sum()
    return float((p * (np.log(p) - np.log(q))).sum())


@pytest.mark.parametrize("mode", ["compact", "compact3"])
def test_a_compact_memory_is_smaller_and_gives_the_next_turn(model, tmp_path, mode, monkeypatch):
    """Compact: the zoom slots' rows, the carried logits, the routing index and (iSWA) the sliding-window cache
    with the window's newest rows are not written, the device rows are stored as q8_0 and (compact3) the host
    tier's 4-bit codes in 3 bits, every array deflated (here down to the smallest); the restore writes the same
    spans into the same slots from the host tier (compact: the saver's rows; compact3: within one 3-bit step of
    them), computes the index again and decodes the window's newest tokens again. The next turn: the saving
    policy's top token, KL < 0.01."""
    monkeypatch.setattr(packing, "DEFLATE_MIN", 0)
    toks = _tokens(model, PROMPT, 500)
    turn = _tokens(model, TURN, 7000)[1:]
    first, second = _make(model), _make(model)
    try:
        first.append(toks)
        resident = [sorted(r) for r in first.memory.zoom.resident]
        assert any(resident)
        full = save_memory(first, tmp_path / "lossless.gguf")
        small = save_memory(first, tmp_path / "compact.gguf", mode=mode)
        assert small.stat().st_size < full.stat().st_size
        saved = load_memory(second, small)
        iswa = first.session.hook.info.is_iswa
        assert saved.mode == mode and saved.content["device"]["swa"] is None
        flat = saved.content["memory"][packing.ARRAYS_KEY]
        assert (packing.Q3_COUNT in flat) == (mode == "compact3")
        assert all(packing.DEFLATE_KEY in x for x in flat.values() if isinstance(x, np.ndarray | dict))
        assert all(saved.content["memory"]["store"][f] is None for f in packing.INDEX_FIELDS)
        lossless = read_memory_file(full).content["device"]
        whole_blocks = lossless["rows"][0][0].shape[2] % 32 == 0     # heads of whole q8_0 blocks (tiny llama: 16)
        assert saved.content["device"].get(packing.DEVICE_KEY) == ("q8_0" if whole_blocks else None)
        assert (lossless["swa"] is not None) == iswa
        assert (saved.content["memory"]["recompute"] > first.session.hook.info.n_swa) if iswa else \
            saved.content["memory"]["recompute"] == 0
        assert [sorted(r) for r in second.memory.zoom.resident] == resident
        hook_a, hook_b = first.session.hook, second.session.hook
        for ikv, held in enumerate(first.memory.zoom.resident):
            for sid, idx in held.items():
                cells = first.memory.zoom.slots[idx]
                for a, b in zip(hook_a.get_rows(ikv, cells), hook_b.get_rows(ikv, cells)):
                    a, b = a.astype(np.float32), b.astype(np.float32)          # [L, Hkv, d]
                    span = a.max(axis=(0, 2)) - a.min(axis=(0, 2))             # [Hkv]
                    if mode == "compact":
                        assert np.array_equal(a, b)
                    else:  # a 4-bit step and a 3-bit step of the span's range, halves: < 0.11 of it
                        assert (np.abs(a - b) <= 0.11 * span[None, :, None] + 1e-3).all()
        assert len(second.memory.store) == len(first.memory.store)
        a_store, b_store = first.memory.store, second.memory.store
        assert np.array_equal(a_store.block_logn, b_store.block_logn)
        for ikv in range(a_store.n_layer):   # the index again from the host rows: block means of 4- (3-) bit keys
            a, b = a_store.block_keys(ikv), b_store.block_keys(ikv)
            assert a.shape == b.shape and (np.abs(a - b) <= _index_bound(a_store, ikv, a, b, mode)).all()
        want, got = _continue(first, turn, 4), _continue(second, turn, 4)
        assert int(np.argmax(got[0])) == int(np.argmax(want[0])) and _kl(want[0], got[0]) < 1e-2
        assert any(second.memory.zoom.resident) and len(got[1]) == 4
    finally:
        first.close()
        second.close()


def _index_bound(store, ikv: int, a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """How far layer ``ikv``'s block keys [Hkv, S, B, d] computed again from a compact file's host rows may lie from
    the saver's (``a``, from the exact rows): per span and channel, half a 4-bit step of the channel's range (exact ->
    4-bit) plus, in compact3, the most the codes move to 3 bits (a 4-bit step * 15/14), plus each index's int8
    rounding (half a step of its block's largest key) and f16 slack."""
    rng = np.stack([sp.k[ikv].scale[0].astype(np.float32) * Q4_LEVELS if sp.k[ikv].q4 is not None
                    else np.zeros(a.shape[::3], dtype=np.float32) for sp in store.spans], axis=1)  # [Hkv, S, d]
    step = rng / Q4_LEVELS
    rows = step * (0.5 + (Q4_LEVELS / (2 * packing.Q3_LEVELS) if mode == "compact3" else 0.0))
    q8 = sum(np.abs(x).max(axis=-1, keepdims=True) / (2 * INDEX_Q8_MAX) for x in (a, b))   # [Hkv, S, B, 1]
    return rows[:, :, None, :] + q8 + 1e-3 * np.abs(a).max()


def test_compact_host_codes_round_trip_within_a_3_bit_step():
    """Every pair of 4-bit codes comes back as the 3-bit codes ``2 * c3`` whose value (scale * 15 / 14) is within
    half a 3-bit step of the 4-bit one, for any number of bytes (the packing works in fours)."""
    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 4, 5, 1001):
        codes = rng.integers(0, 256, n, dtype=np.uint8)
        packed = packing.pack_codes(codes)
        assert packed.size == 3 * -(-n // 4)
        back = packing.unpack_codes(packed, n)
        for nib in (lambda x: x & 0x0F, lambda x: x >> 4):
            assert (nib(back) % 2 == 0).all() and nib(back).max(initial=0) <= 14
            err = np.abs(nib(back) * packing.SCALE_FACTOR - nib(codes))
            assert (err <= 0.5 * 15 / 7 + 1e-9).all()
    with pytest.raises(ValueError, match="3-bit host codes"):
        packing.unpack_codes(np.zeros(5, dtype=np.uint8), 8)


def test_the_routing_index_is_computed_again_as_it_was_made(llama_model):
    """A compact memory leaves the store's block index out; from host rows kept exactly (f16, energy 1) the
    restore computes the very index the saver made from the cache's rows."""
    exact = SekvConfig(route_every=2, host_format="f16", energy=1.0)
    first, second = _make(llama_model, params=exact), _make(llama_model, params=exact)
    try:
        first.append(_tokens(llama_model, 900, 300))
        restore_into(second, capture(first, "compact"))
        a, b = first.memory.store, second.memory.store
        assert len(a) > 4 and np.array_equal(a.block_logn, b.block_logn)
        for ikv in range(a.n_layer):
            assert np.array_equal(a.blocks[ikv], b.blocks[ikv])
            assert np.array_equal(a.block_scale[ikv], b.block_scale[ikv])
    finally:
        first.close()
        second.close()


def test_deflated_arrays_round_trip_bit_for_bit_and_damage_is_refused():
    """``packing.deflate`` / ``inflate``: every dtype a file holds comes back bit for bit (f16 NaNs and -0 too); a
    damaged stream, a stated size the stream does not hold (more, less, or more than any stream of its bytes can),
    a foreign type or a stream that is not bytes is refused naming it."""
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, 5000, dtype=np.uint8), rng.integers(-127, 128, (7, 3, 16), dtype=np.int8),
              np.array([np.nan, -0.0, np.inf, 1e-7, 65504], dtype=np.float16),
              rng.standard_normal((3, 100)).astype(np.float16), rng.standard_normal(33).astype(np.float32),
              np.arange(10, dtype=np.int32), np.zeros(0, dtype=np.float16)]
    for a in arrays:
        entry = packing.deflate(a)
        back = packing.inflate(entry)
        assert back.dtype == a.dtype and back.shape == a.shape
        assert back.tobytes() == a.tobytes()
    entry = packing.deflate(arrays[3])
    stream = entry[packing.DEFLATE_KEY].copy()
    stream[len(stream) // 2] ^= 0xFF
    bad = [({**entry, packing.DEFLATE_KEY: stream}, "damaged|holds"),
           ({**entry, packing.DEFLATE_KEY: entry[packing.DEFLATE_KEY][:-5]}, "holds less"),
           ({**entry, "shape": [3, 99]}, "holds more"), ({**entry, "shape": [3, 101]}, "holds less"),
           ({**entry, "shape": [1 << 40]}, "stream bytes can hold"), ({**entry, "dtype": "object"}, "type"),
           ({**entry, "shape": [-3, 100]}, "shape"), ({**entry, packing.DEFLATE_KEY: stream.view(np.int8)}, "uint8"),
           ({**entry, "shape": [0]}, "holds more"),
           ({**entry, packing.DEFLATE_KEY: np.concatenate([entry[packing.DEFLATE_KEY], [0, 1]]).astype(np.uint8)},
            "holds more")]   # an empty array's stream may not inflate without bound
    for e, problem in bad:
        with pytest.raises(ValueError, match=problem):
            packing.inflate(e)


def _with_arrays(saved, **changes):
    """``saved`` with entries of its flat span arrays replaced (None: removed)."""
    flat = {k: v for k, v in {**saved.content["memory"][packing.ARRAYS_KEY], **changes}.items() if v is not None}
    content = dict(saved.content, memory={**saved.content["memory"], packing.ARRAYS_KEY: flat})
    return type(saved)(fingerprint=saved.fingerprint, mode=saved.mode, content=content)


@pytest.mark.parametrize("mode", ["lossless", "compact", "compact3"])
def test_damaged_span_arrays_are_refused(llama_model, mode):
    """The spans' arrays sit in a few flat tensors (one per field and dtype, not two per span and layer); a memory
    whose flat arrays do not cover its spans' arrays — short packed codes, a missing or a longer array — is
    refused naming them (the policy is left empty), never loaded short; the undamaged one loads, twice (a restore
    does not change the saved content)."""
    first, second = _make(llama_model), _make(llama_model)
    try:
        first.append(_tokens(llama_model, 900, 300))
        saved = capture(first, mode)
        flat = saved.content["memory"][packing.ARRAYS_KEY]
        assert len(flat) <= 2 * len(packing.FIELDS) and len(first.memory.store.spans) > 4
        scales = next(k for k in flat if k.startswith("scale."))
        damaged = [(_with_arrays(saved, **{scales: None}), "span arrays"),
                   (_with_arrays(saved, **{scales: np.concatenate([flat[scales], flat[scales][:2]])}), "span arrays")]
        if mode == "compact3":
            damaged.append((_with_arrays(saved, **{packing.Q3_KEY: flat[packing.Q3_KEY][:-3]}), "3-bit host codes"))
        else:
            assert packing.Q3_KEY not in flat and packing.CODES in flat
        for bad, problem in damaged:
            with pytest.raises(MemoryFileError, match=problem):
                restore_into(second, bad)
            assert second.n_tokens == 0
        restore_into(second, saved)
        restore_into(second, saved)
        assert second.n_tokens == first.n_tokens
    finally:
        first.close()
        second.close()


def test_capture_leaves_the_policy_as_it_was(llama_model):
    """A compact capture un-zooms the saved copy only: the live memory keeps its zoomed spans and biases, and a
    capture afterwards is still lossless-equal to one before."""
    policy = _make(llama_model)
    try:
        policy.append(_tokens(llama_model, PROMPT))
        resident = [sorted(r) for r in policy.memory.zoom.resident]
        assert any(resident)
        hook = policy.session.hook
        bias = [hook.get_bias(i).copy() for i in range(hook.info.n_layer_kv)]
        before = capture(policy).content["device"]
        capture(policy, "compact")
        assert [sorted(r) for r in policy.memory.zoom.resident] == resident
        for i, b in enumerate(bias):
            assert np.array_equal(hook.get_bias(i), b)
        after = capture(policy).content["device"]
        assert all(np.array_equal(a, b) for a, b in zip(after["bias"], before["bias"]))
        assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                   for a, b in zip(after["rows"], before["rows"]))
    finally:
        policy.close()


@pytest.fixture(scope="module")
def saved_file(llama_model, tmp_path_factory) -> Path:
    policy = _make(llama_model)
    try:
        policy.append(_tokens(llama_model, 900, 300))
        return save_memory(policy, tmp_path_factory.mktemp("saved") / "m.gguf")
    finally:
        policy.close()


@pytest.mark.parametrize("other, problem", [
    (dict(params=SekvConfig(route_every=3)), "settings differ: params.route_every saved 2, here 3"),
    (dict(budget=BudgetConfig(kv_budget=768, chunk=128)), "budget_cells saved 512, here 768"),
    (dict(name="streaming"), "policy saved 'sekv', here 'streaming'"),
    (dict(n=2400), "n_context saved 2000, here 2400"),
])
def test_a_memory_is_refused_by_other_settings(llama_model, saved_file, other, problem):
    policy = _make(llama_model, **other)
    try:
        with pytest.raises(MemoryMismatchError) as e:
            load_memory(policy, saved_file)
        assert problem in str(e.value) and str(saved_file) in str(e.value)
        assert policy.n_tokens == 0
    finally:
        policy.close()


def test_a_memory_is_refused_by_another_model(gemma_model, saved_file):
    policy = _make(gemma_model)
    try:
        with pytest.raises(MemoryMismatchError, match="another model: architecture saved 'llama', here 'gemma3'"):
            load_memory(policy, saved_file)
    finally:
        policy.close()


def test_a_version_1_file_is_still_read_and_a_bad_layout_stream_refused(llama_model, tmp_path, monkeypatch):
    """Version 2 stores the layout zlib-compressed (a twentieth of a compact file at 28K as plain JSON); a version-1
    file (plain JSON) loads as before; a layout that is not a zlib stream, or inflates too far, is refused."""
    from sekv_gguf.memory_file import fileio

    policy = _make(llama_model)
    try:
        policy.append(_tokens(llama_model, 900, 300))
        saved = capture(policy)
        v2 = save_memory(policy, tmp_path / "v2.gguf")
        monkeypatch.setattr(K, "FORMAT_VERSION", 1)
        monkeypatch.setattr(fileio, "_pack_layout", lambda text: text)
        v1 = fileio.write_memory_file(tmp_path / "v1.gguf", saved)
        assert v1.stat().st_size > v2.stat().st_size
        a, b = read_memory_file(v1), read_memory_file(v2)
        assert a.tokens == b.tokens and a.mode == b.mode
        assert all(np.array_equal(x, y) for x, y in zip(a.content["device"]["rows"][0], b.content["device"]["rows"][0]))
        monkeypatch.setattr(K, "FORMAT_VERSION", 2)
        monkeypatch.setattr(fileio, "_pack_layout", lambda text: "bm90IHpsaWI=")  # base64, not zlib
        with pytest.raises(MemoryFileError, match="not a zlib stream"):
            read_memory_file(fileio.write_memory_file(tmp_path / "bad.gguf", saved))
        monkeypatch.setattr(K, "LAYOUT_MAX_BYTES", 64)
        monkeypatch.setattr(fileio, "_pack_layout", lambda text: base64.b64encode(zlib.compress(text.encode())).decode())
        with pytest.raises(MemoryFileError, match="inflates past 64 bytes"):
            read_memory_file(fileio.write_memory_file(tmp_path / "big.gguf", saved))
    finally:
        policy.close()


def test_another_version_and_foreign_files_are_refused(saved_file, tmp_path, tiny_llama):
    data = bytearray(saved_file.read_bytes())
    key = K.VERSION.encode()
    at = data.index(key) + len(key) + 4  # the key, then its u32 type, then the value
    data[at:at + 4] = (K.FORMAT_VERSION + 1).to_bytes(4, "little")
    bad = tmp_path / "v2.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(MemoryFileError, match=f"format version {K.FORMAT_VERSION + 1}, this sekv_gguf reads"):
        read_memory_file(bad)
    with pytest.raises(MemoryFileError, match="not a SeKV memory file"):
        read_memory_file(tiny_llama)
    with pytest.raises(MemoryFileError, match="not found"):
        read_memory_file(tmp_path / "none.gguf")


def test_damaged_and_truncated_files_are_refused(saved_file, tmp_path):
    data = saved_file.read_bytes()
    rng = np.random.default_rng(0)
    path = tmp_path / "bad.gguf"
    for cut in (0, 10, 100, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(MemoryFileError) as e:
            read_memory_file(path)
        assert str(path) in str(e.value)
    flipped = 0
    for at in rng.integers(0, len(data), 60):
        b = bytearray(data)
        b[at] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(b))
        try:
            saved = read_memory_file(path)
        except MemoryFileError as e:
            assert str(path) in str(e)
            flipped += 1
            continue
        # a flip in alignment padding changes nothing that is read: the memory is the original one
        assert saved.tokens == read_memory_file(saved_file).tokens
    assert flipped > 40


def test_a_failed_write_leaves_the_old_file(llama_model, saved_file, tmp_path, monkeypatch):
    """The write goes to a temporary file renamed over the old one at the end: a failure half way (here: the
    tensor data) leaves the old file whole and no temporary file behind."""
    import gguf

    target = tmp_path / "m.gguf"
    target.write_bytes(saved_file.read_bytes())
    policy = _make(llama_model)
    try:
        policy.append(_tokens(llama_model, 600))

        def fail(self, *a, **k):
            raise OSError("disk full")

        monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
        with pytest.raises(OSError, match="disk full"):
            save_memory(policy, target)
    finally:
        policy.close()
    assert target.read_bytes() == saved_file.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    assert read_memory_file(target).tokens  # still loads


def test_the_file_is_plain_gguf(saved_file):
    """gguf-py's own reader (what gguf-dump uses) reads it: the type, the version and the fingerprint's keys."""
    from gguf import GGUFReader

    r = GGUFReader(str(saved_file), "r")
    assert r.get_field(K.GENERAL_TYPE).contents() == K.TYPE_MEMORY
    assert r.get_field(K.VERSION).contents() == K.FORMAT_VERSION
    assert r.get_field(K.FP_POLICY).contents() == "sekv" and r.get_field(K.FP_BUDGET_CELLS).contents() == 512
    assert any(t.name == K.TOKENS_TENSOR for t in r.tensors)
