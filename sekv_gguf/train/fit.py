"""Distillation: fit each (hooked layer, query head)'s router on captured teacher data with Adam, then pick its zoom
threshold ``tau``; checkpoints after every head so an interrupted run resumes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .student import Adam, Batch, LossWeights, alphas, loss_and_grad


@dataclass
class TrainConfig:
    """proj_dim: P (smaller when the head is smaller); epochs: passes over the documents; lr: Adam's step;
    min_span_mass: queries whose spans hold less attention are not trained on; seed: initialisation."""

    proj_dim: int = 32
    epochs: int = 60
    lr: float = 0.02
    min_span_mass: float = 0.2
    seed: int = 0
    weights: LossWeights = field(default_factory=LossWeights)

    def __post_init__(self) -> None:
        if self.proj_dim < 1 or self.epochs < 1 or self.lr <= 0:
            raise ValueError(f"bad training config {self}")


def head_batches(captures: list[dict[str, np.ndarray]], ikv: int, h: int, min_span_mass: float) -> list[Batch]:
    """One Batch per document for layer ``ikv``, query head ``h`` (queries with enough span mass only)."""
    out = []
    for c in captures:
        n_head, n_head_kv = c[f"q{ikv}"].shape[1], c[f"keys{ikv}"].shape[1]
        keep = c[f"span_mass{ikv}"][:, h] >= min_span_mass  # [N]
        if not keep.any():
            continue
        out.append(Batch(q=c[f"q{ikv}"][keep, h], keys=c[f"keys{ikv}"][:, h // (n_head // n_head_kv)],
                         lengths=c["lengths"], l_true=c[f"l_true{ikv}"][keep, h], l_sum=c[f"l_sum{ikv}"][keep, h],
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
    """Train every (layer, head); returns w [n_layer] of [H, P, d], b and tau [n_layer] of [H], and a log."""
    n_layer = int(captures[0]["n_layer"])
    n_head, d = captures[0]["q0"].shape[1], captures[0]["q0"].shape[2]
    proj = min(cfg.proj_dim, d)
    rng = np.random.default_rng(cfg.seed)
    init = rng.standard_normal((n_layer, n_head, proj, d)) / np.sqrt(d)
    state = {"w": init, "b": np.zeros((n_layer, n_head)), "tau": np.full((n_layer, n_head), 0.5),
             "done": np.zeros((n_layer, n_head), dtype=bool), "loss0": np.zeros((n_layer, n_head)),
             "loss": np.zeros((n_layer, n_head))}
    if checkpoint is not None and checkpoint.exists():
        saved = np.load(checkpoint)
        if saved["w"].shape == init.shape:
            state = {k: saved[k].copy() for k in state}
    t0 = time.perf_counter()
    todo = [(i, h) for i in range(n_layer) for h in range(n_head) if not state["done"][i, h]]
    for i, h in tqdm(todo, desc="train", unit="head", disable=not progress):
        batches = head_batches(captures, i, h, cfg.min_span_mass)
        if not batches:
            state["done"][i, h] = True
            continue
        w, b = state["w"][i, h].copy(), np.zeros(1)
        opt = Adam([w, b], lr=cfg.lr)
        state["loss0"][i, h] = np.mean([loss_and_grad(w, 0.0, x, cfg.weights)[0] for x in batches])
        for _ in range(cfg.epochs):
            for x in batches:
                _, dw, db, _ = loss_and_grad(w, float(b[0]), x, cfg.weights)
                opt.step([dw, np.array([db])])
        state["loss"][i, h] = np.mean([loss_and_grad(w, float(b[0]), x, cfg.weights)[0] for x in batches])
        a = np.concatenate([alphas(w, float(b[0]), x.q, x.keys, x.lengths).ravel() for x in batches])
        y = np.concatenate([x.y.ravel() for x in batches])
        state["w"][i, h], state["b"][i, h], state["tau"][i, h] = w, b[0], best_tau(a, y)
        state["done"][i, h] = True
        if checkpoint is not None:
            np.savez(checkpoint, **state)
    return {"w": [state["w"][i].astype(np.float32) for i in range(n_layer)],
            "b": [state["b"][i].astype(np.float32) for i in range(n_layer)],
            "tau": [state["tau"][i].astype(np.float32) for i in range(n_layer)],
            "loss_before": float(state["loss0"].mean()), "loss_after": float(state["loss"].mean()),
            "train_s": time.perf_counter() - t0, "proj_dim": proj}
