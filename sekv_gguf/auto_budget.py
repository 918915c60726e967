"""``--kv-budget auto``: a device budget sized by the memory the devices actually have free once the weights are
loaded (llama.cpp's ``ggml_backend_dev_memory``, as its ``--fit`` reads it), less a margin per device and the
buffers a context needs besides its cells (the logits rows of ``ContextConfig.logits_mib``, the sliding-window cache
of an iSWA model). On a machine without a GPU or RPC device the cache shares the RAM with everything else and no
device figure bounds it: the budget stays the default fraction of the context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from . import _ggml, rpc
from .config import MIB, BudgetConfig, ContextConfig, round_cells
from .errors import BudgetError
from .session import Session, output_rows


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class AutoBudget:
    """The budget chosen (``kv_budget``: cells above 1, else a fraction of the context) and why."""

    kv_budget: float
    reason: str
    devices: tuple[DeviceMemory, ...] = ()


MARGIN_MIB = 1024  # left free on each device (llama.cpp's --fit leaves 1 GiB)


def choose(devices: Sequence[DeviceMemory], bytes_per_cell: int, fixed_bytes: int, n_context: int,
           margin_mib: float = MARGIN_MIB, fraction: float = BudgetConfig.kv_budget) -> AutoBudget:
    """The budget for a context of ``n_context`` tokens whose cells take ``bytes_per_cell`` and whose other device
    buffers take ``fixed_bytes``, on ``devices`` (none: ``fraction`` of the context)."""
    if not devices:
        return AutoBudget(fraction, f"no GPU or RPC device: the cache shares the RAM, {fraction:g} of the context")
    free = sum(d.free_bytes for d in devices)
    room = sum(max(d.free_bytes - int(margin_mib * MIB), 0) for d in devices) - fixed_bytes
    cells = max(room, 0) // max(bytes_per_cell, 1) // 256 * 256
    names = ", ".join(d.name for d in devices)
    head = (f"{free / MIB:.0f} MiB free on {names} after the weights, less {margin_mib:g} MiB per device and "
            f"{fixed_bytes / MIB:.0f} MiB of other buffers")
    if cells >= round_cells(n_context):
        return AutoBudget(1.0, f"{head}: the whole context ({n_context} tokens) fits, full KV", tuple(devices))
    if cells < 256:
        need = (256 * bytes_per_cell + fixed_bytes) / MIB + margin_mib * len(devices)
        raise BudgetError(f"{head} leave no room for KV cells of {bytes_per_cell} bytes; --kv-budget auto needs "
                          f"about {need:.0f} MiB free (or give --kv-budget CELLS)")
    return AutoBudget(float(cells), f"{head}: {cells} cells of {bytes_per_cell} bytes", tuple(devices))


def device_memory(config: ContextConfig) -> list[DeviceMemory]:
    """Free and total memory of the GPU and RPC devices a context with ``config`` offloads to (none when it keeps
    every layer on the CPU)."""
    if config.n_gpu_layers == 0:
        return []
    out = []
    for d in rpc.devices(config.rpc_servers, config.rpc_timeout_s):
        free, total = _ggml.ggml_backend_dev_memory(d)
        out.append(DeviceMemory(_ggml.ggml_backend_dev_name(d).decode(), free, total))
    return out


def resolve(model: Any, config: ContextConfig, n_context: int, margin_mib: float = MARGIN_MIB) -> AutoBudget:
    """``choose`` for ``model`` (loaded: its weights are on the devices) with a context like ``config``: the bytes
    of a cell and of the sliding-window cache from a 256-cell probe context."""
    probe = Session(model, config.sized(round_cells(1), min(config.n_batch, 256)))
    try:
        info = probe.hook.info
        n_vocab = probe.n_vocab
        swa = info.swa_kv_bytes  # the probe's window-sized SWA cache: what a budget context holds too
        bytes_per_cell = info.bytes_per_cell
    finally:
        probe.close()
    logits = 4 * n_vocab * output_rows(config, n_vocab)  # the compute buffer's logits rows (f32)
    return choose(device_memory(config), bytes_per_cell, logits + swa, n_context, margin_mib)
