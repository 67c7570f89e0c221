"""The I/O layer: the backend contract, the registry that loads backends by scheme, and the readers on top.

Backends themselves (one module per URL scheme) live in :mod:`wds_async.backends`, loaded lazily by name.

The registry (:mod:`.registry`) maps a scheme to ``"module:Class"`` and the extra that provides its SDK,
so that ``import wds_async`` stays light and a missing SDK produces an install hint instead of an
ImportError deep in a worker; :func:`register_backend` adds custom stores, :func:`scheme_options` checks
``backend_options`` per scheme, and :class:`BackendSet` holds the instances one event loop uses.
"""

from __future__ import annotations

from .backend import Backend, ByteStream, Capabilities, ObjectIdentity, capabilities_of
from .registry import (
           REGISTRY,
           BackendSet,
           accepted_options,
           backend_class,
           backend_key,
           import_backends,
           register_backend,
           scheme_options,
           supported_schemes,
           validate_url,
)

__all__ = ["REGISTRY", "Backend", "BackendSet", "ByteStream", "Capabilities", "ObjectIdentity", "capabilities_of", "accepted_options", "backend_class",
           "backend_key", "import_backends", "register_backend", "scheme_options", "supported_schemes", "validate_url"]
