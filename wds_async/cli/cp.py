"""``wds-async cp``: copy shards between stores as they are, or reshard them, verifying each as it passes.

Forms::

    wds-async cp SRC... DIR/                      each shard to DIR/ + its file name
    wds-async cp SRC DST                          one shard to a full object name
    wds-async cp SRC... --maxcount N DST-%06d.tar  reshard: the samples, in order, into new shards
                                                   (--maxsize SIZE, e.g. 1GB or 512MiB, too or instead)

Sources are any URLs, brace patterns and globs the loader reads (local paths, http(s), s3, gs, az,
``pipe:``); destinations are local paths (folders are created), s3, gs, az and Azure https URLs, with
the reading side's credentials from the environment. A copy is byte for byte (see :mod:`wds_async.write.copy`);
a reshard writes each field's bytes and name unchanged (see :mod:`wds_async.write.reshard`). ``--index URL``
also writes the shard index (:mod:`wds_async.index.format`) of what was written, locally or to a store.

Text: ``ok   SRC -> DST: N samples, B bytes`` or ``FAIL SRC -> DST: error``, one line per source shard in
source order. ``--json``: one JSON object per line, keys ``src``, ``dst``, ``ok``, ``samples``, ``bytes``,
``error`` and ``error_type``; when resharding ``dst`` lists the output shards the source's samples went
into, comma-separated. A summary goes to stderr (not with ``-q``), as does a live bar on a terminal or with
``--progress``. Exit status 0 when every shard was copied, 1 when any failed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from .common import positive, shard_urls

__all__ = ["add_arguments", "command"]


def _size(text: str) -> int:
    from ..node import parse_bytes

    try:
        return parse_bytes(text, "--maxsize")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="SRC", help="shard URLs, brace patterns and globs")
    parser.add_argument("dst", metavar="DST", help="a folder (ending in /), one object's name, or with --maxcount "
                        "or --maxsize a pattern with a %%-format for the shard number (out-%%06d.tar)")
    parser.add_argument("-c", "--concurrency", type=positive, default=8, metavar="N",
                        help="shards in flight (default 8)")
    parser.add_argument("--maxcount", type=positive, metavar="N", help="reshard: at most N samples per shard")
    parser.add_argument("--maxsize", type=_size, metavar="SIZE", help="reshard: start a new shard once one holds "
                        "SIZE bytes of samples (1GB, 512MiB)")
    parser.add_argument("--index", metavar="URL", help="also write the shard index of the shards written (a local "
                        "path or a store URL; .gz to compress)")
    parser.add_argument("--json", action="store_true", help="one JSON object per source shard and line: src, dst, "
                        "ok, samples, bytes, error, error_type")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    parser.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a "
                        "terminal")


def _local_folder(url: str) -> None:
    """Create the local folder a destination ``url`` (a file path or a folder ending in /) lies in."""
    from ..backends.file import local_path
    from ..errors import BackendError
    from ..urls import redact_url, scheme_of

    if scheme_of(url) == "file":
        folder = os.path.dirname(os.path.abspath(local_path(url) + ("x" if url.endswith("/") else "")))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create the folder {folder}: {exc.strerror or exc}; pick another "
                               "destination", url=redact_url(url)) from None


def _check_pattern(pattern: str) -> None:
    from ..errors import UrlError
    from ..urls import redact_url
    from ..write.dest import check_destination

    try:
        distinct = pattern % 0 != pattern % 1
    except (TypeError, ValueError):
        distinct = False
    if not distinct:
        raise UrlError("to reshard, the destination holds one %-format for the shard number, like "
                       "s3://bucket/out-%06d.tar", url=redact_url(pattern))
    check_destination(pattern % 0)


def command(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from .._loop import run_private
    from ..write.copy import CopyReport, copy_all, plan_copies
    from ..write.dest import check_destination
    from .console import ResultLines, live_progress

    reshard = args.maxcount is not None or args.maxsize is not None
    sources = shard_urls(args.urls)
    pairs: list[tuple[str, str]] = []
    if reshard:
        _check_pattern(args.dst)
    else:
        pairs = plan_copies(sources, args.dst)
    if args.index is not None:
        check_destination(args.index)
    for url in [args.dst if reshard else pairs[0][1], *([args.index] if args.index else [])]:
        _local_folder(url)
    bar = live_progress(TextColumn("resharding" if reshard else "copying"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("shards"), TextColumn("{task.fields[mb]:,.1f} MB  {task.fields[rate]:,.1f} MB/s"),
                        TimeElapsedColumn(), progress=args.progress, quiet=args.quiet)
    started, nbytes, failure = time.perf_counter(), 0, None
    with bar:
        task = bar.add_task("cp", total=len(sources), mb=0.0, rate=0.0)
        out = ResultLines(bar)

        def on_bytes(n: int) -> None:
            nonlocal nbytes
            nbytes += n
            bar.update(task, mb=nbytes / 1e6, rate=nbytes / 1e6 / max(time.perf_counter() - started, 1e-9))

        def emit(report: CopyReport) -> None:
            bar.advance(task)
            out(json.dumps(asdict(report)) if args.json else report.line())

        if reshard:
            reports, written, failure = _reshard(args, sources, on_bytes, emit)
        else:
            reports, entries = run_private(lambda: copy_all(pairs, args.concurrency, on_bytes=on_bytes, emit=emit))
            written = [r.dst for r in reports if r.ok]
            if args.index is not None:
                failure = _save_index(entries, args.index)
    seconds = time.perf_counter() - started
    failed = sum(not r.ok for r in reports)
    if failure is not None:
        print(f"wds-async cp: error: writing the {'index' if isinstance(failure, _IndexFailed) else 'shards'} "
              f"failed: {failure}", file=sys.stderr)
    if not args.quiet:
        what = f"resharded {len(reports)} shards into {len(written)}" if reshard else f"copied {len(reports)} shards"
        print(f"{what}: {len(reports) - failed} ok, {failed} failed; {sum(r.samples for r in reports)} samples, "
              f"{nbytes} bytes in {seconds:.2f} s ({nbytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s)", file=sys.stderr)
    return 1 if failed or failure is not None else 0


class _IndexFailed(Exception):
    """Writing the index of the shards copied failed (the shards themselves are in place)."""


def _save_index(entries: list[Any], url: str) -> Exception | None:
    """Write the index of the shards copied; the error, if that failed (then nothing was written there)."""
    import gzip

    from ..errors import WdsError
    from ..index.format import ShardIndex
    from ..write.sinks import put_bytes

    data = ShardIndex(entries).dumps()
    try:
        put_bytes(url, gzip.compress(data, mtime=0) if url.endswith(".gz") else data)
    except WdsError as exc:
        return _IndexFailed(str(exc))
    return None


def _reshard(args: argparse.Namespace, sources: list[str], on_bytes: Any, emit: Any) -> Any:
    from .._loop import run_private
    from ..write.reshard import reshard_all
    from ..write.writer import ShardWriter

    maxcount = args.maxcount if args.maxcount is not None else sys.maxsize
    maxsize = args.maxsize if args.maxsize is not None else float("inf")

    def make() -> ShardWriter:  # the ShardWriter writes the index too (a local path or a store URL)
        return ShardWriter(args.dst, maxcount=maxcount, maxsize=maxsize, verbose=0, index=args.index,
                           encoder=False, keep_meta=True)

    return run_private(lambda: reshard_all(sources, make, args.concurrency, on_bytes=on_bytes, emit=emit))
