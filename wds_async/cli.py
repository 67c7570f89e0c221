"""The ``wds-async`` command: ``bench``, ``ls``, ``verify``."""

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


def main(argv: Sequence[str] | None = None) -> int:
    from . import bench

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
