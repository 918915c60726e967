"""``python -m sekv_gguf train``: teacher capture on the training documents (cached on disk with numpy, so training
reruns without the model), distillation, and the GGUF adapter."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..adapter import RouterAdapter, model_identity, write_adapter
from ..adapter.embed import embed_adapter
from ..config import ContextConfig, SekvConfig, cache_root, round_cells
from ..provenance import commit
from ..session import Session, load_model
from .capture import CaptureConfig, capture
from .corpus import documents
from .fit import TrainConfig, fit
from .student import LossWeights


@dataclass
class TrainRun:
    out: str = "sekv-router.gguf"
    docs: int = 12
    tokens: int = 4096
    budget_weight: float = 0.05  # weight of the loss's budget term (``LossWeights.budget``)
    epochs: int = 60
    proj_dim: int = 0  # 0: the largest P up to MAX_PROJ_DIM whose router stays within max_param_share of the model
    max_param_share: float = 0.0005  # the router's parameters as a share of the model's, at most (proj_dim 0)
    seed: int = 0
    captures: str | None = None
    threads: int = 0
    embed: str | None = None  # also write a copy of the model that carries the router (adapter.embed)

    def __post_init__(self) -> None:
        if self.docs < 1 or self.tokens < 1024 or self.budget_weight < 0:
            raise ValueError(f"need docs >= 1, tokens >= 1024 and budget_weight >= 0, got {self.docs}, {self.tokens}, "
                             f"{self.budget_weight}")
        if self.proj_dim < 0 or not 0 < self.max_param_share <= 1:
            raise ValueError(f"need proj_dim >= 0 (0: sized by max_param_share) and 0 < max_param_share <= 1, got "
                             f"{self.proj_dim}, {self.max_param_share}")


MAX_PROJ_DIM = 32  # the largest router projection proj_dim 0 chooses


def sized_proj_dim(run: TrainRun, n_model_params: int, n_layers: int, n_head: int, head_dim: int) -> int:
    """``run.proj_dim``, or for 0 the largest P <= MAX_PROJ_DIM (and <= head_dim) whose adapter keeps within
    ``run.max_param_share`` of the model's parameters; ``ValueError`` when even P = 1 does not."""
    if run.proj_dim > 0:
        return run.proj_dim
    cap = run.max_param_share * n_model_params
    fits = [p for p in range(1, min(MAX_PROJ_DIM, head_dim) + 1)
            if RouterAdapter.params_for(n_layers, n_head, head_dim, p) <= cap]
    if not fits:
        smallest = RouterAdapter.params_for(n_layers, n_head, head_dim, 1)
        raise ValueError(f"a router for this model ({n_layers} hooked layers x {n_head} heads x head_dim {head_dim}) "
                         f"has {smallest} parameters even at proj_dim 1, {smallest / max(n_model_params, 1):.3%} of "
                         f"the model's {n_model_params} (max_param_share {run.max_param_share:.3%}): give --proj-dim "
                         f"or a larger --max-param-share")
    return fits[-1]


def train(model_path: str, run: TrainRun, progress: bool = True) -> dict[str, Any]:
    t0 = time.perf_counter()
    ident = model_identity(model_path)
    ctx_config = ContextConfig(n_threads=run.threads)
    model = load_model(model_path, ctx_config)
    if run.tokens > model.n_ctx_train() > 0:
        raise ValueError(f"--tokens {run.tokens} exceeds the model's training context of {model.n_ctx_train()}")
    # the hooked layers' shapes (the smallest cache), to size the router before any capture
    probe = Session(model, ContextConfig(n_ctx=round_cells(1), n_threads=run.threads))
    try:
        layers, layer = list(probe.hook.model_layers), probe.hook.layers[0]
    finally:
        probe.close()
    proj_dim = sized_proj_dim(run, ident.n_params, len(layers), layer.n_head, layer.head_dim_k)
    sekv, cap = SekvConfig(), CaptureConfig()
    key = hashlib.sha256(json.dumps([ident.tensor_hash, run.tokens, asdict(cap), asdict(sekv)]).encode()).hexdigest()
    cache = Path(run.captures) if run.captures else \
        cache_root() / "train" / key[:16]
    cache.mkdir(parents=True, exist_ok=True)
    count = lambda text: len(model.tokenize(text.encode("utf-8"), add_bos=True, special=False))  # noqa: E731
    captures = []
    t_cap = time.perf_counter()
    for i, (name, text) in enumerate(tqdm(list(documents(count, run.tokens, run.docs)), desc="capture",
                                          unit="doc", disable=not progress)):
        f = cache / f"doc-{i:03d}.npz"
        if not f.exists():
            tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=False)
            arrays = capture(model, tokens, sekv, cap, ctx_config)
            np.savez_compressed(f.with_suffix(".tmp.npz"), **arrays)
            f.with_suffix(".tmp.npz").rename(f)
        captures.append(dict(np.load(f)))
    capture_s = time.perf_counter() - t_cap
    cfg = TrainConfig(proj_dim=proj_dim, epochs=run.epochs, seed=run.seed,
                      weights=LossWeights(budget=run.budget_weight))
    ck = cache / f"checkpoint-{hashlib.sha256(json.dumps(asdict(cfg), default=str).encode()).hexdigest()[:12]}.npz"
    result = fit(captures, cfg, checkpoint=ck, progress=progress)
    adapter = RouterAdapter(
        base=ident, layers=layers, n_head=layer.n_head, n_head_kv=layer.n_head_kv, head_dim=layer.head_dim_k,
        proj_dim=result["proj_dim"], w=result["w"], b=result["b"], tau=result["tau"], theta=result["theta"],
        spread_rank=result["spread_rank"], n_centroids=result["n_centroids"], kmeans_iters=cap.kmeans_iters,
        train={"docs": run.docs, "tokens": run.tokens, "epochs": run.epochs, "seed": run.seed,
               "budget_weight": run.budget_weight, "loss_before": result["loss_before"],
               "loss_after": result["loss_after"], "capture_s": capture_s, "train_s": result["train_s"],
               "commit": commit(), "corpus": "stdlib docs (not the eval's modules) + filler needles"})
    write_adapter(run.out, adapter)
    if run.embed:
        embed_adapter(model_path, adapter, run.embed)
    return {"adapter": run.out, "embedded": run.embed, "proj_dim": adapter.proj_dim, "params": adapter.n_params,
            "param_share": adapter.param_share,
            "loss_before": result["loss_before"], "loss_after": result["loss_after"], "capture_s": capture_s,
            "train_s": result["train_s"], "total_s": time.perf_counter() - t0, "captures": str(cache)}
