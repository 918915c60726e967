"""Generated long documents with facts spread through them (no downloads): the CLI's default prompt and test data.

``field_report(seed, n_sections)`` writes a gazetteer of invented towns: every section states a few facts (founding
year, river, harbour master, archive ledger number) among descriptive prose. ``default_prompt()`` is the bundled
document (``data/default_document.txt``, written by ``scripts/make_default_document.py``) and a question about a fact
stated early in it. ``stdlib_prose()`` (natural English text found on every machine) and ``needle_prompt`` (a
"special magic number" hidden in it at a given depth, RULER-style) are importable from here too; they live in
``ruler_tasks``, the one place needle prompts are built and sized.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib.resources import files

from .ruler_tasks import FIRST_NAMES, Needle, needle_prompt, stdlib_prose

__all__ = ["FIRST_NAMES", "Fact", "Needle", "default_prompt", "field_report", "needle_prompt", "stdlib_prose"]

_SYLLABLES = ["va", "lor", "mi", "den", "tha", "ros", "quel", "bar", "in", "sol", "ke", "mar", "tu", "vin", "os",
              "ela", "dra", "fen", "gal", "hu", "ir", "jo", "ny", "pel", "rau", "sey", "ti", "um", "zo", "cre"]
_RIVERS = ["Amber", "Silt", "Heron", "Cold", "Lantern", "Willow", "Iron", "Glass", "Fallow", "Ember", "Quiet", "Salt"]
_LAST = ["Albrecht", "Brandt", "Castell", "Dorn", "Eskola", "Fontaine", "Graves", "Holm", "Ivanova", "Jansen",
         "Kessler", "Lindqvist", "Moreau", "Novak", "Ortega", "Petrov", "Quist", "Reyes", "Sato", "Thorne"]
_PROSE = [
    "The streets of {town} climb from the water towards a low ridge of pine and granite.",
    "Travellers who reach {town} in autumn describe the smell of woodsmoke and the sound of bells from the quay.",
    "Most families in {town} still keep small gardens behind their houses, with beans, onions and late apples.",
    "The market of {town} opens before dawn, and by noon the square is quiet again except for the pigeons.",
    "In winter the roads to {town} are often closed, and the town depends on the stores it laid in over summer.",
    "A narrow footbridge crosses the {river} River below {town}, rebuilt many times after the spring floods.",
    "The old school of {town} was turned into a library, and its reading room looks out over the rooftops.",
    "Fishing boats from {town} go out at first light and return in the afternoon with herring and cod.",
    "The people of {town} are known in the region for their patience, their long stories and their strong tea.",
    "Every summer {town} holds a fair where weavers, potters and carpenters show the work of the past year.",
    "The chapel above {town} has a painted ceiling that was restored by students from the capital.",
    "Shepherds bring their flocks down to the meadows near {town} when the first snow covers the high pastures.",
]
_FACTS = {
    "founded": "{town} was founded in the year {value}, when settlers from the coast cleared the first fields.",
    "river": "The river that runs through {town} is the {value} River, which freezes for a few weeks each winter.",
    "master": "The harbour master of {town} is {value}, who has kept the post for more than a decade.",
    "ledger": "The town archive of {town} keeps the old grain accounts in ledger number {value}.",
}
_QUESTIONS = {
    "founded": ("In which year was {town} founded?", "{town} was founded in the year"),
    "river": ("Which river runs through {town}?", "The river that runs through {town} is the"),
    "master": ("Who is the harbour master of {town}?", "The harbour master of {town} is"),
    "ledger": ("In which ledger does the archive of {town} keep the grain accounts?",
               "The town archive of {town} keeps the old grain accounts in ledger number"),
}


@dataclass(frozen=True)
class Fact:
    town: str
    kind: str
    value: str

    @property
    def question(self) -> str:
        q, lead = _QUESTIONS[self.kind]
        return f"Question: {q.format(town=self.town)}\nAnswer: {lead.format(town=self.town)}"


def _town(rng: random.Random, used: set[str]) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if name not in used and len(name) > 3:
            used.add(name)
            return name


def field_report(seed: int = 0, n_sections: int = 24, prose_per_section: int = 6) -> tuple[str, list[Fact]]:
    """A gazetteer of ``n_sections`` invented towns and the facts it states (in order)."""
    rng = random.Random(seed)
    used: set[str] = set()
    parts = ["A Gazetteer of the Northern Valleys\n"]
    facts: list[Fact] = []
    for _ in range(n_sections):
        town = _town(rng, used)
        values = {
            "founded": str(rng.randint(1102, 1899)),
            "river": rng.choice(_RIVERS),
            "master": f"{rng.choice(FIRST_NAMES)} {rng.choice(_LAST)}",
            "ledger": str(rng.randint(1000, 9999)),
        }
        sentences = [t.format(town=town, river=values["river"]) for t in rng.sample(_PROSE, prose_per_section)]
        for kind in rng.sample(sorted(_FACTS), 2):
            sentences.insert(rng.randint(0, len(sentences)), _FACTS[kind].format(town=town, value=values[kind]))
            facts.append(Fact(town, kind, values[kind]))
        parts.append(f"\n{town}\n\n" + " ".join(sentences) + "\n")
    return "".join(parts), facts


def default_prompt() -> tuple[str, str]:
    """The bundled document followed by its question, and the expected answer."""
    data = files("sekv_gguf").joinpath("data")
    doc = data.joinpath("default_document.txt").read_text(encoding="utf-8")
    meta = json.loads(data.joinpath("default_document.json").read_text(encoding="utf-8"))
    return f"{doc}\n{meta['question']}", meta["answer"]
