"""Generated RULER-style tasks: deterministic per seed, fitted to the token budget, facts where they say, RULER scoring.

No model: tokens are counted by cheap stand-ins (characters / 4, or words and punctuation)."""

from __future__ import annotations

import math
import random
import re
from collections import Counter

import pytest

from sekv_gguf.eval import TASKS, Case, make_case, score
from sekv_gguf.eval.tasks import HAYSTACKS
from sekv_gguf.ruler_tasks import _KINDS, MANY_SHOT_ASKED, MANY_SHOT_KINDS, MANY_SHOT_SPREAD, inserted_spans

COUNTS = {
    "chars/4": lambda text: len(text) // 4,
    "words": lambda text: 1 + len(re.findall(r"\w+|[^\w\s]", text)),  # a BOS and a word/punctuation tokenizer
}
count = COUNTS["chars/4"]
OWN_HAYSTACK = {"table_lookup": "table", "many_shot_labels": "examples"}  # the case's own context, not the haystack asked for
ALL = list(TASKS)
N_ANSWERS = {"niah_multivalue": 4, "niah_multiquery": 2, "niah_multiturn": 3, "variable_tracking": 5,
             "frequent_words": 3}


def context(case: Case) -> str:
    start, end = case.meta["context"]
    return case.prompt[start:end]


def test_task_names():
    assert ALL == ["niah_number", "niah_word", "niah_uuid", "niah_multikey", "niah_multivalue", "niah_multiquery",
                   "niah_multiturn", "kv_retrieval", "variable_tracking", "frequent_words", "arithmetic",
                   "many_shot_labels", "code_function", "table_lookup"]


@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("task", ALL)
def test_deterministic_per_seed(task, haystack):
    random.seed(1)
    a = make_case(task, count, 1024, 3, haystack)
    random.seed(2)  # the global generator plays no part
    b = make_case(task, count, 1024, 3, haystack)
    c = make_case(task, count, 1024, 4, haystack)
    assert repr(a) == repr(b)  # repr: depth may be NaN, and NaN != NaN
    assert a.prompt != c.prompt and a.answers != c.answers
    hay = OWN_HAYSTACK.get(task, haystack)
    assert (a.task, a.haystack, a.seed, a.n_tokens) == (task, hay, 3, 1024)


@pytest.mark.parametrize("task", ALL)
def test_shape(task):
    case = make_case(task, count, 1024, 0)
    assert case.haystack == OWN_HAYSTACK.get(task, "prose")  # the default
    assert len(case.answers) == N_ANSWERS.get(task, 1)
    assert case.metric == {"arithmetic": "any", "many_shot_labels": "first"}.get(task, "all")
    leads = [t["text"] for t in case.meta["turns"]] if task == "niah_multiturn" else [case.prompt]
    assert all(lead.endswith(":") for lead in leads)  # an answer lead, no trailing space
    assert math.isnan(case.depth) == (task in ("frequent_words", "arithmetic"))
    assert score(case, " " + ", ".join(case.answers) + ".") == 1.0


@pytest.mark.parametrize("counter", COUNTS)
@pytest.mark.parametrize("n_tokens", [512, 4096])
@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("task", ALL)
def test_token_length_within_bounds(task, haystack, n_tokens, counter):
    n = COUNTS[counter](make_case(task, COUNTS[counter], n_tokens, 5, haystack).prompt)
    assert 0.9 * n_tokens <= n <= n_tokens


@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("task", ALL)
def test_facts_in_context_at_their_depth(task, haystack):
    for seed in range(3):
        case = make_case(task, count, 4096, seed, haystack)
        ctx = context(case)
        question = case.prompt[case.meta["context"][1]:]
        if task not in ("arithmetic", "many_shot_labels"):  # retrieval: every answer stated before the question only
            assert all(answer in ctx and answer not in question for answer in case.answers)
        for item in case.meta["inserted"]:
            assert ctx[item["offset"]:].startswith(item["text"])
            before = ctx[:item["offset"]]
            gap = before[len(before.rstrip()):]
            assert before == "" or gap and (before.rstrip()[-1] in ".!?" or "\n" in gap), before[-80:]
            assert abs((item["offset"] + item["anchor"]) / len(ctx) - item["depth"]) <= 0.05
        first = next((item for item in case.meta["inserted"] if item["answer"]), None)
        assert math.isnan(case.depth) if first is None else case.depth == first["depth"]
        # the prompt's spans of the inserted texts, one each, in order
        assert [case.prompt[a:b] for a, b in inserted_spans(case)] == [i["text"] for i in case.meta["inserted"]]


@pytest.mark.parametrize("haystack", HAYSTACKS)
def test_niah_needles(haystack):
    case = make_case("niah_multikey", count, 2048, 1, haystack)
    needles = re.findall(r"One of the special magic numbers for ([\w-]+) is: (\d{7})\.", context(case))
    assert len(needles) == 4 and len({k for k, _ in needles}) == 4
    asked = [k for k, v in needles if v in case.answers]
    assert len(asked) == 1 and asked[0] in case.prompt[case.meta["context"][1]:]
    case = make_case("niah_multivalue", count, 2048, 1, haystack)
    needles = re.findall(r"One of the special magic numbers for ([\w-]+) is: (\d{7})\.", context(case))
    assert len({k for k, _ in needles}) == 1 and sorted(v for _, v in needles) == sorted(case.answers)
    uuid = make_case("niah_uuid", count, 2048, 1, haystack).answers[0]
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", uuid)


@pytest.mark.parametrize("haystack", HAYSTACKS)
def test_kv_retrieval_pair(haystack):
    case = make_case("kv_retrieval", count, 4096, 2, haystack)
    key = re.search(r'key "([0-9a-f-]{36})"', case.prompt[case.meta["context"][1]:]).group(1)
    assert f'"{key}": "{case.answers[0]}"' in context(case)
    assert case.meta["n_pairs"] == 16


@pytest.mark.parametrize("haystack", HAYSTACKS)
def test_variable_chain(haystack):
    case = make_case("variable_tracking", count, 2048, 3, haystack)
    values: dict[str, str] = {}
    for name, value in re.findall(r"VAR (\w{5}) = (\d{5}|VAR \w{5})\.", context(case)):
        values[name] = values[value[4:]] if value.startswith("VAR ") else value  # defined before use
    assert sorted(values) == sorted(case.answers) and len(set(values.values())) == 1
    assert f"the value {next(iter(values.values()))}" in case.prompt[case.meta["context"][1]:]


@pytest.mark.parametrize("haystack", HAYSTACKS)
def test_frequent_words_are_the_top_three(haystack):
    case = make_case("frequent_words", count, 2048, 4, haystack)
    ranked = Counter(context(case).split()).most_common(4)
    assert tuple(w for w, _ in ranked[:3]) == case.answers
    assert ranked[2][1] > ranked[3][1]


@pytest.mark.parametrize("haystack", HAYSTACKS)
def test_code_function_is_defined_once_and_asked_at_the_end(haystack):
    case = make_case("code_function", count, 4096, 6, haystack, depth=0.3)
    name = re.search(r"What number does (\w+)\(\) return\?", case.prompt[case.meta["context"][1]:]).group(1)
    defs = re.findall(rf"^def {name}\(\):\n    .*\n    return (\d{{7}})$", context(case), re.M)
    assert defs == [case.answers[0]]  # one unindented definition, returning the answer
    assert abs(case.depth - 0.3) < 1e-9


def test_table_lookup_rows():
    case = make_case("table_lookup", count, 4096, 7, "prose", depth=0.8)
    header, *rows = [line.split(",") for line in context(case).split("\n")]
    assert header == ["id", "name", "city", "code"] and len(rows) == case.meta["n_rows"] > 100
    assert all(len(r) == 4 for r in rows) and len({r[0] for r in rows}) == len(rows)
    key = re.search(r"whose id is (\w{5})\?", case.prompt).group(1)
    at = [i for i, r in enumerate(rows) if r[0] == key]
    assert len(at) == 1 and rows[at[0]][3] == case.answers[0]
    assert abs(at[0] / len(rows) - 0.8) <= 1 / len(rows)


def test_arithmetic_shots():
    case = make_case("arithmetic", count, 2048, 6, "filler")
    shots = re.findall(r"Q: [^\n]+\nA: (\d+)", context(case))
    assert len(shots) == len(case.meta["inserted"]) == 2048 // 128
    assert case.prompt.endswith("\nA:") and case.answers[0].isdigit() and case.meta["stop"] == "\n"


@pytest.mark.parametrize("seed", range(4))
def test_many_shot_labels(seed):
    case = make_case("many_shot_labels", count, 4096, seed, "prose")
    shots = re.findall(r'The item "([^"]+)" has the label (\w+)\.', context(case))
    assert len(shots) == case.meta["n_examples"] > 100
    labels, asked, item = case.meta["labels"], case.meta["kind"], case.meta["item"]
    assert len(labels) == len(set(labels.values())) == MANY_SHOT_KINDS and case.answers == (labels[asked],)
    # every example carries its kind's label; the asked item is a member of the asked kind that no example shows
    kind_of = {m: k for k in labels for m in _KINDS[k]}
    assert all(labels[kind_of[m]] == label for m, label in shots)
    assert item in _KINDS[asked] and item not in {m for m, _ in shots}
    assert f'"{item}"' in case.prompt[case.meta["context"][1]:]
    # the asked kind's examples: distinct members, spread over the first share of the examples, the answer inserts
    at = [i for i, (m, _) in enumerate(shots) if kind_of[m] == asked]
    assert len(at) == len({shots[i][0] for i in at}) == MANY_SHOT_ASKED
    assert at[0] < len(shots) * 0.2 and at[-1] < len(shots) * MANY_SHOT_SPREAD
    assert [x["text"] for x in case.meta["inserted"]] == [f'The item "{shots[i][0]}" has the label {shots[i][1]}.'
                                                          for i in at]
    assert case.meta["stop"] == "\n" and case.prompt.endswith("is:")


def test_score_first_word():
    case = _case(("dax",), "first")
    assert score(case, " dax.\n") == 1.0
    assert score(case, "Dax") == 1.0
    assert score(case, " wug, dax, fep") == 0.0  # a list of labels is not an answer
    assert score(case, " daxes") == 0.0
    assert score(case, "") == 0.0


def _case(answers: tuple[str, ...], metric: str) -> Case:
    return Case("t", "prompt", answers, metric, math.nan, "filler", 0, 512, {})


def test_score_any():
    case = _case(("17", "Seventeen"), "any")
    assert score(case, " 17\n") == 1.0
    assert score(case, "  seventeen apples") == 1.0
    assert score(case, "16") == 0.0
    assert score(case, "") == 0.0


def test_score_all_partial_and_case_insensitive():
    case = _case(("1234567", "Quixotic", "ABCDE"), "all")
    assert score(case, "  quixotic, abcde and 1234567.\n") == 1.0
    assert score(case, "QUIXOTIC 1234567") == pytest.approx(2 / 3)
    assert score(case, "abcde") == pytest.approx(1 / 3)
    assert score(case, "nothing") == 0.0
    assert score(_case((" 42 ",), "all"), "The answer is 42.") == 1.0  # references are stripped too


def test_unknown_task_names_the_valid_ones():
    with pytest.raises(ValueError) as err:
        make_case("niah_banana", count, 1024, 0)
    assert "niah_banana" in str(err.value) and all(name in str(err.value) for name in TASKS)


def test_unknown_haystack():
    with pytest.raises(ValueError, match="haystack"):
        make_case("niah_number", count, 1024, 0, "lorem")


@pytest.mark.parametrize("task", ALL)
def test_too_few_tokens(task):
    with pytest.raises(ValueError, match=f"too small for task '{task}'"):
        make_case(task, count, 16, 0)


def test_multiturn_asks_every_needle_later_in_seeded_order():
    """The shared-context case: the prompt is the document alone; one later question per needle, each needle in
    its own third of the context."""
    case = make_case("niah_multiturn", count, 4096, 2)
    needles = re.findall(r"One of the special magic numbers for ([\w-]+) is: (\d{7})\.", context(case))
    assert len(needles) == 3 and case.prompt == case.prompt[:case.meta["context"][1]]
    turns = case.meta["turns"]
    assert sorted(t["answer"] for t in turns) == sorted(v for _, v in needles)
    for t in turns:
        key = next(k for k, v in needles if v == t["answer"])
        assert key in t["text"] and t["answer"] not in t["text"]
    depths = sorted(t["depth"] for t in turns)
    assert all(i / 3 <= d < (i + 1) / 3 for i, d in enumerate(depths))


@pytest.mark.parametrize("task", ["niah_number", "niah_word", "niah_multikey"])
def test_pinned_depth_moves_the_needle_not_the_value(task):
    drawn = make_case(task, count, 4096, 3)
    for depth in (0.1, 0.9):
        pinned = make_case(task, count, 4096, 3, depth=depth)
        assert pinned.answers == drawn.answers and pinned.depth == depth
        asked = next(item for item in pinned.meta["inserted"] if item["answer"])
        assert abs((asked["offset"] + asked["anchor"]) / len(context(pinned)) - depth) <= 0.05
        others = [(i["text"], i["depth"]) for i in pinned.meta["inserted"] if not i["answer"]]
        assert others == [(i["text"], i["depth"]) for i in drawn.meta["inserted"] if not i["answer"]]


def test_pinned_depth_refused_where_there_is_no_single_needle():
    with pytest.raises(ValueError, match="no single needle depth"):
        make_case("variable_tracking", count, 2048, 0, depth=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        make_case("niah_number", count, 2048, 0, depth=1.5)


@pytest.mark.parametrize("value", ["code", "word"])
def test_the_plain_needle_sits_at_its_depth_and_is_asked_at_the_end(value):
    """``access_code_needle``: one plain sentence (a 7-digit access code or a one-word password, drawn by the seed)
    at the first sentence end from the depth on, its question last; the prompt fits the token budget."""
    from sekv_gguf.ruler_tasks import ACCESS_QUESTION, PASSWORD_QUESTION, access_code_needle

    for seed in (0, 1):
        needle = access_code_needle(count, 6000, 0.7, seed, value)
        start, end = needle.span
        sentence = needle.prompt[start:end]
        assert needle.answer in sentence and needle.prompt.count(needle.answer) == 1
        assert (needle.answer.isdigit() and len(needle.answer) == 7) if value == "code" else needle.answer.isalpha()
        assert needle.prompt.endswith(ACCESS_QUESTION if value == "code" else PASSWORD_QUESTION)
        assert 0.68 <= start / len(needle.prompt) <= 0.75 and count(needle.prompt) <= 6000
    with pytest.raises(ValueError, match="value must be"):
        access_code_needle(count, 6000, 0.7, 0, "uuid")
