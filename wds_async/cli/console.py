"""The one rule for live displays of the CLI (``index``, ``tune``, ``bench``, ``ls``, ``verify``): on stderr,
transient, and shown only where a person watches.

Shown when stderr is a terminal, or always with ``--progress``; never with ``-q``, and never under
``CI=true`` unless ``--progress`` asks for it (rich counts ``FORCE_COLOR``, which some CI systems set,
as a terminal, and a CI log would fill with redraws).

Results never pass through the display: :func:`live_progress` turns rich's stdout redirection off, so
what a command prints goes to the real stdout, byte for byte, wherever it points. :class:`ResultLines`
prints a command's result lines while a display runs: straight to stdout, except when stdout is the very
terminal the display draws on, where a line is printed above the display instead of through it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["ResultLines", "live_progress", "progress_console"]

_TRUE = ("1", "true", "yes", "on")


def progress_console(progress: bool = False, quiet: bool = False) -> tuple[Any, bool]:
    """``(console, shown)``: the stderr ``rich.console.Console`` and whether a live display belongs on it."""
    from rich.console import Console

    console = Console(stderr=True, force_terminal=True if progress else None)
    if quiet:
        return console, False
    if progress:
        return console, True
    in_ci = os.environ.get("CI", "").strip().lower() in _TRUE
    return console, bool(console.is_terminal) and not in_ci


def live_progress(*columns: Any, progress: bool = False, quiet: bool = False) -> Any:
    """A transient ``rich.progress.Progress`` on stderr, disabled unless :func:`progress_console` says it is
    shown, that leaves stdout and stderr alone (no redirection into the display)."""
    from rich.progress import Progress

    console, shown = progress_console(progress, quiet)
    return Progress(*columns, console=console, transient=True, disable=not shown, redirect_stdout=False,
                    redirect_stderr=False)


def _same_terminal(a: Any, b: Any) -> bool:
    try:
        if not (a.isatty() and b.isatty()):
            return False
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


class ResultLines:
    """Prints result lines to stdout while ``bar`` (from :func:`live_progress`) may be live on stderr."""

    def __init__(self, bar: Any) -> None:
        self._console = None if bar.disable or not _same_terminal(sys.stdout, sys.stderr) else bar.console

    def __call__(self, line: str) -> None:
        if self._console is None:
            print(line, flush=True)
        else:  # the terminal both streams share: above the display, unwrapped and unstyled
            self._console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
