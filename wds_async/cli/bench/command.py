"""The ``wds-async bench`` command: its arguments, the live status line, the table (see :mod:`wds_async.cli.bench.run`).

Every input is checked before the first phase starts (options, then each URL through
:func:`wds_async.cli.common.shard_urls`): bad input is one line on stderr and exit status 2, as for the
other commands, never a phase's traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..common import positive

__all__ = ["add_arguments", "command"]


def _budget(text: str) -> int:
    """``--max-buffered-bytes``: the engine's floor (1 KiB) is checked here, not in a phase's child process."""
    from ...config import check_size

    try:
        return check_size("max_buffered_bytes", positive(text), shown="--max-buffered-bytes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", help="shard URLs or brace patterns")
    parser.add_argument("-c", "--connections", type=positive, default=16, help="concurrent downloads (both phases)")
    parser.add_argument("--vs-webdataset", action="store_true", help="add the webdataset package's numbers")
    parser.add_argument("--max-buffered-bytes", type=_budget, default=None, help="loader byte budget")
    parser.add_argument("--faults", metavar="QUERY", help="extra loader run with this query appended to every URL "
                        "(emulated store knobs, e.g. 'drop_rate=0.05&fail_rate=0.05')")
    parser.add_argument("--workers", type=positive, default=0, metavar="N",
                        help="add a loader phase through DataLoader(num_workers=N), the connections shared out "
                             "among the workers (needs torch)")
    parser.add_argument("--no-auto", dest="autotune", action="store_false",
                        help="skip the loader phase with max_connections='auto'")
    parser.add_argument("--peers", metavar="NAMES", help="also run these tools on the same shards, each with "
                        "its own client: any of s5cmd,gsutil,boto3,webdataset,s3torchconnector,mosaic,litdata "
                        "(or 'all'); the shard URLs must then be s3://")
    parser.add_argument("--endpoint", metavar="URL", help="the S3-compatible store's base URL (sets "
                        "AWS_ENDPOINT_URL_S3 for every phase; the emulated store also serves GCS there)")
    parser.add_argument("--ca-file", metavar="PEM", help="the CA certificate an https endpoint is signed with "
                        "(every client is told to trust it)")
    parser.add_argument("--plot", metavar="FILE.png", help="with --peers: a bar chart of the table")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--progress", action="store_true", help="show the live status line even when stderr "
                        "is not a terminal")


def command(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..common import shard_urls
    from ..console import progress_console
    from .run import format_table, run_bench

    problem = _check_options(args)
    if problem:
        print(f"wds-async bench: error: {problem}", file=sys.stderr)
        return 2
    urls = shard_urls(args.urls)  # every URL checked and globs listed before any phase starts
    _check_local_files(urls)
    peers: list[str] = []
    if args.peers:
        from .peers import peer_names
        from .peers._run import store_urls

        try:
            peers = peer_names(args.peers)
            store_urls(urls, args.endpoint)  # checks the URLs before any phase starts
        except ValueError as exc:
            print(f"wds-async bench: error: {exc}", file=sys.stderr)
            return 2
    if args.endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint  # our phases' subprocesses inherit it
    if args.ca_file:
        os.environ["SSL_CERT_FILE"] = os.path.abspath(args.ca_file)
    print(f"bench: {len(urls)} shards, {args.connections} connections", flush=True)
    console, shown = progress_console(args.progress)
    line = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    TextColumn("{task.fields[so_far]}"), console=console, transient=True, disable=not shown)
    task = line.add_task("starting", so_far="")
    current = ""

    def status(name: str, elapsed: float, mb_s: float | None, samples: int | None) -> None:
        nonlocal current
        if name != current:  # a new phase: restart the elapsed clock, and draw it now, however short it is
            current = name
            line.reset(task, description=name, so_far="")
            line.refresh()
        so_far = [f"{mb_s:,.1f} MB/s"] if mb_s is not None else []
        so_far += [f"{samples:,} samples"] if samples is not None else []
        line.update(task, so_far="  ".join(so_far))

    with line:
        def peer_status(name: str, elapsed: float) -> None:
            status(name, elapsed, None, None)

        rows = run_bench(urls, connections=args.connections, vs_webdataset=args.vs_webdataset,
                         max_buffered_bytes=args.max_buffered_bytes, faults=args.faults,
                         status=status if shown else None, autotune=args.autotune, peers=peers,
                         endpoint=args.endpoint, ca_file=os.path.abspath(args.ca_file) if args.ca_file else None,
                         peer_status=peer_status if shown else None, workers=args.workers)
    if peers:
        from .peers._report import format_peers_table, plot_peers

        print(format_peers_table(rows, args.connections))
        if args.plot:
            plot_peers(rows, args.plot, f"{len(urls)} shards, {args.connections} connections")
            print(f"plot: {args.plot}")
    else:
        print(format_table(rows))
    if args.json:
        try:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=2)
        except OSError as exc:
            print(f"wds-async bench: error: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0


def _check_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, before any URL is looked at; None when nothing."""
    if args.workers:
        from ...data._torch import HAVE_TORCH

        if not HAVE_TORCH:
            return "--workers runs a torch DataLoader, and torch is not installed: pip install 'wds-async[torch]'"
    if args.ca_file and not os.path.isfile(args.ca_file):
        return f"--ca-file {args.ca_file}: no such file"
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            return f"{option} {path}: no directory {os.path.dirname(os.path.abspath(path))} to write it in"
    return None


def _check_local_files(urls: list[str]) -> None:
    """A missing local shard is reported now, not after a phase's interpreter has started."""
    from ...backends.file import local_path
    from ...errors import NotFound
    from ...io import backend_key

    for url in urls:
        if backend_key(url) == "file" and not os.path.isfile(local_path(url)):
            raise NotFound("no such file; check the path and the brace pattern", url=url)
