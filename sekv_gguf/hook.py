"""The owning layer over the KV hook: one ``KVHook`` per ``llama_context``, numpy in and out, exceptions for errors.

Works on any context: one created by ``llama_cpp.Llama`` (``KVHook.from_llama``) or one this package creates
(``sekv_gguf.session.Session``). The hook acts on the context's attention cache; for iSWA models the base
(global-layer) cache only.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType

from . import _hook_api as api
from . import kv_codec
from .errors import HookError, HookIndexError, HookStateError, HookValueError, UnsupportedModelError

# element dtype of rows whose type is addressable per element; other (block-quantized) types come back as bytes
_ROW_DTYPES = kv_codec.NUMBER_DTYPES

_ERROR_CLASSES: dict[int, type[HookError]] = {
    api.SEKV_ERR_NULL: HookValueError,
    api.SEKV_ERR_UNSUPPORTED: UnsupportedModelError,
    api.SEKV_ERR_LAYER: HookIndexError,
    api.SEKV_ERR_CELL: HookIndexError,
    api.SEKV_ERR_SEQ: HookIndexError,
    api.SEKV_ERR_POS: HookValueError,
    api.SEKV_ERR_CELL_BUSY: HookValueError,
    api.SEKV_ERR_CELL_NOT_SEQ: HookValueError,
    api.SEKV_ERR_SIZE: HookValueError,
    api.SEKV_ERR_TYPE: HookValueError,
    api.SEKV_ERR_VALUE: HookValueError,
    api.SEKV_ERR_STATE: HookStateError,
    api.SEKV_ERR_INTERNAL: HookError,
}


def check(function: str, rc: int) -> int:
    """Return ``rc`` if it is not an error code, else raise the matching ``HookError`` with the hook's message."""
    if rc >= 0:
        return rc
    message = (api.sekv_last_error() or b"").decode("utf-8", "replace") or f"error {rc}"
    raise _ERROR_CLASSES.get(rc, HookError)(function, rc, message)


@dataclass(frozen=True)
class KVInfo:
    """The hooked cache (``struct sekv_kv_info``)."""

    n_layer_kv: int
    n_layer_model: int
    kv_size: int
    n_stream: int
    type_k: int
    type_v: int
    v_trans: bool
    rot_k: bool
    rot_v: bool
    is_iswa: bool
    flash_attn: bool
    n_swa: int
    swa_kv_size: int
    kv_bytes: int
    swa_kv_bytes: int

    @property
    def bytes_per_cell(self) -> int:
        """K+V bytes of one cell over all hooked layers."""
        return self.kv_bytes // self.kv_size

    @staticmethod
    def type_name(type_id: int) -> str:
        """ggml's name of a cache element type ("f16", "q8_0", ...)."""
        try:
            return GGMLQuantizationType(type_id).name.lower()
        except ValueError:
            return str(type_id)


@dataclass(frozen=True)
class KVLayer:
    """One hooked layer (``struct sekv_kv_layer``)."""

    ikv: int
    il: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    k_row_bytes: int
    v_row_bytes: int


def _i32(values: Any, name: str) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(values).reshape(-1))
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got {arr.dtype}")
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        raise HookValueError("sekv", api.SEKV_ERR_SIZE, f"{name} has values outside int32")
    return arr.astype(np.int32, copy=False)


def _ptr(arr: np.ndarray, ctype: Any = ctypes.c_int32) -> Any:
    return arr.ctypes.data_as(ctypes.POINTER(ctype))


class KVHook:
    """Read, write and re-cell the KV cache of one ``llama_context``.

    ``ctx`` is the raw ``llama_context *`` (an int, as ``llama_cpp.Llama.ctx``); ``owner`` is kept alive as long
    as the hook, since the context must outlive it.
    """

    def __init__(self, ctx: int, owner: object | None = None):
        if not ctx:
            raise HookValueError("KVHook", api.SEKV_ERR_NULL, "ctx is NULL")
        version = api.sekv_api_version()
        if version != api.SEKV_API_VERSION:
            raise HookError("KVHook", api.SEKV_ERR_INTERNAL,
                            f"libllama hook API {version}, sekv_gguf expects {api.SEKV_API_VERSION}: rebuild with "
                            "scripts/setup.sh")
        self.ctx = ctx
        self._owner = owner
        self.info = self._get_info()
        self.layers = [self._get_layer(ikv) for ikv in range(self.info.n_layer_kv)]
        self.query_probes = 1  # tokens of each ubatch whose queries the capture keeps (set_query_probes)

    @classmethod
    def from_llama(cls, llm: Any) -> "KVHook":
        """The hook of a ``llama_cpp.Llama``'s own context (no model reload)."""
        return cls(llm.ctx, owner=llm)

    # -- info --------------------------------------------------------------------------------------------------

    def _get_info(self) -> KVInfo:
        out = api.sekv_kv_info()
        check("sekv_kv_get_info", api.sekv_kv_get_info(self.ctx, ctypes.byref(out)))
        flags = {"v_trans", "rot_k", "rot_v", "is_iswa", "flash_attn"}
        return KVInfo(**{name: (bool if name in flags else int)(getattr(out, name))
                         for name, _ in api.sekv_kv_info._fields_})

    def _get_layer(self, ikv: int) -> KVLayer:
        out = api.sekv_kv_layer()
        check("sekv_kv_get_layer", api.sekv_kv_get_layer(self.ctx, ikv, ctypes.byref(out)))
        return KVLayer(ikv=ikv, **{name: int(getattr(out, name)) for name, _ in api.sekv_kv_layer._fields_})

    def report(self) -> dict[str, Any]:
        """The hook's view of the cache as plain data (``python -m sekv_gguf info``)."""
        info = self.info
        return {"kv": asdict(info), "kv_type_k": info.type_name(info.type_k), "kv_type_v": info.type_name(info.type_v),
                "hooked_layers": [asdict(layer) for layer in self.layers], "bytes_per_token": info.bytes_per_cell,
                "swa_bytes": info.swa_kv_bytes, "device_kv_bytes": info.kv_bytes + info.swa_kv_bytes}

    @property
    def model_layers(self) -> list[int]:
        """Model layer index of each hooked layer."""
        return [layer.il for layer in self.layers]

    # -- cells -------------------------------------------------------------------------------------------------

    def cells_pos(self, seq: int = 0) -> np.ndarray:
        """int32 [kv_size]: the position of each cell of ``seq``, -1 for empty cells, -2 for other sequences'."""
        out = np.empty(self.info.kv_size, dtype=np.int32)
        check("sekv_kv_cells_pos", api.sekv_kv_cells_pos(self.ctx, seq, _ptr(out), out.size))
        return out

    def cells_from(self, p0: int, seq: int = 0) -> np.ndarray:
        """int32 [n]: the cells of ``seq``'s positions >= ``p0`` (the newest tokens), in position order."""
        pos = self.cells_pos(seq)
        cells = np.flatnonzero(pos >= p0)
        return cells[np.argsort(pos[cells])].astype(np.int32)

    def cells_of(self, n: int, seq: int = 0) -> np.ndarray:
        """int32 [n]: the cells of ``seq``'s positions 0..n-1 (each must be in the cache)."""
        pos = self.cells_pos(seq)
        cells = np.full(n, -1, dtype=np.int32)
        held = np.flatnonzero((pos >= 0) & (pos < n))
        cells[pos[held]] = held
        if (cells < 0).any():
            raise HookValueError("cells_of", api.SEKV_ERR_POS,
                                 f"positions {np.flatnonzero(cells < 0)[:5].tolist()} are not in the cache")
        return cells

    def claim(self, cells: Any, pos: Any, seq: int = 0) -> None:
        """Make empty ``cells`` belong to ``seq`` at ``pos`` (each at most the sequence's maximum position)."""
        c, p = _i32(cells, "cells"), _i32(pos, "pos")
        if c.size != p.size:
            raise HookValueError("sekv_kv_claim", api.SEKV_ERR_SIZE,
                                 f"{c.size} cells but {p.size} positions")
        check("sekv_kv_claim", api.sekv_kv_claim(self.ctx, seq, _ptr(c), _ptr(p), c.size))

    def release(self, cells: Any, seq: int = 0) -> None:
        """Remove ``seq`` from ``cells``; their rows stay in the tensors but are masked."""
        c = _i32(cells, "cells")
        check("sekv_kv_release", api.sekv_kv_release(self.ctx, seq, _ptr(c), c.size))

    # -- rows --------------------------------------------------------------------------------------------------

    def _row_shape(self, layer: KVLayer, n: int) -> tuple[tuple[Any, tuple[int, ...]], tuple[Any, tuple[int, ...]]]:
        def one(type_: int, row_bytes: int, head_dim: int) -> tuple[Any, tuple[int, ...]]:
            dtype = _ROW_DTYPES.get(type_)
            if dtype is None:
                return np.dtype(np.uint8), (n, row_bytes)
            return dtype, (n, layer.n_head_kv, head_dim)

        return (one(self.info.type_k, layer.k_row_bytes, layer.head_dim_k),
                one(self.info.type_v, layer.v_row_bytes, layer.head_dim_v))

    def get_rows(self, ikv: int, cells: Any, seq: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """K and V rows of ``cells`` in layer ``ikv``: [n, n_head_kv, head_dim] in the cache type (raw bytes
        [n, row_bytes] for block-quantized types)."""
        layer = self._layer(ikv, "sekv_kv_get_rows")
        c = _i32(cells, "cells")
        (dk, sk), (dv, sv) = self._row_shape(layer, c.size)
        k, v = np.empty(sk, dtype=dk), np.empty(sv, dtype=dv)
        check("sekv_kv_get_rows", api.sekv_kv_get_rows(self.ctx, seq, ikv, _ptr(c), c.size,
                                                       k.ctypes.data, k.nbytes, v.ctypes.data, v.nbytes))
        return k, v

    def set_rows(self, ikv: int, cells: Any, k: np.ndarray, v: np.ndarray, seq: int = 0) -> None:
        """Write K and V rows (shaped as ``get_rows`` returns them, or any shape of the same bytes)."""
        layer = self._layer(ikv, "sekv_kv_set_rows")
        c = _i32(cells, "cells")
        (dk, _), (dv, _) = self._row_shape(layer, c.size)
        kb = np.ascontiguousarray(k, dtype=dk)
        vb = np.ascontiguousarray(v, dtype=dv)
        check("sekv_kv_set_rows", api.sekv_kv_set_rows(self.ctx, seq, ikv, _ptr(c), c.size,
                                                       kb.ctypes.data, kb.nbytes, vb.ctypes.data, vb.nbytes))

    def get_values(self, ikv: int, cells: Any, seq: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """K and V rows of ``cells`` in layer ``ikv`` as numbers [n, n_head_kv, head_dim]: f16 / f32 as held,
        block-quantized rows dequantized to f32 (``kv_codec.decode``; in the cache's basis, see ``kv_codec``)."""
        layer = self._layer(ikv, "sekv_kv_get_rows")
        k, v = self.get_rows(ikv, cells, seq)
        return (kv_codec.decode(k, self.info.type_k, layer.n_head_kv, layer.head_dim_k),
                kv_codec.decode(v, self.info.type_v, layer.n_head_kv, layer.head_dim_v))

    def set_values(self, ikv: int, cells: Any, k: np.ndarray, v: np.ndarray, seq: int = 0) -> None:
        """Write numbers [n, n_head_kv, head_dim] (or [n, n_head_kv * head_dim]) as K and V rows: cast to f16 / f32,
        or quantized into the cache's blocks (``kv_codec.encode``)."""
        layer = self._layer(ikv, "sekv_kv_set_rows")
        self.set_rows(ikv, cells, kv_codec.encode(np.asarray(k), self.info.type_k, layer.n_head_kv, layer.head_dim_k),
                      kv_codec.encode(np.asarray(v), self.info.type_v, layer.n_head_kv, layer.head_dim_v), seq)

    def _layer(self, ikv: int, function: str) -> KVLayer:
        if not 0 <= ikv < len(self.layers):
            raise HookIndexError(function, api.SEKV_ERR_LAYER,
                                 f"KV layer index {ikv} out of range [0, {len(self.layers)})")
        return self.layers[ikv]

    # -- per-layer bias ----------------------------------------------------------------------------------------

    def enable_bias(self, on: bool = True) -> None:
        """Switch the per-layer cell bias on (all zeros) or off. Toggling rebuilds the graph on the next decode."""
        check("sekv_bias_enable", api.sekv_bias_enable(self.ctx, int(on)))

    def set_bias(self, ikv: int, bias: Any) -> None:
        """Bias [kv_size] of layer ``ikv`` (-1: every layer); finite values or -inf."""
        b = np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
        check("sekv_bias_set_layer", api.sekv_bias_set_layer(self.ctx, ikv, _ptr(b, ctypes.c_float), b.size))

    def set_bias_cells(self, ikv: int, cells: Any, values: Any) -> None:
        """Bias of some cells of layer ``ikv`` (-1: every layer)."""
        c = _i32(cells, "cells")
        v = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float32), c.shape))
        check("sekv_bias_set_cells", api.sekv_bias_set_cells(self.ctx, ikv, _ptr(c), _ptr(v, ctypes.c_float), c.size))

    def get_bias(self, ikv: int) -> np.ndarray:
        """float32 [kv_size]: the bias of layer ``ikv``."""
        out = np.empty(self.info.kv_size, dtype=np.float32)
        check("sekv_bias_get_layer", api.sekv_bias_get_layer(self.ctx, ikv, _ptr(out, ctypes.c_float), out.size))
        return out

    # -- per-head bias -----------------------------------------------------------------------------------------

    def enable_head_bias(self, on: bool = True) -> None:
        """Switch the per-head cell bias on (all zeros) or off: added on top of the per-layer bias, one value per
        query head, so each hooked layer's KQ mask becomes one per head. Claiming or releasing a cell zeroes its
        per-head bias. Toggling rebuilds the graph on the next decode."""
        check("sekv_head_bias_enable", api.sekv_head_bias_enable(self.ctx, int(on)))

    def set_head_bias_cells(self, ikv: int, cells: Any, values: Any) -> None:
        """Per-head bias of some cells of layer ``ikv`` (-1: every layer): ``values`` finite [n, n_head]."""
        c = _i32(cells, "cells")
        n_head = self._layer(max(ikv, 0), "sekv_head_bias_set_cells").n_head
        v = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float32), (c.size, n_head)))
        check("sekv_head_bias_set_cells",
              api.sekv_head_bias_set_cells(self.ctx, ikv, _ptr(c), _ptr(v, ctypes.c_float), c.size))

    def get_head_bias(self, ikv: int) -> np.ndarray:
        """float32 [n_head, kv_size]: the per-head bias of layer ``ikv``."""
        layer = self._layer(ikv, "sekv_head_bias_get_layer")
        out = np.empty((layer.n_head, self.info.kv_size), dtype=np.float32)
        check("sekv_head_bias_get_layer",
              api.sekv_head_bias_get_layer(self.ctx, ikv, _ptr(out, ctypes.c_float), out.size))
        return out

    # -- query capture -----------------------------------------------------------------------------------------

    def enable_query_capture(self, on: bool = True) -> None:
        """Capture every hooked layer's query of the last token of each decode (takes effect from the next one)."""
        check("sekv_qcap_enable", api.sekv_qcap_enable(self.ctx, int(on)))

    def set_query_probes(self, n: int) -> None:
        """Capture the queries of ``n`` tokens of each decode's ubatch (evenly spaced, ending at its last token; 1:
        the last token alone), 1 <= n <= ``SEKV_MAX_PROBES``; reallocates the capture when it is on."""
        if not 1 <= n <= api.SEKV_MAX_PROBES:
            raise ValueError(f"query probes must be 1..{api.SEKV_MAX_PROBES}, got {n}")
        check("sekv_qcap_probes", api.sekv_qcap_probes(self.ctx, int(n)))
        self.query_probes = int(n)

    def queries(self, ikv: int) -> np.ndarray:
        """float32 [p, n_head, head_dim_k]: layer ``ikv``'s captured queries (times kq_scale) of the last decode's
        ``p = min(probes, n_tokens)`` probe tokens, in token order (the last is its last token)."""
        layer = self._layer(ikv, "sekv_qcap_get_probes")
        out = np.empty((self.query_probes, layer.n_head, layer.head_dim_k), dtype=np.float32)
        got = ctypes.c_int32()
        check("sekv_qcap_get_probes",
              api.sekv_qcap_get_probes(self.ctx, ikv, _ptr(out, ctypes.c_float), out.size, ctypes.byref(got)))
        return out[:got.value]

    def query(self, ikv: int) -> np.ndarray:
        """float32 [n_head, head_dim_k]: layer ``ikv``'s captured query times kq_scale, so that the attention logit of
        a cell is ``query[h] @ k_row[h // (n_head // n_head_kv)]`` before mask and bias."""
        layer = self._layer(ikv, "sekv_qcap_get")
        out = np.empty((layer.n_head, layer.head_dim_k), dtype=np.float32)
        check("sekv_qcap_get", api.sekv_qcap_get(self.ctx, ikv, _ptr(out, ctypes.c_float), out.size))
        return out

    # -- transfers ---------------------------------------------------------------------------------------------

    def on_host(self, ikv: int) -> bool:
        """Whether layer ``ikv``'s K and V live in host memory (the CPU) rather than on a device (a GPU, an RPC
        server), where every row read is a transfer."""
        out = ctypes.c_int32()
        check("sekv_kv_layer_on_host", api.sekv_kv_layer_on_host(self.ctx, ikv, ctypes.byref(out)))
        return bool(out.value)

    def io_counters(self) -> tuple[int, int, int, int]:
        """The hook's own transfers between host and device memory since the context was created (rows, bias,
        query capture; none where the cache is in host memory): (bytes host→device, calls host→device,
        bytes device→host, calls device→host)."""
        out = (ctypes.c_uint64 * 4)()
        check("sekv_io_counters", api.sekv_io_counters(self.ctx, out, 4))
        return int(out[0]), int(out[1]), int(out[2]), int(out[3])

    # -- layer callback ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def layer_callback(self, fn: Callable[[int], None]) -> Iterator[None]:
        """Within the block, every decode calls ``fn(ikv)`` at each hooked layer once its query is captured and
        before its attention reads the cache: ``query(ikv)`` is this decode's, and ``get_rows`` / ``set_rows`` /
        ``set_bias_cells`` / ``set_bias`` take effect for that layer's attention in the same decode (claiming and
        releasing cells are refused). Needs query capture and the bias on (``HookStateError`` otherwise); works
        wherever the cache lives (host memory, a GPU, an RPC server); ``UnsupportedModelError`` where the context
        already has an eval callback of its own. An exception ``fn`` raises stops the calls and is raised when the
        block ends (the decode it happened in still ran to its end)."""
        failure: list[BaseException] = []

        def call(ikv: int, _user: Any) -> None:
            if failure:
                return
            try:
                fn(ikv)
            except BaseException as exc:  # noqa: BLE001 (nothing may cross the C frames; raised at the block's end)
                failure.append(exc)

        cb = api.sekv_layer_callback(call)
        check("sekv_layer_cb_set", api.sekv_layer_cb_set(self.ctx, cb, None))
        try:
            yield
        finally:
            disarm = ctypes.cast(None, api.sekv_layer_callback)
            check("sekv_layer_cb_set", api.sekv_layer_cb_set(self.ctx, disarm, None))
        if failure:
            raise failure[0]


def report_lines(r: dict[str, Any]) -> list[str]:
    """``KVHook.report`` (with ``model``, ``architecture``, ``n_layer`` and ``support`` added) as the text ``info``
    prints; a refused model's report has no hook part: its model, architecture and the refusal."""
    head = [f"model         {r['model']}", f"architecture  {r['architecture']}, {r['n_layer']} layers"]
    if "kv" not in r:
        return head + [f"support       {r['support']}"]
    kv, layers, mib = r["kv"], r["hooked_layers"], 1024 * 1024
    if kv["is_iswa"]:
        head[1] += f", iSWA (window {kv['n_swa']})"
    lines = head + [f"support       {r['support']}",
                    f"hooked cache  {'base (global-layer) cache' if kv['is_iswa'] else 'attention cache'}: "
                    f"{kv['n_layer_kv']} layers {[layer['il'] for layer in layers]}"]
    lines += [f"  layer {layer['il']:>3}  heads {layer['n_head']} q / {layer['n_head_kv']} kv, head dim "
              f"{layer['head_dim_k']}/{layer['head_dim_v']}, row bytes K {layer['k_row_bytes']} V {layer['v_row_bytes']}"
              for layer in layers]
    rotated = [name for name in ("k", "v") if kv[f"rot_{name}"]]
    lines += [f"cells         {kv['kv_size']} ({r['kv_type_k']} K / {r['kv_type_v']} V, flash attention "
              f"{'on' if kv['flash_attn'] else 'off'}, V {'transposed' if kv['v_trans'] else 'row-major'}"
              f"{', ' + '/'.join(rotated).upper() + ' Hadamard-rotated' if rotated else ''})",
              f"bytes/token   {r['bytes_per_token']} (hooked layers, K+V)",
              f"hooked KV     {kv['kv_bytes'] / mib:.2f} MiB"]
    if kv["is_iswa"]:
        lines.append(f"SWA cache     {kv['swa_kv_size']} cells, {kv['swa_kv_bytes'] / mib:.2f} MiB (not hooked)")
    lines.append(f"device KV     {r['device_kv_bytes'] / mib:.2f} MiB in all")
    if "kv_budget_auto" in r:
        auto = r["kv_budget_auto"]
        lines.append(f"kv budget     auto -> {auto['kv_budget']:g} ({auto['reason']})")
    return lines
