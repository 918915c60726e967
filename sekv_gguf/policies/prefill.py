"""Two steps of SeKV's prefill, over a ``SekvMemory`` (called from ``SekvPolicy``): the exact prefill (full attention
over the whole prompt in a temporary full-size context — an ``ExactPass``, which ``SharedPasses`` lets several
runs share — then segmentation and compression into the budget context: sinks, anchors and the window copied
over, spans into the store) and the refresh of the prompt's tail after the first routing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import llama_cpp
import numpy as np

from ..config import round_cells
from ..session import Session, full_kv_bytes
from ..transfer import copy_tokens
from .prompt_cut import cut_prompt
from .sekv_memory import SekvMemory
from .shared_passes import FullPass
from .span_routing import SpanRouting


@dataclass
class ExactPass(FullPass):
    """What an exact prefill segments and compresses (compressions into several budgets may share it:
    ``SharedPasses``); ``key``: ``exact_key``."""

    surprisal: np.ndarray     # f32 [n_tokens]
    last_logits: np.ndarray   # f32 [n_vocab] the next token's logits
    queries: list[np.ndarray]  # per hooked layer [n_head, head_dim]: the last token's captured query


def exact_pass(model: Any, ctx_config: Any, chunk: int, tokens: list[int],
               on_chunk: Callable[[int], None] | None = None) -> ExactPass:
    """Decode ``tokens`` in a full-size context (``chunk`` tokens per decode), scoring every token's surprisal;
    ``on_chunk(n_done)`` after each chunk."""
    cells = round_cells(len(tokens))
    full = Session(model, ctx_config.sized(cells, chunk))
    try:
        full.hook.enable_query_capture()
        surp = np.zeros(len(tokens), dtype=np.float32)  # [n_tokens]
        prev = None
        for c0 in range(0, len(tokens), full.n_batch):
            part = tokens[c0:c0 + full.n_batch]
            surp[c0:c0 + len(part)], prev = full.decode_scored(part, prev)
            if on_chunk is not None:
                on_chunk(c0 + len(part))
        queries = [np.array(full.hook.query(ikv)) for ikv in range(full.hook.info.n_layer_kv)]
    except BaseException:
        full.close()
        raise
    return ExactPass(exact_key(tokens, chunk, ctx_config), full, surp, prev, queries)


def exact_key(tokens: list[int], chunk: int, ctx_config: Any) -> tuple[Any, ...]:
    """What an ``ExactPass`` is made from (``SharedPasses``' key)."""
    return ("exact", tuple(tokens), chunk, ctx_config)


def wants_exact(memory: SekvMemory, tokens: list[int]) -> bool:
    """Whether ``tokens``, the first into the empty ``memory``, are prefilled exactly: ``prefill="exact"``, and
    streaming them would compress some (they are more than the window may hold) — a prompt the window holds whole is
    full attention either way, and one of sinks only is streamed: the refresh needs a window token."""
    cfg, plan = memory.config, memory.plan
    if plan.fits or not memory.segmenter.scored or cfg.prefill != "exact" or len(tokens) <= plan.config.n_sink:
        return False
    return len(tokens) > memory.window_room(0)


def prefill_exact(memory: SekvMemory, routing: SpanRouting, done: ExactPass, tokens: list[int], owned: bool,
                  on_compress: Callable[[], None], on_placed: Callable[[], None] = lambda: None) -> np.ndarray:
    """Fill the empty ``memory`` from the full-attention pass ``done`` over ``tokens``: segment, copy the resident
    tokens into the memory's context, compress the spans (``on_compress()`` first, ``on_placed()`` after), close the
    pass when ``owned``; route with the pass's last query; decode the tail again (``refresh_tail``). The logits of
    the next token."""
    try:
        memory.transient_kv_bytes = full_kv_bytes(done.session, len(tokens), done.session.config.n_ubatch)
        memory.prev_logits = done.last_logits.copy()
        memory.note_sentence_ends(tokens)
        on_compress()
        place_exact(memory, done.session, tokens, done.surprisal)
    finally:
        if owned:
            done.close()
    on_placed()
    if len(memory.store):
        routing.route(memory, done.queries, kind="prompt")
    return refresh_tail(memory, tokens)  # also leaves the last token's logits in the memory's own context


def place_exact(memory: SekvMemory, full: Session, tokens: list[int], surp: np.ndarray) -> None:
    """Cut the full context's tokens (``prompt_cut.cut_prompt``); copy the resident ones into the memory's context,
    compress the spans."""
    n = surp.size
    signal = memory.segmenter.signal(tokens, surp, memory.session.piece)  # f32 [n], kept as a streamed one is
    memory.signal_log = np.asarray(signal, dtype=np.float32).copy()      # (a truncation rewinds it)
    cut = cut_prompt(memory.segmenter, signal, memory.plan, memory.config, memory.sentence_end_at(np.arange(n)))
    n_sink, anchors, groups = cut.n_sink, cut.anchors, cut.spans
    resident = np.concatenate([np.arange(n_sink), anchors, np.arange(cut.window_start, n)]).astype(np.int64)
    cells = copy_tokens(full, memory.session, resident)
    memory.swa_transferred = full.hook.info.is_iswa
    memory.sinks = [int(p) for p in resident[:n_sink]]
    memory.anchors = [int(p) for p in anchors]
    memory.window.extend(np.arange(cut.window_start, n), cells[n_sink + anchors.size:], signal[cut.window_start:])
    if groups:
        full_cells = full.hook.cells_of(n)
        span_cells = np.concatenate([full_cells[g] for g in groups])
        memory.compress(groups, [signal[g] for g in groups], lambda ikv: full.hook.get_rows(ikv, span_cells))


def chunk_starts(n: int, size: int, tail: int) -> list[int]:
    """Start offsets of the chunks ``n`` prompt tokens stream through (at most ``size`` each), the last one holding
    at least ``min(tail, size, n)`` tokens: on iSWA models the tail refresh re-decodes at most the last chunk (the
    sliding-window cache reaches back only that far), so a prompt whose length left a few tokens for its last chunk
    would have its question seen by the zoom only in part."""
    starts = list(range(0, n, size))
    tail = min(tail, size, n)
    if len(starts) > 1 and n - starts[-1] < tail:
        starts[-1] = n - tail
    return starts


def refresh_tail(memory: SekvMemory, tokens: list[int], n: int | None = None) -> np.ndarray:
    """Decode the last ``n`` (default ``refresh_tokens``) prompt tokens of ``memory`` again, now that the router
    has zoomed in for the prompt's end: the question at the end of a long prompt then reads the rebuilt spans, not
    only their summaries (``SekvPolicy.tail_refresh``: on iSWA models also the sliding window before it)."""
    session, window = memory.session, memory.window
    k = max(1, min(memory.config.refresh_tokens if n is None else n, len(tokens), len(window)))
    if session.hook.info.is_iswa:
        # the sliding-window cache must still hold the window before the tail; a cache moved over with the state
        # API holds only the last n_swa positions
        k = min(k, 1 if memory.swa_transferred else session.swa_redo())
    return redecode_tail(memory, tokens, k)


def redecode_tail(memory: SekvMemory, tokens: list[int], k: int) -> np.ndarray:
    """Remove the newest ``k`` tokens (all in the window; ``tokens`` ends with them) from the cache and decode them
    again over the memory as it is now (the tail refresh; the restore of a compact memory file, which rebuilds the
    window's newest rows and the sliding-window cache so); their window signal is kept. The next token's logits."""
    session, window = memory.session, memory.window
    if not (0 < k <= min(len(window), len(tokens))):
        raise ValueError(f"cannot decode the newest {k} tokens again ({len(tokens)} given): the window holds "
                         f"{len(window)}")
    # the window's newest position, not the context's: a restored sliding-window cache may still be empty
    p_last = int(window.pos[-1])
    p0 = p_last - k + 1
    if window.pos[-k] != p0:
        raise ValueError(f"the window's newest {k} positions are not consecutive (from {window.pos[-k]} to {p_last})")
    llama_cpp.llama_memory_seq_rm(session.memory, 0, p0, -1)
    signal = window.signal[-k:]
    window.drop_newest(k)
    out = session.decode(tokens[-k:], pos0=p0)
    window.extend(np.arange(p0, p_last + 1), session.hook.cells_from(p0), signal)
    memory.prev_logits = out.copy()
    memory.counters.refreshed_tokens += k
    return out
