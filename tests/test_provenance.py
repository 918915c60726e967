"""Where a result came from: the commit a result records is the code the process started with."""

from __future__ import annotations

import subprocess

from sekv_gguf import provenance


def test_a_result_records_the_commit_its_process_started_with(monkeypatch):
    started = provenance.commit()
    assert started == provenance.head() and (len(started) == 40 or started == "unknown")

    def later_head(*args, **kwargs):  # a commit made while a long run goes on
        return subprocess.CompletedProcess(args, 0, stdout="f" * 40 + "\n", stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", later_head)
    assert provenance.head() == "f" * 40
    assert provenance.commit() == started and provenance.envelope("x")["commit"] == started


def test_a_result_records_the_code_files_that_were_not_its_commits(monkeypatch):
    """A run made with changed or new code files records them (``uncommitted``, read when the process started), so a
    result from a working tree is not taken for its commit's; outside a git checkout the list is empty."""
    started = provenance.uncommitted()
    assert started == provenance.uncommitted_now()                  # nothing changed in the code since import
    assert provenance.envelope("x")["uncommitted"] == started

    def status(*args, **kwargs):
        return subprocess.CompletedProcess(args, 0, stderr="",
                                           stdout=" M sekv_gguf/policies/lexical.py\n?? scripts/new_bench.py\n")

    monkeypatch.setattr(provenance.subprocess, "run", status)
    assert provenance.uncommitted_now() == ["scripts/new_bench.py", "sekv_gguf/policies/lexical.py"]
    assert provenance.uncommitted() == started                      # the start's, not now's

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    assert provenance.uncommitted_now() == []
