"""Full-attention passes over a prompt that several runs share: an evaluation runs every policy and budget on one
prompt, and the policies that start from full attention over it (SeKV's exact prefill, SnapKV and ChunkKV's
observation-window votes) each need the same pass. ``SharedPasses`` keeps the last pass of each kind; a run asks
for its pass by a key naming what the pass was made from, gets the kept one when the key matches, and a new prompt
closes the old pass. What each policy then does with the pass is what it does with a pass of its own (tested)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ..session import Session


@dataclass
class FullPass:
    """A prompt decoded with full attention in a temporary full-size context. Read only once made: several runs
    may take what they need from it (``SharedPasses``); closing it frees the context."""

    key: tuple[Any, ...]  # what it was made from: (kind, tokens, ..., context config)
    session: Session      # the full-size context, every prompt token resident
    closed: bool = field(default=False, kw_only=True)

    def close(self) -> None:
        if not self.closed:
            self.session.close()
            self.closed = True


P = TypeVar("P", bound=FullPass)


class SharedPasses:
    """The last ``FullPass`` of each kind (``key[0]``), handed out again to a run whose key matches (same kind,
    prompt, batch and context settings, same model); a pass of another key closes the kept one of its kind."""

    def __init__(self) -> None:
        self.last: dict[str, FullPass] = {}
        self.reused = 0  # passes handed out again

    def get(self, key: tuple[Any, ...], model: Any, make: Callable[[], P]) -> P:
        """The kept pass of ``key``'s kind if it was made from ``key`` with ``model``; else ``make()``, kept."""
        kind = key[0]
        kept = self.last.get(kind)
        if kept is not None and kept.key == key and kept.session.model is model:
            self.reused += 1
            return kept  # type: ignore[return-value]
        if kept is not None:
            del self.last[kind]
            kept.close()
        made = make()
        if made.key != key:
            made.close()
            raise AssertionError(f"a pass made for {kind!r} carries another key")
        self.last[kind] = made
        return made

    def close(self) -> None:
        for p in self.last.values():
            p.close()
        self.last.clear()
