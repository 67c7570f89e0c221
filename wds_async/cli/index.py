"""``wds-async index``: stream the shards once and write their index (see :mod:`wds_async.index.format`), with a
live bar on stderr on a terminal (see :mod:`wds_async.cli.console`).
"""

from __future__ import annotations

import argparse
import sys

from .common import positive

__all__ = ["add_arguments", "command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+")
    parser.add_argument("-o", "--output", required=True, help="the index file to write (a local path; .gz "
                        "to compress)")
    parser.add_argument("-c", "--max-connections", type=positive, default=16, help="shards in flight (default 16)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")
    parser.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is "
                        "not a terminal")


def command(args: argparse.Namespace) -> int:
    """Stream the shards once and write their index (see wds_async.index.format); a live bar on a terminal."""
    import os
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..backends.file import local_path
    from ..errors import UrlError
    from ..index.build import build_index
    from ..urls import scheme_of
    from .console import progress_console

    if scheme_of(args.output) != "file":
        raise UrlError("the index is written to a local path; copy it next to the shards afterwards",
                       url=args.output)
    folder = os.path.dirname(os.path.abspath(local_path(args.output)))
    if not os.path.isdir(folder):
        print(f"wds-async: error: cannot write {args.output}: no directory {folder}", file=sys.stderr)
        return 2
    console, shown = progress_console(args.progress, args.quiet)
    bar = Progress(TextColumn("indexing"), BarColumn(), MofNCompleteColumn(), TextColumn("shards"),
                   TextColumn("{task.fields[mb]:,.1f} MB  {task.fields[rate]:,.1f} MB/s"), TimeElapsedColumn(),
                   console=console, transient=True, disable=not shown)
    task = bar.add_task("index", total=None, mb=0.0, rate=0.0)
    started, nbytes = time.perf_counter(), 0

    def progress(done: int, total: int, read: int) -> None:
        nonlocal nbytes
        nbytes = read
        rate = read / 1e6 / max(time.perf_counter() - started, 1e-9)
        bar.update(task, completed=done, total=total, mb=read / 1e6, rate=rate)

    with bar:
        index = build_index(args.urls, max_connections=args.max_connections, progress=progress)
    seconds = time.perf_counter() - started
    try:
        index.save(args.output)
    except OSError as exc:
        print(f"wds-async: error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"indexed {len(index.shards)} shards, {index.total_samples} samples, {nbytes / 1e6:,.1f} MB in "
              f"{seconds:.2f} s ({nbytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s) -> {args.output}")
    return 0
