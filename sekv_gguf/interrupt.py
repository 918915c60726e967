"""Ctrl-C that llama.cpp cannot swallow. llama-cpp-python logs through a Python ctypes callback that llama.cpp calls
during ``llama_decode``; a KeyboardInterrupt raised while that callback runs is printed as "Exception ignored" and
dropped, so most Ctrl-Cs during a prompt were lost. ``install`` (the CLI calls it) records every SIGINT in a flag
that ``check`` (called after each ``llama_decode``) turns into a KeyboardInterrupt in ordinary code, and keeps the
dropped one's traceback off the terminal."""

from __future__ import annotations

import signal
import sys
from typing import Any

_pending = False


def _on_sigint(signum: int, frame: Any) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def _quiet_unraisable(hook: Any) -> Any:
    """After a Ctrl-C: drop the swallowed KeyboardInterrupt, and the AttributeError of a llama-cpp-python object
    whose constructor the interrupt cut short (its ``__del__`` then finds no ``_exit_stack``); report the rest."""
    def unraisable(info: Any) -> None:
        half_built = (info.exc_type is AttributeError
                      and getattr(info.object, "__module__", "").startswith("llama_cpp"))
        if not (_pending and (info.exc_type is KeyboardInterrupt or half_built)):
            hook(info)

    return unraisable


def install() -> None:
    """Route SIGINT through the flag (main thread only; a no-op where SIGINT is ignored, as in background jobs)."""
    global _pending
    _pending = False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)


def check() -> None:
    """Raise the KeyboardInterrupt of a SIGINT that arrived, wherever it was swallowed."""
    if _pending:
        raise KeyboardInterrupt
