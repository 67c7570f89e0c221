"""Which backend serves a URL: the scheme registry, custom backends, per-scheme options, instances.

* :data:`REGISTRY` maps a scheme to ``"module:Class"`` and the extra that provides its SDK; a module is
  imported on first use, so ``import wds_async`` stays light and a missing SDK is an install hint, not an
  ImportError deep in a worker. :func:`register_backend` adds a custom store (or replaces a built-in one).
* ``backend_options`` come per scheme, ``{"s3": {...}, "gs": {...}}``, or flat, ``{"endpoint_url": ...}``,
  when every URL uses one backend. :func:`scheme_options` turns either into the per-scheme form and checks
  every option against the constructor of the backend that will receive it: an option no backend
  accepts is a :class:`~wds_async.errors.UrlError` naming it, the scheme and what that backend accepts.
* :class:`BackendSet` creates one backend per scheme (per distinct options) on first use inside the
  running event loop, hands it to whoever asks for a URL, and closes them all together.

The engine's settings (``max_connections``, ``connect_timeout``, ``read_timeout``, ``chunk_bytes``) come
from the :class:`~wds_async.config.EngineConfig` and are passed to each backend whose constructor takes
them; they are not backend options.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from wds_async.errors import MissingDependency, UrlError
from wds_async.io.backend import Backend
from wds_async.urls import redact_url, scheme_of

if TYPE_CHECKING:
    from wds_async.config import EngineConfig

__all__ = ["REGISTRY", "BackendSet", "accepted_options", "backend_class", "backend_key", "import_backends",
           "register_backend", "scheme_options", "supported_schemes", "validate_url"]

log = logging.getLogger("wds_async")

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

#: Backends registered at run time: scheme -> class or factory. Looked up before REGISTRY.
_CUSTOM: dict[str, Callable[..., Backend]] = {}

#: Settings every backend may take from the engine's config; never backend options.
ENGINE_SETTINGS = ("max_connections", "connect_timeout", "read_timeout", "chunk_bytes")

#: Schemes whose options may be written under either name (they share a backend class).
_ALIASES = {"http": "https", "https": "http", "az": "azure", "azure": "az"}

_AZURE_HOST_SUFFIXES = (".blob.core.windows.net",)
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*\Z")


def backend_key(url: str) -> str:
    """The registry key serving ``url``: its scheme, except that Azure Blob https URLs go to Azure.

    Called several times per URL while a dataset is built (checks, options, listing, imports), so it reads
    the host by slicing, not ``urlsplit``: only whether it ends with an Azure suffix matters here (and once per
    request, through :meth:`BackendSet.for_url`, so its import sits at the top)."""
    scheme = scheme_of(url)
    if scheme == "https" and "https" not in _CUSTOM:
        netloc = url[len("https://"):].partition("/")[0].partition("?")[0].partition("#")[0]
        host = netloc.rpartition("@")[2].partition(":")[0].lower()  # an IPv6 "[..]" host is never Azure
        if host.endswith(_AZURE_HOST_SUFFIXES):
            return "azure"
    return scheme


def supported_schemes() -> list[str]:
    return sorted((set(REGISTRY) | set(_CUSTOM)) - {"azure"})


def _known(scheme: str) -> bool:
    return scheme in _CUSTOM or scheme in REGISTRY


def register_backend(scheme: str, factory: Callable[..., Backend], *, replace: bool = False) -> None:
    """Serve ``scheme://`` URLs with ``factory``: a :class:`~wds_async.io.Backend` class, or any
    callable returning one.

    The factory is called once per event loop (the main process, each DataLoader worker) inside that
    loop, with the options given for the scheme (``backend_options={"scheme": {...}}``) as keywords, plus
    those of ``max_connections``, ``connect_timeout``, ``read_timeout`` and ``chunk_bytes`` its signature
    takes. Registering a scheme that already has a different backend (a built-in one included) raises
    ValueError unless ``replace=True``. Register at import time of a module every process imports:
    forked workers inherit the registry, spawned ones rebuild it only by importing that module.
    """
    if not isinstance(scheme, str) or not _SCHEME.match(scheme):
        raise ValueError(f"a scheme is lowercase letters, digits, '+', '-' or '.', starting with a letter; "
                         f"got {scheme!r}")
    if not callable(factory):
        raise TypeError(f"register_backend({scheme!r}, ...) needs a Backend class or factory, got {factory!r}")
    current = _CUSTOM.get(scheme)
    if current is factory:
        return
    if not replace and (current is not None or scheme in REGISTRY):
        raise ValueError(f"the {scheme}:// scheme already has a backend; pass replace=True to replace it")
    _CUSTOM[scheme] = factory


def _unknown_scheme(scheme: str, url: str | None) -> UrlError:
    return UrlError(
        f"unknown URL scheme {scheme!r}; supported: {', '.join(s + ':' for s in supported_schemes())} "
        "and bare local paths (register_backend() adds a scheme)",
        url=url,
    )


def validate_url(url: str, *, allow_pipe: bool = True) -> None:
    """Check a URL's shape without importing any backend or doing I/O: a known scheme, then what
    :func:`wds_async.io.urlcheck.check_url` checks for the built-in ones (a host for http(s), a bucket and key for
    the stores, a command for ``pipe:`` and pipes allowed, a local path for ``file:``). Raises :class:`UrlError`
    naming the (redacted) URL and the fix. Custom schemes are their backend's to check."""
    from wds_async.io.urlcheck import check_url

    key = backend_key(url)
    if not _known(key):
        raise _unknown_scheme(key, redact_url(url))
    if key not in _CUSTOM:
        check_url(url, allow_pipe=allow_pipe)


def backend_class(scheme: str, url: str | None = None) -> Callable[..., Any]:
    """The backend class (or registered factory) for ``scheme``; raises UrlError for unknown schemes,
    MissingDependency for schemes whose optional SDK is absent."""
    custom = _CUSTOM.get(scheme)
    if custom is not None:
        return custom
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


def import_backends(urls: Iterable[str], given: Mapping[str, Any] | None = None) -> None:
    """Import the backend module of every scheme in ``urls`` now (schemes in ``given``, backends already made, are
    skipped): a missing SDK is an error here rather than at the first read, and the import (botocore alone takes
    about 0.15 s) is paid before the reads start. Datasets call it at construction, so a DataLoader's forked
    workers inherit the imports instead of each repeating them; ``bench``'s raw phase calls it before its clock,
    as the loader's phase constructs its dataset before its own."""
    first: dict[str, str] = {}
    for url in urls:
        first.setdefault(backend_key(url), url)
    for scheme, url in first.items():
        if scheme not in (given or ()):
            backend_class(scheme, redact_url(url))


# -- options ---------------------------------------------------------------------------------------------


def accepted_options(factory: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments ``factory`` takes (a class: along its ``__init__`` chain while each passes
    ``**kwargs`` on); None when it takes any (a factory function with ``**kwargs``)."""
    names: set[str] = set()
    chain = [k.__dict__["__init__"] for k in factory.__mro__ if "__init__" in k.__dict__] \
        if isinstance(factory, type) else [factory]
    for fn in chain:
        if fn is object.__init__:
            break
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: cannot tell
            return None
        if isinstance(factory, type):
            params = params[1:]  # self
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return frozenset(names)
        if not isinstance(factory, type):
            return None
    return frozenset(names)


def _check(scheme: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> frozenset[str] | None:
    """Raise UrlError for the first option ``factory`` does not take; return what it takes."""
    accepted = accepted_options(factory)
    for name in options:
        if name in ENGINE_SETTINGS:
            raise UrlError(f"backend option {name!r} (for {scheme}://) is an engine setting: pass it to "
                           f"WebDataset({name}=...) or EngineConfig, not in backend_options")
        if accepted is not None and name not in accepted:
            takes = sorted(accepted - set(ENGINE_SETTINGS))
            raise UrlError(f"backend option {name!r} is not known to the {scheme}:// backend "
                           f"({getattr(factory, '__name__', factory)!r}); it accepts: "
                           f"{', '.join(takes) if takes else 'no options'}")
    return accepted


def _split(options: Mapping[str, Any] | None) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``(per_scheme, flat)``: per-scheme entries are keys naming a known scheme with a mapping value."""
    options = dict(options or {})
    nested = {k: dict(v) for k, v in options.items() if _known(k) and isinstance(v, Mapping)}
    flat = {k: v for k, v in options.items() if k not in nested}
    if nested and flat:
        raise UrlError(f"backend_options mixes per-scheme entries ({', '.join(map(repr, nested))}) with options "
                       f"outside any scheme ({', '.join(map(repr, flat))}); put every option under its scheme, "
                       f"as in {{'s3': {{'endpoint_url': ...}}}} (schemes: {', '.join(supported_schemes())})")
    return nested, flat


def _lookup(nested: Mapping[str, dict[str, Any]], scheme: str) -> dict[str, Any] | None:
    found = nested.get(scheme)
    return found if found is not None else nested.get(_ALIASES.get(scheme, ""))


def scheme_options(options: Mapping[str, Any] | None, urls: Iterable[str],
                   overrides: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """``backend_options`` in the per-scheme form, every option checked against the constructor of the
    backend that receives it (at construction, before any request). The flat form is accepted when all
    ``urls`` use one backend; schemes served by an instance in ``overrides`` are not checked."""
    nested, flat = _split(options)
    used: dict[str, str] = {}
    for url in urls:
        used.setdefault(backend_key(url), url)
    given = set(overrides or ())
    if flat:
        factories = {s: backend_class(s, redact_url(u)) for s, u in used.items() if s not in given}
        if len(set(factories.values())) > 1:
            raise UrlError(f"backend_options without a scheme apply when all URLs use one backend; these URLs use "
                           f"{', '.join(sorted(factories))}: write backend_options={{'<scheme>': {{...}}}}")
        nested = {s: flat for s in factories} or {s: flat for s in used}
    for scheme, opts in nested.items():
        if scheme in given:
            continue
        try:
            factory = backend_class(scheme, redact_url(used[scheme]) if scheme in used else None)
        except MissingDependency:
            if scheme in used or _ALIASES.get(scheme) in used:
                raise
            continue  # options for a store these URLs do not use, whose SDK is absent: nothing to check
        _check(scheme, factory, opts)
    return nested


# -- instances -------------------------------------------------------------------------------------------


class BackendSet:
    """One backend instance per scheme, created on first use inside the running loop, closed together.

    ``overrides`` are instances to use as they are (tests, custom stores); ``options`` are
    ``backend_options`` in either form (see :func:`scheme_options`). Schemes that share a class and the
    same options (http and https) share one instance and therefore one connection pool.

    ``engine_capped``: the set of an engine, whose limiter caps its requests. The built-in backends' connection
    pools then take no cap of their own (``max_connections=0``), since an engine may hold more streams open than
    its limiter's total: a mix's reader (or a node service session's) waiting for room in the byte budget gives its
    token back and keeps its stream (engine/tokens.py). Capped at the total, those streams could hold every
    connection while the reader the consumer waits for, token in hand, queued for one for good. Registered
    factories still get ``max_connections``: their own cap must not bind below what such an engine holds open.
    """

    def __init__(self, config: EngineConfig, overrides: Mapping[str, Backend] | None = None,
                 options: Mapping[str, Any] | None = None, *, engine_capped: bool = False) -> None:
        self._config = config
        self._engine_capped = engine_capped
        self._instances: dict[str, Backend] = dict(overrides or {})
        self._owned: dict[tuple[int, int], Backend] = {}
        self._nested, self._flat = _split(options)

    def for_url(self, url: str) -> Backend:
        """The backend serving ``url``, created now if this set has none for its scheme yet."""
        scheme = backend_key(url)
        backend = self._instances.get(scheme)
        if backend is None:
            factory = backend_class(scheme, redact_url(url))
            options = _lookup(self._nested, scheme)
            if options is None:
                options = self._flat
            key = (id(factory), id(options))
            backend = self._owned.get(key)
            if backend is None:
                backend = self._owned[key] = self._create(scheme, factory, options)
            self._instances[scheme] = backend
        return backend

    def _create(self, scheme: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> Backend:
        accepted = _check(scheme, factory, options)
        config = self._config
        uncapped = self._engine_capped and scheme not in _CUSTOM  # see the class docstring
        settings = {"max_connections": 0 if uncapped else config.connections,
                    "connect_timeout": config.connect_timeout, "read_timeout": config.read_timeout,
                    "chunk_bytes": config.chunk_bytes}
        backend = factory(**{k: v for k, v in settings.items() if accepted is None or k in accepted}, **options)
        if not isinstance(backend, Backend):
            raise TypeError(f"the {scheme}:// backend factory returned {type(backend).__name__}, which lacks "
                            "the Backend methods open, size, list and aclose")
        return backend

    async def aclose(self) -> None:
        """Close every backend this set created (not the overrides it was given)."""
        owned, self._owned = list(self._owned.values()), {}
        for backend in owned:
            try:
                await backend.aclose()
            except Exception:  # closing must not mask the error that made us close
                log.debug("error closing backend %r", backend, exc_info=True)
