"""``webdataset.cache``: the URL helpers of webdataset's download cache.

wds-async has its own shard cache (``WebDataset(urls, cache_dir=...)``): it fills while the engine
streams, checks the object's identity and never serves a partial file. webdataset's download-then-read cache
classes are therefore not provided; the small helpers are.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from urllib.parse import urlparse

from ._names import refusing

__all__ = ["check_tar_format", "default_cache_dir", "default_cache_size", "islocal", "magic_filetype",
           "pipe_cleaner", "url_to_cache_name", "verbose_cache"]

_OWN_CACHE = ("wds-async caches shards itself while streaming them (WebDataset(urls, cache_dir=...)); "
              "webdataset's download cache is not provided")
__getattr__ = refusing("webdataset.cache", {
    "FileCache": _OWN_CACHE,
    "StreamingOpen": _OWN_CACHE,
    "LRUCleanup": _OWN_CACHE + "; `wds-async cache` trims wds-async's cache to a size",
    "download": _OWN_CACHE,
    "get_filetype": "it shells out to the `file` command; use magic_filetype",
})

default_cache_dir = os.environ.get("WDS_CACHE", "./_cache")
default_cache_size = float(os.environ.get("WDS_CACHE_SIZE", "1e18"))
verbose_cache = int(os.environ.get("WDS_VERBOSE_CACHE", "0"))

_NAMED_SCHEMES = ("", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais")


def islocal(url: str) -> bool:
    """Whether ``url`` is a local path or ``file:`` URL."""
    return urlparse(url).scheme in ("", "file")


def magic_filetype(fname: str) -> str:
    """``"<fname>: gzip compressed data"``, ``"<fname>: POSIX tar archive"`` or ``"<fname>: data"`` from the
    file's first bytes."""
    with open(fname, "rb") as f:
        header = f.read(512)
    if header[:2] == b"\x1f\x8b":
        return f"{fname}: gzip compressed data"
    if header[257:262] == b"ustar":
        return f"{fname}: POSIX tar archive"
    return f"{fname}: data"


def check_tar_format(fname: str) -> bool:
    """Whether the file starts like a tar or a gzip file."""
    kind = magic_filetype(fname).lower()
    return "tar archive" in kind or "gzip compressed" in kind


def pipe_cleaner(spec: str) -> str:
    """The URL inside a ``pipe:`` command (its first ``http(s)``, ``hdfs``, ``gs``, ``ais`` or ``s3`` word), or
    ``spec`` itself."""
    if spec.startswith("pipe:"):
        for word in spec[5:].split(" "):
            if re.match(r"^(https?|hdfs|gs|ais|s3):", word):
                return word
    return spec


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """A cache file name for ``url``: its last ``ndir + 1`` path components for the usual schemes, else the URL
    quoted (its last 128 characters)."""
    parsed = urlparse(url)
    if parsed.scheme in _NAMED_SCHEMES:
        return "/".join(parsed.path.lstrip("/").split("/")[-1 - ndir:])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]
