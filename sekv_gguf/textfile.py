"""Reading a text file the user handed over (``run -f``, ``chat``'s ``/file``, ``serve --config``): every way it can
fail (missing, a directory, unreadable, not UTF-8, NUL bytes, over the size limit) is one ``InputFileError`` naming
the file and the problem."""

from __future__ import annotations

from pathlib import Path

from .errors import InputFileError

MAX_TEXT_BYTES = 1 << 30  # a text file larger than this is refused before it is read (1 GiB: ~250M tokens)


def read_text(path: str | Path, what: str = "text file", limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark dropped); ``what`` names the file in errors."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise InputFileError(f"{what} {p} is a directory")
        if size > limit:
            raise InputFileError(f"{what} {p} is {size} bytes; the limit is {limit}")
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{what} not found: {p}") from None
    except OSError as e:
        raise InputFileError(f"cannot read {what} {p}: {e.strerror or e}") from None
    if len(data) > limit:  # it grew between stat and read
        raise InputFileError(f"{what} {p} is over {limit} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{what} {p} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 4]!r})") from None
    if "\x00" in text:
        raise InputFileError(f"{what} {p} holds a NUL character at offset {text.index(chr(0))}: binary, not text")
    return text
