"""``wds-async cache ls|du|clear [DIR]``: look into, size and empty a shard cache (see :mod:`wds_async.cache.disk`).

``DIR`` defaults to ``WDS_ASYNC_CACHE_DIR`` (then webdataset's ``WDS_CACHE``).

* ``ls``: one line per complete copy, most recently used first: size, last use (UTC), store identity
  (ETag or generation) and the shard's URL (secrets removed). ``--json``: JSON Lines with ``url``, ``file``,
  ``bytes``, ``last_used`` (Unix seconds), ``etag``, ``generation``.
* ``du``: copies and bytes, and the partial files (fills in progress, or left by a crash and never trusted).
  ``--json``: one object.
* ``clear``: removes every copy and every partial file no process is filling; fills in progress go on. Only
  names the cache makes (16 hex digits, a dot, a shard's name) are touched, so a wrong ``DIR`` loses nothing.

A directory the cache itself would refuse (another user's, writable by other users, or a link another user owns;
see "Security" in :mod:`wds_async.cache.disk`) is refused here too, naming it and what to do. Entries that are
not regular files of this user are neither listed nor counted; ``clear`` removes them (never what they point to).

Exit status 0; 2 when the directory is missing, is not a cache, or is refused (bad input).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["add_arguments", "command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    for name, text in (("ls", "list the complete copies, most recently used first"),
                       ("du", "total bytes of the copies and of partial files"),
                       ("clear", "remove every copy and every partial file no process is filling")):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("directory", nargs="?", help="the cache directory (default: $WDS_ASYNC_CACHE_DIR)")
        action.add_argument("--json", action="store_true", help="JSON output (JSON Lines for ls)")


def _directory(given: str | None) -> str:
    from ..errors import UrlError

    directory = given or os.environ.get("WDS_ASYNC_CACHE_DIR") or os.environ.get("WDS_CACHE")
    if not directory:
        raise UrlError("no cache directory: give DIR or set WDS_ASYNC_CACHE_DIR")
    if not os.path.isdir(directory):
        raise UrlError("no such cache directory (nothing was cached there yet?)", url=directory)
    return directory


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def command(args: argparse.Namespace) -> int:
    """Run ``cache ls|du|clear`` (see the module docstring)."""
    from ..cache.disk import ShardCache

    cache = ShardCache(_directory(args.directory))
    cache.check_directory()  # UnsafeCacheDirectory, a WdsError: one line, exit status 2
    out = sys.stdout
    if args.action == "ls":
        for entry in cache.entries():
            tag = entry.identity.generation or entry.identity.etag or ""
            if args.json:
                out.write(json.dumps({"url": entry.url, "file": entry.name, "bytes": entry.size,
                                      "last_used": round(entry.last_used, 3), "etag": entry.identity.etag,
                                      "generation": entry.identity.generation}) + "\n")
            else:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry.last_used))
                out.write(f"{entry.size:>12} {when} {tag:<36} {entry.url}\n")
    elif args.action == "du":
        usage = cache.usage()
        if args.json:
            out.write(json.dumps({"directory": cache.directory, **usage}) + "\n")
        else:
            out.write(f"{cache.directory}: {usage['copies']} copies, {_size(usage['bytes'])} "
                      f"({usage['bytes']} bytes); {usage['partial_files']} partial files, "
                      f"{_size(usage['partial_bytes'])}\n")
    else:
        files, freed = cache.clear()
        if args.json:
            out.write(json.dumps({"directory": cache.directory, "files_removed": files, "bytes_freed": freed}) + "\n")
        else:
            out.write(f"{cache.directory}: removed {files} files, {_size(freed)} freed\n")
    return 0
