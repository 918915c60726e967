"""Write the bundled default document (sekv_gguf/data/default_document.{txt,json}) from the seeded generator.

    .venv/bin/python scripts/make_default_document.py
"""

import json
from pathlib import Path

from sekv_gguf.documents import field_report

SEED = 7
N_SECTIONS = 24

doc, facts = field_report(SEED, N_SECTIONS)
fact = facts[6]  # stated early: the question reaches far back
out = Path(__file__).resolve().parents[1] / "sekv_gguf" / "data"
(out / "default_document.txt").write_text(doc, encoding="utf-8")
(out / "default_document.json").write_text(json.dumps({
    "seed": SEED, "sections": N_SECTIONS, "question": fact.question, "answer": fact.value,
    "facts": [f.__dict__ for f in facts]}, indent=1), encoding="utf-8")
print(f"{len(doc)} characters, {len(facts)} facts; question: {fact.question!r} -> {fact.value!r}")
