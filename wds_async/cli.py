"""The ``wds-async`` command: ``bench``, ``index``, ``ls``, ``tune``, ``verify``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _cmd_ls(args: argparse.Namespace) -> int:
    """Expand braces and globs (through the stores' list APIs); with -l, also each object's size."""
    import asyncio

    from .config import EngineConfig
    from .engine import BackendSet
    from .listing import expand_globs
    from .urls import expand_urls

    urls = expand_globs(expand_urls(args.urls))
    if not args.long:
        for url in urls:
            print(url)
        return 0

    async def sizes() -> list[int | None]:
        backends = BackendSet(EngineConfig())
        try:
            return [await backends.for_url(u).size(u) for u in urls]
        finally:
            await backends.aclose()

    for url, size in zip(urls, asyncio.run(sizes())):
        print(f"{size if size is not None else '-':>14}  {url}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Read every shard completely; print samples per shard and any error."""
    from .dataset import WebDataset
    from .errors import WdsError
    from .urls import expand_urls

    failures = 0
    for url in expand_urls(args.urls):
        ds = WebDataset([url], nodesplitter=None, workersplitter=None)
        try:
            count = sum(1 for _ in ds)
        except WdsError as exc:
            failures += 1
            print(f"FAIL {url}: {exc}")
            continue
        print(f"ok   {url}: {count} samples, {ds.stats()['bytes_read']} bytes")
    return 1 if failures else 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _cmd_index(args: argparse.Namespace) -> int:
    """Stream the shards once and write their index (see wds_async.index); a live bar on a terminal."""
    import os
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ._console import progress_console
    from .backends.file import local_path
    from .errors import UrlError
    from .indexer import build_index
    from .urls import scheme_of

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


def main(argv: Sequence[str] | None = None) -> int:
    from . import _tune_cli, bench

    parser = argparse.ArgumentParser(prog="wds-async", description="Stream WebDataset shards at network speed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine progress")
    sub = parser.add_subparsers(dest="command", required=True)
    p_bench = sub.add_parser("bench", help="loader throughput beside raw parallel download of the same shards")
    bench.add_arguments(p_bench)
    p_bench.set_defaults(func=bench.command)
    p_ls = sub.add_parser("ls", help="print the shard URLs that patterns and globs expand to")
    p_ls.add_argument("-l", "--long", action="store_true", help="also print each object's size")
    p_ls.add_argument("urls", nargs="+")
    p_ls.set_defaults(func=_cmd_ls)
    p_verify = sub.add_parser("verify", help="read shards completely and report samples or errors")
    p_verify.add_argument("urls", nargs="+")
    p_verify.set_defaults(func=_cmd_verify)
    p_index = sub.add_parser("index", help="stream shards once and write their index (keys and byte ranges)")
    p_index.add_argument("urls", nargs="+")
    p_index.add_argument("-o", "--output", required=True, help="the index file to write (a local path; .gz "
                         "to compress)")
    p_index.add_argument("-c", "--max-connections", type=_positive, default=16, help="shards in flight (default 16)")
    p_index.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")
    p_index.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is "
                         "not a terminal")
    p_index.set_defaults(func=_cmd_index)
    p_tune = sub.add_parser("tune", help="sweep concurrency against a store from this node; recommend the node's "
                            "connections and buffers")
    _tune_cli.add_arguments(p_tune)
    p_tune.set_defaults(func=_tune_cli.command)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    from .errors import WdsError

    try:
        return int(args.func(args))
    except WdsError as exc:
        print(f"wds-async: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
