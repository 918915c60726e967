"""``SekvLlama``: a ``llama_cpp.Llama`` whose memory is a KV policy (SeKV by default), for user code and servers.

Everything ``Llama`` offers above its ``eval()`` keeps working (completions and chat, streaming, stop strings,
sampling, grammars and JSON response formats, logprobs of generated tokens): ``eval`` is the seam. A prompt's new
tokens are appended to the policy's memory, generated tokens are stepped, and llama-cpp-python's prefix reuse
truncates the memory instead of the cache. ``n_ctx`` is the *logical* context (default: the model's training
context); the device holds ``kv_budget`` cells. Conversations are kept in ``sekv_gguf.memory.Memories``: a
checkpoint at the end of each prompt, an LRU of memories, a scratch context for short side requests.

``save_state`` / ``load_state`` save and restore the live conversation's memory as a ``SekvState`` (a
``LlamaState``'s fields; its bytes a memory file, ``sekv_gguf.memory_file``); ``set_cache`` takes a
``SekvDiskCache`` (memory files on disk) or llama-cpp-python's ``LlamaRAMCache``; a pickle holds the constructor's
arguments and the live memory. What a compressed memory cannot hold is refused with a clear error:
llama-cpp-python's ``LlamaDiskCache`` (it pickles llama.cpp states), draft models, LoRA, embeddings, multimodal
chat handlers, ``logits_all``, prompt logprobs (``echo`` with ``logprobs``). ``type_k`` / ``type_v`` take f16, f32,
q8_0 and q4_0 (a ggml type id, as llama-cpp-python, or the name; docs/quantized-kv.md); other K/V cache types are
refused.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Generator, Iterator, Sequence

import llama_cpp
import numpy as np

from . import model_params
from .config import KV_TYPES, BudgetConfig, ContextConfig, SekvConfig
from .decode import decode_loop, forced
from .engine import make_policy
from .errors import RequestCancelled, SekvError
from .llm_state import SekvState
from .memory import MemoryConfig, Memories
from .memory_dir import MemoryDir, MemoryDirConfig
from .memory_file import MODES, Fingerprint, capture, memory_bytes, memory_from_bytes, restore_into
from .policies import POLICIES, Policy
from .router import TrainedRouter
from .stats import LlmStats, RequestCounts

THROWAWAY_CELLS = 256  # the context Llama.__init__ insists on making, closed at once (the policy owns the real one)
REPLY_RESERVE = 512  # reply tokens a request without max_tokens is assumed to need (whether it fits the scratch lane)


class UnsupportedError(SekvError, ValueError):
    """A ``Llama`` feature that cannot hold with a compressed memory."""


def _refuse(what: str) -> UnsupportedError:
    return UnsupportedError(f"{what} is not supported by SekvLlama: its memory is a compressed KV policy (use "
                            "llama_cpp.Llama for it)")


class _ContextView:
    """What ``Llama`` sees as ``self._ctx``: the active policy's context, with cache removal through the memory."""

    def __init__(self, llm: "SekvLlama"):
        self._llm = llm

    @property
    def ctx(self) -> Any:
        return self._llm.memories.active.session.ctx

    def n_ctx(self) -> int:
        return self._llm._logical

    def kv_cache_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return self._llm._truncate(p0)

    def kv_cache_clear(self) -> None:
        self._llm.memories.reset()

    def get_logits(self) -> Any:
        return llama_cpp.llama_get_logits(self.ctx)

    def reset_timings(self) -> None:
        llama_cpp.llama_perf_context_reset(self.ctx)

    def print_timings(self) -> None:
        llama_cpp.llama_perf_context_print(self.ctx)

    def decode(self, batch: Any) -> None:
        raise _refuse("decoding a raw batch")

    def close(self) -> None:
        """The policies' contexts are closed by ``SekvLlama.close``."""


def _kv_type(value: int | str | None, name: str) -> str:
    """``type_k`` / ``type_v`` as llama-cpp-python takes them (a ggml type id; here also its name) -> the
    ``ContextConfig`` name (None: f16); a type the engine does not read and write is refused, naming those it does."""
    if value is None:
        return "f16"
    names = {int(v): k for k, v in KV_TYPES.items()}
    if isinstance(value, str):
        if value.lower() in KV_TYPES:
            return value.lower()
    elif int(value) in names:
        return names[int(value)]
    raise ValueError(f"{name}={value!r} is not a K/V cache type SekvLlama reads and writes; supported: "
                     f"{', '.join(f'{k} ({int(v)})' for k, v in KV_TYPES.items())}")


def _no_template_handler(*args: Any, **kwargs: Any) -> Any:
    raise UnsupportedError("this model has no chat template (a base model): pass chat_format (llama-cpp-python's "
                           "names, e.g. 'gemma' for Gemma 3, 'chatml') or use plain completions")


class SekvLlama(llama_cpp.Llama):
    """``llama_cpp.Llama`` with a KV policy as its memory.

    Extra arguments: ``policy`` (a name of ``sekv_gguf.policies.POLICIES``), ``kv_budget`` (device cells, or a
    fraction of ``n_ctx``), ``prefill`` (SeKV's prefill mode), ``sekv`` (all of SeKV's parameters, a
    ``SekvConfig``; its ``prefill`` is used, the ``prefill`` argument must then be left out), ``adapter`` (a trained
    router GGUF for SeKV),
    ``memories`` (a ``MemoryConfig``), ``memory_dir`` (a ``MemoryDirConfig``: every conversation saved to disk
    after each request and at ``close``, and restored from there when a prompt continues it), ``rpc_servers``
    (``"HOST:PORT,..."`` of llama.cpp RPC servers that take the offloaded layers; ``n_gpu_layers`` says how many),
    ``rpc_timeout_s``, ``repack_weights`` (``ContextConfig``).
    ``n_ctx`` is the logical context (0: the model's training context); prompts longer than the device cells work up
    to it. ``counters`` says what each request evaluated and reused.
    """

    def __init__(self, model_path: str, *, policy: str = "sekv", kv_budget: float = BudgetConfig.kv_budget,
                 prefill: str = SekvConfig.prefill, sekv: SekvConfig | None = None, adapter: str | None = None,
                 memories: MemoryConfig | None = None, memory_dir: MemoryDirConfig | None = None,
                 n_ctx: int = 0, n_batch: int = 512, n_threads: int | None = None, n_gpu_layers: int = -1,
                 rpc_servers: str | Sequence[str] | None = None, rpc_timeout_s: float = ContextConfig.rpc_timeout_s,
                 repack_weights: bool = ContextConfig.repack_weights,
                 flash_attn: bool = True, type_k: int | str | None = None, type_v: int | str | None = None,
                 logits_all: bool = False, embedding: bool = False, lora_path: str | None = None,
                 draft_model: Any = None, chat_handler: Any = None, chat_format: str | None = None,
                 verbose: bool = False, **kwargs: Any):
        init = dict(locals())  # the constructor's arguments, for pickling (``__getstate__``)
        self._init_args = {**{k: v for k, v in init.items() if k not in ("self", "kwargs", "__class__")}, **kwargs}
        for bad, what in ((logits_all, "logits_all (logits of every prompt token)"), (embedding, "embedding"),
                          (lora_path, "LoRA (lora_path)"), (draft_model, "a draft model"),
                          (chat_handler is not None and hasattr(chat_handler, "clip_model_path"),
                           "a multimodal chat handler")):
            if bad:
                raise _refuse(what)
        cache_k, cache_v = _kv_type(type_k, "type_k"), _kv_type(type_v, "type_v")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
        if sekv is not None and (policy != "sekv" or prefill != SekvConfig.prefill):
            raise ValueError("sekv= holds SeKV's parameters (prefill among them): only for policy='sekv', and "
                             "without a separate prefill argument")
        if adapter is not None and policy != "sekv":
            raise ValueError(f"adapter is a router for the sekv policy, not for {policy}")
        kwargs.pop("n_ubatch", None)  # the policy's context decodes in batches of n_batch
        kwargs.setdefault("swa_full", False)  # the throwaway context stays small (and quiet) on iSWA models
        devices = ContextConfig(n_gpu_layers=n_gpu_layers, rpc_servers=rpc_servers or (),  # type: ignore[arg-type]
                                rpc_timeout_s=rpc_timeout_s, repack_weights=repack_weights)
        with model_params.for_llama(devices):
            super().__init__(model_path, n_ctx=THROWAWAY_CELLS, n_batch=min(n_batch, THROWAWAY_CELLS),
                             n_ubatch=min(n_batch, THROWAWAY_CELLS), n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                             flash_attn=flash_attn, chat_handler=chat_handler, chat_format=chat_format,
                             verbose=verbose, **kwargs)
        self._ctx.close()  # the throwaway context; the policy's context replaces it
        self.n_batch = n_batch
        n_train = self._model.n_ctx_train()
        logical = n_ctx or n_train
        if n_train > 0 and logical > n_train:
            raise ValueError(f"n_ctx {logical} exceeds the model's training context of {n_train}")
        # the logical context in tokens (device cells are n_cells()); llama-cpp-python's Llama reads it as _n_ctx
        self._n_ctx = self._logical = logical
        self.input_ids = np.zeros(logical, dtype=np.intc)
        self.policy_name = policy
        ctx_config = ContextConfig(n_threads=self.context_params.n_threads, flash_attn=flash_attn,
                                   type_k=cache_k, type_v=cache_v,
                                   n_gpu_layers=n_gpu_layers, rpc_servers=devices.rpc_servers,
                                   rpc_timeout_s=rpc_timeout_s, repack_weights=repack_weights, verbose=verbose)
        budget = BudgetConfig(kv_budget=kv_budget, chunk=n_batch)
        params = (sekv or SekvConfig(prefill=prefill)) if policy == "sekv" else None
        # ``adapter``, else the router the model file carries (adapter.embed)
        router = TrainedRouter.of_model(adapter, model_path, self.metadata) if policy == "sekv" else None
        mem = memories or MemoryConfig()
        self.memories = Memories(
            lambda: make_policy(policy, self._model, logical, ctx_config, budget, params, router),
            lambda: make_policy("full", self._model, mem.scratch_tokens, ctx_config, BudgetConfig(chunk=n_batch)),
            mem, MemoryDir(memory_dir) if memory_dir is not None else None)
        self._ctx = _ContextView(self)
        if self.chat_handler is None and chat_format is None and not any(
                k.startswith("tokenizer.chat_template") for k in self.metadata):
            self.chat_handler = _no_template_handler  # never llama-cpp-python's silent llama-2 fallback
        self._phase = "prompt"
        self._sampled: list[int] = []  # tokens sampled in the current request
        self._reply_hint = REPLY_RESERVE  # tokens the current request may generate (the scratch lane's margin)
        self._rows: dict[int, np.ndarray] | None = None  # logits rows kept for logprobs (position -> [n_vocab])
        self.counters = RequestCounts()
        # set from another thread to end the current request: generation ends at the next token (finish "stop"),
        # a prompt under evaluation at the next chunk (RequestCancelled; the memory is then emptied). A server
        # gives each request its own event here while that request holds the model.
        self.cancel = threading.Event()

    # -- the seam ----------------------------------------------------------------------------------------------

    def eval(self, tokens: Sequence[int]) -> None:
        """Append a prompt's new tokens to the memory (the first call of a generation) or step generated ones."""
        tokens = [int(t) for t in tokens]
        memory = self.memories
        if not tokens:
            self._phase = "generate"
            return
        n0 = self.n_tokens
        if n0 + len(tokens) > self._logical:
            raise ValueError(f"Requested tokens ({n0 + len(tokens)}) exceed context window of {self._logical}")
        try:
            if self._phase == "prompt":
                self.counters.cached_tokens = n0
                self.counters.evaluated_tokens = len(tokens)
                memory.active.append(tokens)
                memory.mark_prompt()
                self._phase = "generate"
            else:
                decode_loop(memory.active.step, np.zeros(0, dtype=np.float32), len(tokens), forced(tokens),
                            after_step=lambda k, logits: self._keep_row())
        except BaseException:
            memory.reset()  # the memory may be half updated
            self.n_tokens = 0
            self._requires_eval = True
            raise
        self.input_ids[n0:n0 + len(tokens)] = tokens
        self.n_tokens = n0 + len(tokens)
        if self._phase == "generate" and self._rows is not None and self.n_tokens - 1 not in self._rows:
            self._keep_row()
        self._requires_eval = False
        assert memory.active.n_tokens == self.n_tokens, (memory.active.n_tokens, self.n_tokens)

    def _keep_row(self) -> None:
        if self._rows is not None:
            ptr = llama_cpp.llama_get_logits_ith(self._ctx.ctx, -1)
            self._rows[self.memories.active.n_tokens - 1] = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()

    def _truncate(self, n: int) -> bool:
        ok = self.memories.truncate(n)
        if ok:
            self.n_tokens = n
        return ok

    def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Generator[int, Any, None]:
        """``Llama.generate`` on the memory that best serves ``tokens`` (``Memories.select``)."""
        tokens = list(tokens)
        active = self.memories.select(tokens, self._reply_hint)
        if active.tokens != list(self.input_ids[:self.n_tokens]):  # another memory is live now
            self.n_tokens = active.n_tokens
            self.input_ids[:self.n_tokens] = active.tokens
            self._requires_eval = True
        self._phase = "prompt"
        self._sampled = []
        active.observer = self._observe
        self.counters.requests += 1
        self.counters.prompt_tokens = len(tokens)
        try:
            return (yield from super().generate(tokens, *args, **kwargs))
        finally:
            if self.memories.active is self.memories.live:
                self.memories.end_turn()  # queued for the memory directory, when there is one
            else:  # a side request's context goes back
                self.memories.end_request()
                self.n_tokens = self.memories.live.n_tokens
                self.input_ids[:self.n_tokens] = self.memories.live.tokens
                self._requires_eval = True

    def reset(self) -> None:
        super().reset()
        self.memories.reset()

    def n_ctx(self) -> int:
        """The logical context: the most tokens a prompt and its reply may hold."""
        return self._logical if hasattr(self, "_logical") else super().n_ctx()

    def n_cells(self) -> int:
        """Device cells of the active memory's context."""
        return int(self.memories.active.session.hook.info.kv_size)

    # -- completions -------------------------------------------------------------------------------------------

    def _create_completion(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """``Llama._create_completion`` with logprobs of generated tokens from kept rows, the logical context in
        the too-long error, and ``usage.prompt_tokens_details.cached_tokens``."""
        logprobs = kwargs.get("logprobs")
        if logprobs is not None and kwargs.get("echo"):
            raise _refuse("prompt logprobs (echo with logprobs)")
        stream = kwargs.get("stream", False)
        max_tokens = kwargs.get("max_tokens")
        self._reply_hint = max_tokens if max_tokens is not None and max_tokens > 0 else REPLY_RESERVE
        self._rows = {} if logprobs is not None else None
        if logprobs is not None and not stream:
            kwargs["logprobs"] = None  # computed here from the kept rows, not from every prompt token's logits
        self._logits_all = logprobs is not None and stream  # the stream path reads rows by index (``_scores``)
        try:
            for chunk in super()._create_completion(*args, **kwargs):
                if "usage" in chunk:
                    chunk["usage"]["prompt_tokens_details"] = {"cached_tokens": self.counters.cached_tokens}
                    if logprobs is not None and not stream:
                        chunk["choices"][0]["logprobs"] = self._logprobs(chunk, logprobs)
                yield chunk
        except ValueError as e:
            if str(e).startswith("Requested tokens"):  # upstream names the device cells, not the logical limit
                n = str(e).split("(")[1].split(")")[0]
                raise ValueError(f"Requested tokens ({n}) exceed context window of {self._logical}") from None
            raise
        finally:
            self._logits_all = False
            self._rows = None

    @property
    def _scores(self) -> "_KeptRows":
        return _KeptRows(self)

    def _logprobs(self, completion: dict, top: int) -> dict:
        """The completion's logprobs (generated tokens only), as llama-cpp-python shapes them."""
        n_prompt = completion["usage"]["prompt_tokens"]
        toks = self._sampled[:completion["usage"]["completion_tokens"]]
        out: dict[str, list] = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
        offset = 0
        for i, t in enumerate(toks):
            row = self._rows.get(n_prompt + i - 1)
            if row is None:
                break
            lp = llama_cpp.Llama.logits_to_logprobs(row.astype(np.float64))
            piece = self.detokenize([t], prev_tokens=toks[:i]).decode("utf-8", errors="ignore")
            best = np.argsort(-lp)[:top]
            out["tokens"].append(piece)
            out["text_offset"].append(offset)
            out["token_logprobs"].append(float(lp[t]))
            tops = {self.detokenize([int(j)], prev_tokens=toks[:i]).decode("utf-8", errors="ignore"): float(lp[j])
                    for j in best}
            tops[piece] = float(lp[t])
            out["top_logprobs"].append(tops)
            offset += len(piece)
        return out

    def _observe(self, policy: Policy) -> None:
        """The active policy's progress callback (after each prompt chunk): where a cancelled prompt stops."""
        if self.cancel.is_set() and policy.phase != "decode":
            raise RequestCancelled("the request was cancelled while its prompt was evaluated")

    def sample(self, *args: Any, **kwargs: Any) -> int:
        if self.cancel.is_set():  # end the reply here, as the model would with its end-of-generation token
            token = self.token_eos()
            self._sampled.append(int(token))
            return token
        token = super().sample(*args, **kwargs)
        self._sampled.append(int(token))  # the last one is never evaluated (it ended the reply)
        return token

    # -- saved memories ----------------------------------------------------------------------------------------

    def save_state(self, mode: str = "lossless", extra: Any = None) -> SekvState:
        """The live conversation's memory as a ``SekvState`` (``mode``: ``lossless``, ``compact`` or ``compact3``,
        docs/memory-files.md; ``extra``: plain data saved with it, e.g. a chat's messages); ``state.save(path)``
        writes it as a memory file."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        live = self.memories.live
        saved = capture(live, mode)
        if extra is not None:
            saved.content["extra"] = extra
        return SekvState.of(live.tokens, memory_bytes(saved), self._n_vocab, self._seed)

    def load_state(self, state: Any) -> None:
        """Make the memory of ``state`` (a ``SekvState``, or any object whose ``llama_state`` holds a memory file's
        bytes) the live one; the conversation it replaces is kept among the saved memories. A state of another
        model, policy, budget, K/V types, batch sizes or settings raises ``MemoryMismatchError``; a damaged one
        ``MemoryFileError``."""
        data = getattr(state, "llama_state", None)
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"load_state takes a SekvState (SekvLlama.save_state), not {type(state).__name__}")
        saved = memory_from_bytes(bytes(data), "the saved state")
        memories = self.memories
        memories.end_request()
        saved.fingerprint.check_fits(Fingerprint.of(memories.live), "the saved state")  # before anything changes
        if memories.live.tokens != saved.tokens:
            memories.set_aside()
        try:
            restore_into(memories.live, saved, "the saved state")
        finally:
            memories.checkpoint = None
            memories.active = memories.live
            self.n_tokens = memories.live.n_tokens
            self.input_ids[:self.n_tokens] = memories.live.tokens
            self._requires_eval = True  # the next prompt evaluates at least its last token: fresh logits
        if getattr(state, "seed", None) is not None:
            self._seed = state.seed

    def set_cache(self, cache: Any) -> None:
        """A prompt cache: a ``SekvDiskCache`` or a ``LlamaRAMCache`` (holding ``SekvState`` s); None: none."""
        if cache is not None and (isinstance(cache, llama_cpp.LlamaDiskCache)
                                  or not isinstance(cache, llama_cpp.llama_cache.BaseLlamaCache)):
            raise _refuse(f"set_cache with a {type(cache).__name__} (llama-cpp-python's disk cache pickles llama.cpp "
                          "states; use sekv_gguf.SekvDiskCache)")
        self.cache = cache

    # -- refused -----------------------------------------------------------------------------------------------

    def create_embedding(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("embeddings")

    def embed(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("embeddings")

    def __getstate__(self) -> dict[str, Any]:
        """What a pickle holds: the constructor's arguments (as ``Llama``'s pickles do) and the live conversation's
        memory as a memory file's bytes (lossless), so that the unpickled model goes on from it."""
        live = self.memories.live
        return {"init": dict(self._init_args), "memory": self.save_state().llama_state if live.n_tokens else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["init"])
        if state["memory"] is not None:
            self.load_state(SekvState.of([], state["memory"], self._n_vocab, None))

    # -- reporting and closing ---------------------------------------------------------------------------------

    def stats(self) -> LlmStats:
        """Device and host bytes, the live memory's size and spans, the last request's counters."""
        live = self.memories.live
        return LlmStats(policy=self.policy_name, n_ctx=self._logical, device_cells=self.n_cells(),
                        tokens=live.n_tokens, memories_host_bytes=self.memories.host_bytes,
                        saved_memories=len(self.memories.saved), request=replace(self.counters),
                        memories=replace(self.memories.counters), live=live.stats())

    @property
    def model_name(self) -> str:
        return Path(self.model_path).stem

    def close(self) -> None:
        memories = getattr(self, "memories", None)
        if memories is not None:
            memories.close()
            self.memories = None
        if hasattr(self, "_stack"):  # a refused construction never reached Llama.__init__
            super().close()


class _KeptRows:
    """``Llama._scores`` (a row per position): the logits rows kept during this request (generated tokens, when
    logprobs are asked for); other rows read as zeros, as llama-cpp-python's own rows do without ``logits_all``."""

    def __init__(self, llm: SekvLlama):
        self._llm = llm

    def __getitem__(self, key: Any) -> np.ndarray:
        i = key[0] if isinstance(key, tuple) else key
        if not isinstance(i, (int, np.integer)):
            raise _refuse("logits of prompt tokens")
        i = int(i) + (self._llm.n_tokens if i < 0 else 0)
        row = (self._llm._rows or {}).get(i)
        return row if row is not None else np.zeros(self._llm._n_vocab, dtype=np.float32)
