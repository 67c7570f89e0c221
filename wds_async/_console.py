"""The one rule for live displays of the CLI (``index``, ``tune``, ``bench``): on stderr, transient, and
shown only where a person watches.

Shown when stderr is a terminal, or always with ``--progress``; never with ``-q``, and never under
``CI=true`` unless ``--progress`` asks for it (rich counts ``FORCE_COLOR``, which some CI systems set,
as a terminal, and a CI log would fill with redraws).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["progress_console"]

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
