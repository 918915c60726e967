"""Training documents, disjoint from the evaluation suite's text: documentation of standard-library modules the
suite does not read (it reads argparse, collections, json, textwrap, logging, unittest), and generated needle tasks
on RULER's filler haystack with seeds the suite does not use."""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Callable, Iterator

from ..ruler_tasks import make_case

TRAIN_MODULES = ("pathlib", "email.message", "http.client", "asyncio.tasks", "typing", "random", "statistics",
                 "datetime", "csv", "sqlite3", "subprocess", "threading", "decimal", "fractions", "heapq", "shutil",
                 "tarfile", "zipfile", "socket", "string", "difflib", "pickle", "functools", "itertools")
TRAIN_SEED0 = 100_000  # generated tasks: seeds from here on (the suite uses small seeds)


def module_text(name: str) -> str:
    """A module's docstring and those of its public classes and functions, in source order."""
    mod = importlib.import_module(name)
    parts = [inspect.getdoc(mod) or ""]
    with warnings.catch_warnings():  # typing's deprecated io / re aliases warn when touched
        warnings.simplefilter("ignore", DeprecationWarning)
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc:
                parts.append(f"{attr}\n{doc}")
    return "\n\n".join(p for p in parts if p)


TRIM = 0.9  # an over-long document is cut to this share of its characters until it fits its token count


def documents(count: Callable[[str], int], n_tokens: int, n_docs: int) -> Iterator[tuple[str, str]]:
    """(name, text) pairs of about ``n_tokens`` tokens: natural text first, every third one a needle task."""
    prose = "\n\n".join(module_text(m) for m in TRAIN_MODULES)
    chars = max(4 * n_tokens, 1000)
    offset = 0
    for i in range(n_docs):
        if i % 3 == 2:
            case = make_case("niah_number", count, n_tokens, TRAIN_SEED0 + i, "filler")
            yield f"niah_number/{TRAIN_SEED0 + i}", case.prompt
            continue
        text = (prose[offset:] + prose[:offset])[:chars]
        while count(text) > n_tokens:
            text = text[: int(len(text) * TRIM)]
        yield f"prose@{offset}", text
        offset = (offset + chars) % len(prose)
