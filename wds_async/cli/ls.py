"""``wds-async ls``: the shard URLs that patterns and globs name, optionally with each object's size.

Text: one URL per line; with ``-l``, the size in bytes right-aligned, two spaces, then the URL.
``--json``: one JSON object per line (JSON Lines), ``{"url": ...}``, with ``-l`` also ``"size"`` (bytes,
or null where the store reports none). Sizes are asked up to :data:`SIZE_CONCURRENCY` at a time; a live
bar on stderr counts them (see :mod:`wds_async.cli.console`). Output is printed once everything is known.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from .common import shard_urls

__all__ = ["SIZE_CONCURRENCY", "add_arguments", "command"]

#: Size requests (HEAD, stat) in flight at once for ``ls -l``.
SIZE_CONCURRENCY = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", help="shard URLs, brace patterns ({000..099}) and globs of listable "
                        "stores (s3, gs, az, local paths)")
    parser.add_argument("-l", "--long", action="store_true", help="also print each object's size in bytes")
    parser.add_argument("--json", action="store_true", help='one JSON object per line: {"url"} (with -l also '
                        '"size")')
    parser.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a "
                        "terminal")


def command(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .._loop import run_private
    from .console import live_progress

    bar = live_progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), progress=args.progress)
    with bar:
        task = bar.add_task("listing", total=None)
        urls = shard_urls(args.urls)
        sizes: list[int | None] | None = None
        if args.long:
            bar.update(task, description="sizes", total=len(urls))
            sizes = run_private(lambda: _sizes(urls, lambda: bar.advance(task)))
    for i, url in enumerate(urls):
        if args.json:
            print(json.dumps({"url": url} if sizes is None else {"url": url, "size": sizes[i]}))
        elif sizes is None:
            print(url)
        else:
            size = sizes[i]
            print(f"{size if size is not None else '-':>14}  {url}")
    return 0


async def _sizes(urls: list[str], tick: Callable[[], None]) -> list[int | None]:
    from asyncio import TaskGroup

    from ..config import EngineConfig
    from ..io import BackendSet

    sizes: list[int | None] = [None] * len(urls)
    todo = iter(enumerate(urls))
    backends = BackendSet(EngineConfig(max_connections=SIZE_CONCURRENCY))

    async def worker() -> None:
        for i, url in todo:
            sizes[i] = await backends.for_url(url).size(url)
            tick()

    try:
        async with TaskGroup() as group:
            for _ in range(min(SIZE_CONCURRENCY, len(urls))):
                group.create_task(worker())
    finally:
        await backends.aclose()
    return sizes
