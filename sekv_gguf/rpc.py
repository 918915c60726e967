"""Layers on other machines through llama.cpp's RPC backend.

Each remote host runs ``ggml-rpc-server`` (built with our patches by ``scripts/setup.sh``: ``.venv/bin/ggml-rpc-server``)
and exposes its devices; ``devices(endpoints)`` adds them the way llama.cpp's own ``--rpc`` does (the RPC registry
entry ``ggml_backend_rpc_add_server``, reached through ``ggml_backend_reg_get_proc_address``) and returns them, with
this machine's GPUs after them, for ``llama_model_params.devices``. llama.cpp then spreads the offloaded layers — and
so their KV cache — over those devices; the KV hook reads and writes rows through ggml's backend tensor API, so it
works unchanged on remote buffers.

The RPC server must never face an open network: it has no authentication and runs what it is sent.

Failures: a server that cannot be reached or does not answer the handshake raises ``RpcError`` before anything is
loaded. llama.cpp's RPC client cannot recover a connection lost mid-run (the layers there are gone): it aborts the
process; ``install_abort_handler`` turns that into one clear line on stderr and exit status ``BACKEND_LOST_EXIT``.
A server that stops answering without closing its connection is detected by the socket timeout
(``ContextConfig.rpc_timeout_s``, given to the patched client as ``$SEKV_RPC_TIMEOUT``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp.llama_cpp as _llama

from . import _ggml
from .endpoints import parse_endpoints  # noqa: F401  (re-exported)
from .errors import RpcError

RPC_REG_NAME = b"RPC"
ADD_SERVER_PROC = b"ggml_backend_rpc_add_server"
SERVER_EXE = "ggml-rpc-server"
TIMEOUT_ENV = "SEKV_RPC_TIMEOUT"  # read by the patched RPC client at each connection (seconds; 0 or unset: none)
BACKEND_LOST_EXIT = 75  # exit status after llama.cpp aborted on a lost backend (EX_TEMPFAIL: retry once it is back)
OTHER_ABORT_EXIT = 70  # exit status after any other llama.cpp abort while the handler is installed (EX_SOFTWARE)


def _check_reachable(endpoint: str, timeout_s: float) -> None:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s or None):  # 0: no timeout
            pass
    except OSError as e:
        raise RpcError(f"RPC server {endpoint} cannot be reached ({e.strerror or e}): is {SERVER_EXE} running "
                       f"there, and the port open to this machine?") from e


_added: dict[str, list[int]] = {}  # endpoint -> its devices (llama.cpp keeps servers for the process's life)
_lock = threading.Lock()


def _add_server(endpoint: str, timeout_s: float) -> list[int]:
    reg = _ggml.ggml_backend_reg_by_name(RPC_REG_NAME)
    if not reg:
        raise RpcError("this libllama was built without the RPC backend (GGML_RPC=ON): rerun scripts/setup.sh")
    addr = _ggml.ggml_backend_reg_get_proc_address(reg, ADD_SERVER_PROC)
    if not addr:
        raise RpcError(f"the RPC backend has no {ADD_SERVER_PROC.decode()}")
    add = _ggml.ggml_backend_rpc_add_server_t(addr)
    _check_reachable(endpoint, timeout_s)
    server_reg = add(endpoint.encode())
    if not server_reg:
        raise RpcError(f"RPC server {endpoint} accepted the connection but did not answer as a {SERVER_EXE} of "
                       f"this llama.cpp version (another service on that port, a different RPC protocol version, "
                       f"or the server busy with another client for {timeout_s:g} s)")
    devs = [_ggml.ggml_backend_reg_dev_get(server_reg, i) for i in range(_ggml.ggml_backend_reg_dev_count(server_reg))]
    if not devs:
        raise RpcError(f"RPC server {endpoint} offers no device")
    return devs


def devices(endpoints: Sequence[str], timeout_s: float) -> list[int]:
    """The devices of ``endpoints`` (connected once per process) followed by this machine's GPUs, in llama.cpp's
    order (RPC first). Raises ``RpcError`` naming the server that cannot be used."""
    set_timeout(timeout_s)
    out: list[int] = []
    with _lock:
        for e in endpoints:
            if e not in _added:
                _added[e] = _add_server(e, timeout_s)
            out.extend(_added[e])
    for i in range(_ggml.ggml_backend_dev_count()):
        dev = _ggml.ggml_backend_dev_get(i)
        if _ggml.ggml_backend_dev_type(dev) in (_ggml.GGML_BACKEND_DEVICE_TYPE_GPU, _ggml.GGML_BACKEND_DEVICE_TYPE_IGPU):
            out.append(dev)
    return out


def describe(devs: Sequence[int]) -> list[dict]:
    """Name, description (the endpoint, for RPC devices) and memory of each device."""
    out = []
    for d in devs:
        free, total = _ggml.ggml_backend_dev_memory(d)
        out.append({"name": _ggml.ggml_backend_dev_name(d).decode(),
                    "description": _ggml.ggml_backend_dev_description(d).decode(),
                    "free_bytes": free, "total_bytes": total})
    return out


def device_array(devs: Sequence[int]) -> ctypes.Array:
    """A NULL-terminated ``ggml_backend_dev_t[]`` (what ``llama_model_params.devices`` points to)."""
    arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
    return arr


def set_timeout(seconds: float) -> None:
    """Send/receive timeout of RPC connections opened from now on (0: none)."""
    os.environ[TIMEOUT_ENV] = f"{max(float(seconds), 0.0):g}"


_abort_cb = None


def install_abort_handler() -> None:
    """Turn llama.cpp's abort (what its RPC client does when a server is lost mid-run) into one clear line on stderr
    and exit status ``BACKEND_LOST_EXIT`` (``OTHER_ABORT_EXIT`` for any other abort), instead of SIGABRT."""
    global _abort_cb
    if _abort_cb is not None:
        return

    def on_abort(message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", "replace")
        lost = "RPC" in text or "rpc" in text
        hint = (" — an RPC server closed the connection or stopped answering; the model's layers there are lost: "
                "restart the server and this program" if lost else "")
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.write(2, f"sekv_gguf: error: llama.cpp stopped: {text}{hint}\n".encode())  # fd 2: even where sys.stderr
        os._exit(BACKEND_LOST_EXIT if lost else OTHER_ABORT_EXIT)

    _abort_cb = _ggml.ggml_abort_callback_t(on_abort)
    _ggml.ggml_set_abort_callback(_abort_cb)


def server_path() -> Path:
    """The ``ggml-rpc-server`` built beside the loaded libllama."""
    p = Path(_llama._lib._name).parent / SERVER_EXE
    if not p.is_file():
        raise RpcError(f"{p} not found: this libllama was built without the RPC server (rerun scripts/setup.sh)")
    return p


@dataclass
class RpcServer:
    """A local ``ggml-rpc-server`` child process (tests, benchmarks, a quick try on one machine).

    port: 0 picks a free one. threads: CPU threads of the server's device. start_timeout_s: how long it may take to
    accept connections."""

    port: int = 0
    threads: int = 1
    host: str = "127.0.0.1"
    start_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "RpcServer":
        if self.port == 0:
            with socket.socket() as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([str(server_path()), "-H", self.host, "-p", str(self.port),
                                      "-t", str(self.threads)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode("utf-8", "replace") if self.proc.stderr else ""
                raise RpcError(f"{SERVER_EXE} on {self.endpoint} exited at start ({self.proc.returncode}): "
                               f"{err.strip()[-500:]}")
            if _listening(self.host, self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise RpcError(f"{SERVER_EXE} on {self.endpoint} did not listen within {self.start_timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def __enter__(self) -> "RpcServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it ends (its process exiting, also by os._exit
    after a lost server), so that no server outlives its starter. Start servers from a long-lived thread."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _listening(host: str, port: int) -> bool:
    """Whether ``host:port`` is bound — read from /proc, so that the check does not take the server's one client
    slot (it serves one connection at a time)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 3 and cols[1].endswith(want) and cols[3] == "0A":  # 0A: LISTEN
                return True
    return False
