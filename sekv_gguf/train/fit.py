"""Distillation: fit each (hooked layer, query head)'s router on captured teacher data with Adam, then pick its zoom
threshold ``tau``; checkpoints after every head so an interrupted run resumes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..features import N_FEATURES, SpanFeatures
from .student import Adam, Batch, LossWeights, Params, alphas, loss_and_grad, make_batch


@dataclass
class TrainConfig:
    """proj_dim: P (smaller when the head is smaller); epochs: passes over the documents; lr: Adam's step;
    min_span_mass: queries whose spans hold less attention are not trained on; seed, w_init: W starts as
    w_init * N(0, 1/d)."""

    proj_dim: int = 32
    epochs: int = 60
    lr: float = 0.02
    min_span_mass: float = 0.2
    seed: int = 0
    w_init: float = 0.01
    weights: LossWeights = field(default_factory=LossWeights)

    def __post_init__(self) -> None:
        if self.proj_dim < 1 or self.epochs < 1 or self.lr <= 0 or self.w_init < 0:
            raise ValueError(f"bad training config {self}")


def span_features(c: dict[str, np.ndarray], ikv: int, kv: int) -> SpanFeatures:
    """The spans of one capture as the router sees them, for KV head ``kv`` of hooked layer ``ikv``."""
    f64 = lambda name: c[f"{name}{ikv}"][:, kv].astype(np.float64)  # noqa: E731
    return SpanFeatures(keys=f64("keys"), dirs=f64("dirs"), var=f64("var"), lo=f64("lo"), hi=f64("hi"),
                        kmin=f64("kmin"), kmax=f64("kmax"), mu=f64("mu"), logw=f64("logw"),
                        lengths=c["lengths"].astype(np.float64))


def head_batches(captures: list[dict[str, np.ndarray]], ikv: int, h: int, min_span_mass: float) -> list[Batch]:
    """One Batch per document for layer ``ikv``, query head ``h`` (queries with enough span mass only)."""
    out = []
    for c in captures:
        n_head, n_head_kv = c[f"q{ikv}"].shape[1], c[f"keys{ikv}"].shape[1]
        keep = c[f"span_mass{ikv}"][:, h] >= min_span_mass  # [N]
        if not keep.any():
            continue
        out.append(make_batch(c[f"q{ikv}"][keep, h], span_features(c, ikv, h // (n_head // n_head_kv)),
                              l_true=c[f"l_true{ikv}"][keep, h], l_sum=c[f"l_sum{ikv}"][keep, h],
                              l_rest=c[f"l_rest{ikv}"][keep, h], y=c[f"y{ikv}"][keep, h]))
    return out


def best_tau(a: np.ndarray, y: np.ndarray) -> float:
    """The threshold on alpha with the best F1 against the zoom labels."""
    best, best_f1 = 0.5, -1.0
    for tau in np.unique(np.quantile(a, np.linspace(0.5, 0.999, 60))):
        pred = a > tau
        tp = float((pred & (y > 0.5)).sum())
        f1 = 2 * tp / max(float(pred.sum() + (y > 0.5).sum()), 1.0)
        if f1 > best_f1:
            best, best_f1 = float(tau), f1
    return best


def fit(captures: list[dict[str, np.ndarray]], cfg: TrainConfig, checkpoint: Path | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Train every (layer, head); returns per hooked layer w [H, P, d], b and tau [H], theta [H, F], and a log."""
    n_layer = int(captures[0]["n_layer"])
    n_head, d = captures[0]["q0"].shape[1], captures[0]["q0"].shape[2]
    proj = min(cfg.proj_dim, d)
    rng = np.random.default_rng(cfg.seed)
    # a small start for W: the router begins as the centroid-mixture mass estimate and learns the match term
    init = rng.standard_normal((n_layer, n_head, proj, d)) * (cfg.w_init / np.sqrt(d))
    state = {"w": init, "b": np.zeros((n_layer, n_head)), "theta": np.zeros((n_layer, n_head, N_FEATURES)),
             "tau": np.full((n_layer, n_head), 0.5),
             "done": np.zeros((n_layer, n_head), dtype=bool), "loss0": np.zeros((n_layer, n_head)),
             "loss": np.zeros((n_layer, n_head))}
    if checkpoint is not None and checkpoint.exists():
        saved = np.load(checkpoint)
        if set(saved.files) == set(state) and saved["w"].shape == init.shape:
            state = {k: saved[k].copy() for k in state}
    t0 = time.perf_counter()
    todo = [(i, h) for i in range(n_layer) for h in range(n_head) if not state["done"][i, h]]
    for i, h in tqdm(todo, desc="train", unit="head", disable=not progress):
        batches = head_batches(captures, i, h, cfg.min_span_mass)
        if not batches:
            state["done"][i, h] = True
            continue
        p = Params.initial(state["w"][i, h])
        opt = Adam(p.arrays(), lr=cfg.lr)
        state["loss0"][i, h] = np.mean([loss_and_grad(p, x, cfg.weights)[0] for x in batches])
        for _ in range(cfg.epochs):
            for x in batches:
                _, g, _ = loss_and_grad(p, x, cfg.weights)
                opt.step(g.arrays())
        state["loss"][i, h] = np.mean([loss_and_grad(p, x, cfg.weights)[0] for x in batches])
        a = np.concatenate([alphas(p, x.q, x.spans, x.phi).ravel() for x in batches])
        y = np.concatenate([x.y.ravel() for x in batches])
        state["w"][i, h], state["b"][i, h], state["tau"][i, h] = p.w, p.b[0], best_tau(a, y)
        state["theta"][i, h] = p.theta
        state["done"][i, h] = True
        if checkpoint is not None:
            np.savez(checkpoint, **state)
    per_layer = {k: [state[k][i].astype(np.float32) for i in range(n_layer)] for k in ("w", "b", "theta", "tau")}
    return {**per_layer, "loss_before": float(state["loss0"].mean()), "loss_after": float(state["loss"].mean()),
            "train_s": time.perf_counter() - t0, "proj_dim": proj,
            "spread_rank": int(captures[0]["var0"].shape[2]), "n_centroids": int(captures[0]["logw0"].shape[2])}
