"""The evaluation suite end to end on the tiny model (mechanics, not accuracy: its weights are random)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sekv_gguf import provenance
from sekv_gguf.cli import main
from sekv_gguf.engine import make_policy
from sekv_gguf.eval.fidelity import KL_LARGE, forced_logits, kl, teacher_forced
from sekv_gguf.eval.report import table, write
from sekv_gguf.eval.suite import EvalConfig, run_suite
from sekv_gguf.eval.summary import summarize


def test_paired_differences_match_cases_and_carry_their_standard_error():
    """sekv against full KV and each baseline at its budget, over the prompts both ran; a failed run (score None)
    and a prompt only one side ran are left out; the standard error is the differences' (ddof 1) / sqrt(n)."""
    def row(policy, budget, seed, score, task="niah_number"):
        return {"policy": policy, "budget": budget, "task": task, "haystack": "prose", "length": 1024, "seed": seed,
                "depth": None, "score": score}

    cases = [row("full", None, s, 1.0) for s in range(4)]
    cases += [row("sekv", 0.1, s, x) for s, x in enumerate([1.0, 0.0, 1.0, 1.0])]
    cases += [row("snapkv", 0.1, s, x) for s, x in enumerate([0.0, 0.0, 1.0, None])]
    cases += [row("snapkv", 0.2, 0, 1.0), row("sekv", 0.1, 9, 1.0, task="arithmetic")]
    paired = summarize(cases, [])["paired"]
    assert set(paired) == {"sekv@0.1"} and set(paired["sekv@0.1"]) == {"full", "snapkv@0.1"}
    assert paired["sekv@0.1"]["full"] == pytest.approx({"diff": -0.25, "se": 0.25, "n": 4})
    d = np.array([1.0, 0.0, 0.0])  # seeds 0-2: the seed-3 SnapKV run failed
    assert paired["sekv@0.1"]["snapkv@0.1"] == pytest.approx({"diff": d.mean(), "se": d.std(ddof=1) / np.sqrt(3),
                                                             "n": 3})


def test_a_sekv_variant_is_paired_with_the_sekv_runs_before_it():
    """A ``--sekv-variant`` run is paired with the sekv runs that ran before it at its budget (not the other way
    round), with full KV and the baselines; task scores by prompt, teacher-forced KL and top-1 by document."""
    def row(policy, budget, seed, score):
        return {"policy": policy, "budget": budget, "task": "niah_number", "haystack": "prose", "length": 1024,
                "seed": seed, "depth": None, "score": score}

    def fid(policy, budget, doc, kl, top1, corpus="prose"):
        return {"policy": policy, "budget": budget, "length": 1024, "corpus": corpus, "doc": doc, "kl_mean": kl,
                "top1_agreement": top1}

    cases = [row("sekv", 0.1, s, x) for s, x in enumerate([1.0, 0.0, 0.0])]
    cases += [row("sekv-x=1", 0.1, s, x) for s, x in enumerate([1.0, 1.0, 0.0])]
    cases += [row("sekv-x=1", 0.2, s, 1.0) for s in range(3)]
    paired = summarize(cases, [])["paired"]
    assert set(paired) == {"sekv-x=1@0.1"} and set(paired["sekv-x=1@0.1"]) == {"sekv@0.1"}
    d = np.array([0.0, 1.0, 0.0])
    assert paired["sekv-x=1@0.1"]["sekv@0.1"] == pytest.approx({"diff": d.mean(), "se": d.std(ddof=1) / np.sqrt(3),
                                                               "n": 3})
    rows = [fid("full", None, 0, 0.0, 1.0), fid("sekv", 0.1, 0, 0.10, 0.90), fid("sekv", 0.1, 1, 0.20, 0.80)]
    rows += [fid("sekv-x=1", 0.1, 0, 0.08, 0.92), fid("sekv-x=1", 0.1, 1, 0.14, 0.84)]
    rows += [fid("snapkv", 0.1, 0, 0.30, 0.70), fid("sekv", 0.1, 0, 0.5, 0.5, corpus="code")]
    pf = summarize([], rows)["paired_fidelity"]
    assert set(pf) == {"prose"} and set(pf["prose"]) == {"sekv@0.1", "sekv-x=1@0.1"}  # code: one run alone
    assert set(pf["prose"]["sekv@0.1"]) == {"snapkv@0.1"}                    # full KV's KL is 0 by definition
    assert set(pf["prose"]["sekv-x=1@0.1"]) == {"sekv@0.1", "snapkv@0.1"}
    got = pf["prose"]["sekv-x=1@0.1"]["sekv@0.1"]
    assert got == pytest.approx({"kl_diff": -0.04, "kl_se": 0.02, "top1_diff": 0.03, "top1_se": 0.01, "n": 2})
    assert pf["prose"]["sekv@0.1"]["snapkv@0.1"] == pytest.approx(
        {"kl_diff": -0.2, "kl_se": 0.0, "top1_diff": 0.2, "top1_se": 0.0, "n": 1})


def test_large_disagreements_say_whose_side_the_text_takes():
    """Steps whose KL from full KV exceeds KL_LARGE: their count, their share of all KL, and the share where the
    policy gave the text's next token more probability than full KV did (ln p_full - ln p_policy < 0)."""
    kls = [0.1, KL_LARGE + 1.0, KL_LARGE + 2.0, 0.0]
    lns = [0.05, -1.0, 0.5, 0.0]  # step 1: the policy likelier on the text; step 2: full KV likelier
    row = {"policy": "sekv", "budget": 0.2, "length": 8192, "doc": 0, "corpus": "tables",
           "kl_mean": float(np.mean(kls)), "top1_agreement": 0.5, "kls": kls, "ln_ppl_ratios": lns,
           "top1_text": 0.5, "ref_top1_text": 0.5}
    s = summarize([], [row])["fidelity_by_corpus"]["tables"]["sekv@0.2"]
    assert s["large_kl_steps"] == 2
    assert s["large_kl_share"] == pytest.approx((2 * KL_LARGE + 3.0) / sum(kls))
    assert s["large_kl_policy_likelier"] == pytest.approx(0.5)
    calm = summarize([], [row | {"kls": [0.1, 0.2, 0.0, 0.0]}])["fidelity_by_corpus"]["tables"]["sekv@0.2"]
    assert calm["large_kl_steps"] == 0 and calm["large_kl_policy_likelier"] == 0.0


def test_kl_is_zero_for_equal_and_positive_for_different():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(100).astype(np.float32)
    assert abs(kl(a, a)) < 1e-12
    assert kl(a, a + 3.0) < 1e-9  # a shift is the same distribution
    b = a.copy()
    b[0] += 5
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    p = np.exp(a64 - a64.max()) / np.exp(a64 - a64.max()).sum()
    q = np.exp(b64 - b64.max()) / np.exp(b64 - b64.max()).sum()
    assert abs(kl(a, b) - float(np.sum(p * np.log(p / q)))) < 1e-9


def test_teacher_forced_full_against_itself_is_exact(llama_model):
    toks = list(range(3, 200))
    ref_policy = make_policy("full", llama_model, len(toks))
    ref = np.stack(list(forced_logits(ref_policy, toks, 6)))
    ref_policy.close()
    again = make_policy("full", llama_model, len(toks))
    fid = teacher_forced(ref, again, toks)
    again.close()
    assert fid.n_steps == 6 and fid.kl_mean < 1e-9 and fid.top1_agreement == 1.0
    assert fid.delta_p_rms < 1e-9 and len(fid.delta_ps) == 6
    assert abs(fid.ln_ppl_ratio) < 1e-9 and fid.top1_text == fid.ref_top1_text


class _Scripted:
    """A stand-in policy whose prefill and steps return given logits [n_vocab] in turn, recording the fed tokens."""

    def __init__(self, rows: np.ndarray):
        self.rows, self.fed = list(rows), []

    def prefill(self, tokens):
        return self.rows.pop(0)

    def step(self, token):
        self.fed.append(token)
        return self.rows.pop(0)


def test_delta_p_is_the_actual_next_tokens_probability_policy_minus_full():
    """llama-perplexity's Δp: at each step the probability of the document's own next token (the token the step's
    logits predict: the second half's first token for the prefill's logits), the policy's minus full KV's."""
    tokens = [1, 2, 3, 0, 2, 1]  # the first half is prefilled; the steps predict 0, 2, 1
    ref = np.log(np.array([[.7, .1, .1, .1], [.1, .1, .7, .1], [.25, .25, .25, .25]]))  # [3 steps, 4]
    got = np.log(np.array([[.4, .4, .1, .1], [.1, .1, .7, .1], [.1, .6, .2, .1]]))
    policy = _Scripted(got)
    fid = teacher_forced(ref, policy, tokens)
    assert policy.fed == [0, 2]  # the last step's logits come from feeding the second half's second token
    assert fid.delta_ps == pytest.approx([.4 - .7, 0.0, .6 - .25])
    assert fid.delta_p_mean == pytest.approx((-.3 + .35) / 3)
    assert fid.delta_p_rms == pytest.approx(np.sqrt((.3 ** 2 + .35 ** 2) / 3))
    assert fid.top1_agreement == pytest.approx(2 / 3)  # step 2's top token: full KV's 0 (a uniform row), the policy's 1
    # llama-perplexity's ln(PPL(Q)/PPL(base)) per token: ln p_full(next) - ln p_policy(next)
    assert fid.ln_ppl_ratios == pytest.approx([np.log(.7 / .4), 0.0, np.log(.25 / .6)])
    assert fid.ln_ppl_ratio == pytest.approx((np.log(.7 / .4) + np.log(.25 / .6)) / 3)
    # the text's next tokens 0, 2, 1: the policy's top tokens 0 (a tie, the first), 2, 1 all hit; full KV's 0, 2, 0
    assert fid.top1_text == pytest.approx(1.0) and fid.ref_top1_text == pytest.approx(2 / 3)


def test_fidelity_runs_are_sized_for_what_they_hold(llama_model, monkeypatch):
    """A fidelity run holds half the document and the forced tokens; its policies are sized for that (a context of
    the whole document made SnapKV reserve the unseen half for generation and fall back to a window, so its KL was
    StreamingLLM's to the digit), with the budget a share of the document in cells. ``samples=0``: fidelity only."""
    import sekv_gguf.eval.suite as suite

    seen, real = [], suite.make_policy

    def spy(name, model, n_context, ctx_config, budget, *args, **kwargs):
        seen.append((name, n_context, budget.kv_budget, budget.chunk))
        return real(name, model, n_context, ctx_config, budget, *args, **kwargs)

    monkeypatch.setattr(suite, "make_policy", spy)
    cfg = EvalConfig(policies=("full", "snapkv", "streaming"), budgets=(0.25,), tasks=("niah_number",),
                     lengths=(1024,), haystacks=("prose",), samples=0, fidelity_docs=1, fidelity_steps=8, chunk=64)
    result = run_suite(llama_model, cfg, progress=False)
    assert result["cases"] == [] and len(result["fidelity"]) == 2
    assert seen == [("full", 520, 1.0, 64), ("snapkv", 520, 256, 64), ("streaming", 520, 256, 64)]  # --chunk
    kls = {r["policy"]: r["kl_mean"] for r in result["fidelity"]}
    assert kls["snapkv"] != kls["streaming"]  # SnapKV's selection ran
    with pytest.raises(ValueError, match="nothing to run"):
        EvalConfig(samples=0, fidelity_docs=0)


def test_suite_runs_every_policy_and_writes_json_and_plot(llama_model, tmp_path):
    cfg = EvalConfig(policies=("full", "streaming", "h2o", "snapkv", "quest", "sekv"), budgets=(0.5,),
                     tasks=("niah_number", "arithmetic"), lengths=(1024,), haystacks=("prose",), n_predict=4,
                     fidelity_docs=1, fidelity_steps=4)
    result = run_suite(llama_model, cfg, progress=False)
    assert len(result["cases"]) == 2 * 6
    assert all(r["output"] is not None and r["score"] in (0.0, 1.0) for r in result["cases"]), result["cases"]
    assert {r["policy"] for r in result["fidelity"]} == {"streaming", "h2o", "snapkv", "quest", "sekv"}
    assert all(r["kl_mean"] >= 0 and 0 <= r["top1_agreement"] <= 1 for r in result["fidelity"])
    assert set(result["summary"]["accuracy"]) == {"full", "streaming@0.5", "h2o@0.5", "snapkv@0.5", "quest@0.5",
                                                  "sekv@0.5"}
    path = write(result, tmp_path, "t", "tiny")
    doc = json.loads(path.read_text())
    assert doc["params"]["tasks"] == ["niah_number", "arithmetic"] and doc["commit"] and doc["machine"]["cpus"]
    assert doc["uncommitted"] == provenance.uncommitted() and doc["command"] == provenance.command_line()
    assert path.with_suffix(".png").stat().st_size > 1000
    assert "| sekv@0.5 |" in table(doc) and "| sekv@0.5 | snapkv@0.5 |" in table(doc)  # the paired rows too
    assert "| sekv@0.5 | snapkv@0.5 | prose |" in table(doc)  # and the paired fidelity rows
    # more policies added to the same file: the old runs stay, the summary covers both
    more = run_suite(llama_model, EvalConfig(policies=("chunkkv",), budgets=(0.5,), tasks=("niah_number", "arithmetic"),
                                             lengths=(1024,), haystacks=("prose",), n_predict=4, fidelity_docs=0),
                     progress=False)
    doc2 = json.loads(write(more, tmp_path, "t", "tiny", merge_into=True).read_text())
    assert len(doc2["cases"]) == 2 * 7 and "chunkkv@0.5" in doc2["summary"]["accuracy"]
    assert doc2["params"]["policies"][-1] == "chunkkv" and len(doc2["fidelity"]) == 5
    # more seeds of a policy added: the rows of a case run again are replaced, the others kept
    seeds = run_suite(llama_model, EvalConfig(policies=("chunkkv",), budgets=(0.5,), tasks=("niah_number", "arithmetic"),
                                              lengths=(1024,), haystacks=("prose",), n_predict=4, fidelity_docs=0,
                                              seed=0, samples=2), progress=False)
    doc3 = json.loads(write(seeds, tmp_path, "t", "tiny", merge_into=True).read_text())
    assert len(doc3["cases"]) == 2 * 7 + 2 and doc3["params"]["samples"] == 2 and doc3["params"]["seed"] == 0
    assert sorted(c["seed"] for c in doc3["cases"] if c["policy"] == "chunkkv") == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="cannot merge: lengths differ"):
        write(run_suite(llama_model, EvalConfig(policies=("streaming",), budgets=(0.5,), tasks=("niah_number",
              "arithmetic"), lengths=(512,), haystacks=("prose",), n_predict=2, fidelity_docs=0), progress=False),
              tmp_path, "t", "tiny", merge_into=True)
    # sekv with another training-free score is reported beside the default
    other = run_suite(llama_model, EvalConfig(policies=("sekv",), budgets=(0.5,), tasks=("niah_number",),
                                              lengths=(1024,), haystacks=("prose",), n_predict=2, fidelity_docs=0,
                                              sekv={"router": "summary"}), progress=False)
    assert {r["policy"] for r in other["cases"]} == {"sekv-summary"}


def test_bad_eval_input_is_refused(llama_model, capsys):
    with pytest.raises(ValueError, match="unknown policy 'nope'; choose from"):
        EvalConfig(policies=("nope",))
    with pytest.raises(ValueError, match="unknown task 'bogus'"):
        EvalConfig(tasks=("bogus",))
    with pytest.raises(ValueError, match="budgets are fractions"):
        EvalConfig(budgets=(0.0,))
    with pytest.raises(ValueError, match="chunk must be >= 1 token, got 0"):
        EvalConfig(chunk=0)
    with pytest.raises(ValueError, match="'variable_tracking' has no single needle depth"):
        EvalConfig(tasks=("niah_number", "variable_tracking"), depths=(0.5,))
    with pytest.raises(ValueError, match="depths are fractions"):
        EvalConfig(tasks=("niah_number",), depths=(1.2,))
    with pytest.raises(ValueError, match="exceeds the model's training context"):
        run_suite(llama_model, EvalConfig(lengths=(70000,)), progress=False)
    assert main(["eval", "--policies", "nope"]) == 1
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_eval_output_is_checked_before_the_run(tmp_path, capsys, monkeypatch):
    """A name with a directory in it, or an output directory that cannot be made, is refused before any model
    loads or case runs (not after an hour of runs, when the results are written)."""
    from sekv_gguf.cli import commands
    from sekv_gguf.eval.report import output_path

    assert output_path(tmp_path / "new", "grid") == tmp_path / "new" / "eval-grid.json"
    assert (tmp_path / "new").is_dir()
    for bad in ("/tmp/x", "a/b", "", "..", "a\0b"):
        with pytest.raises(ValueError, match="--name must be a plain name"):
            output_path(tmp_path, bad)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot create the output directory"):
        output_path(tmp_path / "file" / "sub", "grid")
    monkeypatch.setattr(commands, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["eval", "--name", "/tmp/x", "--out", str(tmp_path)]) == 1
    assert "--name must be a plain name" in capsys.readouterr().err


def test_multiturn_cases_go_through_the_lifecycle_api(llama_model):
    """A shared-context case: every policy prefills the document, then answers each question in a later turn, its
    answers staying in the memory; sekv keeps the rest on the host."""
    cfg = EvalConfig(policies=("full", "snapkv", "sekv"), budgets=(0.5,), tasks=("niah_multiturn",),
                     lengths=(1024,), haystacks=("prose",), n_predict=3, fidelity_docs=0)
    result = run_suite(llama_model, cfg, progress=False)
    assert {r["policy"] for r in result["cases"]} == {"full", "snapkv", "sekv"}
    for r in result["cases"]:
        assert len(r["turn_outputs"]) == 3 and len(r["turn_hits"]) == 3 and r["score"] == sum(r["turn_hits"]) / 3
        assert all("\x00" not in o and o for o in r["turn_outputs"])  # the tokens' text, as a run prints it
        assert r["device_kv_bytes"] > 0
    full = next(r for r in result["cases"] if r["policy"] == "full")
    sekv = next(r for r in result["cases"] if r["policy"] == "sekv")
    assert sekv["host_kv_bytes"] > 0 and sekv["device_kv_bytes"] < full["device_kv_bytes"]


def test_fidelity_on_code_and_tables_reports_llama_perplexity_figures(llama_model):
    """Fidelity documents of each corpus (Python's own sources and Unicode tables), per-token KL pooled per
    (policy, budget, corpus): median and 99th percentile beside the mean, over every scored token."""
    from sekv_gguf.eval.corpora import CORPORA

    texts = {c: CORPORA[c]() for c in ("code", "tables")}
    assert "def " in texts["code"] and "| U+" in texts["tables"]
    assert "U+0021,!,EXCLAMATION MARK" in texts["tables"] and 'U+002C,",",COMMA' in texts["tables"]  # CSV, quoted
    cfg = EvalConfig(policies=("full", "streaming"), budgets=(0.25,), tasks=("niah_number",), lengths=(1024,),
                     haystacks=("prose",), samples=0, fidelity_docs=2, fidelity_steps=8,
                     fidelity_corpora=("code", "tables"))
    result = run_suite(llama_model, cfg, progress=False)
    assert {r["corpus"] for r in result["fidelity"]} == {"code", "tables"} and len(result["fidelity"]) == 4
    for corpus in ("code", "tables"):
        s = result["summary"]["fidelity_by_corpus"][corpus]["streaming@0.25"]
        rows = [r for r in result["fidelity"] if r["corpus"] == corpus]
        kls = np.concatenate([r["kls"] for r in rows])
        assert s["n_tokens"] == 16 == kls.size and s["kl_median"] == pytest.approx(float(np.median(kls)))
        assert s["kl_median"] <= s["kl_p99"] <= kls.max() and s["kl_p99"] > 0
        dps = np.concatenate([r["delta_ps"] for r in rows])  # Δp pooled over the same tokens
        assert dps.size == 16 and s["delta_p_rms"] > 0
        assert s["delta_p_rms"] == pytest.approx(float(np.sqrt(np.mean(dps ** 2))))
        assert s["delta_p_mean"] == pytest.approx(float(dps.mean()))
        lns = np.concatenate([r["ln_ppl_ratios"] for r in rows])
        assert lns.size == 16 and s["ln_ppl_ratio"] == pytest.approx(float(lns.mean()))
        assert s["top1_text"] == pytest.approx(np.mean([r["top1_text"] for r in rows]))
        assert 0 <= s["ref_top1_text"] <= 1
        large = kls > KL_LARGE
        assert s["large_kl_steps"] == int(large.sum())
        assert s["large_kl_share"] == pytest.approx(kls[large].sum() / kls.sum() if large.any() else 0.0)
        assert s["large_kl_policy_likelier"] == pytest.approx(np.mean(lns[large] < 0) if large.any() else 0.0)
    assert result["summary"]["fidelity"] == result["summary"]["fidelity_by_corpus"]["code"]
    assert "KL p99" in table(result | {"model": "tiny"}) and "RMS Δp" in table(result | {"model": "tiny"})
    assert "ln PPL ratio" in table(result | {"model": "tiny"})
    # no task cases (samples 0): the fidelity run still has its row, its task columns empty
    s = result["summary"]["fidelity"]["streaming@0.25"]
    assert f"| streaming@0.25 | — | — | {s['kl_mean']:.3f} |" in table(result | {"model": "tiny"})
    with pytest.raises(ValueError, match="fidelity corpora"):
        EvalConfig(fidelity_corpora=("poetry",))


def test_equal_total_runs_give_the_baselines_sekv_s_device_and_host_bytes(llama_model, monkeypatch):
    """``equal_total``: after each prompt's runs, every baseline runs again at the share of the context that the
    sekv run's device + host bytes are of full KV's, named ``<policy>=total`` and filed under sekv's budget; its
    device KV is then about sekv's device + host; the paired differences and the fidelity rows carry it too."""
    import sekv_gguf.eval.suite as suite

    seen, real = [], suite.make_policy

    def spy(name, model, n_context, ctx_config, budget, *args, **kwargs):
        seen.append((name, budget.kv_budget))
        return real(name, model, n_context, ctx_config, budget, *args, **kwargs)

    monkeypatch.setattr(suite, "make_policy", spy)
    cfg = EvalConfig(policies=("sekv", "snapkv"), budgets=(0.25,), tasks=("niah_number",), lengths=(1024,),
                     haystacks=("prose",), samples=1, n_predict=4, fidelity_docs=1, fidelity_steps=8,
                     equal_total=True)
    result = run_suite(llama_model, cfg, progress=False)
    rows = {r["policy"]: r for r in result["cases"]}
    assert list(rows) == ["sekv", "snapkv", "snapkv=total"]
    ref, eq = rows["sekv"], rows["snapkv=total"]
    share = (ref["device_kv_bytes"] + ref["host_kv_bytes"]) / ref["full_kv_bytes"]
    assert ref["host_kv_bytes"] > 0 and eq["budget"] == 0.25 and eq["budget_share"] == pytest.approx(share)
    assert ("snapkv", pytest.approx(share)) in seen and share > 0.25
    assert rows["snapkv"]["device_kv_bytes"] < eq["device_kv_bytes"]
    assert abs(eq["device_kv_bytes"] - ref["device_kv_bytes"] - ref["host_kv_bytes"]) < 0.1 * ref["full_kv_bytes"]
    assert set(result["summary"]["paired"]["sekv@0.25"]) == {"snapkv@0.25", "snapkv=total@0.25"}
    fid = {r["policy"]: r for r in result["fidelity"]}
    assert list(fid) == ["sekv", "snapkv", "snapkv=total"]
    f_share = (fid["sekv"]["device_kv_bytes"] + fid["sekv"]["host_kv_bytes"]) / fid["sekv"]["full_kv_bytes"]
    assert fid["snapkv=total"]["budget_share"] == pytest.approx(f_share) and fid["snapkv=total"]["kl_mean"] >= 0
    assert ("snapkv", int(np.ceil(f_share * 1024))) in seen
    with pytest.raises(ValueError, match="at least one baseline"):
        EvalConfig(policies=("full", "sekv"), equal_total=True)
