"""``python -m sekv_gguf chat`` through its stdin and stdout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import prose
from sekv_gguf.models import smollm2_path

ROOT = Path(__file__).resolve().parents[1]


def test_chat_streams_answers_keeps_the_memory_and_takes_commands(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text(prose(1500, 900))
    script = "\n".join(["Hello!", f"/file {doc}", "What are the notes about?", "/stats", "/reset", "/stats",
                        "Bye.", "/quit"]) + "\n"
    r = subprocess.run([sys.executable, "-m", "sekv_gguf", "chat", str(smollm2_path()), "--kv-budget", "512",
                        "--n-ctx", "4096", "--max-tokens", "12"], input=script, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert any(line.startswith("(added notes.txt") for line in out)
    stats = [line for line in out if line.startswith("sekv:")]
    assert len(stats) == 2
    # after the document turn most of the memory was reused, and /reset emptied it
    assert "cached" in stats[0] and " 0 tokens in memory" in stats[1]
    first_tokens = int(stats[0].split(": ")[1].split(" tokens")[0])
    assert first_tokens > 300
    assert "(new conversation)" in out
