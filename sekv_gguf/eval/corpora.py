"""Running text for the teacher-forced fidelity check, beyond prose, all shipped with Python itself (so every
machine has the same bytes): ``prose`` (documentation strings of standard modules), ``code`` (the source of
standard modules) and ``tables`` (rows of the Unicode database that ``unicodedata`` carries, as CSV and Markdown
tables in turn)."""

from __future__ import annotations

import csv
import inspect
import io
import unicodedata
from functools import lru_cache
from typing import Callable

from ..documents import stdlib_prose
from ..ruler_tasks import stdlib_code

TABLE_ROWS = 40             # rows per table before the format switches (CSV, then Markdown, ...)
TABLE_FIRST_CODEPOINT = 0x20
TABLE_LAST_CODEPOINT = 0x2FFF


@lru_cache(maxsize=1)
def unicode_tables() -> str:
    """Named code points of ``unicodedata`` as tables of ``TABLE_ROWS`` rows: code point, character, name, general
    category, bidirectional class, East Asian width; CSV and Markdown in turn, each with its header."""
    rows = [(f"U+{c:04X}", chr(c), unicodedata.name(chr(c)), unicodedata.category(chr(c)),
             unicodedata.bidirectional(chr(c)), unicodedata.east_asian_width(chr(c)))
            for c in range(TABLE_FIRST_CODEPOINT, TABLE_LAST_CODEPOINT + 1)
            if unicodedata.name(chr(c), "") and unicodedata.category(chr(c))[0] not in "CZ"]
    header = ("code point", "character", "name", "category", "bidi", "width")
    parts = []
    for i in range(0, len(rows), TABLE_ROWS):
        block = rows[i:i + TABLE_ROWS]
        if (i // TABLE_ROWS) % 2 == 0:
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows([header, *block])  # quoted where a cell holds a comma
            parts.append(out.getvalue().rstrip("\n"))
        else:
            md = ["| " + " | ".join(r) + " |" for r in [header, ("---",) * len(header), *block]]
            parts.append("\n".join(md))
    return "\n\n".join(parts)


CORPORA: dict[str, Callable[[], str]] = {"prose": stdlib_prose, "code": stdlib_code, "tables": unicode_tables}
