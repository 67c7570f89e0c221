"""The engine: many shard downloads in flight, parsed as they arrive, into one byte-bounded channel.

``Engine.run()`` starts ``max_connections`` reader coroutines in a TaskGroup. Each takes the next shard
from the shared shard iterator (so shards open in list order), streams it through its backend into a
sans-IO :class:`~wds_async.tarstream.TarParser` and a :class:`~wds_async.grouping.Grouper`, and puts
complete samples into the :class:`~wds_async.queues.SampleChannel`. Before every read a reader waits on
the shared :class:`~wds_async.queues.ByteBudget`, so a slow consumer stops the downloads.

A transient failure (see :class:`~wds_async.errors.TransientError`) is retried with exponential backoff
and full jitter, reopening the source at the exact byte where the stream stopped and feeding the same
parser, so nothing is lost or repeated. Between attempts the object's identity must not change.
Errors that end a shard go to the user's ``handler``: it returns True (skip the shard, counted),
False (stop the data here), or raises (the error reaches the consumer at this shard's position).

The engine owns no thread: the bridge runs it in its loop thread.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any

from ._compat import TaskGroup
from .config import EngineConfig
from .errors import BackendError, TransientError, WdsError
from .grouping import Grouper, Sample, sample_nbytes
from .queues import ByteBudget, ChannelClosed, SampleChannel
from .stats import Stats
from .tarstream import TarParser
from .urls import redact_url

__all__ = ["BackendSet", "Engine", "Handler"]

log = logging.getLogger("wds_async")

# Python 3.10 has no exception groups; an empty tuple in ``except`` catches nothing.
_GROUP: Any = getattr(builtins, "BaseExceptionGroup", ())

#: ``handler(exc) -> bool``: True to skip and continue, False to stop, raise to propagate.
Handler = Callable[[BaseException], bool]


class BackendSet:
    """One backend instance per scheme, created on first use inside the running loop."""

    def __init__(self, config: EngineConfig, overrides: Mapping[str, Any] | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        self._config = config
        self._instances: dict[str, Any] = dict(overrides or {})
        self._owned: list[Any] = []
        self._options = dict(options or {})

    def for_url(self, url: str) -> Any:
        from .backends import backend_class, backend_key

        scheme = backend_key(url)
        backend = self._instances.get(scheme)
        if backend is None:
            cls = backend_class(scheme, redact_url(url))
            # http and https share one instance and therefore one connection pool.
            shared = next((b for b in self._owned if type(b) is cls), None)
            backend = shared or cls(
                max_connections=self._config.max_connections,
                connect_timeout=self._config.connect_timeout,
                read_timeout=self._config.read_timeout,
                chunk_bytes=self._config.chunk_bytes,
                **self._options,
            )
            if shared is None:
                self._owned.append(backend)
            self._instances[scheme] = backend
        return backend

    async def aclose(self) -> None:
        owned, self._owned = self._owned, []
        for backend in owned:
            try:
                await backend.aclose()
            except Exception:  # closing must not mask the error that made us close
                log.debug("error closing backend %r", backend, exc_info=True)


class _Stop(Exception):
    """The handler asked to stop at this point."""


class _HandlerRaised(Exception):
    """The handler raised ``error`` for a sample-level problem."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class Engine:
    """Fetches ``urls`` concurrently into ``channel`` (see module docstring)."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        backends: BackendSet,
        channel: SampleChannel,
        config: EngineConfig,
        handler: Handler,
        stats: Stats,
        log_interval: float | None = None,
        select_files: Callable[[str], bool] | None = None,
        rename_files: Callable[[str], str] | None = None,
    ) -> None:
        self.select_files = select_files
        self.rename_files = rename_files
        # A list, or a lazy iterator (resampled or pipeline shard streams), pulled only in the loop thread.
        self.urls = urls
        self.backends = backends
        self.channel = channel
        self.budget: ByteBudget = channel.budget
        self.config = config
        self.handler = handler
        self.stats = stats
        self.log_interval = log_interval
        self._stopping = False
        self.stats.shards_total = len(urls) if isinstance(urls, Sized) else 0
        self.stats.buffer_limit = self.budget.limit
        self.stats.budget = self.budget

    async def run(self) -> None:
        """Fetch every shard; errors that escape the handler logic are delivered via the channel."""
        shards = iter(self.urls)
        try:
            async with TaskGroup() as outer:
                logger = outer.create_task(self._log_periodically()) if self.log_interval else None
                async with TaskGroup() as readers:
                    count = len(self.urls) if isinstance(self.urls, Sized) else self.config.max_connections
                    for _ in range(min(self.config.max_connections, count)):
                        readers.create_task(self._reader(shards))
                if logger is not None:
                    logger.cancel()
        except ChannelClosed:
            pass
        except _GROUP as group:
            errors = [e for e in group.exceptions if not isinstance(e, ChannelClosed)]
            if errors:
                self._fail(errors[0] if len(errors) == 1 else group)
        except Exception as exc:  # a bug, not a shard problem: surface it to the consumer
            self._fail(exc)
        finally:
            self.stats.finished = time.perf_counter()
            self.channel.finish()

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, ChannelClosed):
            return
        log.debug("engine failed", exc_info=exc)
        token = object()
        self.channel.open_shard(token)
        self.channel.put_error(token, exc)
        self.channel.close_shard(token)

    async def _log_periodically(self) -> None:
        assert self.log_interval
        while True:
            await asyncio.sleep(self.log_interval)
            log.info("wds-async: %s", self.stats.line())

    async def _reader(self, shards: Iterable[str]) -> None:
        for url in shards:
            if self._stopping or self.channel.abandoned:
                return
            token = object()
            self.channel.open_shard(token)
            self.stats.shards_in_flight += 1
            try:
                await self._fetch_shard(url, token)
                self.stats.shards_done += 1
            except ChannelClosed:
                return
            except _Stop:
                self.channel.put_stop(token)
                self._stopping = True
            except _HandlerRaised as raised:
                self.channel.put_error(token, raised.error)
                self._stopping = True
            except (WdsError, OSError) as exc:
                self._shard_failed(token, exc)
            finally:
                self.stats.shards_in_flight -= 1
                self.budget.forget(token)
                if not self.channel.abandoned:
                    self.channel.close_shard(token)

    def _shard_failed(self, token: object, exc: BaseException) -> None:
        try:
            keep_going = self.handler(exc)
        except BaseException as raised:  # noqa: BLE001 - delivered to the consumer, not swallowed
            self.channel.put_error(token, raised)
            self._stopping = True
            return
        if keep_going:
            self.stats.shards_skipped += 1
        else:
            self.channel.put_stop(token)
            self._stopping = True

    def _on_sample_error(self, err: WdsError) -> None:
        try:
            keep_going = self.handler(err)
        except BaseException as raised:  # noqa: BLE001
            raise _HandlerRaised(raised) from None
        if not keep_going:
            raise _Stop()
        self.stats.samples_skipped += 1

    def _emit(self, token: object, samples: list[Sample], held: int, parser: TarParser, grouper: Grouper) -> int:
        """Put complete samples into the channel and re-account the bytes this reader holds."""
        emitted = 0
        for sample in samples:
            nbytes = sample_nbytes(sample)
            emitted += nbytes
            self.channel.put(token, sample, nbytes)
        self.stats.samples_read += len(samples)
        new_held = parser.pending_bytes + grouper.pending_bytes
        self.budget.add(new_held + emitted - held)
        return new_held

    async def _fetch_shard(self, url: str, token: object) -> None:
        shown = redact_url(url)
        backend = self.backends.for_url(url)
        parser = TarParser(url=shown)
        grouper = Grouper(shown, self._on_sample_error, select_files=self.select_files,
                          rename_files=self.rename_files)
        policy = self.config.retry
        pos = 0  # bytes of the source consumed (compressed bytes for .tar.gz): where a retry resumes
        identity = None
        failures = 0
        first_failure = 0.0
        held = 0
        try:
            while True:
                progress_at_start = pos
                try:
                    async with backend.open(url, start=pos) as stream:
                        if identity is None:
                            identity = stream.identity
                        else:
                            conflict = identity.conflicts_with(stream.identity)
                            if conflict:
                                raise BackendError(
                                    f"the object changed between attempts ({conflict}); refusing to splice two "
                                    "versions of one shard", url=shown, offset=pos)
                        chunks = stream.__aiter__()
                        while True:
                            await self.budget.wait_for_room(token, self.channel)
                            try:
                                chunk = await chunks.__anext__()
                            except StopAsyncIteration:
                                break
                            pos += len(chunk)
                            self.stats.bytes_read += len(chunk)
                            samples = grouper.push(parser.feed(chunk))
                            held = self._emit(token, samples, held, parser, grouper)
                    if identity.size is not None and pos < identity.size:
                        raise TransientError(f"stream ended after {pos} of {identity.size} bytes", url=shown,
                                             offset=pos)
                    break
                except TransientError as exc:
                    if pos > progress_at_start:
                        failures, first_failure = 0, 0.0
                    failures += 1
                    now = time.monotonic()
                    first_failure = first_failure or now
                    if failures >= policy.attempts or now - first_failure >= policy.deadline:
                        raise TransientError(
                            f"gave up after {failures} attempts over {now - first_failure:.1f} s: {exc.message}",
                            url=shown, offset=pos) from exc
                    delay = random.uniform(0, min(policy.max_delay, policy.base_delay * 2 ** (failures - 1)))
                    log.info("retrying %s at byte %d in %.2f s: %s", shown, pos, delay, exc.message)
                    self.stats.retries += 1
                    await asyncio.sleep(delay)
            parser.close()
            self._emit(token, grouper.finish(), held, parser, grouper)
            held = 0
        finally:
            if held:
                self.budget.release(held)
