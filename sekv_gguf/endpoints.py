"""``HOST:PORT`` endpoints of llama.cpp RPC servers, checked (no llama.cpp import: configs validate with it)."""

from __future__ import annotations

from typing import Sequence

from .errors import RpcEndpointError


def parse_endpoints(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"HOST:PORT[,HOST:PORT...]"`` (or a sequence of such) as a tuple of checked endpoints."""
    items = spec.split(",") if isinstance(spec, str) else [e for s in spec for e in str(s).split(",")]
    out = []
    for raw in items:
        e = raw.strip()
        host, sep, port = e.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RpcEndpointError(f"RPC server {raw!r} is not HOST:PORT (a port in 1..65535)")
        if ":" in host:
            raise RpcEndpointError(f"RPC server {raw!r}: llama.cpp's RPC client speaks IPv4 only (give a name or an IPv4 "
                           f"address)")
        out.append(f"{host}:{int(port)}")
    if not out:
        raise RpcEndpointError("no RPC server given")
    if len(set(out)) != len(out):
        raise RpcEndpointError(f"an RPC server is named twice in {','.join(out)}")
    return tuple(out)
