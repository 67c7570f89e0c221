"""The shape of one shard URL, checked per built-in scheme before anything is read.

:class:`~wds_async.WebDataset` (and the CLI, bench and the indexer) check every URL they were given (after
``${NAME}`` and brace expansion) at construction, through :func:`wds_async.io.validate_url`, which asks
the registry whether the scheme is known and then calls :func:`check_url`. A malformed URL is then a
:class:`~wds_async.errors.UrlError` that names the URL and the fix there, rather than a failure in a worker at
the first batch. It is string work only:
no I/O, no backend import. Schemes this module does not know pass unchecked.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import UrlError
from ..urls import redact_text, redact_url, scheme_of

__all__ = ["check_url"]

#: Built-in schemes whose URLs name an object in a bucket (container): ``SCHEME://BUCKET/KEY``.
_STORES = {"s3": "bucket", "gs": "bucket", "az": "container", "azure": "container"}
#: What a well-formed URL of each checked network scheme looks like, for the error messages.
_EXAMPLES = {scheme: f"{scheme}://{what}/path/shard-{{000..009}}.tar" for scheme, what in _STORES.items()} | {
    "http": "http://host/path/shard-{000..009}.tar", "https": "https://host/path/shard-{000..009}.tar"}


def check_url(url: str, *, allow_pipe: bool = True) -> None:
    """Raise :class:`UrlError`, naming the (redacted) URL and the fix, unless ``url`` is well formed for its
    built-in scheme: a command after ``pipe:`` (and pipes allowed), a local file for ``file://``, a host for
    http(s), a bucket and an object key for ``s3://``, ``gs://``, ``az://``. Pure string work, no I/O;
    other schemes are left to the backend registry."""
    scheme = scheme_of(url)
    if scheme == "pipe":
        if not url[len("pipe:"):].strip():
            raise UrlError("a pipe: URL needs a command after 'pipe:', as in 'pipe:curl -s https://host/a.tar'",
                           url=redact_url(url))
        if not allow_pipe:
            raise UrlError("pipe: URLs are disabled (allow_pipe=False, or WDS_ASYNC_NO_PIPE is set): pass "
                           "allow_pipe=True to run the command, or name the shards by path or store URL",
                           url=redact_url(url))
    elif scheme == "file":
        _check_file(url)
    elif scheme in _EXAMPLES:
        rest = url[len(scheme):]
        if not rest.startswith("://"):
            raise UrlError(f"write {scheme} URLs with two slashes after '{scheme}:', as in {_EXAMPLES[scheme]}",
                           url=redact_text(url))  # not parsable as a URL: mask secret parameters in the text
        if scheme in _STORES:
            _check_store(url, scheme, rest[3:])
        else:
            _check_host(url)


def _check_store(url: str, scheme: str, rest: str) -> None:
    bucket, _, key = rest.partition("/")
    what = _STORES[scheme]
    if not bucket:
        raise UrlError(f"the {scheme}:// URL names no {what}: write {_EXAMPLES[scheme]}", url=redact_url(url))
    if not key.lstrip("/"):
        raise UrlError(f"the {scheme}:// URL names a {what} but no object in it: write "
                       f"{scheme}://{bucket}/path/shard-{{000..009}}.tar, or a glob such as {scheme}://{bucket}/*.tar",
                       url=redact_url(url))


def _check_host(url: str) -> None:
    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    if not host:
        raise UrlError(f"the URL names no host (or an unparsable one): write {_EXAMPLES[scheme_of(url)]}",
                       url=redact_url(url))


def _check_file(url: str) -> None:
    if url.startswith("file://"):
        try:
            host, path = urlsplit(url).netloc, url[len("file://"):].partition("/")[2]
        except ValueError:
            host, path = "?", ""
        if host not in ("", "localhost"):
            raise UrlError(f"file:// URLs name local files only, not files on host {host!r}: write "
                           "file:///path/shard.tar (three slashes) or a bare path", url=redact_url(url))
    else:
        path = url.removeprefix("file:")
    if not path.strip():
        raise UrlError("the URL names no file: write a path such as /data/shard-{000..009}.tar", url=redact_url(url))
