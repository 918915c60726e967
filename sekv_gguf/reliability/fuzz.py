"""Mutation fuzzing of every file sekv_gguf parses itself: the router adapter, a model's GGUF metadata (its identity),
prompt/document text files, ``serve``'s config file (JSON and YAML) and saved memories (``memory_file``). A valid seed file per target is damaged by
a few ``Mutation`` s (truncations, bit flips, absurd 32/64-bit counts and sizes written over fields, inserted and
deleted bytes) and parsed; the property: the parser returns a value or raises the target's typed error, never any
other exception, within ``FuzzConfig.hang_s``, and allocates no more than its valid seed needs plus a multiple of
the file's size. ``tests/test_fuzz_files.py`` drives it with hypothesis; ``scripts/fuzz_files.py`` runs the long
campaign and writes ``bench/reliability.json``."""

from __future__ import annotations

import json
import random
import signal
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import AdapterError, InputFileError, MemoryFileError, ModelError

KINDS = ("truncate", "flip", "u32", "u64", "insert", "delete")
# values written over fields: zero, one, sign bits, all-ones, a count of terabytes
EXTREMES = (0, 1, 0x7F, 0xFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1)


@dataclass(frozen=True)
class FuzzConfig:
    """hang_s: a parse slower than this is a hang. watchdog_s: a parse is interrupted after this long.
    peak_file_factor: tracemalloc peak allowed per byte of the damaged file, above its seed's own peak.
    peak_slack: bytes allowed above that (Python's own bookkeeping)."""

    hang_s: float = 1.0
    watchdog_s: float = 5.0
    peak_file_factor: float = 8.0
    peak_slack: int = 1 << 20

    def __post_init__(self) -> None:
        if not 0 < self.hang_s <= self.watchdog_s or self.peak_file_factor < 0 or self.peak_slack < 0:
            raise ValueError(f"bad fuzz limits: {self}")


@dataclass(frozen=True)
class Mutation:
    """kind (one of ``KINDS``) at ``at`` (a fraction of the target's structured head when ``head``, else of the whole
    file); ``value``: the bit (flip), the integer written (u32/u64, little-endian, truncated to its width) or the
    length (insert: random bytes from ``value``; delete: bytes removed)."""

    kind: str
    at: float
    head: bool = True
    value: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or not 0.0 <= self.at < 1.0 or self.value < 0:
            raise ValueError(f"bad mutation {self}")


def mutate(data: bytes, mutations: list[Mutation], head: int) -> bytes:
    """``data`` with each mutation applied in turn; ``head`` bytes at the start hold the file's structure."""
    out = bytearray(data)
    for m in mutations:
        span = max(1, min(head, len(out)) if m.head else len(out))
        i = min(int(m.at * span), max(len(out) - 1, 0))
        if m.kind == "truncate":
            del out[i:]
        elif not out:
            continue
        elif m.kind == "flip":
            out[i] ^= 1 << (m.value % 8)
        elif m.kind in ("u32", "u64"):
            width = 4 if m.kind == "u32" else 8
            out[i:i + width] = (m.value % (1 << 8 * width)).to_bytes(width, "little")
        elif m.kind == "insert":
            out[i:i] = random.Random(m.value).randbytes(1 + m.value % 64)
        else:  # delete
            del out[i:i + 1 + m.value % 64]
    return bytes(out)


def random_mutations(rng: random.Random, most: int = 4) -> list[Mutation]:
    """1..``most`` mutations drawn from ``rng`` (the long campaign's generator; hypothesis draws its own)."""
    def value() -> int:
        return rng.choice(EXTREMES) if rng.random() < 0.5 else rng.getrandbits(rng.choice((8, 16, 32, 64)))

    return [Mutation(rng.choice(KINDS), rng.random(), rng.random() < 0.8, value()) for _ in range(rng.randint(1, most))]


@dataclass
class Target:
    """A file kind we parse: its valid seed bytes, the suffix its files carry, the bytes at the start that hold its
    structure, the parser (a path in, a value out) and the typed errors it may raise."""

    name: str
    seed: bytes
    suffix: str
    head: int
    parse: Callable[[Path], Any]
    errors: tuple[type[BaseException], ...]
    seed_peak: int = 0  # tracemalloc peak of parsing the seed (set by ``targets``)


@dataclass
class Outcome:
    status: str  # "ok" (parsed), "rejected" (a typed error), "crash" (any other exception), "hang"
    seconds: float
    peak: int  # tracemalloc peak bytes during the parse
    size: int  # bytes of the damaged file
    error: str = ""


class _Watchdog(BaseException):  # not an Exception: parsers that catch Exception must not swallow it
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Watchdog()


def run_one(target: Target, data: bytes, work: Path, cfg: FuzzConfig = FuzzConfig()) -> Outcome:
    """Parse ``data`` as ``target`` (written to a file in ``work``) and classify the result."""
    path = work / f"input{target.suffix}"
    path.write_bytes(data)
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        signal.setitimer(signal.ITIMER_REAL, cfg.watchdog_s)
        try:
            target.parse(path)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Watchdog:
        status = "hang"
    except target.errors as e:
        status, error = "rejected", str(e)
    except Exception as e:  # noqa: BLE001 - anything else is what the fuzzer is looking for
        status, error = "crash", f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    signal.signal(signal.SIGALRM, old)
    if status != "hang" and seconds > cfg.hang_s:
        status = "hang"
    return Outcome(status, seconds, peak, len(data), error)


def over_memory(target: Target, outcome: Outcome, cfg: FuzzConfig = FuzzConfig()) -> bool:
    """Whether a parse allocated more than its seed needs plus ``peak_file_factor`` per byte of the file."""
    return outcome.peak > target.seed_peak + cfg.peak_file_factor * outcome.size + cfg.peak_slack


def _tiny_adapter_bytes(work: Path) -> bytes:
    from ..adapter import RouterAdapter, write_adapter
    from ..adapter.identity import ModelIdentity
    from ..features import N_FEATURES

    rng = np.random.default_rng(0)
    layers, n_head, proj, head_dim = [0, 2], 2, 4, 8
    base = ModelIdentity(name="tiny", architecture="llama", n_layer=4, n_embd=64, n_vocab=300,
                         tensor_hash="0" * 64, n_params=12345)
    a = RouterAdapter(base=base, layers=layers, n_head=n_head, n_head_kv=1, head_dim=head_dim, proj_dim=proj,
                      w=[rng.standard_normal((n_head, proj, head_dim)).astype(np.float32) for _ in layers],
                      b=[rng.standard_normal(n_head).astype(np.float32) for _ in layers],
                      tau=[rng.random(n_head).astype(np.float32) for _ in layers],
                      theta=[rng.standard_normal((n_head, N_FEATURES)).astype(np.float32) for _ in layers],
                      spread_rank=2, n_centroids=2, kmeans_iters=1, train={"docs": 1, "note": "fuzz seed"})
    return write_adapter(work / "seed.gguf", a).read_bytes()


def _tiny_model_bytes(work: Path) -> bytes:
    from ..tiny_models import TinySpec, write_tiny_llama

    return write_tiny_llama(work / "model.gguf", TinySpec(n_layer=1, n_embd=16, n_head=2, n_head_kv=1, head_dim=8,
                                                          n_ff=16)).read_bytes()


def _tiny_memory_bytes(work: Path) -> bytes:
    """A small saved memory (no model needed to parse one): the shapes of a SeKV memory, random contents."""
    from ..memory_file import Fingerprint, SavedMemory, write_memory_file
    from ..memory_file.fingerprint import tokens_hash

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 300, 40).astype(np.int32)
    fp = Fingerprint(model_name="tiny", model_architecture="llama", model_n_layer=2, model_n_embd=16,
                     model_n_vocab=300, model_tensor_hash="0" * 64, policy="sekv", n_context=64, budget_cells=256,
                     type_k=1, type_v=1, n_batch=32, n_ubatch=32, settings=json.dumps({"budget": {"kv_budget": 256}}),
                     n_tokens=tokens.size, tokens_sha256=tokens_hash(tokens))
    cells = np.arange(24, dtype=np.int32)
    rows = [[rng.standard_normal((24, 1, 8)).astype(np.float16) for _ in "kv"] for _ in range(2)]
    device = {"cells": cells, "pos": cells + 16, "blank": np.zeros(24, dtype=bool), "rows": rows,
              "bias": [np.zeros(256, dtype=np.float32) for _ in range(2)], "swa": None}
    memory = {"sinks": [0, 1, 2, 3], "window": {"pos": cells + 16, "signal": rng.random(24).astype(np.float32)},
              "store": {"spans": [{"id": 0, "positions": np.arange(4, 16, dtype=np.int32),
                                   "k": [{"q4": rng.integers(0, 255, (12, 1, 4), dtype=np.uint8), "raw": None}]}]},
              "zoom": {"resident": [{0: np.arange(3)}, {}], "last_use": [{0: 2}, {}]}, "steps": np.int64(3),
              "carry_signal": np.float32(0.5), "sentence_end": rng.random(40) > 0.5, "pair": (1, "two", None)}
    saved = SavedMemory(fingerprint=fp, mode="lossless", content={"tokens": tokens, "device": device,
                                                                  "memory": memory})
    return write_memory_file(work / "memory-seed.gguf", saved).read_bytes()


def _gguf_head(data: bytes, work: Path) -> int:
    from gguf import GGUFReader

    path = work / "head.gguf"
    path.write_bytes(data)
    return int(GGUFReader(str(path), "r").data_offset)


def targets(work: Path, cfg: FuzzConfig = FuzzConfig()) -> list[Target]:
    """Every file kind, with its seed written under ``work`` and its seed parse's memory peak measured."""
    from ..adapter import read_adapter
    from ..adapter.identity import read_identity
    from ..memory_file import read_memory_file
    from ..serve import ServeConfig
    from ..textfile import read_text

    work.mkdir(parents=True, exist_ok=True)
    adapter, model, memory = _tiny_adapter_bytes(work), _tiny_model_bytes(work), _tiny_memory_bytes(work)
    text = ("A prompt with ümlauts, 中文, emoji 🙂 and a needle: the code is 7463343.\n" * 8).encode()
    config = {"policy": "sekv", "kv_budget": 0.25, "port": 8123, "max_tokens": 64, "memories": 2, "api_key": None}
    out = [Target("adapter", adapter, ".gguf", _gguf_head(adapter, work), read_adapter, (AdapterError,)),
           Target("model_identity", model, ".gguf", _gguf_head(model, work), read_identity, (ModelError,)),
           Target("memory_file", memory, ".gguf", _gguf_head(memory, work), read_memory_file, (MemoryFileError,)),
           Target("prompt_file", text, ".txt", len(text), lambda p: read_text(p, "prompt file"), (InputFileError,)),
           Target("serve_config_json", json.dumps(config).encode(), ".json", 1 << 16, ServeConfig.from_file,
                  (InputFileError,)),
           Target("serve_config_yaml", "".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()).encode(),
                  ".yaml", 1 << 16, ServeConfig.from_file, (InputFileError,))]
    for t in out:
        run_one(t, t.seed[:len(t.seed) // 2], work, cfg)  # warm-up: first-use imports and caches of the error path
        seed = run_one(t, t.seed, work, cfg)
        if seed.status != "ok":
            raise RuntimeError(f"the {t.name} seed does not parse: {seed.status} {seed.error}")
        t.seed_peak = seed.peak
    return out


@dataclass
class Tally:
    """Per target: inputs tried, each status counted, the slowest parse, the largest peak over the bound, and the
    first few crashes / hangs / over-memory inputs (as mutation lists) to replay."""

    inputs: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "rejected": 0, "crash": 0, "hang": 0})
    over_memory: int = 0
    max_seconds: float = 0.0
    max_peak_per_byte: float = 0.0  # (peak - seed peak) / file size, the worst seen
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, target: Target, mutations: list[Mutation], outcome: Outcome, cfg: FuzzConfig, keep: int = 5) -> None:
        self.inputs += 1
        self.counts[outcome.status] += 1
        self.max_seconds = max(self.max_seconds, outcome.seconds)
        self.max_peak_per_byte = max(self.max_peak_per_byte,
                                     (outcome.peak - target.seed_peak) / max(outcome.size, 1))
        bad_memory = over_memory(target, outcome, cfg)
        self.over_memory += bad_memory
        if (outcome.status in ("crash", "hang") or bad_memory) and len(self.failures) < keep:
            self.failures.append({"status": outcome.status, "error": outcome.error, "peak": outcome.peak,
                                  "mutations": [vars(m) for m in mutations]})
