"""The evaluation's tasks: the generated RULER-style prompts, made in ``sekv_gguf.ruler_tasks`` (a level below eval/
and train/: training mixes its needle tasks into its documents too), and their grading, ``score`` (RULER's substring
match)."""

from __future__ import annotations

import re

from ..ruler_tasks import HAYSTACKS, OWN_CONTEXT_TASKS, PINNED_DEPTH_TASKS, TASKS, Case, make_case

__all__ = ["HAYSTACKS", "OWN_CONTEXT_TASKS", "PINNED_DEPTH_TASKS", "TASKS", "Case", "make_case", "score"]


def score(case: Case, output: str) -> float:
    """RULER's string match: "any" scores 1.0 if one reference occurs in ``output``, "all" the fraction that occur
    (case-insensitive substrings, whitespace stripped); "first" 1.0 if the output's first word is a reference (a
    classification's label: an output that lists every label scores nothing)."""
    text = output.strip().lower()
    hits = [answer.strip().lower() in text for answer in case.answers]
    if case.metric == "any":
        return float(any(hits))
    if case.metric == "all":
        return sum(hits) / len(hits)
    if case.metric == "first":
        words = re.findall(r"[^\W_]+", text)
        return float(bool(words) and words[0] in {answer.strip().lower() for answer in case.answers})
    raise ValueError(f"unknown metric {case.metric!r}; valid metrics: all, any, first")
