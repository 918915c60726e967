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
