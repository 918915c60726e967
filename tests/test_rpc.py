"""SeKV over llama.cpp's RPC backend: real ``ggml-rpc-server`` processes on 127.0.0.1 hold the offloaded layers and
their KV cache; the hook's rows, relocation, bias and query capture behave as locally; policies give the same
tokens; bad servers are clear errors and a server lost mid-run ends the process with one line, not a hang."""

from __future__ import annotations

import gc
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from helpers import ROOT, free_port, prose
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.errors import RpcEndpointError, RpcError
from sekv_gguf.llm import SekvLlama
from sekv_gguf.rpc import BACKEND_LOST_EXIT, RpcServer, parse_endpoints
from sekv_gguf.serve import ServeConfig
from sekv_gguf.session import Session, load_model

import test_engine
import test_hook_bias
import test_hook_layer_callback
import test_hook_query
import test_hook_rows


def _connections(endpoints: list[str]) -> int:
    """Established TCP connections from this machine to ``endpoints`` (an RPC server serves one client at a time:
    a connection this process keeps would make the next client wait)."""
    ports = {f":{int(e.rpartition(':')[2]):04X}" for e in endpoints}
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for r in rows if r.split()[3] == "01" and any(r.split()[2].endswith(p) for p in ports))


def _assert_no_connection(endpoints: list[str]) -> None:
    """Every model and context on the servers has been freed: their connections are closed (the servers are free
    for the next client, and stopping them cannot hit a live connection)."""
    gc.collect()
    deadline = time.monotonic() + 5
    while _connections(endpoints) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connections(endpoints) == 0, "a connection to an RPC server outlived its models"


# The servers compute with one thread, and a one-token decode on the CPU backend sums in an order that depends on
# the thread count (measured: with 2 local threads layer 1's query differs from the server's by ~1e-5 relative, and
# greedy tokens part at a near tie): runs compared token for token use the servers' thread count locally too.
SERVER_THREADS = 1
LIKE_THE_SERVERS = ContextConfig(n_threads=SERVER_THREADS)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[str]]:
    """Two RPC servers (``SERVER_THREADS`` CPU threads each) for the module."""
    with RpcServer(threads=SERVER_THREADS) as a, RpcServer(threads=SERVER_THREADS) as b:
        yield [a.endpoint, b.endpoint]
        _assert_no_connection([a.endpoint, b.endpoint])


# where the layers go: every layer on one server; spread over two servers; half local (CPU), half remote
# (n_gpu_layers counts the output layer too: 2 of the tiny models' 2 + 1 keeps their first block on the CPU)
PLACEMENTS = {"one-server": (1, -1), "two-servers": (2, -1), "half-local": (1, 2)}


@pytest.fixture(params=list(PLACEMENTS))
def rpc_session(request, servers) -> Iterator[Callable[..., Session]]:
    """Like conftest's ``open_session``, with the layers placed as ``PLACEMENTS`` says."""
    n_servers, n_gpu_layers = PLACEMENTS[request.param]
    opened: list[Session] = []

    def make(path: Path, **config: object) -> Session:
        s = Session.open(path, ContextConfig(rpc_servers=tuple(servers[:n_servers]), n_gpu_layers=n_gpu_layers,
                                             **config))  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield make
    while opened:  # (a loop variable would keep the last session, and its model, alive)
        opened.pop().close()
    _assert_no_connection(servers)


# -- addresses and unusable servers -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["localhost", "host:", ":50052", "host:0", "host:65536", "host:port", "::1:50052",
                                 "a:1,a:1", ""])
def test_malformed_endpoints_are_refused_before_anything_loads(bad):
    with pytest.raises(RpcEndpointError):
        parse_endpoints(bad)
    if bad:
        with pytest.raises(ValueError, match="RPC server"):
            ContextConfig(rpc_servers=(bad,))
        with pytest.raises(ValueError, match="RPC server"):
            ServeConfig(rpc=bad)
    assert parse_endpoints(" 10.0.0.2:50052 ,gpu-box:1") == ("10.0.0.2:50052", "gpu-box:1")


def test_an_unreachable_server_is_a_clear_error(tiny_llama):
    port = free_port()  # nothing listens there
    t = time.monotonic()
    with pytest.raises(RpcError, match=f"127.0.0.1:{port} cannot be reached"):
        Session.open(tiny_llama, ContextConfig(rpc_servers=(f"127.0.0.1:{port}",)))
    assert time.monotonic() - t < 10


@pytest.mark.parametrize("reply", [b"", b"HTTP/1.1 400 Bad Request\r\n\r\n"], ids=["silent", "http"])
def test_a_service_that_is_not_an_rpc_server_is_refused(tiny_llama, reply):
    """A port where something else listens: refused after the handshake's timeout, named, no abort and no hang."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]
    conns: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            conns.append(c)
            if reply:
                c.sendall(reply)

    threading.Thread(target=accept, daemon=True).start()
    t = time.monotonic()
    try:
        with pytest.raises(RpcError, match=f"127.0.0.1:{port} accepted the connection but did not answer"):
            Session.open(tiny_llama, ContextConfig(rpc_servers=(f"127.0.0.1:{port}",), rpc_timeout_s=1))
    finally:
        lsock.close()
        for c in conns:
            c.close()
    assert time.monotonic() - t < 15


# -- the layers and their KV cache really are remote --------------------------------------------------------------

def test_layers_and_kv_cache_are_placed_on_the_servers(servers, tiny_llama, capsys):
    """llama.cpp's own log says where each KV layer lives: all remote, or split between this machine and a
    server (n_gpu_layers=2 of 2 blocks + the output layer keeps block 0 on the CPU)."""
    for n_gpu_layers, want in ((-1, ["RPC", "RPC"]), (2, ["CPU", "RPC"])):
        s = Session.open(tiny_llama, ContextConfig(n_ctx=256, rpc_servers=(servers[0],), n_gpu_layers=n_gpu_layers,
                                                   verbose=True))
        s.close()
        err = capsys.readouterr().err
        devs = re.findall(r"llama_kv_cache: layer +(\d+): dev = (\w+?)\d*\n", err)
        assert [d for _, d in devs] == want, err[-2000:]
        assert servers[0] in err  # the server's endpoint names its buffers


# -- the hook on remote buffers, as locally (the local tests' own bodies, run over RPC) ----------------------------

def test_row_round_trip_is_bit_identical(rpc_session, tiny_llama, tiny_gemma):
    test_hook_rows._round_trip(rpc_session, tiny_llama, 400, n_ctx=512, n_batch=128, n_ubatch=128)
    test_hook_rows._round_trip(rpc_session, tiny_gemma, 400, n_ctx=512, n_batch=128, n_ubatch=128)


def test_remote_rows_equal_local_rows(servers, open_session, tiny_llama):
    text = prose(300)
    local = open_session(tiny_llama, n_ctx=512)
    remote = open_session(tiny_llama, n_ctx=512, rpc_servers=(servers[0],))
    for s in (local, remote):
        s.decode(s.tokenize(text), logits="none")
    cells = np.flatnonzero(local.hook.cells_pos() >= 0).astype(np.int32)
    np.testing.assert_array_equal(remote.hook.cells_pos(), local.hook.cells_pos())
    for ikv in range(local.hook.info.n_layer_kv):
        for a, b in zip(local.hook.get_rows(ikv, cells), remote.hook.get_rows(ikv, cells)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash"])
def test_relocation(rpc_session, tiny_llama, flash_attn):
    test_hook_rows.test_relocation_matches_full_kv(rpc_session, tiny_llama, flash_attn)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "softmax"])
def test_bias(rpc_session, tiny_llama, tiny_gemma, flash_attn):
    test_hook_bias.test_minus_inf_bias_equals_release(rpc_session, tiny_llama, flash_attn)
    for model in ("llama", "gemma"):
        test_hook_bias.test_per_layer_bias_matches_reference(rpc_session, tiny_llama, tiny_gemma, model, flash_attn)
        test_hook_bias.test_per_head_bias_matches_reference(rpc_session, tiny_llama, tiny_gemma, model, flash_attn)
    test_hook_bias.test_claim_and_release_zero_the_per_head_bias(rpc_session, tiny_llama)


def test_query_capture(rpc_session, tiny_llama, tiny_gemma):
    for model in ("llama", "gemma"):
        test_hook_query.test_captured_query_matches_reference(rpc_session, tiny_llama, tiny_gemma, model)
    test_hook_query.test_capture_follows_each_decode(rpc_session, tiny_llama)


# -- the layer callback on remote buffers: routing inside a decode, as locally ----------------------------------

@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash", "softmax"])
def test_layer_callback(rpc_session, tiny_llama, tiny_gemma, flash_attn):
    """Each hooked layer is called once, in order, with this decode's query; rows and bias written inside the call
    act on that layer's attention in the same decode, bit for bit as written before it (the last layer: on the
    second server in the two-server placement); errors raised inside surface after the decode."""
    for model in ("llama", "gemma"):
        if flash_attn:
            test_hook_layer_callback.test_each_layer_is_called_once_in_order_with_this_decodes_query(
                rpc_session, tiny_llama, tiny_gemma, model)
        test_hook_layer_callback.test_rows_and_bias_written_in_the_callback_act_on_the_same_decode(
            rpc_session, tiny_llama, tiny_gemma, model, flash_attn)
    test_hook_layer_callback.test_callback_errors_surface_after_the_decode(rpc_session, tiny_llama)


def test_bias_writes_are_counted_transfers_not_a_per_decode_upload(servers, tiny_llama):
    """The bias lives on the server: a decode moves none of the hook's bytes; a bias write of a few cells is one
    small transfer per layer; a row read is counted device->host. Locally nothing is counted."""
    for remote in (True, False):
        s = Session.open(tiny_llama, ContextConfig(n_ctx=256, rpc_servers=(servers[0],) if remote else ()))
        try:
            s.hook.enable_bias()
            s.decode(s.tokenize(prose(200)), logits="none")
            before = s.hook.io_counters()
            s.decode(s.tokenize(" next", add_bos=False))
            assert s.hook.io_counters() == before  # no upload of the bias per decode
            n_layer = s.hook.info.n_layer_kv
            s.hook.set_bias_cells(-1, [3, 4, 5], -np.inf)
            h2d, calls, d2h, gets = s.hook.io_counters()
            if not remote:
                assert (h2d, calls, d2h, gets) == (0, 0, 0, 0)
                continue
            assert (h2d - before[0], calls - before[1]) == (3 * 4 * n_layer, n_layer)
            s.hook.set_bias(0, np.zeros(s.hook.info.kv_size, np.float32))
            assert s.hook.io_counters()[:2] == (h2d + 4 * s.hook.info.kv_size, calls + 1)
            k, v = s.hook.get_rows(0, [0, 1, 2])
            assert s.hook.io_counters()[2:] == (d2h + k.nbytes + v.nbytes, gets + 2)
        finally:
            s.close()


def _remote_model(path: Path, servers: list[str], placement: str):
    n_servers, n_gpu_layers = PLACEMENTS[placement]
    return load_model(path, ContextConfig(rpc_servers=tuple(servers[:n_servers]), n_gpu_layers=n_gpu_layers))


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("which, routing", [("llama", "layer"), ("gemma", "layer"), ("llama", "refresh"),
                                           ("llama", "refused")])
def test_a_turn_routed_inside_its_decode_over_rpc(servers, tiny_llama, tiny_gemma, llama_model, gemma_model,
                                                  placement, which, routing):
    """test_engine's turn anchor with the model and its cache on RPC servers: routed inside its one decode, the
    turn's logits equal full KV's (the same body) and, bit for bit, the same turn's logits locally; the two-pass
    fallback (``refresh``, or ``refused``: the hook refusing the callback) too. Times printed (``-s``)."""
    remote = _remote_model(tiny_llama if which == "llama" else tiny_gemma, servers, placement)
    try:
        got, took = test_engine.turn_zoomed_inside_its_decode(remote, routing)
    finally:
        remote.close()
    want, took_local = test_engine.turn_zoomed_inside_its_decode(llama_model if which == "llama" else gemma_model,
                                                                 routing)
    np.testing.assert_array_equal(got, want)
    print(f"\nturn {which} {routing} {placement}: {took * 1e3:.1f} ms over RPC, {took_local * 1e3:.1f} ms locally")


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("which, routing", [("llama", "layer"), ("gemma", "layer"), ("llama", "lagged")])
def test_a_step_routed_inside_its_decode_over_rpc(servers, tiny_llama, tiny_gemma, llama_model, gemma_model,
                                                  placement, which, routing):
    """test_engine's step anchor over RPC: the routing step's logits equal full KV's when routed inside its decode,
    and the same step's locally bit for bit."""
    remote = _remote_model(tiny_llama if which == "llama" else tiny_gemma, servers, placement)
    try:
        got, took = test_engine.step_routed_inside_its_decode(remote, which, routing)
    finally:
        remote.close()
    want, took_local = test_engine.step_routed_inside_its_decode(llama_model if which == "llama" else gemma_model,
                                                                 which, routing)
    np.testing.assert_array_equal(got, want)
    print(f"\nstep {which} {routing} {placement}: {took * 1e3:.1f} ms over RPC, {took_local * 1e3:.1f} ms locally")


def _routed_generation(model, toks: list[int], turn: list[int]) -> tuple[list[int], object]:
    """Greedy tokens of a sekv memory whose every routing runs inside a decode (streamed chunks, a turn, steps), and
    its counters."""
    cfg = SekvConfig(prefill="streaming", chunk_routing="layer", turn_routing="layer", step_routing="layer",
                     route_every=2)
    policy = make_policy("sekv", model, len(toks) + len(turn) + 32, LIKE_THE_SERVERS,
                         BudgetConfig(kv_budget=512, chunk=128), cfg)
    try:
        out: list[int] = []
        logits = policy.prefill(toks)
        for part in range(2):
            for _ in range(8):
                out.append(int(np.argmax(logits)))
                logits = policy.step(out[-1])
            if part == 0:
                logits = policy.append(turn)
        return out, policy.memory.counters
    finally:
        policy.close()


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_routed_generation_over_rpc_is_token_identical(servers, tiny_llama, tiny_gemma, llama_model, gemma_model,
                                                       which):
    """A small budget, streamed prompt chunks, a turn and decode steps all routed inside their decodes over RPC:
    the same tokens as locally, and the callback really ran there."""
    local = llama_model if which == "llama" else gemma_model
    toks = local.tokenize(prose(3000, 100).encode(), add_bos=True, special=False)[:900]
    turn = local.tokenize(prose(120, 5000).encode(), add_bos=False, special=False)[:20]
    want, _ = _routed_generation(local, toks, turn)
    remote = _remote_model(tiny_llama if which == "llama" else tiny_gemma, servers, "one-server")
    try:
        got, counters = _routed_generation(remote, toks, turn)
    finally:
        remote.close()
    assert got == want
    assert counters.chunk.routes > 0 and counters.layer_routed_turns == 1 and counters.layer_routed_steps == 8


def _stepped(model, toks: list[int], n: int = 12):
    """A sekv memory at a small budget, prefilled and stepped ``n`` greedy tokens (every 2nd step routed inside its
    decode). The policy (open: close it)."""
    cfg = SekvConfig(prefill="streaming", route_every=2)
    policy = make_policy("sekv", model, len(toks) + n + 8, LIKE_THE_SERVERS, BudgetConfig(kv_budget=512, chunk=128),
                         cfg)
    logits = policy.prefill(toks)
    for _ in range(n):
        logits = policy.step(int(np.argmax(logits)))
    return policy


def test_a_step_reads_back_only_its_queries_and_transfers_are_reported(servers, tiny_llama, llama_model):
    """Over RPC the two-stage router judges the spans the zoom slots hold by the host rows they were rebuilt from:
    per decode step the hook reads back nothing but the captured queries of the step routings (and writes rows and
    bias), with the same tokens as locally; the stats report the hook's transfers per step. Locally nothing is
    counted."""
    toks = llama_model.tokenize(prose(3000, 300).encode(), add_bos=True, special=False)[:900]
    local = _stepped(llama_model, toks)
    try:
        st = local.stats().sekv
        assert (st.h2d_bytes_per_step, st.h2d_calls_per_step, st.d2h_bytes_per_step, st.d2h_calls_per_step) == (0, 0,
                                                                                                                0, 0)
        want_tokens = local.tokens
    finally:
        local.close()
    remote = _remote_model(tiny_llama, servers, "one-server")
    try:
        policy = _stepped(remote, toks)
        try:
            hook, counters = policy.session.hook, policy.memory.counters
            assert policy.tokens == want_tokens
            assert sum(len(r) for r in policy.memory.zoom.resident) > 0 and counters.step.routes > 0
            st = policy.stats().sekv
            assert st.h2d_calls_per_step > 0 and st.h2d_bytes_per_step > 0
            query_bytes = sum(4 * layer.n_head * layer.head_dim_k for layer in hook.layers)  # f32, every layer
            assert st.d2h_bytes_per_step * counters.io_steps == counters.step.routes * query_bytes
            assert st.d2h_calls_per_step * counters.io_steps == counters.step.routes * len(hook.layers)
        finally:
            policy.close()
    finally:
        remote.close()


# -- policies: the same tokens over RPC ----------------------------------------------------------------------------

def _greedy(path: str, text: str, n: int, **kw: object) -> str:
    llm = SekvLlama(path, n_ctx=2048, **kw)
    try:
        return llm.create_completion(text, temperature=0, max_tokens=n)["choices"][0]["text"]
    finally:
        llm.close()


def _rpc_equals_local(servers: list[str], path: str, text: str, n: int) -> None:
    # locally without weight repacking: the server's CPU computes with the plain kernels, and so must the reference
    # (repacked Q4_K kernels move Gemma's logits by up to ~1, enough to change a greedy token within 24)
    want = _greedy(path, text, n, policy="full", repack_weights=False)
    assert want
    assert _greedy(path, text, n, policy="full", rpc_servers=servers[0]) == want
    assert _greedy(path, text, n, policy="full", rpc_servers=",".join(servers)) == want
    # sekv with a budget that covers the whole context is full KV
    assert _greedy(path, text, n, policy="sekv", kv_budget=2048, rpc_servers=servers[0]) == want


def test_full_and_covering_sekv_over_rpc_equal_full_locally_tiny(servers, tiny_llama):
    _rpc_equals_local(servers, str(tiny_llama), prose(1200, 40), 24)


@pytest.mark.gemma
def test_full_and_covering_sekv_over_rpc_equal_full_locally_gemma(servers, gemma_path):
    _rpc_equals_local(servers, str(gemma_path), prose(3000, 700), 24)


def test_sekv_with_a_small_budget_runs_over_rpc(servers, tiny_llama):
    """Summaries, zooms and the host tier over a remote KV cache: same tokens as locally (the policy decides the
    same way; only where the rows live differs)."""
    text = prose(2200, 10)
    kw = dict(policy="sekv", kv_budget=512)
    assert _greedy(str(tiny_llama), text, 16, rpc_servers=servers[0], **kw) == _greedy(str(tiny_llama), text, 16,
                                                                                         **kw)


def test_run_and_info_take_rpc(servers, tiny_llama):
    base = [sys.executable, "-m", "sekv_gguf"]
    run = ["run", str(tiny_llama), "-p", prose(800), "-n", "8", "--json", "-q", "--policy", "full"]
    local = subprocess.run(base + run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    remote = subprocess.run(base + run + ["--rpc", servers[0]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert local.returncode == remote.returncode == 0, remote.stderr
    import json

    assert json.loads(remote.stdout)["text"] == json.loads(local.stdout)["text"]
    info = subprocess.run(base + ["info", str(tiny_llama), "--json", "--rpc", ",".join(servers)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert [d["description"] for d in json.loads(info.stdout)["devices"]] == servers
    bad = subprocess.run(base + ["info", str(tiny_llama), "--rpc", f"127.0.0.1:{free_port()}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "cannot be reached" in bad.stderr and "Traceback" not in bad.stderr


# -- a server lost mid-run ------------------------------------------------------------------------------------------

CHILD = """
import sys, time
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.session import Session, load_model
s = Session.open(sys.argv[1], ContextConfig(n_ctx=4096, rpc_servers=(sys.argv[2],), rpc_timeout_s=float(sys.argv[3])))
toks = s.tokenize("word " * 200)
s.decode(toks[:100], logits="none")
print("ready", flush=True)
for _ in range(3900):  # decodes (and reads rows) until the server is gone: ~20 s at most
    s.decode(toks[100:101])
    s.hook.get_rows(0, [0, 1, 2])
    time.sleep(0.005)
print("the server was never lost", flush=True)
"""


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_server_lost_mid_run_ends_the_process_with_a_clear_error(tiny_llama, how):
    """Killed: the connection closes; stopped (SIGSTOP: alive, silent): the 2 s timeout fires. Either way the
    client ends within seconds with one line naming the RPC server and exit status BACKEND_LOST_EXIT — no hang,
    no SIGABRT."""
    with RpcServer(threads=1) as srv:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_llama), srv.endpoint, "2"], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            assert srv.proc is not None
            os.kill(srv.proc.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            t = time.monotonic()
            rc = child.wait(timeout=60)
            took = time.monotonic() - t
            err = child.stderr.read()
        finally:
            if child.poll() is None:
                child.kill()
            if how == "stopped" and srv.proc is not None:
                os.kill(srv.proc.pid, signal.SIGCONT)
    assert rc == BACKEND_LOST_EXIT, err[-2000:]
    assert "sekv_gguf: error: llama.cpp stopped" in err and "RPC server" in err
    assert took < (10 if how == "killed" else 20)
