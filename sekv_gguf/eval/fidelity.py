"""Teacher-forced fidelity: how far a policy's next-token distributions drift from full KV on natural text.

A document is prefilled up to its middle; then its own next tokens are fed one by one (teacher forcing) to ``full``
and to the policy, and at every step KL(full ‖ policy) of the next-token distributions and whether their argmax
agree are recorded, over the second half of the document (``n_steps`` tokens of it), and as llama-perplexity's
``--kl-divergence`` also reports it, Δp: the policy's probability of the document's actual next token minus full
KV's (negative where the policy is less sure of what the text does say next), and ln(PPL(policy) / PPL(full)): the
mean over those tokens of ln p_full(next) − ln p_policy(next). KL treats full KV as the truth; these two and the
share of steps whose top token is the text's own next token (for the policy and for full KV) tell where a policy
that disagrees with full KV is the one the text agrees with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..decode import decode_loop, forced
from ..policies import Policy


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p ‖ q) in nats of the softmax distributions of two logit vectors [n_vocab]."""
    return _kl_of_log(log_softmax(p_logits), log_softmax(q_logits))


def _kl_of_log(lp: np.ndarray, lq: np.ndarray) -> float:
    """KL(p ‖ q) of two log-probability vectors [n_vocab]."""
    return float(np.sum(np.exp(lp) * (lp - lq)))


KL_TAIL = 99.0  # the percentile of per-token KL reported beside mean and median (llama-perplexity's 99.0%)
KL_LARGE = 1.0  # nats: a step counted as a large disagreement with full KV (whose side the text takes is reported)


@dataclass
class Fidelity:
    """One document's teacher-forced comparison: KL(full ‖ policy) per forced token (nats) and their mean, median
    and ``KL_TAIL`` percentile; the share of tokens whose top token is full KV's (llama-perplexity's "same top");
    Δp per forced token (the actual next token's probability, policy − full KV) with its mean and root mean
    square (llama-perplexity's "Mean Δp", "RMS Δp"); ln p_full − ln p_policy of the actual next token per forced token
    and their mean (llama-perplexity's "Mean ln(PPL(Q)/PPL(base))": positive where the policy predicts the text
    worse); the share of forced tokens that are the policy's top token (``top1_text``) and full KV's
    (``ref_top1_text``)."""

    kl_mean: float
    kl_median: float
    kl_p99: float
    top1_agreement: float
    n_steps: int
    kls: list[float]
    delta_p_mean: float
    delta_p_rms: float
    delta_ps: list[float]
    ln_ppl_ratio: float
    ln_ppl_ratios: list[float]
    top1_text: float
    ref_top1_text: float


def _prefix(tokens: list[int]) -> int:
    """How many of a document's tokens are prefilled before teacher forcing starts: its first half."""
    return len(tokens) // 2


def forced_logits(policy: Policy, tokens: list[int], n_steps: int) -> Iterator[np.ndarray]:
    """Prefill ``policy`` with the first half of ``tokens``, then feed the next tokens of the second half one by one;
    yields the next-token logits [n_vocab] after the prefill and after each fed token (``n_steps`` in all)."""
    half = _prefix(tokens)
    steps = min(n_steps, len(tokens) - half)
    if half < 1 or steps < 1:
        raise ValueError(f"a document of {len(tokens)} tokens is too short for teacher forcing")
    rows = [policy.prefill(tokens[:half])]
    decode_loop(policy.step, rows[0], steps - 1, forced(tokens[half:]), after_step=lambda k, logits: rows.append(logits))
    yield from rows


def teacher_forced(reference: np.ndarray, policy: Policy, tokens: list[int]) -> Fidelity:
    """Compare ``policy`` with the reference (full KV) logits [n_steps, n_vocab] of ``forced_logits``."""
    kls, agree, dps, lns, hits, ref_hits = [], [], [], [], [], []
    nexts = tokens[_prefix(tokens):]  # the token each step's logits predict (forced_logits' first is the prefill's)
    for ref, got, nxt in zip(reference, forced_logits(policy, tokens, reference.shape[0]), nexts):
        lp, lq = log_softmax(ref), log_softmax(got)  # [n_vocab] each
        kls.append(_kl_of_log(lp, lq))
        top_ref, top_got = int(np.argmax(ref)), int(np.argmax(got))
        agree.append(top_ref == top_got)
        dps.append(float(np.exp(lq[nxt]) - np.exp(lp[nxt])))
        lns.append(float(lp[nxt] - lq[nxt]))
        hits.append(top_got == nxt)
        ref_hits.append(top_ref == nxt)
    return Fidelity(kl_mean=float(np.mean(kls)), top1_agreement=float(np.mean(agree)), n_steps=len(kls),
                    kls=[float(x) for x in kls], delta_ps=dps, ln_ppl_ratio=float(np.mean(lns)), ln_ppl_ratios=lns,
                    top1_text=float(np.mean(hits)), ref_top1_text=float(np.mean(ref_hits)),
                    **token_spread(np.asarray(kls), np.asarray(dps)))


def token_spread(kls: np.ndarray, dps: np.ndarray) -> dict[str, float]:
    """The per-token figures llama-perplexity reports beside the means: KL's median and ``KL_TAIL`` percentile over
    ``kls`` [tokens], Δp's mean and root mean square over ``dps`` [tokens] (one document's or pooled); an empty
    array (rows of earlier files) gives none of its figures."""
    out = {"kl_median": float(np.median(kls)), "kl_p99": float(np.percentile(kls, KL_TAIL))} if kls.size else {}
    if dps.size:
        out.update(delta_p_mean=float(dps.mean()), delta_p_rms=float(np.sqrt(np.mean(dps * dps))))
    return out
