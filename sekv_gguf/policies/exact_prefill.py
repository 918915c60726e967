"""SeKV's exact prefill: full attention over the whole prompt in a temporary full-size context, then segmentation
and compression into the budget context (sinks, anchors and the window copied over, spans into the store)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import round_cells
from ..session import Session
from ..transfer import copy_tokens


def prefill_exact(policy: Any, tokens: list[int]) -> np.ndarray:
    """Prefill ``policy`` (a ``SekvPolicy``, called from its ``prefill``) with ``tokens`` exactly; the logits of the
    next token."""
    full = Session(policy.model, policy.ctx_config.sized(round_cells(len(tokens)), policy.plan.config.chunk))
    try:
        full.hook.enable_query_capture()
        surp = np.zeros(len(tokens), dtype=np.float32)
        prev = None
        for c0 in range(0, len(tokens), full.n_batch):
            chunk = tokens[c0:c0 + full.n_batch]
            surp[c0:c0 + len(chunk)], prev = full.decode_scored(chunk, prev)
            policy.n_prefilled = c0 + len(chunk)
            policy.notify()
        policy.prev_logits = prev
        policy.phase = "compress"
        policy.notify()
        _transfer(policy, full, surp)
        queries = [full.hook.query(ikv) for ikv in range(policy.n_layer)]
    finally:
        full.close()
    if len(policy.store):
        policy.route(queries)
    logits = policy.redecode_tail(tokens)
    policy.phase = "decode"
    return logits


def _transfer(policy: Any, full: Session, surp: np.ndarray) -> None:
    """Segment the full context's tokens; copy the resident ones into the policy's context, compress the spans."""
    n = surp.size
    n_sink = min(policy.plan.config.n_sink, n)
    window_start = max(n_sink, n - policy.plan.window)
    policy.segmenter.observe(surp[n_sink:])
    seg = policy.segmenter.cut(surp[n_sink:window_start], final=True)
    anchors = n_sink + seg.anchors
    groups = [n_sink + g for g in seg.spans]
    resident = np.concatenate([np.arange(n_sink), anchors, np.arange(window_start, n)]).astype(np.int64)
    cells = copy_tokens(full, policy.session, resident)
    policy.swa_transferred = full.hook.info.is_iswa
    policy.sinks = [int(p) for p in resident[:n_sink]]
    policy.anchors = [int(p) for p in anchors]
    policy.window.extend(np.arange(window_start, n), cells[n_sink + anchors.size:], surp[window_start:])
    if groups:
        full_cells = full.hook.cells_of(n)
        span_cells = np.concatenate([full_cells[g] for g in groups])
        policy.compress(groups, [surp[g] for g in groups], lambda ikv: full.hook.get_rows(ikv, span_cells))
