"""SemantiCache-like (2025, "SemantiCache: Efficient KV Cache Compression via Semantic Chunking and Clustered
Merging"): tokens leaving the recent window are grouped into delimiter-bounded chunks (sentences, joined until a
chunk is long enough to merge); within each chunk the keys are clustered into semantic cores and each core becomes
one merged cell (mean K and mean V of its members) whose attention score gets ``+log(count)`` (proportional
attention). Clustering is per hooked layer (k-means, scipy) with the same number of cores per chunk in every layer,
so one set of cells serves all layers and the per-layer bias carries each layer's counts. The merge is final: the
members' rows are gone (the semantic-grouping weak point SeKV addresses).

Parameters: ``BudgetConfig.kv_budget``, ``n_sink``, ``window``, ``chunk``; ``SemantiCacheConfig``. The merge
ratio (cores per token) follows from the budget: everything merged must fit beside the sinks, the window and a
prompt chunk."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy.cluster.vq import kmeans2

from ..config import BudgetConfig, ContextConfig
from ..errors import BudgetError
from ..segment import SentenceSegmenter
from ..session import Session
from ..stats import MergeStats, PolicyStats
from .base import Policy, StreamedPolicy
from .budget import BudgetPlan
from .memory_state import PolicyMemory
from .window import Window

NEG_INF = float("-inf")


@dataclass
class SemantiCacheConfig:
    """span_max: longest sentence piece of a chunk; max_sentences: a budget that needs chunks of more than
    ``max_sentences * span_max`` tokens per merged core is refused (the merge would blur whole paragraphs);
    delimiters: token endings that close a sentence (besides a line break)."""

    span_max: int = 64
    max_sentences: int = 4
    delimiters: tuple[bytes, ...] = (b".", b"!", b"?", b";", b":")

    def __post_init__(self) -> None:
        if self.span_max < 1 or self.max_sentences < 1 or not self.delimiters:
            raise ValueError(f"span_max and max_sentences must be >= 1 and delimiters non-empty, got {self}")


@dataclass
class MergedCores(PolicyMemory):
    """SemantiCache's memory: sinks taken, the recent window (signal: 1 where a token ends a sentence), merged cores
    and the tokens merged into them."""

    n_sinks: int = 0
    window: Window = field(default_factory=Window)
    cores: int = 0
    merged_tokens: int = 0


class SemantiCachePolicy(StreamedPolicy):
    name = "semanticache"
    Config = SemantiCacheConfig

    def __init__(self, model: Any, n_context: int, ctx_config: ContextConfig, budget: BudgetConfig | None = None,
                 params: SemantiCacheConfig | None = None, observer: Callable[[Policy], None] | None = None):
        self.params = params = params or SemantiCacheConfig()
        self.plan = plan = BudgetPlan.of(budget or BudgetConfig(), n_context)
        self.budget, self.fits, self.chunk, self.n_sink = plan.cells, plan.fits, plan.chunk, plan.config.n_sink
        room = self.budget - self.n_sink - plan.window - self.chunk - params.span_max
        compressed = max(n_context - self.n_sink - plan.window, 1)
        self.ratio = room / compressed  # merged cells per compressed token
        self.min_chunk = math.ceil(1 / self.ratio) if self.ratio > 0 else 0
        if not self.fits and (room < 1 or self.min_chunk > params.span_max * params.max_sentences):
            raise BudgetError(f"kv_budget of {self.budget} cells leaves {room} cells for merged cores of "
                              f"{compressed} tokens; use a larger budget")
        super().__init__(Session(model, ctx_config.sized(self.budget, self.chunk)), observer)
        self.hook = self.session.hook
        self.n_layer = self.hook.info.n_layer_kv
        if not self.fits:
            self.hook.enable_bias()
        self.segmenter = SentenceSegmenter(params.span_max, params.delimiters)
        self.memory = MergedCores()
        self._init_done()

    def _decode(self, tokens: list[int]) -> np.ndarray:
        p0 = self.session.pos_max() + 1
        logits = self.session.decode(tokens)
        cells = self.hook.cells_from(p0)  # [n] the new tokens' cells, in position order
        n_sink = min(self.n_sink - self.memory.n_sinks, len(tokens)) if not len(self.memory.window) else 0
        self.memory.n_sinks += n_sink
        ends = self.segmenter.signal(tokens, None, self.session.piece)  # [n] 1 at delimiters
        self.memory.window.extend(np.arange(p0 + n_sink, p0 + len(tokens)), cells[n_sink:], ends[n_sink:])
        self._maintain()
        return logits

    def _maintain(self) -> None:
        over = len(self.memory.window) - self.plan.window
        if self.fits or over <= 0:
            return
        seg = self.segmenter.cut(self.memory.window.signal[:over])
        groups: list[np.ndarray] = []
        pending: list[np.ndarray] = []
        for span in seg.spans:  # join sentences until a chunk holds at least min_chunk tokens
            pending.append(span)
            if sum(p.size for p in pending) >= self.min_chunk:
                groups.append(np.concatenate(pending))
                pending = []
        if not groups:
            return
        done = int(groups[-1][-1]) + 1  # window indices [0, done) are merged
        self.irreversible()  # a merge is final
        self._merge(groups)
        self.memory.window.drop_oldest(done)

    def _merge(self, groups: list[np.ndarray]) -> None:
        cells = self.memory.window.cell
        all_cells = np.concatenate([cells[g] for g in groups])
        n_cores = [max(1, int(self.ratio * g.size)) for g in groups]
        rows_k, rows_v, bias = [], [], []  # per layer: f16 [sum cores, Hkv*d] and f32 [sum cores]
        for ikv in range(self.n_layer):
            k, v = self.hook.get_values(ikv, all_cells)  # [n, Hkv, d] numbers (blocks dequantized)
            kf = k.reshape(k.shape[0], -1).astype(np.float32)  # [n, Hkv*d]
            vf = v.reshape(v.shape[0], -1).astype(np.float32)
            ks, vs, bs = [], [], []
            o = 0
            for g, kk in zip(groups, n_cores):
                gk, gv = kf[o:o + g.size], vf[o:o + g.size]
                o += g.size
                if kk == 1:
                    labels = np.zeros(g.size, dtype=np.int64)
                else:
                    _, labels = kmeans2(gk, kk, minit="++", seed=0)
                for c in range(kk):
                    m = labels == c
                    cnt = int(m.sum())
                    ks.append(gk[m].mean(axis=0) if cnt else np.zeros(gk.shape[1], np.float32))
                    vs.append(gv[m].mean(axis=0) if cnt else np.zeros(gv.shape[1], np.float32))
                    bs.append(math.log(cnt) if cnt else NEG_INF)
            rows_k.append(np.stack(ks).astype(np.float16))
            rows_v.append(np.stack(vs).astype(np.float16))
            bias.append(np.asarray(bs, dtype=np.float32))
        self.hook.release(all_cells)
        free = np.flatnonzero(self.hook.cells_pos()[: self.budget] == -1).astype(np.int32)
        total = sum(n_cores)
        if free.size < total:
            raise BudgetError(f"no room for {total} merged cells within the budget of {self.budget}")
        free = free[:total]
        positions = np.repeat([int(self.memory.window.pos[int(g[-1])]) for g in groups], n_cores)
        self.hook.claim(free, positions)
        for ikv in range(self.n_layer):
            self.hook.set_values(ikv, free, rows_k[ikv], rows_v[ikv])  # quantized into a quantized cache
            self.hook.set_bias_cells(ikv, free, bias[ikv])
        self.memory.cores += total
        self.memory.merged_tokens += int(all_cells.size)

    def _truncate(self, n: int) -> bool:
        """Within the recent window only: merged cores are final."""
        w = self.memory.window
        if not len(w) or n < w.pos[0] or not self.swa_covers(n):
            return False
        self.discard_from(n)
        w.keep(np.flatnonzero(w.pos < n))
        return True

    def stats(self) -> PolicyStats:
        return PolicyStats(device_kv_bytes=self.device_kv_bytes, baseline=MergeStats(
            budget_cells=self.budget, cores=self.memory.cores, merged_tokens=self.memory.merged_tokens,
            merge_ratio=self.ratio))
