"""``wds-async verify``: read every shard completely, through the loader's reader, tar parser and grouping
rules, and report each shard's samples and bytes or its error.

Globs and brace patterns are expanded first, so each shard gets its own line, in shard order, printed as
soon as it and every shard before it are done. Up to ``--max-connections`` shards are read at once; a
failing shard never stops the others.

Text: ``ok   URL: N samples, B bytes`` or ``FAIL URL: error``. ``--json``: one JSON object per line
(JSON Lines), keys ``url``, ``ok``, ``samples``, ``bytes`` (read before a failure, for a failing shard),
``error`` and ``error_type`` (null when ok). A summary goes to stderr (not with ``-q``), as does a live
bar on a terminal or with ``--progress``. Exit status 0 when every shard is whole, 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..engine.shard import shard_samples
from ..io import BackendSet
from .common import positive, shard_urls

__all__ = ["ShardReport", "add_arguments", "command"]


@dataclass
class ShardReport:
    """One line of ``verify``: what reading ``url`` to its end gave."""

    url: str
    ok: bool = True
    samples: int = 0
    bytes: int = 0
    error: str | None = None
    error_type: str | None = None

    def line(self) -> str:
        if self.ok:
            return f"ok   {self.url}: {self.samples} samples, {self.bytes} bytes"
        return f"FAIL {self.url}: {self.error}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", help="shard URLs, brace patterns and globs")
    parser.add_argument("-c", "--max-connections", type=positive, default=8, help="shards read at once (default 8)")
    parser.add_argument("--json", action="store_true", help="one JSON object per shard and line: url, ok, samples, "
                        "bytes, error, error_type")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    parser.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a "
                        "terminal")


def command(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from .._loop import run_private
    from .console import ResultLines, live_progress

    bar = live_progress(TextColumn("verifying"), BarColumn(), MofNCompleteColumn(), TextColumn("shards"),
                        TextColumn("{task.fields[mb]:,.1f} MB"), TimeElapsedColumn(), progress=args.progress,
                        quiet=args.quiet)
    with bar:
        urls = shard_urls(args.urls)
        task = bar.add_task("verify", total=len(urls), mb=0.0)
        out = ResultLines(bar)
        nbytes = 0

        def on_bytes(n: int) -> None:
            nonlocal nbytes
            nbytes += n
            bar.update(task, mb=nbytes / 1e6)

        def emit(report: ShardReport) -> None:
            bar.advance(task)
            out(json.dumps(asdict(report)) if args.json else report.line())

        reports = run_private(lambda: _verify_all(urls, args.max_connections, on_bytes, emit))
    failed = sum(not r.ok for r in reports)
    if not args.quiet:
        print(f"verified {len(reports)} shards: {len(reports) - failed} ok, {failed} failed; "
              f"{sum(r.samples for r in reports)} samples, {sum(r.bytes for r in reports)} bytes", file=sys.stderr)
    return 1 if failed else 0


async def _verify_one(backends: BackendSet, url: str, on_bytes: Callable[[int], None]) -> ShardReport:
    from contextlib import aclosing

    from ..errors import WdsError
    from ..urls import redact_text

    report = ShardReport(redact_text(url))  # as text: a pipe: command's URLs are scrubbed too

    def count(n: int) -> None:
        report.bytes += n
        on_bytes(n)

    try:
        async with aclosing(shard_samples(backends.for_url(url), url, on_bytes=count)) as batches:
            async for batch in batches:
                report.samples += len(batch)
    except WdsError as exc:
        report.ok, report.error, report.error_type = False, str(exc), type(exc).__name__
    return report


async def _verify_all(urls: list[str], connections: int, on_bytes: Callable[[int], None],
                      emit: Callable[[ShardReport], None]) -> list[ShardReport]:
    """Verify ``urls`` with ``connections`` readers; ``emit`` each report in shard order as soon as it can."""
    from asyncio import TaskGroup

    from ..config import EngineConfig


    reports: list[ShardReport | None] = [None] * len(urls)
    todo = iter(enumerate(urls))  # shared by the readers, so shards open in list order
    emitted = 0
    backends = BackendSet(EngineConfig(max_connections=connections))

    async def reader() -> None:
        nonlocal emitted
        for i, url in todo:
            reports[i] = await _verify_one(backends, url, on_bytes)
            while emitted < len(reports) and (ready := reports[emitted]) is not None:
                emit(ready)
                emitted += 1

    try:
        async with TaskGroup() as group:
            for _ in range(min(connections, len(urls))):
                group.create_task(reader())
    finally:
        await backends.aclose()
    return [r for r in reports if r is not None]
