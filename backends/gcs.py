"""``gs://bucket/object/key`` over the GCS JSON API, with the clients inherited from HttpBackend (downloads through its
builtin HTTP/1.1 client, metadata and listing through its aiohttp session).

* Endpoint: ``endpoint_url=`` if given, else ``STORAGE_EMULATOR_HOST`` (``http://`` is prepended when it
  has no scheme; the emulator also means anonymous access), else ``https://storage.googleapis.com``.
* Credentials, in order: ``credentials=`` (a google-auth object); anonymous for ``anonymous=True`` or the
  emulator; otherwise application default credentials, resolved lazily on first use. ADC discovery may
  probe the metadata server and a refresh is a blocking HTTP call, so both run in a thread, behind an
  asyncio.Lock so that a burst of concurrent opens refreshes once. Without any credentials we fall back
  to anonymous access (public buckets) and keep a ``note`` saying so. ``credential_source`` names what
  is in use (a class name, "anonymous", "emulator") for error messages; a token never appears in one.
* Data: ``GET {base}/download/storage/v1/b/{bucket}/o/{quoted key}?alt=media`` with ``Range: bytes=a-b``
  or ``bytes=a-`` (never a suffix range). Identity for resume comes from ``x-goog-generation``/``ETag``
  and the size from Content-Range, as parsed by :func:`identity_from_headers`.
* Listing goes through the JSON list API on the same aiohttp session rather than google-cloud-storage's
  ``list_blobs`` in a thread: it reuses the credentials, connection pool and error mapping we already
  have, needs no project or second HTTP stack (requests), and holds no thread for a long listing. Pages
  follow ``nextPageToken``; the server filters by the glob's literal prefix (plus ``delimiter=/`` when
  the pattern cannot cross a ``/``), and :func:`glob_regex` decides the matches.
* Errors: downloads, metadata and listing all go through HttpBackend's ``response_error`` (status
  mapping, the JSON ``"message"`` from the first 2 KB of the body); 401/403 add
  :meth:`GcsBackend.auth_description`. aiohttp's exceptions go through ``map_aiohttp_errors`` as for
  downloads. A failed token refresh is PermissionDenied, or TransientError when google-auth calls it
  retryable or a transport failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport.requests

from wds_async.errors import NotFound, PermissionDenied, TransientError, UrlError, WdsError
from wds_async.io.backend import ObjectIdentity, glob_prefix, glob_regex
from wds_async.urls import redact_url

from ._errors import map_aiohttp_errors
from .http import HttpBackend

__all__ = ["GcsBackend", "parse_gs_url", "resolve_access"]

log = logging.getLogger("wds_async")

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]\Z")


def parse_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/key`` -> (bucket, key). Split by hand: a key may hold ``?`` or ``#`` literally."""
    bucket, _, key = url[len("gs://"):].partition("/") if url.startswith("gs://") else ("", "", "")
    if not _BUCKET.match(bucket) or not key:
        raise UrlError("malformed gs:// URL: it needs a bucket and an object name, as in gs://bucket/dir/shard.tar",
                       url=redact_url(url))
    return bucket, key


def resolve_access(endpoint_url: str | None, anonymous: bool,
                   credentials: google.auth.credentials.Credentials | None) -> tuple[str, bool, str]:
    """``(endpoint, anonymous, credential source)`` as the module docstring orders them; the writers
    (:mod:`wds_async.write.sinks`) resolve theirs with it too. Application default credentials are left to the
    caller (their scope differs: read-only here)."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    base = endpoint_url or emulator or DEFAULT_ENDPOINT
    endpoint = (base if "://" in base else "http://" + base).rstrip("/")
    if credentials is not None:
        return endpoint, False, type(credentials).__name__
    if anonymous or (emulator and not endpoint_url):
        return endpoint, True, "anonymous" if anonymous else "emulator"
    return endpoint, False, "application default credentials (not resolved yet)"


def _refresh(credentials: google.auth.credentials.Credentials) -> None:
    """Blocking token refresh (run in a thread); the requests session is closed right after."""
    request = google.auth.transport.requests.Request()
    try:
        credentials.refresh(request)
    finally:
        request.session.close()


class GcsBackend(HttpBackend):
    """Streams ``gs://`` objects with ranged JSON API media downloads."""

    #: The store's API serves byte ranges on every object, whether or not an answer says Accept-Ranges, and
    #: lists objects by prefix.
    capabilities = dataclasses.replace(HttpBackend.capabilities, ranges_guaranteed=True, listing=True)

    def __init__(self, *, endpoint_url: str | None = None, anonymous: bool = False,
                 credentials: google.auth.credentials.Credentials | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.endpoint, self._anonymous, self.credential_source = resolve_access(endpoint_url, anonymous, credentials)
        self.note: str | None = None
        self._credentials = credentials
        self._auth_lock = asyncio.Lock()

    # -- credentials ---------------------------------------------------------------------------------

    def _load_default(self) -> google.auth.credentials.Credentials | None:
        try:
            credentials, _project = google.auth.default(scopes=[READ_ONLY_SCOPE])
        except google.auth.exceptions.DefaultCredentialsError:
            return None
        return credentials

    async def _auth_headers(self, shown: str) -> dict[str, str]:
        """``Authorization`` (and a quota project) for authenticated use; nothing when anonymous."""
        if self._anonymous:
            return {}
        creds = self._credentials
        if creds is None or not creds.valid:
            async with self._auth_lock:  # whoever waited here finds the work done
                if self._anonymous:  # another opener found no credentials meanwhile
                    return {}
                try:
                    if self._credentials is None:
                        self._credentials = await asyncio.to_thread(self._load_default)
                        if self._credentials is None:
                            self._anonymous, self.credential_source = True, "anonymous"
                            self.note = "no Google credentials found (anonymous)"
                            log.info("gs: %s; only public buckets are readable", self.note)
                            return {}
                        self.credential_source = type(self._credentials).__name__
                    if not self._credentials.valid:
                        await asyncio.to_thread(_refresh, self._credentials)
                except google.auth.exceptions.GoogleAuthError as exc:
                    raise self._auth_error(exc, shown) from None
            creds = self._credentials
        assert creds is not None
        headers = {"Authorization": f"Bearer {creds.token}"}
        quota_project = getattr(creds, "quota_project_id", None)
        if quota_project:  # user credentials bill their quota project, as google-auth's apply() does
            headers["x-goog-user-project"] = quota_project
        return headers

    def _auth_error(self, exc: Exception, shown: str) -> WdsError:
        kind = TransientError if isinstance(exc, google.auth.exceptions.TransportError) or getattr(
            exc, "retryable", False) else PermissionDenied
        text = " ".join(str(exc).split())[:300]
        return kind(f"could not obtain a Google access token ({self.credential_source}): "
                    f"{type(exc).__name__}: {text}", url=shown)

    # -- HttpBackend hooks ---------------------------------------------------------------------------

    def request_url(self, url: str) -> str:
        bucket, key = parse_gs_url(url)
        return f"{self.endpoint}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}?alt=media"

    async def request_headers(self, url: str, start: int, end: int | None) -> dict[str, str]:
        headers = await super().request_headers(url, start, end)
        headers.update(await self._auth_headers(url))
        return headers

    def conditions(self, target: str, headers: dict[str, str], expect: ObjectIdentity | None) -> str:
        """The JSON API's precondition is the generation: ``ifGenerationMatch`` (412 when it moved on)."""
        if expect is not None and expect.generation:
            return f"{target}&ifGenerationMatch={quote(str(expect.generation), safe='')}"
        return target

    def auth_description(self) -> str:
        return f"Google credentials: {self.note or self.credential_source}"

    # -- metadata and listing: JSON API on the same session --------------------------------------------

    async def _json(self, url: str, target: str, params: Mapping[str, str] | None = None) -> Any:
        """GET a JSON API resource; non-2xx answers go through :meth:`response_error` like downloads."""
        headers = {**self.headers, **await self._auth_headers(url)}
        with map_aiohttp_errors(url):
            session = self._get_session()
            async with session.get(target, **self.environment(target, headers), params=params) as response:
                if response.status != 200:
                    raise await self.response_error(response, url, 0)
                with map_aiohttp_errors(url, reading=True, read_timeout=self._timeout.sock_read):
                    body = await response.read()
        try:
            return json.loads(body)
        except ValueError as exc:  # a body cut short or not JSON: an answer worth asking for again
            raise TransientError(f"unreadable JSON answer: {exc}", url=url) from None

    async def size(self, url: str) -> int | None:
        bucket, key = parse_gs_url(url)
        meta = await self._json(url, f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}")
        return int(meta["size"]) if "size" in meta else None

    async def list(self, pattern: str) -> list[str]:
        bucket, key_pattern = parse_gs_url(pattern)
        prefix, regex = glob_prefix(key_pattern), glob_regex(key_pattern)
        params = {"prefix": prefix, "fields": "items(name),nextPageToken", "maxResults": "1000"}
        if not any(c in key_pattern[len(prefix):] for c in "/[") and "**" not in key_pattern:
            params["delimiter"] = "/"  # matches stay in this level: skip the subtrees below it
        names: list[str] = []
        target = f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}/o"
        while True:
            try:
                page = await self._json(pattern, target, params)
            except NotFound as exc:
                raise NotFound(f"{exc.message} (no bucket {bucket!r}?)", url=exc.url) from None
            names.extend(item["name"] for item in page.get("items", ()) if regex.match(item["name"]))
            token = page.get("nextPageToken")
            if not token:
                break
            params["pageToken"] = token
        return [f"gs://{bucket}/{name}" for name in sorted(set(names))]
