"""``SekvLlama`` in llama-cpp-python's own server (``python -m llama_cpp.server``, docs/serving.md).

``scripts/setup.sh`` applies ``patches/python/0001-server-kv-policy.patch`` to llama-cpp-python's server: its
``ModelSettings`` (the source of the server's flags and of each model entry of a ``--config_file``) gains
``kv_policy``, ``kv_budget``, ``prefill``, ``lexical_share``, ``memory_dir`` and ``memory_dir_bytes``
(``SEKV_SETTINGS``, all None by default: ``llama_cpp.Llama`` as before). With any of them set, the settings'
validation calls ``check_settings`` (a ``ValueError`` naming the first setting ``SekvLlama`` cannot honour, at
start-up, for every model of a config file) and the model proxy loads the model with ``load_sekv_llama`` (on every
swap back to it, too). Nothing here is imported by a server that does not use these settings.
"""

from __future__ import annotations

import sys
from typing import Any

from .config import SekvConfig
from .llm import SekvLlama
from .memory_dir import MemoryDirConfig
from .policies import POLICIES

SEKV_SETTINGS = ("kv_policy", "kv_budget", "prefill", "lexical_share", "memory_dir", "memory_dir_bytes")
# the SekvConfig fields among them (SeKV's parameters: only with kv_policy sekv)
SEKV_CONFIG_SETTINGS = ("prefill", "lexical_share")

# chat formats whose handlers llama-cpp-python's server builds itself: a CLIP model (refused by SekvLlama) or a
# Hugging Face tokenizer (not wired here)
REFUSED_CHAT_FORMATS = ("llava-1-5", "obsidian", "llava-1-6", "mtmd", "gemma4", "moondream", "nanollava",
                        "llama-3-vision-alpha", "minicpm-v-2.6", "qwen2.5-vl", "hf-autotokenizer",
                        "hf-tokenizer-config")

# settings SekvLlama cannot honour, refused when they differ from llama-cpp-python's default (what is wrong with them)
_REFUSED = {
    "vocab_only": "a SekvLlama always has a memory",
    "embedding": "embeddings are not supported by SekvLlama",
    "lora_base": "LoRA is not supported by SekvLlama",
    "lora_path": "LoRA is not supported by SekvLlama",
    "clip_model_path": "multimodal chat handlers are not supported by SekvLlama",
    "draft_model": "draft models are not supported by SekvLlama",
    "hf_model_repo_id": "download the GGUF and give its path as model",
    "hf_pretrained_model_name_or_path": "Hugging Face tokenizers are not wired into SekvLlama",
    "hf_tokenizer_config_path": "Hugging Face tokenizer configs are not wired into SekvLlama",
    "offload_kqv": "the policy's context keeps llama.cpp's default (True)",
    "rope_scaling_type": "the policy's context uses the model's RoPE settings",
    "rope_freq_base": "the policy's context uses the model's RoPE settings",
    "rope_freq_scale": "the policy's context uses the model's RoPE settings",
    "yarn_ext_factor": "the policy's context uses the model's RoPE settings",
    "yarn_attn_factor": "the policy's context uses the model's RoPE settings",
    "yarn_beta_fast": "the policy's context uses the model's RoPE settings",
    "yarn_beta_slow": "the policy's context uses the model's RoPE settings",
    "yarn_orig_ctx": "the policy's context uses the model's RoPE settings",
}


def _refuse(name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{name}={value!r} cannot be used with kv_policy (sekv_gguf's SekvLlama): {why}")


def check_settings(settings: Any) -> None:
    """Raise ``ValueError`` naming the first of ``settings`` (llama-cpp-python's ``ModelSettings``) that
    ``SekvLlama`` cannot honour. Settings left at llama-cpp-python's defaults are never refused; its default
    ``logits_all=True`` becomes False (refused only when given explicitly)."""
    fields = type(settings).model_fields
    given = settings.model_fields_set
    if settings.kv_policy is None:
        other = [name for name in SEKV_SETTINGS[1:] if getattr(settings, name) is not None]
        if other:
            raise ValueError(f"{other[0]} is a setting of sekv_gguf's SekvLlama: set kv_policy too (e.g. sekv)")
        return
    if settings.kv_policy not in POLICIES:
        raise ValueError(f"kv_policy={settings.kv_policy!r} is not a KV policy; choose from {sorted(POLICIES)}")
    if settings.kv_budget is not None and not settings.kv_budget > 0:
        raise ValueError(f"kv_budget={settings.kv_budget!r}: device cells (> 1) or a fraction of n_ctx (0 < f <= 1)")
    given_sekv = _given_sekv(settings)
    if given_sekv and settings.kv_policy != "sekv":
        raise ValueError(f"{next(iter(given_sekv))} is a parameter of SeKV: only for kv_policy sekv, not "
                         f"{settings.kv_policy}")
    _config_of(given_sekv)  # SekvConfig's own checks (a prefill mode, lexical_share in [0, 1])
    if settings.memory_dir_bytes is not None and settings.memory_dir is None:
        raise ValueError("memory_dir_bytes caps memory_dir: set memory_dir too")
    if settings.memory_dir is not None:
        _memory_dir(settings)  # its own checks (a path, max_bytes >= 0)
    for name, why in _REFUSED.items():
        value = getattr(settings, name)
        if value != fields[name].default:
            raise _refuse(name, value, why)
    if settings.chat_format in REFUSED_CHAT_FORMATS:
        raise _refuse("chat_format", settings.chat_format, "its handler is multimodal or a Hugging Face tokenizer")
    if "logits_all" in given and settings.logits_all:
        raise _refuse("logits_all", True, "logits of every prompt token are not kept by a compressed memory")
    if "n_ubatch" in given and settings.n_ubatch != settings.n_batch:
        raise _refuse("n_ubatch", settings.n_ubatch, "the policy's context decodes in batches of n_batch")
    if "n_threads_batch" in given and settings.n_threads_batch != settings.n_threads:
        raise _refuse("n_threads_batch", settings.n_threads_batch, "the policy's context uses n_threads for both")
    if settings.cache and settings.cache_type == "disk":
        raise _refuse("cache_type", "disk", "llama-cpp-python's disk cache pickles llama.cpp states; use memory_dir")


def _given_sekv(settings: Any) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in SEKV_CONFIG_SETTINGS if getattr(settings, name) is not None}


def _sekv_config(settings: Any) -> SekvConfig | None:
    """The ``SekvConfig`` of the settings' SeKV parameters (``SEKV_CONFIG_SETTINGS``; the rest at its defaults), or
    None when none is set."""
    return _config_of(_given_sekv(settings))


def _config_of(given: dict[str, Any]) -> SekvConfig | None:
    """``SekvConfig(**given)``, its error naming the settings given; None for none."""
    if not given:
        return None
    try:
        return SekvConfig(**given)
    except ValueError as e:
        raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())}: {e}") from None


def _memory_dir(settings: Any) -> MemoryDirConfig:
    try:
        if settings.memory_dir_bytes is None:
            return MemoryDirConfig(settings.memory_dir)
        return MemoryDirConfig(settings.memory_dir, max_bytes=settings.memory_dir_bytes)
    except ValueError as e:
        raise ValueError(f"memory_dir={settings.memory_dir!r}, memory_dir_bytes={settings.memory_dir_bytes!r}: "
                         f"{e}") from None


def _kv_overrides(items: list[str] | None) -> dict[str, bool | int | float | str] | None:
    """``kv_overrides`` as llama-cpp-python's server parses them (``key=type:value``)."""
    if items is None:
        return None
    out: dict[str, bool | int | float | str] = {}
    for kv in items:
        key, value = kv.split("=")
        if ":" in value:
            kind, value = value.split(":")
            casts = {"bool": lambda v: v.lower() in ("true", "1"), "int": int, "float": float, "str": str}
            if kind not in casts:
                raise ValueError(f"Unknown value type {kind}")
            out[key] = casts[kind](value)
    return out


class ServedSekvLlama(SekvLlama):
    """``SekvLlama`` as llama-cpp-python's server runs it. That server has no ``/sekv/stats``: with ``verbose`` (its
    default) each request ends with one line on stderr, ``sekv: ...``, saying what the memory reused and what the
    memory directory did."""

    def _create_completion(self, *args: Any, **kwargs: Any) -> Any:
        try:
            yield from super()._create_completion(*args, **kwargs)
        finally:
            if self.verbose and self.memories is not None:
                r, m = self.counters, self.memories.counters
                print(f"sekv: policy {self.policy_name}, {self.n_cells()} device cells, n_ctx {self._logical}: "
                      f"request {r.requests}, prompt {r.prompt_tokens} tokens, {r.cached_tokens} reused, "
                      f"{r.evaluated_tokens} evaluated; memory dir: {m.disk_restores} restores, "
                      f"{m.disk_saves} saves", file=sys.stderr, flush=True)


def load_sekv_llama(settings: Any) -> SekvLlama:
    """A ``SekvLlama`` for llama-cpp-python's ``ModelSettings`` (what ``LlamaProxy`` loads when ``kv_policy`` is
    set); the settings ``SekvLlama`` cannot honour raise ``ValueError`` (``check_settings``)."""
    import llama_cpp

    check_settings(settings)
    if settings.kv_policy is None:
        raise ValueError("load_sekv_llama needs kv_policy")
    given = settings.model_fields_set
    kwargs: dict[str, Any] = dict(
        policy=settings.kv_policy, n_ctx=settings.n_ctx, n_batch=settings.n_batch, n_threads=settings.n_threads,
        n_gpu_layers=settings.n_gpu_layers, split_mode=settings.split_mode, main_gpu=settings.main_gpu,
        tensor_split=settings.tensor_split, use_mmap=settings.use_mmap, use_mlock=settings.use_mlock,
        kv_overrides=_kv_overrides(settings.kv_overrides), rpc_servers=settings.rpc_servers, seed=settings.seed,
        last_n_tokens_size=settings.last_n_tokens_size, numa=settings.numa, chat_format=settings.chat_format,
        type_k=settings.type_k, type_v=settings.type_v, verbose=settings.verbose)
    if settings.kv_budget is not None:
        kwargs["kv_budget"] = settings.kv_budget
    sekv = _sekv_config(settings)
    if sekv is not None:
        kwargs["sekv"] = sekv
    if settings.memory_dir is not None:
        kwargs["memory_dir"] = _memory_dir(settings)
    if "flash_attn" in given:  # llama-cpp-python's default is off, SekvLlama's on
        kwargs["flash_attn"] = settings.flash_attn
    llm = ServedSekvLlama(settings.model, **kwargs)
    if settings.chat_template_kwargs:  # as llama-cpp-python's server does it
        base = (llm.chat_handler or llm._chat_handlers.get(llm.chat_format)
                or llama_cpp.llama_chat_format.get_chat_completion_handler(llm.chat_format))
        extra = dict(settings.chat_template_kwargs)

        def chat_handler_with_kwargs(*args: Any, **kw: Any) -> Any:
            return base(*args, **{**extra, **kw})

        llm.chat_handler = chat_handler_with_kwargs
    if settings.cache:  # "ram" (a disk cache is refused above): LlamaRAMCache holds SekvStates
        if settings.verbose:
            print(f"Using ram cache with size {settings.cache_size}", file=sys.stderr)
        llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=settings.cache_size))
    return llm
