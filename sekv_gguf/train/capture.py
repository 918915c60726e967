"""Teacher capture: run full KV on a training document and record, at query positions with long-range dependence,
what the router student trains on (``student.Batch`` per hooked layer and query head), saved with numpy.

The document's first part is prefilled (surprisal from the chunk logits) and cut exactly as the engine's exact
prefill cuts it for the same budget (``policies.prompt_cut``: sinks, anchors capped at the budget's share, spans, the
window the budget leaves). The last ``n_queries`` tokens are then decoded one by one; after
each, the hook gives every hooked layer's query, and the full attention logits over all earlier tokens are computed
from it and the cache rows: per span the logsumexp of its tokens' logits (``l_true``), the summary row's logit
``q·k̄ + log|S|`` (``l_sum``), and the logsumexp of everything else (``l_rest``). Queries whose spans hold less than
``min_span_mass`` of the attention are dropped (no long-range dependence); labels are the spans covering 90% of the
span mass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import BudgetConfig, ContextConfig, SekvConfig, round_cells
from ..decode import decode_loop, forced
from ..policies.budget import BudgetPlan
from ..policies.prompt_cut import cut_prompt
from ..segment import Segmenter, span_ends
from ..session import Session
from ..spans import sketches, weighted_mean


@dataclass
class CaptureConfig:
    """n_queries: decoded positions per document (the engine's window, sinks and anchors are cut as the engine cuts);
    min_span_mass: smallest share of a query's attention on spans to keep it; label_mass: share of the span mass
    the labelled spans cover; spread_rank: principal directions of each span's keys kept for the student
    (``spans.spread``); n_centroids, kmeans_iters: ``spans.centroids`` of each span's keys; min_spans: a document
    must leave room for at least this many longest spans before its window."""

    n_queries: int = 48
    min_span_mass: float = 0.2
    label_mass: float = 0.9
    spread_rank: int = 8
    n_centroids: int = 4
    kmeans_iters: int = 5
    min_spans: int = 4

    def __post_init__(self) -> None:
        if self.n_queries < 1 or not 0 <= self.min_span_mass < 1 or not 0 < self.label_mass <= 1 \
                or self.spread_rank < 1 or self.n_centroids < 1 or self.kmeans_iters < 0 or self.min_spans < 1:
            raise ValueError(f"bad capture config {self}")


def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


def capture(model: object, tokens: list[int], sekv: SekvConfig, cap: CaptureConfig,
            ctx_config: ContextConfig | None = None, budget: BudgetConfig | None = None) -> dict[str, np.ndarray]:
    """Arrays per hooked layer ``ikv``: q{ikv} [N, H, d], keys{ikv} [S, Hkv, d], dirs{ikv} [S, Hkv, r, d],
    var{ikv}, lo{ikv}, hi{ikv} [S, Hkv, r] (``spans.spread``), kmin{ikv} / kmax{ikv} [S, Hkv, d] (channel-wise),
    mu{ikv} [S, Hkv, c, d] and logw{ikv} [S, Hkv, c] (``spans.centroids``), l_true{ikv} [N, H, S], l_sum{ikv}
    [N, H, S], l_rest{ikv} [N, H], y{ikv} [N, H, S]; lengths [S] and span_starts [S] (each span's first
    position). The document is cut as an engine with ``budget`` over a context of its tokens cuts its first part."""
    ctx_config, budget = ctx_config or ContextConfig(), budget or BudgetConfig()
    n = len(tokens)
    n_pre = n - cap.n_queries
    plan = BudgetPlan.of(budget, n, sekv.zoom_share, sekv.anchor_share, sekv.compress_when_fits)
    if plan.fits:
        raise ValueError(f"a budget of {plan.cells} cells holds the whole document of {n} tokens: nothing is "
                         f"compressed, nothing to capture")
    s = Session(model, ctx_config.sized(round_cells(n), budget.chunk))
    try:
        s.hook.enable_query_capture()
        surp, _ = s.decode_scored(tokens[:n_pre], None)
        spans = cut_prompt(Segmenter(sekv, plan.anchor_cap), surp, plan, sekv,
                           span_ends(sekv, s.piece, tokens[:n_pre])).spans
        if len(spans) < cap.min_spans:
            raise ValueError(f"a document of {n} tokens is too short to capture from ({len(spans)} spans at a budget "
                             f"of {plan.cells} cells, at least {cap.min_spans} needed)")
        lengths = np.array([g.size for g in spans], dtype=np.float64)
        in_span = np.full(n, -1, dtype=np.int64)
        for i, g in enumerate(spans):
            in_span[g] = i
        n_layer = s.hook.info.n_layer_kv
        layer = s.hook.layers[0]
        n_head, group = layer.n_head, layer.n_head // layer.n_head_kv
        keys_all = [s.hook.get_values(ikv, s.hook.cells_of(n_pre))[0].astype(np.float64)
                    for ikv in range(n_layer)]  # [n_pre, Hkv, d] per layer
        summaries = [np.stack([weighted_mean(k[g], surp[g]) for g in spans]).astype(np.float64)
                     for k in keys_all]  # [S, Hkv, d]
        out: dict[str, list] = {f"{name}{ikv}": [] for ikv in range(n_layer)
                                for name in ("q", "l_true", "l_sum", "l_rest", "y")}

        def record(n_done: int, _logits: np.ndarray) -> None:
            """After each query token's decode: its full attention over every earlier token, per layer."""
            t = n_pre + n_done - 1
            cell = s.hook.cells_from(t)  # [1] the token just decoded
            for ikv in range(n_layer):
                k_new = s.hook.get_values(ikv, cell)[0].astype(np.float64)  # [1, Hkv, d]
                keys_all[ikv] = np.concatenate([keys_all[ikv], k_new])
                q = s.hook.query(ikv).astype(np.float64)  # [H, d]
                k = keys_all[ikv][:, np.arange(n_head) // group, :]  # [t+1, H, d]
                logits = np.einsum("thd,hd->ht", k, q)  # [H, t+1]
                owner = in_span[: t + 1]
                l_true = np.full((n_head, len(spans)), -np.inf)
                for i, g in enumerate(spans):
                    l_true[:, i] = _lse(logits[:, g])
                rest = logits[:, owner < 0]
                l_rest = _lse(rest)  # [H]
                kbar = summaries[ikv][:, np.arange(n_head) // group, :]  # [S, H, d]
                l_sum = np.einsum("shd,hd->hs", kbar, q) + np.log(lengths)[None, :]  # [H, S]
                total = _lse(np.concatenate([l_true, l_rest[:, None]], axis=1))  # [H]
                share = np.exp(l_true - total[:, None])  # [H, S] full attention share of each span
                y = np.zeros_like(share)
                for h in range(n_head):
                    order = np.argsort(-share[h])
                    cum = np.cumsum(share[h, order])
                    k_lab = int(np.searchsorted(cum, cap.label_mass * cum[-1])) + 1
                    y[h, order[:k_lab]] = 1.0
                out[f"q{ikv}"].append(q)
                out[f"l_true{ikv}"].append(l_true)
                out[f"l_sum{ikv}"].append(l_sum)
                out[f"l_rest{ikv}"].append(l_rest)
                out[f"y{ikv}"].append(y)
                out.setdefault(f"span_mass{ikv}", []).append(share.sum(axis=1))  # [H]

        decode_loop(lambda tok: s.decode([tok]), np.zeros(0, dtype=np.float32), n - n_pre, forced(tokens[n_pre:]),
                    after_step=record)
        result = {k: np.stack(v) for k, v in out.items()}
        for ikv in range(n_layer):
            result[f"keys{ikv}"] = summaries[ikv]
            parts = [keys_all[ikv][g] for g in spans]
            for name, x in sketches(parts, cap.spread_rank, cap.n_centroids, cap.kmeans_iters).items():
                result[f"{name}{ikv}"] = x
            result[f"kmin{ikv}"] = np.stack([p.min(axis=0) for p in parts]).astype(np.float32)  # [S, Hkv, d]
            result[f"kmax{ikv}"] = np.stack([p.max(axis=0) for p in parts]).astype(np.float32)
        result["lengths"] = lengths
        result["span_starts"] = np.array([g[0] for g in spans], dtype=np.int64)
        result["n_layer"] = np.array(n_layer)
        return result
    finally:
        s.close()
