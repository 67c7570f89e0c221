"""Backends, one module per URL scheme, loaded lazily by name.

The registry maps a scheme to ``"module:Class"`` and the extra that provides its SDK, so that
``import wds_async`` stays light and a missing SDK produces an install hint instead of an ImportError
deep in a worker.
"""

from __future__ import annotations

import importlib
from typing import Any

from wds_async.errors import MissingDependency, UrlError

from .base import Backend, ByteStream, ObjectIdentity

__all__ = ["Backend", "ByteStream", "ObjectIdentity", "REGISTRY", "backend_class", "backend_key", "supported_schemes",
           "validate_url"]

#: scheme -> ("module:Class", extra or None)
REGISTRY: dict[str, tuple[str, str | None]] = {
    "file": ("wds_async.backends.file:FileBackend", None),
    "pipe": ("wds_async.backends.pipe:PipeBackend", None),
    "http": ("wds_async.backends.http:HttpBackend", None),
    "https": ("wds_async.backends.http:HttpBackend", None),
    "s3": ("wds_async.backends.s3:S3Backend", "s3"),
    "gs": ("wds_async.backends.gcs:GcsBackend", "gcs"),
    "az": ("wds_async.backends.azure:AzureBackend", "azure"),
    # https://ACCOUNT.blob.core.windows.net/... URLs are routed here by backend_key().
    "azure": ("wds_async.backends.azure:AzureBackend", "azure"),
}

_AZURE_HOST_SUFFIXES = (".blob.core.windows.net",)


def backend_key(url: str) -> str:
    """The registry key serving ``url``: its scheme, except that Azure Blob https URLs go to Azure."""
    from urllib.parse import urlsplit

    from wds_async.urls import scheme_of

    scheme = scheme_of(url)
    if scheme == "https":
        host = (urlsplit(url).hostname or "").lower()
        if host.endswith(_AZURE_HOST_SUFFIXES):
            return "azure"
    return scheme


def supported_schemes() -> list[str]:
    return sorted(k for k in REGISTRY if k != "azure")


def _unknown_scheme(scheme: str, url: str | None) -> UrlError:
    return UrlError(
        f"unknown URL scheme {scheme!r}; supported: {', '.join(s + ':' for s in supported_schemes())} "
        "and bare local paths",
        url=url,
    )


def validate_url(url: str) -> None:
    """Check a URL's shape without importing any backend: a known scheme, a host for http(s), a command
    for ``pipe:``. Raises :class:`UrlError` naming the (redacted) URL."""
    from wds_async.urls import redact_url

    from .base import check_http_url
    from .pipe import pipe_command

    key = backend_key(url)
    if key not in REGISTRY:
        raise _unknown_scheme(key, redact_url(url))
    if key in ("http", "https"):
        check_http_url(url)
    elif key == "pipe":
        pipe_command(url)


def backend_class(scheme: str, url: str | None = None) -> type[Any]:
    """The backend class for ``scheme``; raises UrlError for unknown schemes, MissingDependency for
    schemes whose optional SDK is absent."""
    try:
        target, extra = REGISTRY[scheme]
    except KeyError:
        raise _unknown_scheme(scheme, url) from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'wds-async[{extra}]'" if extra else "reinstall wds-async"
        raise MissingDependency(f"the {scheme}:// backend needs {exc.name or 'a package'}: {hint}", url=url) from exc
    return getattr(module, class_name)  # type: ignore[no-any-return]
