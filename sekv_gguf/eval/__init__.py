"""Offline evaluation tasks (RULER-style, generated from a seed): ``make_case`` builds a prompt, ``score`` grades it."""

from .tasks import TASKS, Case, make_case, score

__all__ = ["TASKS", "Case", "make_case", "score"]
