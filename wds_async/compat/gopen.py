"""``webdataset.gopen``: open a URL as a file object, through wds-async's backends.

``gopen(url)`` returns a binary file object to ``read`` from: a local path or ``file://`` URL is the file itself
(``open``); ``pipe:CMD`` and every store wds-async reads (``http(s)``, ``s3``, ``gs``, ``az``, and any scheme given
to :func:`wds_async.register_backend`) come through that scheme's backend, the same client, credentials and
connection settings the engine uses, on a private event loop in a helper thread. ``gopen(url, "wb")`` writes a local
file, a ``pipe:CMD``'s standard input, or an object in a store (s3, gs, az) through wds-async's upload sinks, which
commit the object on ``close()`` only.

``gopen_schemes`` maps a scheme to the function that opens it, as in webdataset; assigning an entry (a function
``(url, mode, bufsize, **kw) -> file``) replaces how that scheme is opened here, and ``"__default__"`` is called for
a scheme nobody handles. webdataset's per-tool openers (curl, gsutil, ais, hf) are not provided: wds-async reads
those stores with its own clients.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import IO, Any
from urllib.parse import urlparse

from .._loop import new_event_loop, stopped_if_interrupted
from ..backends.file import local_path
from ..config import EngineConfig
from ..errors import UrlError
from ..io import BackendSet, supported_schemes
from ..write.sinks import open_sink
from ..write.sinks.pipe import PipeSink
from ._names import refusing

__all__ = ["gopen", "gopen_backend", "gopen_error", "gopen_file", "gopen_pipe", "gopen_schemes", "reader"]

_OWN_CLIENT = ("wds-async reads {} URLs with its own client: call gopen(url) (or open through gopen_schemes) "
               "instead of this tool-specific opener")
__getattr__ = refusing("webdataset.gopen", {
    "gopen_curl": _OWN_CLIENT.format("http(s)"),
    "gopen_htgs": _OWN_CLIENT.format("http(s)"),
    "gopen_gsutil": _OWN_CLIENT.format("gs://"),
    "gopen_ais": "wds-async has no AIStore client; read AIStore through its S3 or HTTP endpoint",
    "gopen_hf": "wds-async does not resolve hf:// Hugging Face paths; give the dataset's https:// resolve URLs",
    "Pipe": "gopen('pipe:CMD') returns a stream of wds-async's pipe backend, which checks the command's exit "
            "status itself; there is no Pipe class to build by hand",
    "set_options": "it configures webdataset's Pipe objects, which wds-async does not make",
    "rewrite_url": "wds-async does not rewrite URLs from GOPEN_REWRITE; pass the URLs to read",
    "info": "webdataset's debugging record of the last opened URL; wds-async keeps none",
})


class _LoopThread:
    """An event loop running in a daemon thread, for one stream; :meth:`call` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wds-async-gopen", daemon=True)
        with stopped_if_interrupted(self._running, self.stop):
            self._thread.start()

    def _run(self) -> None:
        self._running.set()
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _BackendReader(io.RawIOBase):
    """The bytes of ``url`` in order, read through its wds-async backend (opened at construction, so a missing
    object raises from :func:`gopen` as a missing local file does)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.name = url
        self._pending = memoryview(b"")
        self._eof = False
        self._runner: _LoopThread | None = _LoopThread()
        self._backends: BackendSet | None = None
        self._context: Any = None
        self._chunks: Any = None
        try:
            self._runner.call(self._open())
        except BaseException:
            self.close()
            raise

    async def _open(self) -> None:
        self._backends = BackendSet(EngineConfig())
        self._context = self._backends.for_url(self.name).open(self.name)
        stream = await self._context.__aenter__()
        self._chunks = aiter(stream)

    async def _next(self) -> bytes:
        try:
            return bytes(await anext(self._chunks))
        except StopAsyncIteration:
            return b""

    async def _shut(self) -> None:
        try:
            if self._context is not None:
                await self._context.__aexit__(None, None, None)
        finally:
            if self._backends is not None:
                await self._backends.aclose()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on a closed stream")
        while not self._pending and not self._eof:
            assert self._runner is not None
            chunk = self._runner.call(self._next())
            if chunk:
                self._pending = memoryview(chunk)
            else:
                self._eof = True
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            try:
                runner.call(self._shut())
            finally:
                runner.stop()
        super().close()


def gopen_file(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[Any]:
    """A local path or ``file://`` URL, opened with ``open``."""
    return open(local_path(url), mode, buffering=bufsize if "b" in mode else -1)


def gopen_backend(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[Any]:
    """A store URL: read through its wds-async backend (``"rb"``), or written through an upload sink (``"wb"``,
    committed on ``close()``). ``kw`` (webdataset's pipe options) are not used."""
    if mode == "rb":
        return io.BufferedReader(_BackendReader(url), buffer_size=max(bufsize, io.DEFAULT_BUFFER_SIZE))
    if mode == "wb":
        return open_sink(url)  # type: ignore[return-value]
    raise ValueError(f"gopen: mode {mode!r} is not supported for {urlparse(url).scheme}:// URLs; use 'rb' or 'wb'")


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[Any]:
    """``pipe:CMD``: its standard output (``"rb"``, through wds-async's pipe backend, which raises when the command
    fails) or its standard input (``"wb"``; ``close()`` waits for the command and raises if it failed)."""
    if mode == "rb":
        return gopen_backend(url, mode, bufsize)
    if mode == "wb":
        return PipeSink(url)  # type: ignore[return-value]
    raise ValueError(f"gopen: mode {mode!r} is not supported for pipe: URLs; use 'rb' or 'wb'")


def gopen_error(url: str, *args: Any, **kw: Any) -> IO[Any]:
    """The opener of a scheme nobody handles: raises :class:`~wds_async.UrlError`."""
    raise UrlError(f"gopen: no handler for the scheme of {url!r}; wds-async reads {', '.join(supported_schemes())} "
                   "URLs and local paths (add one with wds_async.register_backend or gopen_schemes)")


#: scheme -> opener ``(url, mode, bufsize, **kw) -> file``; ``"__default__"`` opens the schemes not listed.
gopen_schemes: dict[str, Callable[..., IO[Any]]] = {
    "__default__": gopen_error,
    "file": gopen_file,
    "pipe": gopen_pipe,
    **{scheme: gopen_backend for scheme in supported_schemes() if scheme not in ("file", "pipe")},
}


def gopen(url: str | os.PathLike[str], mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[Any]:
    """Open ``url`` for reading (``"rb"``) or writing (``"wb"``; local files take any ``open`` mode); ``"-"`` is
    standard input or output. The opener comes from :data:`gopen_schemes` by the URL's scheme."""
    url = os.fspath(url)
    if url == "-":
        return sys.stdin.buffer if mode[0] == "r" else sys.stdout.buffer
    scheme = "pipe" if url.startswith("pipe:") else urlparse(url).scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):  # a bare path (or a drive letter)
        scheme = "file"
    if scheme not in gopen_schemes and scheme in supported_schemes():  # a backend registered after import
        opener: Callable[..., IO[Any]] = gopen_backend
    else:
        opener = gopen_schemes.get(scheme, gopen_schemes["__default__"])
    return opener(url, mode, bufsize, **kw)


def reader(url: str, **kw: Any) -> IO[Any]:
    """``gopen(url, "rb", **kw)``."""
    return gopen(url, "rb", **kw)
