"""The offline evaluation suite: every policy × budget on generated tasks and teacher-forced fidelity, side by side
in one process, through the same engine. ``run_suite`` returns a JSON-ready dict (``report.write`` saves it)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from ..config import BudgetConfig, ContextConfig, SekvConfig
from ..decode import decode_loop, greedy
from ..engine import generate, make_policy
from ..errors import SekvError
from ..policies import POLICIES
from ..policies.shared_passes import SharedPasses
from ..session import full_kv_bytes
from .corpora import CORPORA
from .fidelity import forced_logits, teacher_forced
from .summary import summarize
from .tasks import HAYSTACKS, OWN_CONTEXT_TASKS, PINNED_DEPTH_TASKS, TASKS, make_case, score

DEFAULT_POLICIES = tuple(POLICIES)  # all of them: full, the baselines, sekv


@dataclass
class EvalConfig:
    """What one evaluation run covers.

    policies / tasks: names from ``POLICIES`` / ``TASKS``. budgets: device budgets as fractions of prompt +
    generation (``full`` ignores them). lengths: prompt lengths in tokens. samples: seeds per (task, haystack,
    length; 0: fidelity only). haystacks: "prose" (natural text), "filler" (RULER's repeated sentences) and/or
    "code" (standard-library source); a task with its own context (``OWN_CONTEXT_TASKS``: a table) runs once, under
    the first. n_predict: greedy tokens generated per case. fidelity_docs / fidelity_steps: natural-text documents
    per length and teacher-forced tokens per document (0 docs: no fidelity); a fidelity run's budget is that share
    of the document, in cells, for a context of what it holds (half the document + the forced tokens). seed: first
    task seed. depths: pinned needle depths, sample s at ``depths[s % len(depths)]`` (empty: each seed draws its own;
    single-needle tasks only).
    """

    policies: tuple[str, ...] = DEFAULT_POLICIES
    budgets: tuple[float, ...] = (0.1, 0.2, 0.3)
    tasks: tuple[str, ...] = tuple(TASKS)
    lengths: tuple[int, ...] = (4096,)
    samples: int = 1
    haystacks: tuple[str, ...] = ("prose", "filler")
    n_predict: int = 24  # at least; a case that needs more (``meta["max_new_tokens"]``) gets more
    fidelity_docs: int = 1
    fidelity_steps: int = 64
    fidelity_corpora: tuple[str, ...] = ("prose",)  # running text of the fidelity documents (eval.corpora)
    seed: int = 0
    depths: tuple[float, ...] = ()
    sekv: dict[str, Any] = field(default_factory=dict)  # SekvConfig overrides
    sekv_variants: tuple[dict[str, Any], ...] = ()  # more sekv runs, each with these overrides on top of ``sekv``
    # (named by them, e.g. sekv-mass); the runs of one prompt share its full-attention passes (SharedPasses)
    chunk: int = BudgetConfig.chunk  # prompt tokens per llama_decode, every policy (BudgetConfig.chunk)
    equal_total: bool = False  # also run each baseline at the device + host bytes of the sekv run at each budget
    # (on a CPU both are the same RAM): named <policy>=total, filed under that budget, at its own share of the context
    adapter: str | None = None  # trained router adapter for sekv (its runs are named "sekv-trained")
    fidelity_stride: int = 7919 * 13  # characters between the fidelity documents' starts in the prose (a prime
    # multiple, so that documents of one run start at unrelated places)

    def __post_init__(self) -> None:
        for kind, names, known in (("policy", self.policies, POLICIES), ("task", self.tasks, TASKS)):
            bad = [n for n in names if n not in known]
            if bad:
                raise ValueError(f"unknown {kind} {bad[0]!r}; choose from {', '.join(sorted(known))}")
        if not self.policies or not self.tasks or not self.lengths or not self.budgets:
            raise ValueError("need at least one policy, task, length and budget")
        if any(not 0 < b <= 1 for b in self.budgets):
            raise ValueError(f"budgets are fractions of the context in (0, 1], got {list(self.budgets)}")
        if any(n < 256 for n in self.lengths):
            raise ValueError(f"lengths must be >= 256 tokens, got {list(self.lengths)}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 token, got {self.chunk}")
        if self.samples < 0 or self.n_predict < 1 or self.fidelity_docs < 0 or self.fidelity_steps < 1:
            raise ValueError("n_predict and fidelity_steps must be >= 1, samples and fidelity_docs >= 0")
        if self.samples == 0 and self.fidelity_docs == 0:
            raise ValueError("nothing to run: samples 0 (fidelity only) needs fidelity_docs >= 1")
        bad_c = [c for c in self.fidelity_corpora if c not in CORPORA]
        if bad_c or not self.fidelity_corpora:
            raise ValueError(f"fidelity corpora are {', '.join(CORPORA)}, got {list(self.fidelity_corpora)}")
        bad_h = [h for h in self.haystacks if h not in HAYSTACKS]
        if bad_h or not self.haystacks:
            raise ValueError(f"haystacks are {', '.join(HAYSTACKS)}, got {list(self.haystacks)}")
        if any(not 0 <= d <= 1 for d in self.depths):
            raise ValueError(f"depths are fractions of the context in [0, 1], got {list(self.depths)}")
        unpinned = [t for t in self.tasks if self.depths and t not in PINNED_DEPTH_TASKS]
        if unpinned:
            raise ValueError(f"task {unpinned[0]!r} has no single needle depth to pin; tasks that do: "
                             f"{', '.join(PINNED_DEPTH_TASKS)}")
        for variant in ({}, *self.sekv_variants):
            SekvConfig(**(self.sekv | variant))  # validates the overrides
        if self.sekv_variants and self.adapter:
            raise ValueError("sekv_variants are training-free runs: leave out the adapter")
        if self.equal_total and ("sekv" not in self.policies or set(self.policies) <= {"full", "sekv"}):
            raise ValueError("equal_total runs the baselines at sekv's device + host bytes: it needs sekv and at least "
                             "one baseline among the policies")
        if self.sekv_variants and "sekv" not in self.policies:
            raise ValueError("sekv_variants are runs of the sekv policy: add sekv to the policies")


def _runs(cfg: EvalConfig) -> list[tuple[str, float | None, dict[str, Any]]]:
    """(policy, budget, sekv overrides) triples: full once, every other policy at every budget, sekv once per
    variant (its overrides: ``sekv`` and the variant's; empty for the other policies)."""
    out = []
    for p in cfg.policies:
        variants = [cfg.sekv | v for v in ({}, *cfg.sekv_variants)] if p == "sekv" else [{}]
        out += [(p, b, v) for v in variants for b in ([None] if p == "full" else cfg.budgets)]
    return out


def total_share(device_bytes: int, host_bytes: int, full_bytes: int) -> float:
    """A run's device + host bytes as a share of full KV's (capped at 1): the budget of an equal-total run."""
    return min(1.0, (device_bytes + host_bytes) / max(full_bytes, 1))


def check_lengths(model: Any, cfg: EvalConfig) -> None:
    limit = model.n_ctx_train()
    too_long = [n for n in cfg.lengths if limit > 0 and n + cfg.n_predict > limit]
    if too_long:
        raise ValueError(f"length {too_long[0]} + {cfg.n_predict} generated tokens exceeds the model's training "
                         f"context of {limit} tokens")


def run_suite(model: Any, cfg: EvalConfig, ctx_config: ContextConfig | None = None, progress: bool = True,
              log: Callable[[str], None] | None = None, router: Any = None) -> dict[str, Any]:
    """Run every (task case, policy, budget) and the fidelity documents; returns cases, fidelity and a summary.
    ``router`` (stateless, see ``sekv_gguf.router``) replaces sekv's training-free score in every sekv run."""
    check_lengths(model, cfg)
    ctx_config = ctx_config or ContextConfig()
    tokenize = lambda text: model.tokenize(text.encode("utf-8"), add_bos=True, special=False)  # noqa: E731
    count = lambda text: len(tokenize(text))  # noqa: E731
    runs = _runs(cfg)
    per_length = sum(1 if t in OWN_CONTEXT_TASKS else len(cfg.haystacks) for t in cfg.tasks)
    n_cases = len(cfg.lengths) * per_length * cfg.samples
    n_fid = len(cfg.lengths) * cfg.fidelity_docs * len(cfg.fidelity_corpora)
    # a fidelity document is its full-KV reference pass and every other run
    n_fid_runs = n_fid * (1 + sum(name != "full" for name, _, _ in runs))
    n_total = len(cfg.budgets) * len([p for p in cfg.policies if p not in ("full", "sekv")]) if cfg.equal_total else 0
    bar = tqdm(total=(n_cases + n_fid) * n_total + n_cases * len(runs) + n_fid_runs, desc="eval", unit="run",
               disable=not progress)
    cases: list[dict[str, Any]] = []
    fidelity: list[dict[str, Any]] = []

    # one full-attention pass per prompt for every exact sekv prefill of it, one for SnapKV and ChunkKV's votes
    passes = SharedPasses()

    def make(name: str, budget: float | int | None, n_context: int, overrides: dict[str, Any] | None = None):
        policy = make_policy(name, model, n_context, ctx_config, BudgetConfig(kv_budget=budget or 1.0, chunk=cfg.chunk),
                             SekvConfig(**(overrides or {})) if name == "sekv" else None,
                             router=router if name == "sekv" else None)
        policy.shared_passes = passes
        return policy

    def label(name: str, overrides: dict[str, Any] | None = None) -> str:
        if name != "sekv":
            return name
        if router is not None:
            only = getattr(router, "candidates", None) == 0  # a trained score without exact-mass verification
            return f"sekv-{router.name}" + ("-only" if only else "")
        overrides = overrides or {}
        score = overrides.get("router", SekvConfig.router)
        parts = ([score] if score != SekvConfig.router else []) + [f"{k}={v}" for k, v in overrides.items()
                                                                    if k != "router"]
        return "-".join([name, *parts])

    baselines = [p for p in cfg.policies if p not in ("full", "sekv")] if cfg.equal_total else []
    base_sekv = label("sekv", cfg.sekv)  # the sekv run whose device + host bytes the equal-total runs get

    def case_run(case: Any, tokens: list[int], n_predict: int, name: str, budget: float | None,
                 overrides: dict[str, Any], share: float | None = None) -> dict[str, Any]:
        """One run of ``name`` on ``case`` at ``budget`` (with ``share``: an equal-total run at that share of the
        context, named ``<name>=total`` and filed under the sekv run's ``budget``)."""
        row = {"task": case.task, "haystack": case.haystack, "length": case.n_tokens, "seed": case.seed,
               "prompt_tokens": len(tokens), "depth": None if np.isnan(case.depth) else case.depth,
               "answers": list(case.answers), "metric": case.metric,
               "policy": label(name, overrides) + ("" if share is None else "=total"), "budget": budget}
        cells_budget = budget if share is None else share
        if share is not None:
            row["budget_share"] = share
        try:
            if case.meta.get("turns"):
                row.update(_converse(lambda n: make(name, cells_budget, n, overrides), model, case, tokens,
                                     cfg.n_predict))
            else:
                policy = make(name, cells_budget, len(tokens) + n_predict, overrides)
                reused = passes.reused
                try:
                    r = generate(policy, tokens, n_predict)
                finally:
                    policy.close()
                # a prefill that took another run's full-attention pass: its prefill_s is not what the prefill
                # costs alone
                row["shared_prefill"] = passes.reused > reused
                # a task may end its answer at a stop string (arithmetic: the first line)
                answer = r.text.split(case.meta["stop"])[0] if case.meta.get("stop") else r.text
                row.update({"output": r.text, "score": score(case, answer), "device_kv_bytes": r.device_kv_bytes,
                            "full_kv_bytes": r.full_kv_bytes, "host_kv_bytes": r.host_kv_bytes,
                            "prefill_s": r.prefill_s, "decode_s": r.decode_s})
        except SekvError as e:  # e.g. a budget too small for this policy: recorded, not fatal
            row.update({"output": None, "score": None, "error": str(e)})
        if log:
            log(f"{case.task:>18} {case.haystack:>6} {case.n_tokens:>6} {row['policy']:>9} {budget or '':>4} "
                f"score {row['score']} {str(row['output'])[:40]!r}")
        bar.update(1)
        return row

    for length in cfg.lengths:
        for task in cfg.tasks:
            for hay in cfg.haystacks[:1] if task in OWN_CONTEXT_TASKS else cfg.haystacks:
                for s in range(cfg.samples):
                    depth = cfg.depths[s % len(cfg.depths)] if cfg.depths else None
                    case = make_case(task, count, length, cfg.seed + s, hay, depth)
                    tokens = tokenize(case.prompt)
                    # answers such as uuids or four 7-digit numbers need more tokens than the default
                    n_predict = max(cfg.n_predict, int(case.meta.get("max_new_tokens", 0)))
                    rows = [case_run(case, tokens, n_predict, name, budget, overrides)
                            for name, budget, overrides in runs]
                    for ref in [r for r in rows if r["policy"] == base_sekv and r.get("full_kv_bytes")]:
                        share = total_share(ref["device_kv_bytes"], ref["host_kv_bytes"], ref["full_kv_bytes"])
                        rows += [case_run(case, tokens, n_predict, name, ref["budget"], {}, share)
                                 for name in baselines]
                    cases += rows
                    passes.close()
        for corpus, doc in ((c, d) for c in cfg.fidelity_corpora for d in range(cfg.fidelity_docs)):
            text = CORPORA[corpus]()
            offset = (len(text) // 3 + doc * cfg.fidelity_stride) % len(text)
            tokens = tokenize((text[offset:] + text[:offset]) * (1 + 8 * length // max(len(text), 1)))[:length]
            # sized for what a run holds (half the document + the forced steps): a context sized for the whole
            # document made prompt-end selectors reserve its unseen half for generation and fall back to a window;
            # the budget stays a share of the document, in cells
            held = min(len(tokens), len(tokens) // 2 + cfg.fidelity_steps)
            full = make("full", None, held)
            try:
                reference = np.stack(list(forced_logits(full, tokens, cfg.fidelity_steps)))  # [steps, n_vocab]
                full_bytes = full_kv_bytes(full.session, length, full.full_kv_ubatch)
            finally:
                full.close()
            bar.update(1)

            def fid_run(name: str, budget: float, overrides: dict[str, Any], share: float | None = None):
                row = {"length": length, "corpus": corpus, "doc": doc,
                       "policy": label(name, overrides) + ("" if share is None else "=total"), "budget": budget}
                if share is not None:
                    row["budget_share"] = share
                try:
                    policy = make(name, int(np.ceil((budget if share is None else share) * length)), held,
                                  overrides)
                    try:
                        fid = teacher_forced(reference, policy, tokens)
                        row.update({"device_kv_bytes": policy.device_kv_bytes, "host_kv_bytes": policy.host_bytes,
                                    "full_kv_bytes": full_bytes})
                    finally:
                        policy.close()
                    row.update(asdict(fid))
                except SekvError as e:
                    row.update({"kl_mean": None, "top1_agreement": None, "error": str(e)})
                bar.update(1)
                return row

            rows = [fid_run(name, budget, overrides) for name, budget, overrides in runs if name != "full"]
            for ref in [r for r in rows if r["policy"] == base_sekv and r.get("device_kv_bytes")]:
                share = total_share(ref["device_kv_bytes"], ref["host_kv_bytes"], full_bytes)
                rows += [fid_run(name, ref["budget"], {}, share) for name in baselines]
            fidelity += rows
    bar.close()
    passes.close()
    params = asdict(cfg)
    params["policies"] = list(dict.fromkeys(label(p, v) for p, _, v in runs))
    return {"params": params, "cases": cases, "fidelity": fidelity, "summary": summarize(cases, fidelity)}


def _converse(make: Callable[[int], Any], model: Any, case: Any, doc: list[int], n_predict: int) -> dict[str, Any]:
    """A multi-turn case (``case.meta["turns"]``): the document is prefilled with no question, then each turn's
    question is appended through the policy's lifecycle API and answered greedily, the answer staying in the memory
    before the next question. Score: the share of turns whose answer holds its value."""
    turns = [(model.tokenize(t["text"].encode("utf-8"), add_bos=False, special=False), t["answer"])
             for t in case.meta["turns"]]
    per_turn = [max(n_predict, len(model.tokenize((" " + a).encode(), add_bos=False, special=False)) + 8)
                for _, a in turns]
    policy = make(len(doc) + sum(len(q) for q, _ in turns) + sum(per_turn))
    outputs: list[str] = []
    t0 = time.perf_counter()
    try:
        policy.prefill(doc)
        t1 = time.perf_counter()
        for (question, _), n in zip(turns, per_turn):
            done = decode_loop(policy.step, policy.append(question), n, greedy, eos=model.token_eos())
            outputs.append(policy.session.text(done.tokens))
        stats = policy.stats()
        full_bytes = full_kv_bytes(policy.session, len(doc) + sum(len(q) for q, _ in turns) + sum(per_turn),
                                   policy.full_kv_ubatch)
    finally:
        policy.close()
    hits = [answer.strip().lower() in text.strip().lower() for text, (_, answer) in zip(outputs, turns)]
    return {"output": " | ".join(outputs), "turn_outputs": outputs, "turn_hits": hits,
            "turn_depths": [t["depth"] for t in case.meta["turns"]], "score": sum(hits) / len(hits),
            "device_kv_bytes": stats.device_kv_bytes, "host_kv_bytes": stats.host_kv_bytes,
            "full_kv_bytes": full_bytes,
            "prefill_s": t1 - t0, "decode_s": time.perf_counter() - t1}
