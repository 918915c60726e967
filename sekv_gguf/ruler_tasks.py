"""Generated, offline long-context tasks modelled on RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?").

Every task is a plain completion prompt for a base LM: an instruction, a context fitted to ``n_tokens`` tokens as
counted by ``count(text)`` (``fit_size``, the one search over a context's size), then a question ending in an answer
lead, so the greedy continuation should contain the answers (``eval.tasks.score`` grades it with RULER's
substring match). The evaluation suite runs these tasks; training (``train.corpus``) mixes needle tasks of its own
seeds into its documents.

Retrieval tasks (``niah_*``, ``kv_retrieval``, ``variable_tracking``) and ``arithmetic`` insert their sentences into a
haystack, each at the sentence boundary nearest its depth (a fraction of the context's characters): ``"filler"`` is
RULER's repeated noise sentences, ``"prose"`` is ``stdlib_prose()`` from a paragraph picked by the seed, ``"code"``
is ``stdlib_code()`` (standard-library source) from a blank line picked by the seed, where a fact may start any
line. ``code_function`` inserts a function definition and asks what it returns (a function defined early in a long
file, called late); ``table_lookup`` is a long CSV table, the whole context (its case's haystack is ``"table"``),
and asks for one row's code by its id; ``many_shot_labels``'s labelled examples are the whole context too (its
haystack is ``"examples"``). In ``frequent_words`` the word list is the whole context, and the haystack
picks its vocabulary: RULER's random letter strings for ``"filler"``, words of the text for the others. Sentence
boundaries in the prose are a few hundred characters apart at most, so a fact sits within 0.05 of its depth from
~2K tokens on (further off in shorter prose).

``Case.meta`` holds ``context`` (its character span in the prompt), ``inserted`` (each inserted text, its offset in the
context, the offset of its fact within it, its depth and whether it holds an answer), ``prompt_tokens`` and
``max_new_tokens`` (the answers' token count plus a margin: a UUID alone is ~37 Gemma tokens, four 7-digit numbers
~37). For ``arithmetic`` (``stop``), score the first line of the output: later lines invent more problems.
``answer_span`` finds the inserted text that holds an answer in the prompt (``inserted_spans``: every inserted
text), ``token_range`` its tokens.

Two plain needles outside the task list, sized by the same ``fit_size``: ``needle_prompt`` (a "special magic number
for <city>" sentence in the prose, the engine and RPC benchmarks' and a Gemma test's prompt) and
``access_code_needle`` (the access code of the blue archive, ``scripts/long_needle.py``'s case). Both come with the
needle's character span.

The texts the prompts are made of live here too: ``stdlib_prose()``, natural English text found on every machine (the
standard library's documentation strings), and ``FIRST_NAMES`` (``documents`` uses them as well).
"""

from __future__ import annotations

import bisect
import math
import random
import re
import string
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

Count = Callable[[str], int]

# first names of invented people (the people of the word problems; documents' gazetteer's harbour masters)
FIRST_NAMES = ["Ada", "Bruno", "Celia", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaia", "Luca",
               "Mira", "Nils", "Oona", "Pavel", "Rosa", "Soren", "Tamsin", "Viktor"]

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
HAYSTACKS = ("filler", "prose", "code")
# the standard-library modules whose source is the code haystack (and the code fidelity corpus)
CODE_MODULES = ("argparse", "difflib", "textwrap", "json.decoder", "json.encoder", "logging", "collections",
                "unittest.case", "dataclasses", "string")

# a new sentence starts after ., ! or ? and whitespace, after a blank line, or at a code/table/list line
_BOUNDARY = re.compile(r"[.!?]\s+|\n\s*\n\s*|\n(?=[ \t]*[>|+*%-])")
_LINE_START = re.compile(r"\n")  # in code a fact may start any line
_ADJECTIVES = ["amber", "brisk", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly", "keen",
               "lofty", "mellow", "nimble", "odd", "plain", "quiet", "rusty", "silent", "tidy"]
_NOUNS = ["anchor", "badger", "candle", "dagger", "engine", "falcon", "garden", "harbor", "island", "jacket", "kettle",
          "lantern", "meadow", "nutmeg", "orchard", "pebble", "quarry", "ribbon", "saddle", "tunnel"]
# uncommon words, none of which occurs in stdlib_prose()
_WORDS = ["quixotic", "ephemeral", "obsidian", "halcyon", "petrichor", "sonorous", "labyrinth", "gossamer", "verdigris",
          "zephyr", "mellifluous", "tenebrous", "cormorant", "meridian", "apricity", "sibilant", "palimpsest",
          "nocturne", "quagmire", "bramble", "cinnabar", "filigree", "lacuna", "marzipan", "nebula", "opaline",
          "parapet", "quiescent", "reverie", "solstice", "talisman", "umbrage", "wistful", "xylophone", "yarrow",
          "zenith", "alabaster", "brocade", "chrysalis", "damask", "effigy", "fjord", "garrulous", "harbinger",
          "isthmus", "juniper", "kestrel", "lanolin", "mandolin", "nautilus", "ocelot", "pangolin", "quince",
          "rhubarb", "saffron", "tamarind"]
_ITEMS = ["apples", "pencils", "marbles", "stamps", "cookies", "books", "shells", "coins", "buttons", "cards"]


@dataclass(frozen=True)
class Case:
    task: str
    prompt: str  # instruction + context (haystack with inserted sentences) + question + answer lead
    answers: tuple[str, ...]  # reference strings that must appear in the model output
    metric: str  # "all": every reference must appear (the score is the fraction found); "any": one suffices;
    # "first": the output's first word is a reference
    depth: float  # depth of the first inserted text that holds an answer, as a fraction of the context (NaN: none)
    haystack: str  # "filler" or "prose"
    seed: int
    n_tokens: int  # the target token length
    meta: dict


@dataclass(frozen=True)
class _Insert:
    text: str
    depth: float
    answer: bool = False  # holds an answer
    anchor: int = 0  # where in the text the fact starts: that is what sits at the depth


def stdlib_prose() -> str:
    """Natural English text present on every machine: documentation strings of a few standard modules."""
    import argparse
    import collections
    import inspect
    import json as json_mod
    import logging
    import textwrap
    import unittest

    parts: list[str] = []
    for mod in (argparse, collections, json_mod, textwrap, logging, unittest):
        parts.append(inspect.getdoc(mod) or "")
        for obj in vars(mod).values():
            if inspect.isclass(obj) or inspect.isfunction(obj):
                parts.append(inspect.getdoc(obj) or "")
                if inspect.isclass(obj):
                    parts.extend(inspect.getdoc(m) or "" for m in vars(obj).values() if inspect.isfunction(m))
    return "\n\n".join(dict.fromkeys(p for p in parts if len(p) > 80))


@lru_cache(maxsize=1)
def _prose() -> str:
    return stdlib_prose()


@lru_cache(maxsize=1)
def stdlib_code() -> str:
    """Python source found on every machine: the standard library's ``CODE_MODULES``, one after the other."""
    import importlib
    import inspect

    return "\n\n".join(f"# {name}\n" + inspect.getsource(importlib.import_module(name)) for name in CODE_MODULES)


def _text(haystack: str) -> str:
    """The natural text a haystack is cut from: the prose, or the code."""
    return stdlib_code() if haystack == "code" else _prose()


def _rotated(start: int, sep: str, text: str | None = None) -> str:
    """The prose (or ``text``) from character ``start`` on, then ``sep`` and the part before ``start``."""
    text = _prose() if text is None else text
    return text[start:] + sep + text[:start]


def _repeat(unit: str, n_chars: int) -> str:
    """The first ``n_chars`` characters of ``unit`` repeated."""
    return (unit * (n_chars // len(unit) + 1))[:n_chars]


def _check_haystack(haystack: str) -> None:
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; valid haystacks: {', '.join(HAYSTACKS)}")


def _check_depth(depth: float | None) -> None:
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth is a fraction of the context in [0, 1], got {depth}")


def _haystack_unit(haystack: str, rng: random.Random) -> str:
    """The text the haystack repeats: the filler sentences, or the prose (the code) rotated to start at a seeded
    paragraph (blank line)."""
    if haystack == "filler":
        return FILLER + " "
    text = _text(haystack)
    return _rotated(rng.choice([0] + [m.end() for m in re.finditer(r"\n\n", text)]), "\n\n", text)


def _body(unit: str, n_chars: int) -> str:
    """The first ``n_chars`` characters of ``unit`` repeated, cut back to a whole word."""
    text = _repeat(unit, n_chars + 1)
    body = text[:n_chars]
    if not text[n_chars].isspace():
        body = body[:max(body.rfind(" "), body.rfind("\n")) + 1]
    return body.rstrip()


def _insert(body: str, inserts: list[_Insert], sep: str, boundary: re.Pattern = _BOUNDARY) -> tuple[str, list[int]]:
    """``body`` with every insert at the sentence boundary (``boundary``; in code any line start) that puts its anchor
    nearest its depth (a fraction of the result's length), and the inserts' offsets in the result."""
    bounds = [0] + [m.end() for m in boundary.finditer(body)] + ([len(body)] if body.endswith((".", "!", "?")) else [])
    total = len(body) + sum(len(x.text) + len(sep) for x in inserts)
    parts: list[str] = []
    offsets = [0] * len(inserts)
    n = pos = shift = 0  # characters written, body characters used, characters inserted so far
    for i in sorted(range(len(inserts)), key=lambda i: inserts[i].depth):
        target = inserts[i].depth * total - shift - inserts[i].anchor
        k = bisect.bisect_left(bounds, target)
        cut = min((b for b in bounds[max(k - 1, 0):k + 1] if b >= pos), key=lambda b: abs(b - target), default=pos)
        chunk = body[pos:cut]
        if chunk and not chunk[-1].isspace():  # only at the end of a body that ends a sentence
            chunk += sep
        offsets[i] = n + len(chunk)
        parts += [chunk, inserts[i].text + sep]
        n, pos, shift = offsets[i] + len(parts[-1]), cut, shift + len(parts[-1])
    parts.append(body[pos:])
    return "".join(parts).rstrip(), offsets


def fit_size(count: Count, n_tokens: int, prompt: Callable[[int], str], lo: int, guess: int, what: str) -> int:
    """The largest size (>= ``lo``) whose ``prompt(size)`` has at most ``n_tokens`` tokens, to a unit or 0.1%: a
    bracket shrunk by interpolation (a safeguarded bisection; ``count`` can be slow on long texts). ``what`` names the
    prompt in the error when even ``lo`` does not fit. Every prompt of this module is sized by it."""
    c_lo = count(prompt(lo))
    if c_lo > n_tokens:
        raise ValueError(f"n_tokens={n_tokens} is too small for {what}: it needs at least {c_lo} tokens")
    hi = max(lo + 1, guess)
    while (c_hi := count(prompt(hi))) <= n_tokens:
        lo, c_lo, hi = hi, c_hi, 2 * hi
        if hi > 1000 * (n_tokens + 1000):
            raise ValueError("count(text) does not grow with the text")
    while hi - lo > max(1, lo // 1024) and c_lo < n_tokens - n_tokens // 1024:
        step = (hi - lo) * (n_tokens - c_lo) // max(c_hi - c_lo, 1)
        mid = lo + min(max(step, (hi - lo) // 8, 1), hi - lo - max((hi - lo) // 8, 1))
        c_mid = count(prompt(mid))
        lo, c_lo, hi, c_hi = (mid, c_mid, hi, c_hi) if c_mid <= n_tokens else (lo, c_lo, mid, c_mid)
    return lo


def _meta(count: Count, prompt: str, head: str, context: str, answers: tuple[str, ...], **extra) -> dict:
    return {"context": (len(head), len(head) + len(context)), "prompt_tokens": count(prompt),
            "max_new_tokens": count(" " + ", ".join(answers)) + 8, **extra}


def _haystack_case(task: str, count: Count, n_tokens: int, seed: int, haystack: str, rng: random.Random, head: str,
                   inserts: list[_Insert], tail: str, answers: tuple[str, ...], metric: str, sep: str = " ",
                   **extra) -> Case:
    """A haystack fitted to ``n_tokens`` with ``inserts`` in it, between ``head`` and ``tail``."""
    unit = _haystack_unit(haystack, rng)
    cuts = _LINE_START if haystack == "code" else _BOUNDARY
    size = fit_size(count, n_tokens, lambda n: head + _insert(_body(unit, n), inserts, sep, cuts)[0] + tail,
                    lo=0, guess=4 * n_tokens, what=f"task {task!r}")
    context, offsets = _insert(_body(unit, size), inserts, sep, cuts)
    prompt = head + context + tail
    placed = sorted(({"text": x.text, "offset": off, "anchor": x.anchor, "depth": x.depth, "answer": x.answer}
                     for x, off in zip(inserts, offsets)), key=lambda d: d["offset"])
    depth = next((d["depth"] for d in placed if d["answer"]), math.nan)
    return Case(task, prompt, answers, metric, depth, haystack, seed, n_tokens,
                _meta(count, prompt, head, context, answers, inserted=placed, **extra))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(1_000_000, 9_999_999))
    return rng.choice(_WORDS) if kind == "words" else _uuid(rng)


def _depth(rng: random.Random) -> float:
    return round(rng.random(), 3)


def _niah(task: str, count: Count, n_tokens: int, seed: int, haystack: str, kind: str = "numbers",
          n_keys: int = 1, n_values: int = 1, n_queries: int = 1, depth: float | None = None) -> Case:
    """RULER's needle in a haystack: ``n_keys`` keys with ``n_values`` values each, ``n_queries`` keys asked.
    ``depth`` pins the asked needles' depth (the seed still draws every other choice, so the value is unchanged)."""
    _check_haystack(haystack)
    _check_depth(depth)
    rng = random.Random(seed)
    keys = [f"{a}-{b}" for a, b in rng.sample([(a, b) for a in _ADJECTIVES for b in _NOUNS], n_keys)]
    values: list[str] = []
    while len(values) < n_keys * n_values:
        value = _value(kind, rng)
        if value not in values:
            values.append(value)
    needles = [(keys[i // n_values], value) for i, value in enumerate(values)]
    asked = keys[:n_queries]
    drawn = [_depth(rng) for _ in needles]
    inserts = [_Insert(f"One of the special magic {kind} for {k} is: {v}.",
                       depth if depth is not None and k in asked else d, k in asked)
               for (k, v), d in zip(needles, drawn)]
    answers = tuple(v for k in asked for key, v in needles if key == k)
    head = (f"Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
            f"I will quiz you about the {kind} afterwards.\n\n")
    who = " and ".join(asked)
    if len(answers) == 1:
        question = f"What is the special magic {kind[:-1]} for {who} mentioned in the provided text?"
        lead = f"The special magic {kind[:-1]} for {who} mentioned in the provided text is:"
    else:
        question = f"What are all the special magic {kind} for {who} mentioned in the provided text?"
        lead = f"The special magic {kind} for {who} mentioned in the provided text are:"
    return _haystack_case(task, count, n_tokens, seed, haystack, rng, head, inserts,
                          f"\n\nQuestion: {question}\nAnswer: {lead}", answers, "all")


def niah_number(count: Count, n_tokens: int, seed: int, haystack: str = "prose", depth: float | None = None) -> Case:
    return _niah("niah_number", count, n_tokens, seed, haystack, depth=depth)


def niah_word(count: Count, n_tokens: int, seed: int, haystack: str = "prose", depth: float | None = None) -> Case:
    return _niah("niah_word", count, n_tokens, seed, haystack, kind="words", depth=depth)


def niah_uuid(count: Count, n_tokens: int, seed: int, haystack: str = "prose", depth: float | None = None) -> Case:
    return _niah("niah_uuid", count, n_tokens, seed, haystack, kind="UUIDs", depth=depth)


def niah_multikey(count: Count, n_tokens: int, seed: int, haystack: str = "prose", depth: float | None = None) -> Case:
    return _niah("niah_multikey", count, n_tokens, seed, haystack, n_keys=4, depth=depth)


def niah_multivalue(count: Count, n_tokens: int, seed: int, haystack: str = "prose", depth: float | None = None) -> Case:
    return _niah("niah_multivalue", count, n_tokens, seed, haystack, n_values=4, depth=depth)


def niah_multiquery(count: Count, n_tokens: int, seed: int, haystack: str = "prose", depth: float | None = None) -> Case:
    return _niah("niah_multiquery", count, n_tokens, seed, haystack, n_keys=4, n_queries=2, depth=depth)


def niah_multiturn(count: Count, n_tokens: int, seed: int, haystack: str = "prose", n_turns: int = 3) -> Case:
    """SCBench's shared-context setting: a document holding ``n_turns`` special magic numbers (one per stratum of
    depth) and no question; ``meta["turns"]`` holds the later questions, one per number in a seeded order, each a
    text to append after the document (and the earlier turns) and its answer. The prompt ends with the document."""
    _check_haystack(haystack)
    rng = random.Random(seed)
    keys = [f"{a}-{b}" for a, b in rng.sample([(a, b) for a in _ADJECTIVES for b in _NOUNS], n_turns)]
    values: list[str] = []
    while len(values) < n_turns:
        value = _value("numbers", rng)
        if value not in values:
            values.append(value)
    depths = [round((i + 0.1 + 0.8 * rng.random()) / n_turns, 3) for i in range(n_turns)]
    inserts = [_Insert(f"One of the special magic numbers for {k} is: {v}.", d, True)
               for k, v, d in zip(keys, values, depths)]
    head = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.\n\n")
    order = rng.sample(range(n_turns), n_turns)
    turns = [{"text": f"\n\nQuestion: What is the special magic number for {keys[i]} mentioned in the provided "
                      f"text?\nAnswer: The special magic number for {keys[i]} mentioned in the provided text is:",
              "answer": values[i], "depth": depths[i]} for i in order]
    return _haystack_case("niah_multiturn", count, n_tokens, seed, haystack, rng, head, inserts, "",
                          tuple(values), "all", turns=turns)


def kv_retrieval(count: Count, n_tokens: int, seed: int, haystack: str = "prose") -> Case:
    """A JSON object of UUID pairs (one pair per 256 target tokens, at least 4); the asked pair is at a seeded depth
    (the object sits around it: the pair's index in the object is in proportion to its depth)."""
    _check_haystack(haystack)
    rng = random.Random(seed)
    pairs = [(_uuid(rng), _uuid(rng)) for _ in range(max(4, n_tokens // 256))]
    depth = _depth(rng)
    key, value = pairs[min(int(depth * len(pairs)), len(pairs) - 1)]
    block = "JSON data:\n{" + ",\n ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
    head = "The text below contains a JSON object. Extract the value corresponding to the specified key in it.\n\n"
    tail = (f'\n\nQuestion: What is the value associated with the key "{key}" in the JSON object above?\n'
            f'Answer: The value associated with the key "{key}" is:')
    return _haystack_case("kv_retrieval", count, n_tokens, seed, haystack, rng, head,
                          [_Insert(block, depth, True, block.index(f'"{key}"'))], tail, (value,), "all", sep="\n\n",
                          n_pairs=len(pairs))


def variable_tracking(count: Count, n_tokens: int, seed: int, haystack: str = "prose") -> Case:
    """RULER's variable tracking, one chain of 4 hops: "VAR A = 12345.", "VAR B = VAR A.", ... in order."""
    _check_haystack(haystack)
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < 5:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99999))
    lines = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
    depths = sorted(_depth(rng) for _ in lines)
    head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    tail = (f"\n\nQuestion: Find all variables that are assigned the value {value} in the text above.\n"
            f"Answer: According to the chain(s) of variable assignment in the text above, {len(names)} variables "
            f"are assigned the value {value}, they are:")
    return _haystack_case("variable_tracking", count, n_tokens, seed, haystack, rng, head,
                          [_Insert(s, d, True) for s, d in zip(lines, depths)], tail, tuple(names), "all")


def _vocabulary(haystack: str, rng: random.Random, size: int) -> list[str]:
    """``size`` distinct words; the first three are no substring of any other (they are the answers)."""
    _check_haystack(haystack)
    if haystack == "filler":
        words: set[str] = set()
        while len(words) < size:
            words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 7))))
        vocab = rng.sample(sorted(words), size)
    else:
        vocab = rng.sample(sorted(set(re.findall(r"(?<![\w'])[a-z]{4,12}(?![\w'])", _text(haystack)))), size)
    top = [w for w in vocab if not any(w != o and w in o for o in vocab)][:3]
    return top + [w for w in vocab if w not in top]


def frequent_words(count: Count, n_tokens: int, seed: int, haystack: str = "prose") -> Case:
    """RULER's frequent words extraction: a shuffled list whose word counts fall off as 1/rank (Zipf); the three
    most frequent words are asked."""
    rng = random.Random(seed)
    vocab = _vocabulary(haystack, rng, 200)
    salt = rng.getrandbits(64)

    def words(n: int) -> tuple[list[str], list[int]]:  # about n words, rank r counted n / (r * H_V) times
        weights = [1 / r for r in range(1, min(len(vocab), max(20, n // 20)) + 1)]
        counts = [int(n * w / sum(weights)) for w in weights]
        seq = [w for w, c in zip(vocab, counts) for _ in range(c)]
        random.Random(f"{salt}:{n}").shuffle(seq)
        return seq, counts

    head = ("Read the following text and track how often each word appears. "
            "Find the three most frequently appeared words.\n\n")
    tail = ("\n\nQuestion: What are the three most frequently appeared words in the text above?\n"
            "Answer: According to the text above, the three most frequently appeared words are:")
    n = fit_size(count, n_tokens, lambda n: head + " ".join(words(n)[0]) + tail, lo=100, guess=n_tokens // 2,
                 what="task 'frequent_words'")
    seq, counts = words(n)
    context = " ".join(seq)
    prompt = head + context + tail
    answers = tuple(vocab[:3])
    return Case("frequent_words", prompt, answers, "all", math.nan, haystack, seed, n_tokens,
                _meta(count, prompt, head, context, answers, inserted=[], n_words=len(seq),
                      counts=dict(zip(vocab, counts[:5]))))


def _problem(rng: random.Random) -> tuple[str, int]:
    """A one-step word problem and its answer (10 or more)."""
    name, item, form = rng.choice(FIRST_NAMES), rng.choice(_ITEMS), rng.randrange(4)
    if form == 0:
        a, b = rng.randint(10, 60), rng.randint(2, 30)
        return f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?", a + b
    if form == 1:
        a = rng.randint(20, 99)
        b = rng.randint(1, a - 10)
        return f"{name} had {a} {item} and gave {b} of them away. How many {item} does {name} have left?", a - b
    if form == 2:
        a, b = rng.randint(2, 9), rng.randint(5, 9)
        return f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy in total?", a * b
    a, b = rng.randint(10, 20), rng.randint(2, 5)
    return f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each friend get?", a


def arithmetic(count: Count, n_tokens: int, seed: int, haystack: str = "prose") -> Case:
    """Many-shot word problems (a GSM8K-style stand-in): solved "Q: ... A: 17" shots spread evenly through the
    haystack (one per 128 target tokens, at least 4), then an unsolved one."""
    _check_haystack(haystack)
    rng = random.Random(seed)
    n_shots = max(4, n_tokens // 128)
    shots = [_problem(rng) for _ in range(n_shots)]
    question, answer = _problem(rng)
    inserts = [_Insert(f"Q: {q}\nA: {a}", round((i + 0.5) / n_shots, 3)) for i, (q, a) in enumerate(shots)]
    head = "The following text contains arithmetic word problems with their answers.\n\n"
    return _haystack_case("arithmetic", count, n_tokens, seed, haystack, rng, head, inserts,
                          f"\n\nQ: {question}\nA:", (str(answer),), "any", sep="\n\n", stop="\n")


def code_function(count: Count, n_tokens: int, seed: int, haystack: str = "code",
                  depth: float | None = None) -> Case:
    """A function defined once in a long text (on the ``code`` haystack: standard-library source, so a function
    among functions) and asked about at the end, as a later line of the file would call it: what it returns (a
    7-digit number)."""
    _check_haystack(haystack)
    _check_depth(depth)
    rng = random.Random(seed)
    name = f"{rng.choice(_ADJECTIVES)}_{rng.choice(_NOUNS)}_code"
    value = _value("numbers", rng)
    drawn = _depth(rng)
    # a blank line first: the definition starts a line of its own, unindented, wherever it lands
    text = f'\ndef {name}():\n    """The special magic number of this module."""\n    return {value}\n'
    head = "Below is a long Python source file. Read it carefully: you will be asked what one function returns.\n\n"
    tail = f"\n\n# Question: What number does {name}() return?\n# Answer: The number {name}() returns is:"
    return _haystack_case("code_function", count, n_tokens, seed, haystack, rng, head,
                          [_Insert(text, drawn if depth is None else depth, True)], tail, (value,), "all",
                          sep="\n\n")


# kinds of things whose members a model knows (the many-shot classification's classes), eight members each
_KINDS = {
    "fruit": ["apple", "banana", "cherry", "mango", "plum", "pear", "peach", "apricot"],
    "mammal": ["wolf", "tiger", "horse", "rabbit", "bear", "deer", "fox", "camel"],
    "tool": ["hammer", "wrench", "screwdriver", "chisel", "saw", "pliers", "drill", "shovel"],
    "instrument": ["violin", "piano", "trumpet", "flute", "guitar", "cello", "drum", "harp"],
    "metal": ["iron", "copper", "silver", "gold", "zinc", "nickel", "tin", "aluminium"],
    "colour": ["red", "blue", "green", "yellow", "purple", "brown", "pink", "grey"],
    "country": ["France", "Kenya", "Peru", "Japan", "Norway", "Egypt", "Chile", "India"],
    "vehicle": ["truck", "bicycle", "train", "airplane", "motorcycle", "bus", "tractor", "scooter"],
    "body part": ["elbow", "knee", "shoulder", "ankle", "wrist", "finger", "neck", "ear"],
    "bird": ["eagle", "sparrow", "owl", "parrot", "pigeon", "crow", "swan", "robin"],
    "weather": ["rain", "snow", "hail", "fog", "thunder", "drizzle", "sleet", "wind"],
    "sport": ["tennis", "soccer", "rugby", "golf", "hockey", "baseball", "volleyball", "boxing"],
}
# made-up labels (no meaning a model could bring to them)
_LABELS = ["dax", "wug", "blicket", "fep", "toma", "zib", "lorp", "mib", "kiki", "vosk", "trell", "quon"]
MANY_SHOT_KINDS = 4  # classes in one prompt
MANY_SHOT_ASKED = 6  # labelled examples of the asked class (each a different member)
MANY_SHOT_SPREAD = 0.75  # they sit in this first share of the examples (a recent window cannot answer)


def many_shot_labels(count: Count, n_tokens: int, seed: int, haystack: str = "prose") -> Case:
    """Many-shot classification with made-up labels, generated offline; the examples are the whole context
    (``haystack`` is not used; the case records ``examples``). ``MANY_SHOT_KINDS`` kinds of things (fruit, tools,
    ...) each get a made-up label, and labelled examples ("The item "plum" has the label dax.") fill the context:
    ``MANY_SHOT_ASKED`` of the asked kind, evenly spread over the first ``MANY_SHOT_SPREAD`` of the examples, the
    rest drawn from the other kinds. The question asks the label of a member of the asked kind that no example
    names: the answer needs that kind's examples and the rule they share, not one copied fact. Graded on the
    answer's first word (``metric="first"``): listing every label scores nothing."""
    _check_haystack(haystack)
    rng = random.Random(seed)
    kinds = rng.sample(sorted(_KINDS), MANY_SHOT_KINDS)
    labels = dict(zip(kinds, rng.sample(_LABELS, MANY_SHOT_KINDS)))
    asked = rng.choice(kinds)
    *shown, item = rng.sample(_KINDS[asked], MANY_SHOT_ASKED + 1)
    others = [(k, m) for k in kinds if k != asked for m in _KINDS[k]]
    salt = rng.getrandbits(64)

    def shot(kind: str, member: str) -> str:
        return f'The item "{member}" has the label {labels[kind]}.'

    def examples(n: int) -> tuple[list[tuple[str, str]], list[int]]:  # n examples, where the asked kind's sit
        r = random.Random(salt)
        at = [min(int((i + 0.5) / MANY_SHOT_ASKED * MANY_SHOT_SPREAD * n), n - 1) for i in range(MANY_SHOT_ASKED)]
        fill = iter([r.choice(others) for _ in range(n)])
        ex = dict(zip(at, ((asked, m) for m in shown)))
        return [ex[i] if i in ex else next(fill) for i in range(n)], at

    def body(n: int) -> str:
        return "\n".join(shot(k, m) for k, m in examples(n)[0])

    head = ("The text below contains labelled examples: items of the same kind share one made-up label. "
            "Learn which label goes with which kind of item.\n\n")
    tail = (f'\n\nQuestion: Which label does the item "{item}" have?\n'
            f'Answer: The label of the item "{item}" is:')
    n = fit_size(count, n_tokens, lambda n: head + body(n) + tail, lo=2 * MANY_SHOT_ASKED,
                 guess=max(2 * MANY_SHOT_ASKED, n_tokens // 12), what="task 'many_shot_labels'")
    ex, at = examples(n)
    lines = [shot(k, m) for k, m in ex]
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in at]
    context = "\n".join(lines)
    prompt = head + context + tail
    inserted = [{"text": lines[i], "offset": off, "anchor": 0, "depth": round(off / len(context), 3), "answer": True}
                for i, off in zip(at, starts)]
    return Case("many_shot_labels", prompt, (labels[asked],), "first", inserted[0]["depth"], "examples", seed,
                n_tokens, _meta(count, prompt, head, context, (labels[asked],), n_examples=n, inserted=inserted,
                                stop="\n", kind=asked, item=item, labels=labels))


TABLE_HEADER = ("id", "name", "city", "code")


def table_lookup(count: Count, n_tokens: int, seed: int, haystack: str = "prose",
                 depth: float | None = None) -> Case:
    """A row looked up by its key in a long CSV table (the table is the whole context: ``haystack`` is not used
    and the case records ``table``): rows of a 5-letter id, a first name, a city and a 7-digit code; the asked row
    at ``depth`` of the rows (drawn from the seed when None); its code is the answer."""
    _check_haystack(haystack)
    _check_depth(depth)
    rng = random.Random(seed)
    at = _depth(rng) if depth is None else depth
    salt = rng.getrandbits(64)

    def rows(n: int) -> list[tuple[str, ...]]:  # the first n rows of the seed's table (ids and codes distinct)
        r, ids, codes, out = random.Random(salt), set(), set(), []
        while len(out) < n:
            key = "".join(r.choices(string.ascii_uppercase, k=5))
            code = str(r.randint(1_000_000, 9_999_999))
            if key not in ids and code not in codes:
                ids.add(key)
                codes.add(code)
                out.append((key, r.choice(FIRST_NAMES), r.choice(_CITIES), code))
        return out

    def table(n: int) -> str:
        return "\n".join(",".join(row) for row in [TABLE_HEADER, *rows(n)])

    def question(key: str) -> str:
        return (f"\n\nQuestion: What is the code in the row whose id is {key}?\n"
                f"Answer: The code in the row whose id is {key} is:")

    head = "The table below lists records as CSV. You will be asked to look up one row by its id.\n\n"
    n = fit_size(count, n_tokens, lambda n: head + table(n) + question("XXXXX"), lo=4, guess=max(8, n_tokens // 12),
                 what="task 'table_lookup'")
    body = rows(n)
    idx = min(int(at * n), n - 1)
    key, code = body[idx][0], body[idx][3]
    context = table(n)
    text = ",".join(body[idx])
    offset = len(table(idx)) + 1  # the header and the rows before it (the same first rows), then a line break
    full = head + context + question(key)
    return Case("table_lookup", full, (code,), "all", round(idx / n, 3), "table", seed, n_tokens,
                _meta(count, full, head, context, (code,), n_rows=n,
                      inserted=[{"text": text, "offset": offset, "anchor": 0, "depth": round(idx / n, 3),
                                 "answer": True}]))


TASKS: dict[str, Callable[..., Case]] = {
    "niah_number": niah_number,
    "niah_word": niah_word,
    "niah_uuid": niah_uuid,
    "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue,
    "niah_multiquery": niah_multiquery,
    "niah_multiturn": niah_multiturn,
    "kv_retrieval": kv_retrieval,
    "variable_tracking": variable_tracking,
    "frequent_words": frequent_words,
    "arithmetic": arithmetic,
    "many_shot_labels": many_shot_labels,
    "code_function": code_function,
    "table_lookup": table_lookup,
}
# tasks whose context is their own (not a haystack): an evaluation runs them once per length and seed
OWN_CONTEXT_TASKS = ("table_lookup", "many_shot_labels")


PINNED_DEPTH_TASKS = ("niah_number", "niah_word", "niah_uuid", "niah_multikey", "niah_multivalue", "niah_multiquery",
                      "code_function", "table_lookup")


def make_case(task: str, count: Count, n_tokens: int, seed: int, haystack: str = "prose",
              depth: float | None = None) -> Case:
    """The ``task`` prompt of about ``n_tokens`` tokens (as counted by ``count``) for ``seed``; ``depth`` pins the
    asked needle's depth (``PINNED_DEPTH_TASKS`` only; None: drawn from the seed)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    if depth is None:
        return TASKS[task](count, n_tokens, seed, haystack)
    if task not in PINNED_DEPTH_TASKS:
        raise ValueError(f"task {task!r} has no single needle depth to pin; tasks that do: "
                         f"{', '.join(PINNED_DEPTH_TASKS)}")
    return TASKS[task](count, n_tokens, seed, haystack, depth=depth)



def inserted_spans(case: Case) -> list[tuple[int, int]]:
    """The character spans, in ``case.prompt``, of every text inserted into the haystack (needles, a chain's links,
    distractors), in the order they appear in it."""
    start = case.meta["context"][0]
    return [(start + x["offset"], start + x["offset"] + len(x["text"])) for x in case.meta["inserted"]]


def answer_span(case: Case, answer: str) -> tuple[int, int]:
    """The character span, in ``case.prompt``, of the inserted text that holds ``answer`` (a retrieval task's
    needle sentence)."""
    for x, span in zip(case.meta["inserted"], inserted_spans(case)):
        if answer in x["text"]:
            return span
    raise ValueError(f"no inserted text of this {case.task} case holds {answer!r}")


def token_range(count: Count, prompt: str, span: tuple[int, int]) -> tuple[int, int]:
    """The token positions of ``prompt[span[0]:span[1]]`` in ``prompt``'s tokens, one token of margin each side (a
    token can straddle the span's ends); ``count`` counts a text's tokens as the prompt's are made (BOS included)."""
    return count(prompt[:span[0]]) - 1, count(prompt[:span[1]]) + 1


_CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Tbilisi", "Quito", "Dakar", "Perth", "Riga", "Cusco",
           "Bergen", "Tunis", "Kyoto", "Malmo", "Porto", "Sapporo", "Tallinn", "Windhoek", "Yerevan"]
ACCESS_QUESTION = ("\n\nQuestion: What is the access code of the blue archive?\n"
                   "Answer: The access code of the blue archive is")
PASSWORD_QUESTION = ("\n\nQuestion: What is the password of the blue archive?\n"
                     "Answer: The password of the blue archive is")


@dataclass(frozen=True)
class Needle:
    prompt: str
    answer: str
    depth: float
    span: tuple[int, int]  # the needle's characters in the prompt


def _plain_needle(count: Count, n_tokens: int, unit: str, needle: str, question: str, cut: Callable[[str], int],
                  answer: str, depth: float) -> Needle:
    """``unit`` repeated as long as the prompt fits ``n_tokens``, ``needle`` inserted at character ``cut(body)`` of
    it, ``question`` after it."""
    def parts(n: int) -> tuple[str, str]:
        body = _repeat(unit, n)
        at = cut(body)
        return body[:at], body[at:]

    def prompt(n: int) -> str:
        before, after = parts(n)
        return before + needle + after + question

    before, after = parts(fit_size(count, n_tokens, prompt, lo=0, guess=4 * n_tokens, what="a needle prompt"))
    return Needle(before + needle + after + question, answer, depth, (len(before), len(before) + len(needle)))


def needle_prompt(count: Count, n_tokens: int, depth: float, seed: int = 0) -> Needle:
    """A haystack of natural text of about ``n_tokens`` tokens (as counted by ``count(text)``) with one "special
    magic number for <city>" sentence at relative ``depth`` (after the sentence end before it), and a question about
    it at the end."""
    rng = random.Random(seed)
    city = rng.choice(_CITIES)
    number = str(rng.randint(1_000_000, 9_999_999))
    question = (f"\n\nWhat is the special magic number for {city} mentioned in the provided text? "
                f"The special magic number for {city} is:")
    unit = _rotated(rng.randrange(0, max(len(_prose()) - 1, 1)), "\n\n")

    def cut(body: str) -> int:
        at = int(len(body) * depth)
        return max(body.rfind(". ", 0, at) + 2, 0) if at > 0 else 0

    return _plain_needle(count, n_tokens, unit, f" The special magic number for {city} is: {number}. ", question,
                         cut, number, depth)


def access_code_needle(count: Count, n_tokens: int, depth: float, seed: int = 0, value: str = "code") -> Needle:
    """A haystack of natural text of about ``n_tokens`` tokens (as counted by ``count(text)``), starting at a
    character picked by ``seed``, with one plain sentence holding a 7-digit access code (``value="code"``) or a
    one-word password (``"word"``: an uncommon word) at the first sentence end from relative ``depth`` on, and the
    question (``ACCESS_QUESTION``, ``PASSWORD_QUESTION``) at the end."""
    rng = random.Random(seed)
    if value == "code":
        answer, sentence, question = str(rng.randint(1_000_000, 9_999_999)), "access code", ACCESS_QUESTION
    elif value == "word":
        answer, sentence, question = rng.choice(_WORDS), "password", PASSWORD_QUESTION
    else:
        raise ValueError(f"value must be 'code' or 'word', got {value!r}")
    unit = _rotated((seed * 7919) % len(_prose()), "")
    return _plain_needle(count, n_tokens, unit, f" The {sentence} of the blue archive is {answer}.", question,
                         lambda body: body.find(". ", int(depth * len(body))) + 1, answer, depth)
