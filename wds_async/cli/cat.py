"""``wds-async cat URL``: what one shard holds, member by member or sample by sample, as it streams.

* default, the members: ``OFFSET SIZE NAME`` per line (offset of the member's first tar header, data
  size in bytes), ``--json``: ``{"name", "size", "offset"}`` per line;
* ``--samples``, the samples (webdataset's grouping rules): ``OFFSET KEY ext=size ext=size ...``,
  ``--json``: ``{"key", "offset", "fields": {ext: size}}``;
* ``--keys K1,K2`` (implies ``--samples``) also prints those fields' contents: UTF-8 text as text, other
  bytes as ``<N bytes: first bytes in hex ...>``; in JSON a ``"content"`` object maps each field to its
  text, ``{"bytes": N, "head": hex}``, or null where the sample lacks it. With ``--raw`` the contents are
  written as they are, back to back and nothing else (``-n 1 --keys jpg --raw > a.jpg``); with ``--raw
  --json`` binary contents are ``{"bytes": N, "base64": ...}``.

``-n N`` stops after N members (or samples) and closes the stream. A shard that turns out damaged ends
the listing with an error naming the URL and offset, exit status 1 (2 for URLs that cannot be read).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from ..engine.shard import MemberList, shard_samples
from .common import positive, shard_urls

__all__ = ["add_arguments", "command", "is_text"]

_HEAD = 16  # bytes of a binary field shown in hex
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # control bytes other than tab, newline, return


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="one shard (a pattern or glob must name exactly one)")
    parser.add_argument("--samples", action="store_true", help="one line per sample: key and field sizes")
    parser.add_argument("--keys", metavar="K1,K2", help="print these fields' contents (implies --samples)")
    parser.add_argument("--raw", action="store_true", help="with --keys: write the contents as they are")
    parser.add_argument("--json", action="store_true", help="one JSON object per member or sample and line")
    parser.add_argument("-n", "--limit", type=positive, default=None, metavar="N",
                        help="stop after N members or samples")


def is_text(data: bytes) -> bool:
    """True for UTF-8 without control characters other than tab, newline and carriage return."""
    if _CONTROL.search(data):
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _summary(data: bytes) -> str:
    more = " ..." if len(data) > _HEAD else ""
    return f"<{len(data)} bytes: {data[:_HEAD].hex(' ')}{more}>"


def _json_content(data: bytes | None, raw: bool) -> Any:
    if data is None:
        return None
    if is_text(data):
        return data.decode("utf-8")
    if raw:
        return {"bytes": len(data), "base64": base64.b64encode(data).decode("ascii")}
    return {"bytes": len(data), "head": data[:_HEAD].hex()}


def _field_lines(k: str, data: bytes | None) -> list[str]:
    if data is None:
        return [f"    {k}: (none)"]
    if not is_text(data):
        return [f"    {k}: {_summary(data)}"]
    lines = data.decode("utf-8").splitlines() or [""]
    if len(lines) == 1:
        return [f"    {k}: {lines[0]}"]
    return [f"    {k}:", *(f"      {text}" for text in lines)]  # several lines: indented under the name


def _printer(args: argparse.Namespace, keys: list[str], write: Callable[[str], None]) -> Callable[[Any], None]:
    """What to do with each member (the default) or sample (``--samples``, ``--keys``)."""
    if not (keys or args.samples):
        if args.json:
            return lambda m: write(json.dumps({"name": m.name, "size": len(m.data), "offset": m.offset}))
        return lambda m: write(f"{m.offset:>12} {len(m.data):>12}  {m.name}")
    if args.raw and not args.json:
        def write_raw(sample: Any) -> None:
            for k in keys:
                if k in sample:
                    sys.stdout.buffer.write(sample[k])

        return write_raw

    def show(sample: Any) -> None:
        fields = {k: len(v) for k, v in sample.items() if not k.startswith("__")}
        if args.json:
            record: dict[str, Any] = {"key": sample["__key__"], "offset": sample.offset, "fields": fields}
            if keys:
                record["content"] = {k: _json_content(sample.get(k), args.raw) for k in keys}
            write(json.dumps(record))
            return
        write(f"{sample.offset:>12}  {sample['__key__']}  " + " ".join(f"{k}={n}" for k, n in fields.items()))
        for k in keys:
            for line in _field_lines(k, sample.get(k)):
                write(line)

    return show


def command(args: argparse.Namespace) -> int:
    from .._loop import run_private
    from ..errors import ShardFormatError, UrlError
    from ..urls import redact_url

    keys = [k.strip().lower() for k in args.keys.split(",") if k.strip()] if args.keys else []
    if args.raw and not keys:
        print("wds-async cat: error: --raw needs --keys (the fields to write)", file=sys.stderr)
        return 2
    urls = shard_urls([args.url])
    if len(urls) != 1:
        raise UrlError(f"cat reads one shard, and this names {len(urls)}; pick one (wds-async ls lists them)",
                       url=redact_url(args.url))
    def write(line: str) -> None:
        sys.stdout.write(line + "\n")

    show = _printer(args, keys, write)
    members = not (keys or args.samples)
    try:
        run_private(lambda: _stream(urls[0], members, show, args.limit))
    except ShardFormatError as exc:
        sys.stdout.flush()
        print(f"wds-async cat: error: {exc}; the shard is damaged or not a tar: re-create or re-upload it "
              "(wds-async verify checks many shards)", file=sys.stderr)
        return 1
    finally:
        sys.stdout.flush()
    return 0


async def _stream(url: str, members: bool, show: Callable[[Any], None], limit: int | None) -> None:
    from contextlib import aclosing

    from ..config import EngineConfig
    from ..io import BackendSet

    backends = BackendSet(EngineConfig(max_connections=1))
    shown = 0
    try:
        async with aclosing(shard_samples(backends.for_url(url), url, grouper=MemberList() if members else None)) as batches:
            async for batch in batches:
                for item in batch:
                    show(item)
                    shown += 1
                    if limit is not None and shown >= limit:
                        return
    finally:
        await backends.aclose()
