"""Which needle each layer reads while a multi-turn answer is decided: the evaluation's document (``eval --tasks
niah_multiturn``), its first question, and the right answer teacher-forced token by token under full KV and sekv; at
every answer token, per hooked layer and query head, the attention mass (softmax over every cell of the cache, the
policy's per-layer bias included) that falls on each needle's tokens — zoomed rows, window or anchor rows, and the
needle spans' summary rows where they are not masked. Shows the first layer at which sekv's heads read another
needle where full KV's read the asked one. Writes JSON.

    .venv/bin/python scripts/trace_binding.py --model qwen-coder --seed 1 --out bench/trace-binding-qwen-8k.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sekv_gguf.cli import sekv_overrides
from sekv_gguf.config import BudgetConfig, ContextConfig, SekvConfig
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.fidelity import log_softmax
from sekv_gguf.eval.trace import multiturn_conversation, sekv_memory
from sekv_gguf.models import model_by_name
from sekv_gguf.provenance import envelope
from sekv_gguf.session import load_model


SUMMARY = -2  # ``row_positions``: a summary row


def row_positions(policy, ikv: int) -> tuple[np.ndarray, np.ndarray]:
    """[n_cells] the token position whose row each cell of layer ``ikv`` holds (-1: none, ``SUMMARY``: a summary
    row), and [n_cells] the first position of the span a summary row stands for (-1 elsewhere): by the cell's own
    position, and for sekv's zoom slots by the span they hold."""
    hook = policy.session.hook
    pos = hook.cells_pos().astype(np.int64)                                  # [n_cells] position, -1 free
    rows, summary_of = pos.copy(), np.full(pos.size, -1, dtype=np.int64)
    memory = sekv_memory(policy)
    if memory is None:
        return rows, summary_of
    rows[memory.zoom.slots] = -1
    spans = memory.store.spans
    for sid, idx in memory.zoom.resident[ikv].items():
        rows[memory.zoom.slots[idx]] = spans[sid].positions
    for span in spans:  # a span's summary row speaks for the whole span (masked when it is zoomed)
        if span.summary_cell >= 0:
            rows[span.summary_cell] = SUMMARY
            summary_of[span.summary_cell] = int(span.positions[0])
    return rows, summary_of


def owners(rows: np.ndarray, summary_of: np.ndarray, needles: list[tuple[int, int]]) -> np.ndarray:
    """[n_cells] which needle (index into ``needles``) each cell holds a row or the summary of, -1 for none."""
    at = np.where(rows == SUMMARY, summary_of, rows)
    owner = np.full(rows.size, -1, dtype=np.int64)
    for j, (a, b) in enumerate(needles):
        owner[(at >= a) & (at < b)] = j
    return owner


@dataclass
class ExactRows:
    """Full KV's K rows of every needle token (the needles one after the other)."""

    k: list[np.ndarray]     # per hooked layer [n_tok, n_head_kv, d] f32
    owner: np.ndarray       # [n_tok] which needle (index into the needles) each token belongs to
    positions: np.ndarray   # [n_tok] each token's position

    def at(self, ikv: int, positions: np.ndarray) -> np.ndarray:
        """Layer ``ikv``'s exact K rows [n, n_head_kv, d] of ``positions`` (needle tokens)."""
        index = {int(p): i for i, p in enumerate(self.positions)}
        return self.k[ikv][[index[int(p)] for p in positions]]


def exact_rows(policy, needles: list[tuple[int, int]]) -> ExactRows:
    """Full KV's K rows of every needle token, read from ``policy``'s cache (every token resident)."""
    hook = policy.session.hook
    pos = hook.cells_pos()
    cells = np.concatenate([np.flatnonzero((pos >= a) & (pos < b)) for a, b in needles])
    owner = np.concatenate([np.full(int(((pos >= a) & (pos < b)).sum()), j) for j, (a, b) in enumerate(needles)])
    return ExactRows([hook.get_values(ikv, cells)[0].astype(np.float32) for ikv in range(len(hook.layers))], owner,
                     pos[cells].astype(np.int64))


def among_needles(q: np.ndarray, k: np.ndarray, owner: np.ndarray, n: int) -> list[list[float]]:
    """Per query head of ``q`` [n_head, d]: the softmax over the needle tokens' exact keys ``k`` [n_tok, n_head_kv,
    d] alone, summed per needle — which needle the query prefers, whatever else the cache holds."""
    group = q.shape[0] // k.shape[1]
    logits = np.einsum("hd,nhd->hn", q, np.repeat(k, group, axis=1))       # [n_head, n_tok]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return [[round(float(p[h, owner == j].sum()), 4) for j in range(n)] for h in range(q.shape[0])]


def needle_mass(policy, needles: list[tuple[int, int]], exact: ExactRows) -> tuple[list, list, list]:
    """Per hooked layer, per query head: the attention mass of the last decode's last token on each needle; the same
    query's preference among the needles' exact keys (``among_needles``); and per needle the rows the layer holds
    (``needle_rows``)."""
    hook = policy.session.hook
    pos = hook.cells_pos()
    live = pos >= 0
    out, prefer, held = [], [], []
    for ikv in range(len(hook.layers)):
        layer = hook.layers[ikv]
        q = hook.query(ikv)                                                  # [n_head, d] times kq_scale
        prefer.append(among_needles(q, exact.k[ikv], exact.owner, len(needles)))
        k, _ = hook.get_values(ikv, np.flatnonzero(live))                    # [n_live, n_head_kv, d]
        group = layer.n_head // layer.n_head_kv
        # query head h reads KV head h // group: [n_head, n_live]
        logits = np.einsum("hd,nhd->hn", q, np.repeat(k.astype(np.float32), group, axis=1))
        if sekv_memory(policy) is not None:  # the per-layer bias (summaries +log|S|, masked cells -inf)
            logits = logits + hook.get_bias(ikv)[live][None, :]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)                                    # [n_head, n_live]
        rows, summary_of = row_positions(policy, ikv)
        owner = owners(rows, summary_of, needles)[live]                      # [n_live]
        out.append([[round(float(p[h, owner == j].sum()), 4) for j in range(len(needles))]
                    for h in range(layer.n_head)])
        held.append(needle_rows(rows[live], k, exact, ikv, needles))
    return out, prefer, held


def needle_rows(rows: np.ndarray, k: np.ndarray, exact: ExactRows, ikv: int, needles) -> list[dict]:
    """Per needle: how many of its token rows layer ``ikv`` holds, and their K rows' relative error against full
    KV's (``exact``) — rows that a streamed prefill computed over compressed memory, or rounded in the host tier."""
    out = []
    for j, (a, b) in enumerate(needles):
        have = np.flatnonzero((rows >= a) & (rows < b))                      # live cells of this needle's rows
        ref = exact.at(ikv, rows[have])                                      # [n, n_head_kv, d]
        got = k[have].astype(np.float32)
        err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-9)) if have.size else None
        out.append({"rows": int(have.size), "of": int((exact.owner == j).sum()),
                    "k_rel_err": None if err is None else round(err, 4)})
    return out


def forced(model, doc, question, answer, needles, name, budget, params, threads, chunk,
           exact: ExactRows | None = None) -> tuple[dict, ExactRows]:
    """The right answer fed token by token after ``question``: per token p(it), and before it every layer's and
    head's mass on each needle."""
    target = model.tokenize((" " + answer).encode(), add_bos=False, special=False)
    policy = make_policy(name, model, len(doc) + len(question) + len(target) + 1, ContextConfig(n_threads=threads),
                         BudgetConfig(kv_budget=budget or 1.0, chunk=chunk), params)
    policy.session.hook.enable_query_capture()  # full KV's policy does not capture queries of its own
    steps = []
    try:
        policy.prefill(doc)
        if exact is None:  # full KV's run comes first
            exact = exact_rows(policy, needles)
        logits = policy.append(question)
        for token in target:
            p = np.exp(log_softmax(np.asarray(logits)))                      # [n_vocab]
            mass, prefer, held = needle_mass(policy, needles, exact)
            steps.append({"token": policy.session.text([token]), "p": round(float(p[token]), 3),
                          "top": policy.session.text([int(np.argmax(p))]), "mass": mass, "prefer": prefer,
                          "held": held})
            logits = policy.step(token)
    finally:
        policy.close()
    return {"policy": name, "budget": budget, "steps": steps}, exact


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma", help='"gemma" (the default model), "qwen-coder", or a GGUF path')
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--sekv", action="append", metavar="KEY=VALUE", help="a SekvConfig override (repeatable)")
    ap.add_argument("--chunk", type=int, default=BudgetConfig.chunk, help="prompt tokens per llama_decode")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/trace-binding.json")
    args = ap.parse_args()
    path = model_by_name(args.model)
    model = load_model(str(path))
    conv = multiturn_conversation(model, args.tokens, args.seed)
    question, answer = conv.turns[0]
    values = [answer] + [v for v in conv.case.answers if v != answer]       # the asked needle first
    needles = [conv.needles[v] for v in values]
    full, exact = forced(model, conv.doc, question, answer, needles, "full", None, None, args.threads, args.chunk)
    sekv, _ = forced(model, conv.doc, question, answer, needles, "sekv", args.budget,
                     SekvConfig(**sekv_overrides(args.sekv or [])), args.threads, args.chunk, exact)
    rows = [full, sekv]
    decisive = int(np.argmin([s["p"] for s in rows[1]["steps"]]))            # the answer token sekv doubts most
    for row in rows:
        step = row["steps"][decisive]
        print(f"{row['policy']}: token {step['token']!r} p {step['p']} (top {step['top']!r})")
        for ikv, heads in enumerate(step["mass"]):
            best = max(range(len(heads)), key=lambda h: sum(heads[h]))       # the head most on the needles
            pref = step["prefer"][ikv][best]
            print(f"  layer {ikv:2d}  head {best:2d}  mass: asked {heads[best][0]:.3f}  others "
                  + " ".join(f"{m:.3f}" for m in heads[best][1:])
                  + "  | among exact keys: " + " ".join(f"{m:.3f}" for m in pref)
                  + "  | rows held (K err): " + " ".join(f"{h['rows']}/{h['of']} ({h['k_rel_err']})"
                                                       for h in step["held"][ikv]))
    Path(args.out).write_text(json.dumps({**envelope(), "model": path.name, "params": vars(args), "values": values,
                                          "needles": needles, "decisive_step": decisive, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
