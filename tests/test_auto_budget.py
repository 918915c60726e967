"""``--kv-budget auto``: the budget from the devices' free memory (fake figures here: this machine has no GPU)."""

from __future__ import annotations

import json

import pytest

from helpers import prose
from sekv_gguf import auto_budget
from sekv_gguf.auto_budget import DeviceMemory, choose
from sekv_gguf.cli import main
from sekv_gguf.config import MIB, ContextConfig
from sekv_gguf.errors import BudgetError
from sekv_gguf.session import Session

GPU = DeviceMemory("CUDA0", free_bytes=3 * 1024 * MIB, total_bytes=8 * 1024 * MIB)


def test_free_memory_less_margin_and_buffers_in_whole_granules():
    got = choose([GPU], bytes_per_cell=28 * 1024, fixed_bytes=200 * MIB, n_context=131072)
    room = 3 * 1024 * MIB - 1024 * MIB - 200 * MIB
    assert got.kv_budget == room // (28 * 1024) // 256 * 256 and "CUDA0" in got.reason
    # two devices pool what each leaves above its margin
    two = choose([GPU, DeviceMemory("RPC0[host:50052]", 1536 * MIB, 4096 * MIB)], 28 * 1024, 200 * MIB, 131072)
    assert two.kv_budget == (room + 512 * MIB) // (28 * 1024) // 256 * 256


def test_no_device_keeps_the_fraction_and_a_context_that_fits_is_full_kv():
    cpu = choose([], bytes_per_cell=28 * 1024, fixed_bytes=0, n_context=32768)
    assert cpu.kv_budget == 0.25 and "RAM" in cpu.reason
    small = choose([GPU], bytes_per_cell=28 * 1024, fixed_bytes=0, n_context=4096)
    assert small.kv_budget == 1.0 and "full KV" in small.reason


def test_too_little_free_memory_is_refused_naming_what_it_needs():
    with pytest.raises(BudgetError, match=r"needs about \d+ MiB free"):
        choose([DeviceMemory("CUDA0", 1100 * MIB, 2048 * MIB)], 28 * 1024, 200 * MIB, 131072)


def test_resolve_reads_the_cells_bytes_from_the_model(llama_model, monkeypatch):
    monkeypatch.setattr(auto_budget, "device_memory", lambda config: [GPU])
    config = ContextConfig(n_batch=256, n_ubatch=256)
    got = auto_budget.resolve(llama_model, config, 10 ** 7)
    with Session(llama_model, config.sized(256, 256)) as s:
        per_cell, logits = s.hook.info.bytes_per_cell, 4 * s.n_vocab * 256
    assert got.kv_budget == choose([GPU], per_cell, logits, 10 ** 7).kv_budget > 256


def test_run_auto_uses_the_chosen_cells(tiny_llama, monkeypatch, capsys, tmp_path):
    """A fake device with room for 1,024 cells of the tiny model: run's budget is those cells."""
    with Session.open(tiny_llama, ContextConfig(n_ctx=256)) as s:
        per_cell, n_vocab = s.hook.info.bytes_per_cell, s.n_vocab
    fixed = min(4 * n_vocab * 512, 128 * MIB)
    free = 1024 * MIB + fixed + 1100 * per_cell  # 1,100 cells' worth: 1,024 after rounding down
    monkeypatch.setattr(auto_budget, "device_memory", lambda config: [DeviceMemory("FAKE0", free, 2 * free)])
    prompt = tmp_path / "p.txt"
    prompt.write_text(prose(6000))
    assert main(["run", str(tiny_llama), "-f", str(prompt), "-n", "4", "--kv-budget", "auto", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sekv"]["budget_cells"] == 1024
