"""The KV hook under a property test: hypothesis draws sequences of decode / release / claim / set rows / get rows /
bias / cells->positions calls on the tiny llama, valid and adversarial (cells out of range or repeated, positions
above the maximum, busy or foreign cells, wrong sizes, NaN bias, bad layers), and after every step the cache must
match a plain Python model of it: which cell holds which position, what rows each cell holds, which bias applies.
Rejected calls must raise the hook's typed error and change nothing. ``test_asan.py`` runs this file again against
a libllama built with AddressSanitizer and UndefinedBehaviorSanitizer."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sekv_gguf.config import ContextConfig
from sekv_gguf.errors import HookError
from sekv_gguf.session import Session
from sekv_gguf.tiny_models import write_tiny_llama

N_CELLS = 256
EXAMPLES = int(os.environ.get("SEKV_HOOK_EXAMPLES", "12"))
STEPS = int(os.environ.get("SEKV_HOOK_STEPS", "30"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_llama(tmp_path_factory.mktemp("hookprop") / "tiny.gguf")


class CacheModel(RuleBasedStateMachine):
    """The cache as the hook should see it: ``pos`` per cell (-1 empty), the rows last read or written per layer
    and cell (they survive release: "their rows stay in the tensors"), and the bias per layer."""

    path = None  # set by the test

    @initialize(n=st.integers(8, 40))
    def start(self, n: int) -> None:
        self.s = Session.open(self.path, ContextConfig(n_ctx=N_CELLS, n_threads=1))
        self.hook = self.s.hook
        self.hook.enable_bias()
        self.n_layer = self.hook.info.n_layer_kv
        self.pos = np.full(N_CELLS, -1, dtype=np.int64)
        self.rows: list[dict[int, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(self.n_layer)]
        self.bias = np.zeros((self.n_layer, N_CELLS), dtype=np.float32)
        self.rng = np.random.default_rng(n)
        self._decode(n)

    def teardown(self) -> None:
        if hasattr(self, "s"):
            self.s.close()

    # -- helpers -----------------------------------------------------------------------------------------------

    def _held(self) -> np.ndarray:
        return np.flatnonzero(self.pos >= 0)

    def _empty(self) -> np.ndarray:
        return np.flatnonzero(self.pos < 0)

    def _max(self) -> int:
        return int(self.pos.max())

    def _read(self, cells: np.ndarray) -> None:
        for ikv in range(self.n_layer):
            k, v = self.hook.get_rows(ikv, cells)
            for i, c in enumerate(cells):
                self.rows[ikv][int(c)] = (k[i].copy(), v[i].copy())

    def _decode(self, n: int) -> None:
        before = self.pos.copy()
        toks = self.rng.integers(3, 200, size=n).tolist()
        p0 = self._max() + 1 if (self.pos >= 0).any() else 0
        logits = self.s.decode(toks, pos0=p0)
        assert np.isfinite(logits).all()
        now = self.hook.cells_pos().astype(np.int64)
        kept = before >= 0
        np.testing.assert_array_equal(now[kept], before[kept])  # decoding moved no held cell
        new = np.flatnonzero((now >= 0) & ~kept)
        assert sorted(now[new].tolist()) == list(range(p0, p0 + n))
        self.pos = now
        self._read(new.astype(np.int32))

    def _rejected(self, call) -> None:
        """``call`` must raise a HookError and leave positions, rows and bias as they were."""
        with pytest.raises(HookError):
            call()
        self.check_positions()

    # -- valid operations --------------------------------------------------------------------------------------

    @precondition(lambda self: len(self._empty()) > 48)
    @rule(n=st.integers(1, 24))
    def decode(self, n: int) -> None:
        self._decode(n)

    @precondition(lambda self: len(self._held()) > 2)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        newest = int(np.argmax(self.pos))
        others = [int(c) for c in self._held() if c != newest]
        cells = data.draw(st.lists(st.sampled_from(others), min_size=1, max_size=min(8, len(others)), unique=True))
        self.hook.release(cells)
        self.pos[cells] = -1

    @precondition(lambda self: len(self._empty()) > 0 and len(self._held()) > 0)
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        empty = [int(c) for c in self._empty()]
        cells = data.draw(st.lists(st.sampled_from(empty), min_size=1, max_size=min(6, len(empty)), unique=True))
        pos = data.draw(st.lists(st.integers(0, self._max()), min_size=len(cells), max_size=len(cells)))
        self.hook.claim(cells, pos)
        self.pos[cells] = pos

    @precondition(lambda self: len(self._held()) > 0)
    @rule(data=st.data())
    def set_rows(self, data: st.DataObject) -> None:
        ikv = data.draw(st.integers(0, self.n_layer - 1))
        held = [int(c) for c in self._held()]
        cells = np.array(data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=min(6, len(held)),
                                            unique=True)), dtype=np.int32)
        k0, v0 = self.hook.get_rows(ikv, cells)
        k = self.rng.standard_normal(k0.shape).astype(k0.dtype)
        v = self.rng.standard_normal(v0.shape).astype(v0.dtype)
        self.hook.set_rows(ikv, cells, k, v)
        for i, c in enumerate(cells):
            self.rows[ikv][int(c)] = (k[i], v[i])

    @precondition(lambda self: len(self._held()) > 0)
    @rule(data=st.data())
    def get_rows(self, data: st.DataObject) -> None:
        ikv = data.draw(st.integers(0, self.n_layer - 1))
        known = [c for c in self.rows[ikv]]
        cells = np.array(data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=8, unique=True)),
                         dtype=np.int32)
        k, v = self.hook.get_rows(ikv, cells)
        for i, c in enumerate(cells):
            np.testing.assert_array_equal(k[i], self.rows[ikv][int(c)][0])
            np.testing.assert_array_equal(v[i], self.rows[ikv][int(c)][1])

    @rule(data=st.data())
    def bias(self, data: st.DataObject) -> None:
        ikv = data.draw(st.integers(-1, self.n_layer - 1))
        cells = data.draw(st.lists(st.integers(0, N_CELLS - 1), min_size=1, max_size=8, unique=True))
        values = data.draw(st.lists(st.one_of(st.floats(-30, 30, width=32), st.just(-np.inf)),
                                    min_size=len(cells), max_size=len(cells)))
        self.hook.set_bias_cells(ikv, cells, values)
        for layer in (range(self.n_layer) if ikv == -1 else [ikv]):
            self.bias[layer, cells] = values

    # -- adversarial operations --------------------------------------------------------------------------------

    @rule(data=st.data())
    def bad_cells(self, data: st.DataObject) -> None:
        bad = data.draw(st.one_of(st.integers(N_CELLS, 2**31 - 1), st.integers(-2**31, -1)))
        good = int(self._held()[0])
        cells = data.draw(st.sampled_from([[bad], [good, bad], [good, good]]))
        ikv = data.draw(st.integers(0, self.n_layer - 1))
        self._rejected(lambda: self.hook.get_rows(ikv, cells))
        self._rejected(lambda: self.hook.release(cells))
        self._rejected(lambda: self.hook.set_bias_cells(ikv, cells, 0.0))

    @rule(ikv=st.one_of(st.integers(-2**31, -2), st.integers(2, 2**31 - 1)))
    def bad_layer(self, ikv: int) -> None:
        self._rejected(lambda: self.hook.get_rows(ikv, [int(self._held()[0])]))
        self._rejected(lambda: self.hook.set_bias(ikv, np.zeros(N_CELLS)))

    @precondition(lambda self: len(self._empty()) > 1)
    @rule(data=st.data())
    def bad_claim(self, data: st.DataObject) -> None:
        empty, held = int(self._empty()[0]), int(self._held()[0])
        top = self._max()
        cells, pos = data.draw(st.sampled_from([([empty], [top + 1]), ([empty], [-3]), ([held], [0]),
                                                ([empty, int(self._empty()[1])], [0]),
                                                ([empty, held], [0, 0])]))
        self._rejected(lambda: self.hook.claim(cells, pos))

    @rule(data=st.data())
    def bad_release(self, data: st.DataObject) -> None:
        """An empty cell, or the one cell holding the sequence's newest position (with two cells at that position,
        either may go: claim can give a second cell the newest position)."""
        holders = np.flatnonzero(self.pos == self._max())
        options = ([[int(holders[0])]] if holders.size == 1 else []) + (
            [[int(self._empty()[0])]] if len(self._empty()) else [])
        if options:
            cells = data.draw(st.sampled_from(options))
            self._rejected(lambda: self.hook.release(cells))

    @rule(data=st.data())
    def bad_rows(self, data: st.DataObject) -> None:
        cells = np.array([int(self._held()[0])], dtype=np.int32)
        k, v = self.hook.get_rows(0, cells)
        short = data.draw(st.sampled_from(["k", "v"]))
        kk = k.reshape(-1)[:-1] if short == "k" else k
        vv = v.reshape(-1)[:-1] if short == "v" else v
        self._rejected(lambda: self.hook.set_rows(0, cells, kk, vv))

    @rule(bad=st.sampled_from([np.nan, np.inf]))
    def bad_bias(self, bad: float) -> None:
        self._rejected(lambda: self.hook.set_bias_cells(0, [0], [bad]))
        whole = np.zeros(N_CELLS, dtype=np.float32)
        whole[5] = bad
        self._rejected(lambda: self.hook.set_bias(0, whole))

    # -- invariants ----------------------------------------------------------------------------------------------

    @invariant()
    def check_positions(self) -> None:
        if hasattr(self, "hook"):
            np.testing.assert_array_equal(self.hook.cells_pos().astype(np.int64), self.pos)
            assert self.s.pos_max() == self._max()

    @invariant()
    def check_rows(self) -> None:
        """Every row the model knows (held cells and released ones: release keeps the rows) reads back as known."""
        if hasattr(self, "hook"):
            for ikv in range(self.n_layer):
                cells = np.array(sorted(self.rows[ikv]), dtype=np.int32)
                k, v = self.hook.get_rows(ikv, cells)
                want_k = np.stack([self.rows[ikv][int(c)][0] for c in cells])
                want_v = np.stack([self.rows[ikv][int(c)][1] for c in cells])
                np.testing.assert_array_equal(k, want_k)
                np.testing.assert_array_equal(v, want_v)

    @invariant()
    def check_bias(self) -> None:
        if hasattr(self, "hook"):
            for ikv in range(self.n_layer):
                np.testing.assert_array_equal(self.hook.get_bias(ikv), self.bias[ikv])


def test_the_hook_matches_its_model(tiny):
    CacheModel.path = tiny
    CacheModel.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                                            database=None, suppress_health_check=list(HealthCheck))
    CacheModel.TestCase().runTest()
