"""``gs://bucket/object``: a resumable upload session (google-resumable-media), one chunk at a time.

Access is the reading backend's (:func:`wds_async.backends.gcs.resolve_access`: ``endpoint_url`` or
``STORAGE_EMULATOR_HOST``, ``anonymous``, a ``credentials`` object), except that application default
credentials are asked for the read-write scope. The session is initiated when the first chunk is full (or
at ``close()`` for a small object); chunks (8 MiB unless told, a multiple of 256 KiB) go out in order from
a background thread while the producer fills the next. google-resumable-media's own retries are off:
after a failed chunk the sink asks the session how many bytes it persisted (``recover``) and sends from
there, under the sink's RetryPolicy. Bytes the session persisted of a chunk in part are carried into the
next one. The last chunk finalizes the object, checked against its crc32c; ``abort()`` cancels the session
(DELETE on its URI), so nothing is finalized.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import quote

import google.auth
import google.auth.exceptions
import requests
from google.auth.transport.requests import AuthorizedSession
from google.resumable_media import DataCorruption, InvalidResponse, RetryStrategy
from google.resumable_media.requests import ResumableUpload

from ...backends.gcs import parse_gs_url, resolve_access
from ...config import RetryPolicy
from ...errors import BackendError, PermissionDenied, TransientError, WdsError
from ...io import ObjectIdentity
from ...io.backend import status_error
from ._parts import PartSink

__all__ = ["CHUNK_UNIT", "GcsSink"]

log = logging.getLogger("wds_async")

#: A non-final chunk of a resumable upload is a multiple of this.
CHUNK_UNIT = 256 << 10
READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


class _Window:
    """The file object the upload reads: bytes ``[base, base + len(data))`` of the object, one chunk
    (plus any carry) at a time; positions are offsets in the whole object."""

    def __init__(self) -> None:
        self.base, self.pos, self.data = 0, 0, memoryview(b"")

    def reset(self, base: int, data: bytes | bytearray) -> None:
        self.base, self.pos, self.data = base, 0, memoryview(data)

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def tell(self) -> int:
        return self.base + self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0 or not 0 <= offset - self.base <= len(self.data):
            raise ValueError(f"the session asks for byte {offset}, outside the chunk held "
                             f"[{self.base}, {self.base + len(self.data)})")
        self.pos = offset - self.base
        return offset

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.pos + size
        chunk = bytes(self.data[self.pos:end])
        self.pos += len(chunk)
        return chunk


class GcsSink(PartSink):
    """A :class:`~wds_async.write.sinks.Sink` for ``gs://`` (see the module docstring)."""

    in_flight = 1  # a session takes its chunks in order
    part_name = "chunk"

    def __init__(self, url: str, options: dict[str, Any], *, part_bytes: int,
                 policy: RetryPolicy | None = None) -> None:
        super().__init__(url, part_bytes=part_bytes, policy=policy)
        if part_bytes <= 0 or part_bytes % CHUNK_UNIT:
            raise ValueError(f"GCS chunks are a positive multiple of {CHUNK_UNIT} bytes (256 KiB), not {part_bytes}")
        bucket, self.key = parse_gs_url(url)
        self._credentials = options.get("credentials")
        endpoint, self._anonymous, self.credential_source = resolve_access(
            options.get("endpoint_url"), bool(options.get("anonymous", False)), self._credentials)
        self._start_url = f"{endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=resumable"
        self._ca_file: str | None = options.get("ca_file")
        self._session: requests.Session | None = None
        self._resumable: ResumableUpload | None = None
        self._window = _Window()
        self._carry = b""
        self._answer: requests.Response | None = None
        self._corrupt: requests.Response | None = None
        self._object_url = f"{endpoint}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(self.key, safe='')}"

    def _transport(self) -> requests.Session:
        if self._session is None:
            if self._anonymous:
                session = requests.Session()
            else:
                credentials = self._credentials
                if credentials is None:
                    credentials, _ = google.auth.default(scopes=[READ_WRITE_SCOPE])
                    self.credential_source = type(credentials).__name__
                session = AuthorizedSession(credentials)
            if self._ca_file:
                session.verify = self._ca_file
            self._session = session
        return self._session

    def _begin(self) -> None:
        upload = ResumableUpload(self._start_url, self.part_bytes, checksum="crc32c")
        upload._retry_strategy = RetryStrategy(max_retries=0)  # the sink retries, with its policy
        self._window.reset(0, b"")
        upload.initiate(self._transport(), self._window, {"name": self.key}, "application/x-tar", stream_final=False)
        self._resumable = upload

    def _send_part(self, number: int, part: bytearray) -> None:
        self._send(part, final=False)

    def _send(self, data: bytearray, *, final: bool) -> None:
        """Send ``data`` after the carry: whole chunks, and the rest too when ``final``; keep what is left."""
        upload = self._resumable
        assert upload is not None
        window = self._carry + data if self._carry else data
        self._window.reset(upload.bytes_uploaded, window)
        end = self._window.end
        while self._answer is None and (final or end - upload.bytes_uploaded >= self.part_bytes):
            self._call(f"the chunk at byte {upload.bytes_uploaded}", self._transmit, final)
        left = end - upload.bytes_uploaded
        self._carry = bytes(window[len(window) - left:]) if left > 0 and not final else b""
        self._window.reset(upload.bytes_uploaded, b"")  # the part's buffer is not held past its upload

    def _transmit(self, final: bool) -> None:
        """Send the next chunk; after a failure, first ask the session what it persisted (``recover``) and
        send from there, unless that leaves less than a chunk of a non-final window (carried instead)."""
        upload, session = self._resumable, self._transport()
        assert upload is not None
        if upload.invalid:
            try:
                upload.recover(session)  # the offset the session persisted
            except InvalidResponse as exc:
                if exc.response.status_code in (200, 201):  # the last chunk arrived; its answer was lost
                    self._answer = exc.response
                    return
                raise
            if not final and self._window.end - upload.bytes_uploaded < self.part_bytes:
                return
        self._window.seek(upload.bytes_uploaded)
        try:
            response = upload.transmit_next_chunk(session)
        except DataCorruption as exc:  # finalized nonetheless: _cancel deletes that generation
            self._corrupt = exc.response
            raise
        except Exception:  # the session may hold any part of the chunk: recover() asks before resending
            upload._make_invalid()
            raise
        if upload.finished:
            self._answer = response

    def _finish(self, last: bytearray) -> ObjectIdentity:
        if not self._began:
            self._call("starting the upload", self._begin)
            self._began = True
        self._send(last, final=True)
        assert self._answer is not None
        meta = json.loads(self._answer.content or b"{}")
        generation = meta.get("generation")
        return ObjectIdentity(size=int(meta.get("size", self.size)), generation=str(generation) if generation else None)

    def _cancel(self) -> None:
        upload = self._resumable
        if upload is None or upload.resumable_url is None or self._answer is not None:
            return
        try:
            if self._corrupt is not None:  # only the generation this upload made
                generation = json.loads(self._corrupt.content or b"{}").get("generation")
                self._transport().delete(self._object_url, params={"ifGenerationMatch": generation}, timeout=30)
            else:  # GCS answers 499; a session not cancelled expires in a week, never finalized
                self._transport().delete(upload.resumable_url, timeout=30)
        except (requests.RequestException, ValueError):
            log.debug("could not cancel the upload of %s", self.url, exc_info=True)

    def _release(self) -> None:
        super()._release()
        self._carry = b""
        if self._session is not None:
            self._session.close()

    def _translate(self, exc: Exception) -> WdsError:
        if isinstance(exc, InvalidResponse):
            response = exc.response
            try:
                note = str(response.json()["error"]["message"])[:300]
            except (ValueError, KeyError, TypeError):
                note = ""
            auth = f"Google credentials: {self.credential_source}" if response.status_code in (401, 403) else ""
            return status_error(response.status_code, self.url, str(response.reason or ""), notes=(note, auth))
        if isinstance(exc, DataCorruption):
            return BackendError(f"the uploaded object's checksum does not match what was sent: {exc.args[-1]}",
                                url=self.url)
        if isinstance(exc, (requests.ConnectionError, requests.Timeout, google.auth.exceptions.TransportError)):
            return TransientError(f"GCS request failed: {type(exc).__name__}", url=self.url)
        if isinstance(exc, google.auth.exceptions.GoogleAuthError):
            return PermissionDenied(f"could not obtain Google credentials ({self.credential_source}): "
                                    f"{' '.join(str(exc).split())[:300]}", url=self.url)
        return BackendError(f"GCS upload failed: {type(exc).__name__}: {str(exc)[:300]}", url=self.url)
