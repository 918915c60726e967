"""A llama.cpp model + context driven with explicit positions (llama-cpp-python's ``Llama`` caps positions at n_ctx).

``Session.open(path)`` loads a model; ``Session.from_llama(llm)`` adds a context to the model a ``llama_cpp.Llama``
already holds (no reload). Either way the session owns its context, decodes token chunks at given positions and
exposes the KV hook of that context.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import llama_cpp
import llama_cpp._internals as _internals
import llama_cpp._logger as _llama_logger

from .config import KV_TYPES, MIB, ContextConfig, round_cells
from . import _threadpool, interrupt, model_params
from .errors import ModelError, SekvError
from . import kv_codec, native, support
from .hook import KVHook

GGUF_MAGIC = b"GGUF"
SWA_CELL_PAD = 256  # llama.cpp pads an iSWA model's sliding-window cache to a multiple of this (llama-kv-cache-iswa.cpp)


def swa_cache_cells(n_swa: int, n_ubatch: int) -> int:
    """Cells of an iSWA model's sliding-window cache in one sequence's context (llama.cpp's rule, with patches/0003:
    ``n_swa + n_ubatch`` rounded up to ``SWA_CELL_PAD``)."""
    return -(-(n_swa + n_ubatch) // SWA_CELL_PAD) * SWA_CELL_PAD


def swa_ubatch(n_swa: int, redo: int, least: int) -> int:
    """The smallest ubatch of at least ``least`` tokens whose sliding-window cache keeps the ``n_swa`` positions
    before the newest ``redo`` ones, so that those can be removed and decoded again (``Session.swa_redo``)."""
    return max(least, SWA_CELL_PAD * (-(-(n_swa + redo) // SWA_CELL_PAD) - 1) + 1 - n_swa)


def check_gguf_file(path: str | Path) -> Path:
    """The path, if it names a readable GGUF file; else a ``ModelError`` that says what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelError(f"model path is not a file: {p}")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{p} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    return p


def load_model(path: str | Path, config: ContextConfig | None = None) -> _internals.LlamaModel:
    """Load a GGUF model (weights shared by every session created over it)."""
    config = config or ContextConfig()
    p = check_gguf_file(path)
    _llama_logger.set_verbose(config.verbose)
    with model_params.params(config) as mparams:
        try:
            return _internals.LlamaModel(path_model=str(p), params=mparams, verbose=config.verbose)
        except ValueError as e:
            where = f" onto RPC servers {','.join(config.rpc_servers)}" if config.rpc_servers else ""
            raise ModelError(f"llama.cpp could not load {p}{where} (corrupt file, unsupported architecture, or a "
                             f"device out of memory): {e}") from e


def apply_chat_template(model: _internals.LlamaModel, text: str) -> str:
    """``text`` as one user turn in the model's chat template (with the assistant turn opened)."""
    tmpl = llama_cpp.llama_model_chat_template(model.model, None)
    if not tmpl:
        raise ModelError("the model has no chat template (a base model): run without --chat")
    msg = llama_cpp.llama_chat_message(role=b"user", content=text.encode("utf-8"))
    arr = (llama_cpp.llama_chat_message * 1)(msg)
    size = max(4 * len(text) + 256, 1024)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(tmpl, arr, 1, True, buf, size)
        if n < 0:
            raise ModelError("the model's chat template could not be applied")
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    raise ModelError("the model's chat template could not be applied")


def check_kv_types(model: _internals.LlamaModel, config: ContextConfig) -> None:
    """Refuse a quantized K/V cache (``config.type_k`` / ``type_v``) whose head sizes are not whole blocks of its
    type, naming them (llama.cpp's own refusal is only a log line). Head sizes from the GGUF metadata (key / value
    length, else embedding length / heads); a model that states neither is left to llama.cpp."""
    meta = model.metadata()
    arch = meta.get("general.architecture", "")
    heads = meta.get(f"{arch}.attention.head_count", "")
    width = meta.get(f"{arch}.embedding_length", "")
    fallback = str(int(width) // int(heads)) if width.isdigit() and heads.isdigit() and int(heads) else ""
    for name, key in (("type_k", "key_length"), ("type_v", "value_length")):
        type_id = KV_TYPES[getattr(config, name)]
        size = meta.get(f"{arch}.attention.{key}", fallback)
        block = kv_codec.block_values(type_id)
        if size.isdigit() and int(size) % block:
            raise SekvError(f"{name} {getattr(config, name)} stores {block}-value blocks, and this model's "
                            f"{'K' if name == 'type_k' else 'V'} head size {size} is not a multiple of {block}: use "
                            "f16 for it")


def output_rows(config: ContextConfig, n_vocab: int) -> int:
    """Logits rows one llama_decode of a context with ``config`` returns at most: ``logits_mib`` of f32 rows over
    ``n_vocab`` tokens, at least one, at most the batch (what llama.cpp reserves its logits buffers for)."""
    rows = int(config.logits_mib * MIB // (4 * n_vocab)) if config.logits_mib else config.n_batch
    return max(1, min(rows, config.n_batch))


class Session:
    """One llama_context (sequence 0) with explicit-position decoding and its ``KVHook``."""

    def __init__(self, model: _internals.LlamaModel, config: ContextConfig, owner: object | None = None):
        self.config = config
        self.model = model
        self._owner = owner
        _llama_logger.set_verbose(config.verbose)

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = config.n_ctx
        params.n_batch = config.n_batch
        params.n_ubatch = config.n_ubatch
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(model.vocab)
        # logits rows per decode: what the compute and output buffers are sized for (never the whole batch's)
        self.n_outputs = output_rows(config, self.n_vocab)
        params.n_outputs_max = self.n_outputs
        params.n_seq_max = 1
        params.n_threads = config.threads
        params.n_threads_batch = config.threads
        params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn
                                  else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.swa_full = config.swa_full
        check_kv_types(model, config)
        params.type_k = KV_TYPES[config.type_k]
        params.type_v = KV_TYPES[config.type_v]
        params.no_perf = True
        try:
            self.context = _internals.LlamaContext(model=model, params=params, verbose=config.verbose)
        except ValueError as e:
            raise SekvError(f"llama.cpp could not create a context with {config}: {e}") from e
        self._pool: int | None = None
        if config.poll is not None:  # our own thread pool, for its polling level
            self._pool = _threadpool.new_pool(config.threads, config.poll)
            _threadpool.attach(self.context.ctx, self._pool)

        self.n_batch = llama_cpp.llama_n_batch(self.context.ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        # views over the batch arrays; every token is in sequence 0
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            self._batch.seq_id[i][0] = 0
        self._hook: KVHook | None = None
        # an encoder-decoder model's decoder needs llama_encode first, which nothing here calls: llama.cpp aborts
        self._needs_encoder = bool(llama_cpp.llama_model_has_encoder(model.model))
        self.decoded_tokens = 0  # tokens through llama_decode so far (what a memory's reuse saves is read here)
        self.output_rows = 0     # logits rows those decodes computed (each one a pass through the output layer)

    # -- construction ------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, config: ContextConfig | None = None) -> "Session":
        """Load the GGUF model at ``path`` and create a context for it."""
        config = config or ContextConfig()
        return cls(load_model(path, config), config)

    @classmethod
    def from_llama(cls, llm: Any, config: ContextConfig | None = None) -> "Session":
        """A new context on the model of a ``llama_cpp.Llama`` (the model is shared, not reloaded)."""
        return cls(llm._model, config or ContextConfig(), owner=llm)

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._hook = None
        self.context.close()
        if self._pool is not None:  # after the context that used it
            _threadpool.free_pool(self._pool)
            self._pool = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- properties --------------------------------------------------------------------------------------------

    @property
    def ctx(self) -> int:
        """The raw ``llama_context *``."""
        return self.context.ctx

    @property
    def hook(self) -> KVHook:
        """The context's ``KVHook``; an ``UnsupportedModelError`` naming the architecture and the reason where SeKV
        cannot serve the model (``support``)."""
        if self._hook is None:
            self._hook = support.open_hook(self.model, self.ctx, owner=self)
        return self._hook

    @property
    def memory(self) -> Any:
        return self.context.memory

    def pos_max(self, seq: int = 0) -> int:
        """Largest position of ``seq`` in the memory (-1 when empty); the next token goes at ``pos_max() + 1``."""
        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, seq))

    # -- text --------------------------------------------------------------------------------------------------

    def swa_reach(self) -> int:
        """The earliest position decoding can go on from once later positions are removed: the sliding-window cache
        of an iSWA model must still hold the window before it (llama.cpp keeps every position from its smallest to
        its largest and overwrites the oldest once the cache, n_swa + n_ubatch cells, is full); 0 without one or
        while it still holds position 0."""
        info = self.hook.info
        if not info.is_iswa:
            return 0
        p_min = int(llama_cpp.llama_memory_seq_pos_min(self.memory, 0))
        return 0 if p_min <= 0 else p_min + info.n_swa

    def swa_covers(self, n: int) -> bool:
        """Whether decoding can go on from position ``n`` once later positions are removed (``swa_reach``)."""
        return n >= self.swa_reach()

    def swa_redo(self) -> int:
        """How many of the newest positions can be removed and decoded again (``swa_reach``); at least one."""
        return max(1, self.pos_max() + 1 - self.swa_reach())

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)

    def piece(self, token: int) -> bytes:
        """The bytes of one token (a UTF-8 character may span several tokens)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.model.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.model.vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def text(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (their pieces joined, invalid UTF-8 replaced)."""
        return b"".join(self.piece(int(t)) for t in tokens).decode("utf-8", "replace")

    # -- decoding ----------------------------------------------------------------------------------------------

    def _decode_chunk(self, chunk: np.ndarray, start: int, outputs: Literal["last", "all", "none"]) -> None:
        """One ``llama_decode`` of at most n_batch tokens at positions start, start+1, ..."""
        if self._needs_encoder:
            raise ModelError(f"architecture {support.architecture(self.model)!r} cannot be decoded here: "
                             f"{support.ENCODER_DECODER}")
        n = chunk.size
        self._tok[:n] = chunk
        self._pos[:n] = np.arange(start, start + n, dtype=np.int32)
        self._out[:n] = 1 if outputs == "all" else 0
        if outputs == "last":
            self._out[n - 1] = 1
        self._batch.n_tokens = n
        self.decoded_tokens += n
        self.output_rows += n if outputs == "all" else int(outputs == "last")
        rc = llama_cpp.llama_decode(self.ctx, self._batch)
        interrupt.check()  # a Ctrl-C that llama.cpp's log callback swallowed during the decode
        if rc != 0:
            raise SekvError(f"llama_decode returned {rc} at positions {start}..{start + n - 1}"
                            + (" (no free KV cell: the cache is full)" if rc == 1 else ""))

    def _check_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        toks = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if toks.size == 0:
            raise ValueError("decode: no tokens")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError(f"decode: token ids must be in [0, {self.n_vocab})")
        return toks

    def decode(self, tokens: Sequence[int], pos0: int | None = None,
               logits: Literal["last", "all", "none"] = "last") -> np.ndarray | None:
        """Decode ``tokens`` at positions ``pos0, pos0+1, ...`` (default: after the newest one), in chunks of n_batch.

        Returns float32 logits: [n_vocab] for the last token, [n, n_vocab] for all, or None.
        """
        toks = self._check_tokens(tokens)
        start = self.pos_max() + 1 if pos0 is None else int(pos0)
        rows: list[np.ndarray] = []
        step = self.n_outputs if logits == "all" else self.n_batch  # every row wanted: pieces of n_outputs
        for c0 in range(0, toks.size, step):
            chunk = toks[c0:c0 + step]
            last = logits == "last" and c0 + chunk.size == toks.size
            self._decode_chunk(chunk, start + c0, "all" if logits == "all" else "last" if last else "none")
            if logits == "all":
                ptr = llama_cpp.llama_get_logits(self.ctx)
                rows.append(np.ctypeslib.as_array(ptr, shape=(chunk.size, self.n_vocab)).copy())
        if logits == "none":
            return None
        if logits == "all":
            return np.concatenate(rows, axis=0)
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def decode_scored(self, tokens: Sequence[int], prev_logits: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Decode ``tokens`` after the newest one; their surprisal (nats) and the last token's logits [n_vocab].

        Surprisal of token i comes from the logits row of token i-1, read in llama.cpp's buffer piece by piece of
        ``n_outputs`` tokens (never a prompt x vocab matrix); token 0's from ``prev_logits`` (0 when None).
        """
        toks = self._check_tokens(tokens)
        start = self.pos_max() + 1
        surp = np.zeros(toks.size, dtype=np.float32)
        prev = prev_logits
        for c0 in range(0, toks.size, self.n_outputs):
            chunk = toks[c0:c0 + self.n_outputs]
            self._decode_chunk(chunk, start + c0, "all")
            address = ctypes.cast(llama_cpp.llama_get_logits(self.ctx), ctypes.c_void_p).value
            if prev is not None:
                surp[c0] = native.surprisal(prev[None, :], chunk[:1])[0]
            surp[c0 + 1:c0 + chunk.size] = native.surprisal_at(address, chunk.size - 1, self.n_vocab, chunk[1:])
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, chunk.size - 1),
                                        shape=(self.n_vocab,))
            prev = row.copy()
        return surp, prev


def full_kv_bytes(session: Session, n_tokens: int, n_ubatch: int) -> int:
    """Bytes llama.cpp would allocate for full KV of ``n_tokens`` (``swa_full=False``), from the hook's row sizes."""
    info = session.hook.info
    cells = round_cells(n_tokens)
    total = info.bytes_per_cell * cells
    if info.is_iswa and info.swa_kv_size:
        swa_cells = round_cells(info.n_swa + n_ubatch)  # sized by its window (patches/0003), not capped by the base
        total += info.swa_kv_bytes // info.swa_kv_size * swa_cells
    return int(total)
