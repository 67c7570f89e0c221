"""The ``wds-async`` command: ``bench``, ``cache``, ``cat``, ``cp``, ``index``, ``ls``, ``serve``, ``tune``, ``verify``.

Each subcommand lives in a module of its own (``_cli_ls``, ``_cli_cache``, ``_cli_cat``, ``_cli_cp``,
``_cli_verify``, ``_cli_index``, ``_cli_serve``, ``_bench_cli``, ``_tune_cli``) with ``add_arguments(parser)`` and
``command(args) -> exit status``. Here they are wired up, and bad input is turned into one line: a
:class:`~wds_async.errors.WdsError` (also one inside an exception group) prints ``wds-async: error: ...``
naming the URL, exit status 2; any other exception prints its traceback, scrubbed of credentials like every
log line (:func:`~wds_async.urls.redact_text`), exit status 1. Ctrl-C exits with 130, and a closed stdout
(``wds-async cat URL | head``) ends the command quietly.

Commands that print results (``ls``, ``verify``, ``cat``, ``cp``) take ``--json``: one JSON object per line (JSON
Lines) with the keys their module docstrings list. Live progress goes to stderr only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from . import cache as _cli_cache
    from . import cat as _cli_cat
    from . import cp as _cli_cp
    from . import index as _cli_index
    from . import ls as _cli_ls
    from . import serve as _cli_serve
    from . import verify as _cli_verify
    from .bench import command as _bench_cli
    from .tune import command as _tune_cli

    parser = argparse.ArgumentParser(prog="wds-async", description="Stream WebDataset shards at network speed.",
                                     epilog="Units: MB and GB are 10**6 and 10**9 bytes, KiB, MiB and GiB 2**10, 2**20 "
                                            "and 2**30, in the output and in options that take a size (4MiB, 512MB).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine progress")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = [
        ("bench", _bench_cli, "loader throughput beside raw parallel download of the same shards"),
        ("cache", _cli_cache, "list, size or empty a shard cache directory (ls, du, clear)"),
        ("cat", _cli_cat, "list one shard's members, or its samples and their fields"),
        ("cp", _cli_cp, "copy shards between stores (or reshard them), verifying each as it passes"),
        ("index", _cli_index, "stream shards once and write their index (keys and byte ranges)"),
        ("ls", _cli_ls, "print the shard URLs that patterns and globs expand to"),
        ("serve", _cli_serve, "one loader service for every rank and worker of this node (Unix socket)"),
        ("tune", _tune_cli, "sweep concurrency against a store from this node; recommend its settings"),
        ("verify", _cli_verify, "read shards completely and report samples or errors"),
    ]
    for name, module, text in commands:
        command = sub.add_parser(name, help=text, description=module.__doc__.split("\n\n")[0] if module.__doc__
                                 else text)
        module.add_arguments(command)
        command.set_defaults(func=module.command)
    return parser


class _ScrubbingFormatter(logging.Formatter):
    """Log lines (with their tracebacks) through the credential scrubber: what the command logs never shows a
    password or a signature, whoever logged it."""

    def format(self, record: logging.LogRecord) -> str:
        from ..urls import redact_text

        return redact_text(super().format(record))


def _print_traceback(exc: BaseException) -> None:
    """Python's traceback of ``exc``, scrubbed: an unexpected error still says where it came from (for a bug
    report), and the URLs in its messages and in the frames' source lines carry no credentials."""
    import traceback

    from ..urls import redact_text

    print(redact_text("".join(traceback.format_exception(exc))), end="", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = logging.StreamHandler()  # stderr, as basicConfig's own
    handler.setFormatter(_ScrubbingFormatter("%(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    from .common import wds_error

    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("wds-async: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, and keep the exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as exc:
        error = wds_error(exc)
        if error is None:
            if not isinstance(exc, Exception):
                raise  # SystemExit, GeneratorExit: not errors to report
            _print_traceback(exc)  # what Python would print, less the credentials, and its exit status
            return 1
        print(f"wds-async: error: {error}", file=sys.stderr)  # a WdsError scrubs its own message and url
        return 2


if __name__ == "__main__":
    sys.exit(main())
