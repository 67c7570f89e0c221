"""The part pipeline the store sinks share: parts filled by the producer, uploaded by background threads.

``write()`` copies bytes into the current part. A full part goes to a thread pool (at most ``in_flight``
uploading at once) while the producer fills the next, so a sink holds the part being filled plus at most
``in_flight`` parts, whatever the object's size: ``buffered_bytes`` counts them and
``peak_buffered_bytes`` keeps the high-water mark. When ``in_flight`` parts are out, ``write()`` waits for
one to finish. Every store call goes through :meth:`PartSink._call`, which retries transient errors with
the :class:`~wds_async.config.RetryPolicy` (exponential backoff, full jitter) and stops at once on abort.

A part that fails for good fails the sink: the next ``write()`` or ``close()`` aborts the upload and
raises. ``close()`` waits for the parts, then hands the last, short (possibly empty) part to the store's
``_finish``, which commits and returns the identity. A store subclass provides ``_begin`` (start the
upload; called before the first full part), ``_put`` (one part, from a pool thread; or ``_send_part``
when a part is not retried whole), ``_finish``, ``_cancel`` (best effort, never raises: remove whatever
was started) and ``_translate`` (SDK error -> WdsError).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar, TypeVar

from ...config import RetryPolicy
from ...errors import BackendError, TransientError, WdsError
from ...io import ObjectIdentity
from ...urls import redact_url

__all__ = ["PartSink", "as_bytes_view"]

log = logging.getLogger("wds_async")

T = TypeVar("T")


def as_bytes_view(data: Any) -> memoryview:
    """``data`` as a flat memoryview of bytes (``len()`` counts bytes), copying only a non-contiguous one."""
    view = memoryview(data)
    if view.ndim == 1 and view.itemsize == 1 and view.format in ("B", "b", "c"):
        return view
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())


class PartSink:
    """Base of the store sinks (see the module docstring). Not thread-safe: one producer at a time."""

    #: Parts uploading at once.
    in_flight: ClassVar[int] = 2
    #: The store's limit on the number of parts (None: none). The part size doubles every tenth of it, so
    #: that the last allowed part is reached only past ~1000x the first parts' size.
    max_parts: ClassVar[int | None] = None
    #: What the store calls a part, for messages.
    part_name: ClassVar[str] = "part"

    def __init__(self, url: str, *, part_bytes: int, policy: RetryPolicy | None) -> None:
        self.url = redact_url(url)
        self.part_bytes = part_bytes
        self.policy = policy or RetryPolicy()
        self.identity: ObjectIdentity | None = None
        #: Bytes written, parts handed to the store, store calls retried.
        self.size = self.parts = self.retries = 0
        self.buffered_bytes = self.peak_buffered_bytes = 0
        self._part = bytearray()
        self._target = self.part_size(1)
        self._pending: list[Future[None]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()  # set by abort(): retries and queued parts stop
        self._began = False
        self._state = "open"  # -> "closed" | "aborted"
        self._error: BaseException | None = None

    # -- what a store provides -----------------------------------------------------------------------

    def _begin(self) -> None:
        """Start the upload (before the first full part; not called for an object of one short part)."""

    def _put(self, number: int, data: bytearray) -> None:
        raise NotImplementedError

    def _finish(self, last: bytearray) -> ObjectIdentity:
        raise NotImplementedError

    def _cancel(self) -> None:
        """Remove what was started, if anything (best effort; must not raise)."""

    def _translate(self, exc: Exception) -> WdsError:
        raise NotImplementedError

    # -- the Sink interface --------------------------------------------------------------------------

    def part_size(self, number: int) -> int:
        """The size of part ``number`` (from 1); the last part may be shorter."""
        if self.max_parts is None:
            return self.part_bytes
        if number > self.max_parts:
            raise BackendError(f"the object needs more than the store's {self.max_parts} {self.part_name}s; "
                               f"pass a larger part size (now {self.part_bytes} bytes, doubling every "
                               f"{self.max_parts // 10} {self.part_name}s)", url=self.url)
        return self.part_bytes << ((number - 1) // (self.max_parts // 10))

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` into parts, waiting while ``in_flight`` parts are uploading; returns its length."""
        self._check_open()
        view = as_bytes_view(data)
        pos, total = 0, len(view)
        try:
            while pos < total:
                piece = view[pos:pos + self._target - len(self._part)]
                self._part += piece
                pos += len(piece)
                self._grow(len(piece))
                if len(self._part) >= self._target:
                    self._submit()
        except BaseException as exc:
            self._fail(exc)
            raise
        self.size += total
        return total

    def flush(self) -> None:
        """Nothing to do: parts leave when full, and nothing is visible before ``close()``."""

    def close(self) -> None:
        """Wait for the parts and commit; on failure abort, then raise (see :class:`~wds_async.write.sinks.Sink`)."""
        if self._state == "closed":
            return
        self._check_open()
        try:
            self._drain(0)
            identity = self._finish(self._part)
        except BaseException as exc:
            self._fail(exc)
            raise
        self._state, self.identity = "closed", identity
        self._release()

    def abort(self) -> None:
        """Stop the parts, then remove what the upload started; never raises, does nothing after a commit."""
        if self._state in ("closed", "aborted"):
            return
        self._state = "aborted"
        self._stop.set()
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)  # a part mid-request ends first
            self._cancel()  # each store knows what it started (an upload id, a session), if anything
        except BaseException:  # abort never raises (a second Ctrl-C lands here)
            log.debug("error aborting the upload of %s", self.url, exc_info=True)
        self._release()

    # -- machinery -----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            what = "committed" if self._state == "closed" else "aborted"
            raise BackendError(f"the upload was already {what}; open a new sink to write again",
                               url=self.url) from self._error

    def _grow(self, n: int) -> None:
        with self._lock:
            self.buffered_bytes += n
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, self.buffered_bytes)

    def _submit(self) -> None:
        """Hand the full current part to the pool (starting the upload first), once a slot is free."""
        number = self.parts + 1
        if not self._began:
            self._call("starting the upload", self._begin)
            self._began = True
        self._drain(self.in_flight - 1)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="wds-upload")
        part, self._part = self._part, bytearray()
        self._pending.append(self._pool.submit(self._upload, number, part))
        self.parts = number
        self._target = self.part_size(number + 1)

    def _send_part(self, number: int, part: bytearray) -> None:
        """Upload one full part, retried as a whole (a store whose parts are not independent overrides)."""
        self._call(f"{self.part_name} {number}", self._put, number, part)

    def _upload(self, number: int, part: bytearray) -> None:
        size = len(part)
        try:
            self._send_part(number, part)
        finally:
            with self._lock:
                self.buffered_bytes -= size

    def _drain(self, keep: int) -> None:
        """Wait until at most ``keep`` parts are uploading; raise the first failure among those done."""
        while self._pending:
            done = [f for f in self._pending if f.done()]
            if not done and len(self._pending) <= keep:
                return
            if not done:
                done = list(wait(self._pending, return_when=FIRST_COMPLETED).done)
            for future in done:
                self._pending.remove(future)
                future.result()

    def _call(self, what: str, fn: Callable[..., T], *args: Any, stoppable: bool = True,
              policy: RetryPolicy | None = None) -> T:
        """``fn(*args)``, its errors translated, transient ones retried per ``policy`` (default: the sink's;
        exponential backoff with full jitter). ``stoppable``: give up at once when the sink is aborted."""
        policy = policy or self.policy
        failures, first = 0, 0.0
        while True:
            if stoppable and self._stop.is_set():
                raise BackendError(f"{what}: the upload was aborted", url=self.url)
            try:
                return fn(*args)
            except Exception as exc:  # translated at this boundary
                error = exc if isinstance(exc, WdsError) else self._translate(exc)
                if not isinstance(error, TransientError):
                    raise error from None
            failures += 1
            now = time.monotonic()
            first = first or now
            if failures >= policy.attempts or now - first >= policy.deadline:
                raise TransientError(f"{what} failed {failures} times over {now - first:.1f} s, giving up "
                                     f"({error.message}); the store may be down or refusing uploads: retry "
                                     "later, or allow more with RetryPolicy(attempts=, deadline=)", url=self.url)
            delay = policy.delay(failures)
            log.info("retrying %s of %s in %.2f s: %s", what, self.url, delay, error.message)
            with self._lock:
                self.retries += 1
            if stoppable and self._stop.wait(delay):
                raise BackendError(f"{what}: the upload was aborted", url=self.url)
            if not stoppable:
                time.sleep(delay)

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self.abort()

    def _release(self) -> None:
        self._part = bytearray()
        self._pending = []
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        with self._lock:
            self.buffered_bytes = 0
