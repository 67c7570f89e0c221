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

__all__ = ["Backend", "ByteStream", "ObjectIdentity", "REGISTRY", "backend_class", "supported_schemes"]

#: scheme -> ("module:Class", extra or None)
REGISTRY: dict[str, tuple[str, str | None]] = {
    "file": ("wds_async.backends.file:FileBackend", None),
    "pipe": ("wds_async.backends.pipe:PipeBackend", None),
    "http": ("wds_async.backends.http:HttpBackend", None),
    "https": ("wds_async.backends.http:HttpBackend", None),
}


def supported_schemes() -> list[str]:
    return sorted(REGISTRY)


def backend_class(scheme: str, url: str | None = None) -> type[Any]:
    """The backend class for ``scheme``; raises UrlError for unknown schemes, MissingDependency for
    schemes whose optional SDK is absent."""
    try:
        target, extra = REGISTRY[scheme]
    except KeyError:
        raise UrlError(
            f"unknown URL scheme {scheme!r}; supported: {', '.join(s + ':' for s in supported_schemes())} "
            "and bare local paths",
            url=url,
        ) from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'wds-async[{extra}]'" if extra else "reinstall wds-async"
        raise MissingDependency(f"the {scheme}:// backend needs {exc.name or 'a package'}: {hint}", url=url) from exc
    return getattr(module, class_name)  # type: ignore[no-any-return]
