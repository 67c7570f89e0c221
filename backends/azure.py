"""Azure Blob Storage: ``az://container/blob`` and ``https://ACCOUNT.blob.core.windows.net/container/blob``.

The bytes move as ranged Blob REST GETs through the inherited HttpBackend (its builtin HTTP/1.1 client; HEAD requests
through its aiohttp session), with no thread per download.
azure-storage-blob is used only for what it must own: the SAS signature for account-key auth
(``generate_blob_sas`` / ``generate_container_sas``), so no signing scheme is written by hand here.

Credentials, first match wins (for https URLs, an account key or SAS applies only to its own account):

1. ``backend_options``: ``anonymous=True``; ``credential=`` (a TokenCredential, AzureNamedKeyCredential,
   AzureSasCredential, or a string: a SAS if it contains ``sig=``, else an account key); ``account_key=``;
   ``sas_token=``; ``connection_string=`` (replaces ``AZURE_STORAGE_CONNECTION_STRING``);
2. ``AZURE_STORAGE_CONNECTION_STRING``: AccountKey, then SharedAccessSignature;
3. ``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY``, then ``AZURE_STORAGE_SAS_TOKEN``;
4. azure-identity's ``DefaultAzureCredential`` (bearer token), falling back to anonymous access (public
   containers) when it finds no credential at all.

A SAS already in an https URL's query is used as is. The blob endpoint of ``az://`` URLs is
``blob_endpoint=``, else the connection string's BlobEndpoint (Azurite), else
``https://{account}.blob.{EndpointSuffix}``.

Listing uses the List Blobs REST API on the same session rather than ``ContainerClient.list_blobs`` in a
thread: one auth path (the SAS, bearer or anonymous request the reads use), one error translation, no
second HTTP stack (requests/urllib3 with its own pool, sockets and retry policy) to configure and close.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from azure.core.exceptions import ClientAuthenticationError
from azure.storage.blob import BlobSasPermissions, ContainerSasPermissions, generate_blob_sas, generate_container_sas

from wds_async.errors import BackendError, PermissionDenied, TransientError, UrlError
from wds_async.io.backend import ByteStream, ObjectIdentity, glob_prefix, glob_regex, status_error
from wds_async.urls import redact_url

from ._errors import map_aiohttp_errors
from .http import Answer, HttpBackend

__all__ = ["AzureBackend", "parse_connection_string"]

log = logging.getLogger(__name__)

API_VERSION = "2021-08-06"
TOKEN_SCOPE = "https://storage.azure.com/.default"
SAS_LIFETIME = timedelta(hours=1)
REFRESH_MARGIN = 300.0  # seconds: a token or SAS is renewed this long before it expires
SAS_CACHE_SIZE = 4096
LIST_PAGE = 5000
_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}|\$root|\$web|\$logs")


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` with keys lower-cased; values keep their ``=`` (SAS tokens contain them)."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, eq, value = part.partition("=")
        if not eq:  # never echo the segment: it may hold the key
            raise BackendError("malformed Azure connection string: a segment has no '='")
        fields[key.strip().lower()] = value.strip()
    return fields


@dataclass(frozen=True)
class _Target:
    """Where a URL points: ``base`` is the endpoint for https URLs, None for az:// (configured one)."""

    prefix: str        # how the URL began ("az://" or "https://host/"), to list in the same form
    base: str | None
    account: str | None
    container: str
    blob: str
    query: str         # a SAS the URL carries itself


def parse_url(url: str) -> _Target:
    """Split an az:// or https Blob URL; the https path is percent-decoded, az:// keys are literal."""
    prefix = next((p for p in ("az://", "azure://") if url.startswith(p)), None)
    if prefix is not None:
        container, _, blob = url[len(prefix):].partition("/")
        target = _Target(prefix, None, None, container, blob, "")
    else:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        container, _, blob = unquote(parts.path).lstrip("/").partition("/")
        if parts.scheme != "https" or ".blob." not in host:
            raise UrlError("not an Azure Blob URL: expected az://container/blob or "
                           "https://ACCOUNT.blob.core.windows.net/container/blob", url=redact_url(url))
        target = _Target(f"https://{parts.netloc}/", f"https://{parts.netloc}", host.split(".")[0], container,
                         blob, parts.query)
    if not blob or not _CONTAINER.fullmatch(container):  # Azure would answer 400 InvalidResourceName
        raise UrlError("an Azure URL needs a container (3-63 lowercase letters, digits, hyphens) and a blob name, "
                       "as in az://container/dir/shard.tar", url=redact_url(url))
    return target


class AzureBackend(HttpBackend):
    """Ranged Blob GETs authorised by a cached SAS (account key or given), a bearer token, or nothing."""

    #: The store's API serves byte ranges on every object, whether or not an answer says Accept-Ranges, and
    #: lists objects by prefix.
    capabilities = dataclasses.replace(HttpBackend.capabilities, ranges_guaranteed=True, listing=True)

    def __init__(self, *, connection_string: str | None = None, account_name: str | None = None,
                 account_key: str | None = None, sas_token: str | None = None, credential: Any = None,
                 anonymous: bool = False, blob_endpoint: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        env = os.environ.get
        cs = parse_connection_string(connection_string or env("AZURE_STORAGE_CONNECTION_STRING", ""))
        endpoint = blob_endpoint or cs.get("blobendpoint")
        self._endpoint = endpoint.rstrip("/") if endpoint else None
        self._suffix = cs.get("endpointsuffix", "core.windows.net")
        self._protocol = cs.get("defaultendpointsprotocol", "https")
        host = urlsplit(self._endpoint or "").hostname or ""
        self.account = (account_name or cs.get("accountname") or env("AZURE_STORAGE_ACCOUNT")
                        or (host.split(".")[0] if ".blob." in host else None))
        if isinstance(credential, str):  # as the SDK reads it: a SAS when it has a signature, else a key
            if "sig=" in credential:
                sas_token = credential
            else:
                account_key = credential
            credential = None
        elif hasattr(credential, "named_key"):  # AzureNamedKeyCredential
            self.account, account_key = credential.named_key
            credential = None
        elif hasattr(credential, "signature"):  # AzureSasCredential
            sas_token, credential = credential.signature, None
        levels = [(account_key, sas_token), (cs.get("accountkey"), cs.get("sharedaccesssignature")),
                  (env("AZURE_STORAGE_KEY"), env("AZURE_STORAGE_SAS_TOKEN"))]
        if credential is not None:  # an explicit token credential outranks keys found in the environment
            levels = levels[:1]
        self._key: str | None = None
        self._sas: str | None = None
        for key, sas in levels:  # within a level, a key before a SAS
            if key or sas:
                self._key, self._sas = (key, None) if key else (None, (sas or "").lstrip("?"))
                break
        self._anonymous = anonymous
        self._credential = credential           # a TokenCredential; DefaultAzureCredential made on first use
        self._owns_credential = False
        self._no_token = False                  # DefaultAzureCredential found nothing: go anonymous
        self._token: tuple[str, float] | None = None
        self._token_lock = asyncio.Lock()
        self._sas_cache: dict[tuple[str, str | None], tuple[str, datetime]] = {}

    # -- credentials -------------------------------------------------------------------------------------

    def _mode(self, target: _Target) -> str:
        """'url', 'key', 'sas', 'token' or 'anonymous' for this target."""
        if target.query:
            return "url"
        if self._anonymous:
            return "anonymous"
        mine = target.account is None or target.account == (self.account or "").lower()
        if mine and self._key:
            return "key"
        if mine and self._sas:
            return "sas"
        return "anonymous" if self._no_token else "token"

    def credential_source(self, target: _Target) -> str:
        """The name of the credential used, for error messages (never the secret itself)."""
        mode = self._mode(target)
        if mode == "token" and self._credential is not None and not self._owns_credential:
            return type(self._credential).__name__
        if mode == "anonymous" and self._no_token:
            return "anonymous (no key, SAS or token credential found)"
        return {"url": "SAS token (in the URL)", "key": "account key", "sas": "SAS token",
                "token": "DefaultAzureCredential", "anonymous": "anonymous"}[mode]

    def _signed(self, container: str, blob: str | None) -> str:
        """A read (and, for a container, list) SAS signed with the account key; cached until near expiry."""
        now = datetime.now(UTC)
        hit = self._sas_cache.get((container, blob))
        if hit is not None and (hit[1] - now).total_seconds() > REFRESH_MARGIN:
            return hit[0]
        if not self.account:
            raise BackendError("an Azure account key needs the account name: set AccountName or AZURE_STORAGE_ACCOUNT")
        expiry = now + SAS_LIFETIME
        if blob is None:
            sas = generate_container_sas(self.account, container, account_key=self._key,
                                         permission=ContainerSasPermissions(read=True, list=True), expiry=expiry)
        else:
            sas = generate_blob_sas(self.account, container, blob, account_key=self._key,
                                    permission=BlobSasPermissions(read=True), expiry=expiry)
        if len(self._sas_cache) >= SAS_CACHE_SIZE:
            self._sas_cache.pop(next(iter(self._sas_cache)))  # oldest first: dicts keep insertion order
        self._sas_cache[(container, blob)] = (sas, expiry)
        return sas

    def _query(self, target: _Target, *, listing: bool = False) -> str:
        mode = self._mode(target)
        if mode == "key":
            return self._signed(target.container, None if listing else target.blob)
        return {"url": target.query, "sas": self._sas or ""}.get(mode, "")

    async def _bearer(self, url: str) -> str | None:
        """A bearer token, refreshed off the loop ~5 min before expiry; one refresh at a time."""
        if self._token is not None and self._token[1] - time.time() > REFRESH_MARGIN:
            return self._token[0]
        async with self._token_lock:
            if self._token is not None and self._token[1] - time.time() > REFRESH_MARGIN:
                return self._token[0]
            if self._credential is None:
                try:
                    from azure.identity import DefaultAzureCredential
                except ImportError:
                    self._no_token = True
                    return None
                self._credential, self._owns_credential = DefaultAzureCredential(), True
            source, get = type(self._credential).__name__, self._credential.get_token
            try:
                token = await get(TOKEN_SCOPE) if inspect.iscoroutinefunction(get) else \
                    await asyncio.to_thread(get, TOKEN_SCOPE)
            except ClientAuthenticationError as exc:
                if self._owns_credential:  # nothing configured anywhere: try public access
                    log.info("DefaultAzureCredential found no credential; reading Azure anonymously")
                    await self._close_credential()
                    self._no_token = True
                    return None
                raise PermissionDenied(f"{source} could not get a token: {exc.message.splitlines()[0]}",
                                       url=redact_url(url)) from None
            except Exception as exc:  # foreign errors stop at the backend boundary
                raise TransientError(f"{source} token request failed ({type(exc).__name__})",
                                     url=redact_url(url)) from None
            self._token = (str(token.token), float(token.expires_on))
            return self._token[0]

    # -- requests ----------------------------------------------------------------------------------------

    def _base(self, target: _Target, url: str) -> str:
        base = target.base or self._endpoint
        if base is None:
            if not self.account:
                raise BackendError("no Azure storage account configured: set AZURE_STORAGE_CONNECTION_STRING or "
                                   "AZURE_STORAGE_ACCOUNT, or pass backend_options={'account_name': ...}",
                                   url=redact_url(url))
            base = f"{self._protocol}://{self.account}.blob.{self._suffix}"
        return base

    def _object_url(self, target: _Target, blob: str | None, url: str) -> str:
        return f"{self._base(target, url)}/{target.container}" + ("" if blob is None else "/" + quote(blob, safe="/"))

    def sdk_client_args(self, url: str) -> tuple[dict[str, Any], str]:
        """Keyword arguments for azure-storage-blob's ``BlobClient`` reaching ``url`` with the credential
        reads resolve (above), and its mode: 'url' (the URL's own SAS), 'key', 'sas', 'token' (the
        ``credential`` given, or None when the caller is to find one) or 'anonymous'. For the writers."""
        target = parse_url(url)
        mode = self._mode(target)
        credential: Any = None
        if mode == "key":
            if not self.account:
                raise BackendError("an Azure account key needs the account name: set AccountName or "
                                   "AZURE_STORAGE_ACCOUNT", url=redact_url(url))
            from azure.core.credentials import AzureNamedKeyCredential

            credential = AzureNamedKeyCredential(self.account, self._key or "")
        elif mode in ("url", "sas"):
            credential = target.query if mode == "url" else self._sas
        elif mode == "token":
            credential = self._credential
        return {"account_url": self._base(target, url), "container_name": target.container, "blob_name": target.blob,
                "credential": credential}, mode

    def request_url(self, url: str) -> str:
        target = parse_url(url)
        query = self._query(target)
        return self._object_url(target, target.blob, url) + (f"?{query}" if query else "")

    async def request_headers(self, url: str, start: int, end: int | None) -> dict[str, str]:
        headers = await super().request_headers(url, start, end)
        headers["x-ms-version"] = API_VERSION
        if self._mode(parse_url(url)) == "token":
            token = await self._bearer(url)
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _send(self, method: str, url: str, target_url: str, headers: dict[str, str],
                    start: int | None = None) -> Answer:
        """One request (a GET through :meth:`get`, so the builtin client); any status but 200/206 becomes an error
        naming the user URL and credential."""
        shown = redact_url(url)
        response: Answer
        if method == "GET":
            response = await self.get(target_url, headers, shown, start)
        else:
            with map_aiohttp_errors(shown, start):  # its messages are scrubbed: the request URL carries the SAS
                session = self._get_session()
                response = await session.request(method, target_url, **self.environment(target_url, headers),
                                                 allow_redirects=True)
        if response.status in (200, 206):
            return response
        response.close()
        code = response.headers.get("x-ms-error-code")
        # The credential on every status: Azure answers 404, not 403, to anonymous reads of a private container.
        raise status_error(response.status, shown, response.reason or "", offset=start, code=code,
                           notes=(f"x-ms-error-code: {code}" if code else "",
                                  f"credential: {self.credential_source(parse_url(url))}"))

    @asynccontextmanager
    async def open(self, url: str, *, start: int = 0, end: int | None = None,
                   expect: ObjectIdentity | None = None) -> AsyncIterator[ByteStream]:
        plain_url = self.request_url(url)  # first: an account missing is said before any credential is sought
        headers = await self.request_headers(url, start, end)
        target_url = self.conditions(plain_url, headers, expect)
        response = await self._send("GET", url, target_url, headers, start)
        async with self.streaming(response, redact_url(url), start, end) as stream:
            yield stream

    async def size(self, url: str) -> int | None:
        """Content-Length of a HEAD (Get Blob Properties)."""
        target_url = self.request_url(url)
        response = await self._send("HEAD", url, target_url, await self.request_headers(url, 0, None))
        response.release()
        return response.content_length

    async def list(self, pattern: str) -> list[str]:
        """Matches of a glob URL, sorted, in the URL form given (List Blobs on the glob's literal prefix)."""
        target = parse_url(pattern)
        regex, prefix = glob_regex(target.blob), glob_prefix(target.blob)
        base, names, marker = self._object_url(target, None, pattern), [], ""
        while True:
            params = {"restype": "container", "comp": "list", "prefix": prefix, "maxresults": str(LIST_PAGE)}
            if marker:
                params["marker"] = marker
            query = "&".join(filter(None, (urlencode(params), self._query(target, listing=True))))
            headers = await self.request_headers(pattern, 0, None)
            response = await self._send("GET", pattern, f"{base}?{query}", headers)
            try:
                with map_aiohttp_errors(pattern, reading=True, read_timeout=self._timeout.sock_read):
                    body = await response.content.read()
            finally:
                response.release()
            try:
                root = ET.fromstring(body)
            except ET.ParseError:
                raise BackendError("the List Blobs answer is not valid XML", url=redact_url(pattern)) from None
            for element in root.iterfind("Blobs/Blob/Name"):
                name = unquote(element.text or "") if element.get("Encoded") == "true" else element.text or ""
                if regex.match(name):
                    names.append(name)
            marker = root.findtext("NextMarker") or ""
            if not marker:
                break
        if target.base is None:  # az:// keys are literal; https paths are percent-encoded
            return [f"{target.prefix}{target.container}/{n}" for n in sorted(names)]
        query = f"?{target.query}" if target.query else ""
        return [f"{target.prefix}{target.container}/{quote(n, safe='/')}{query}" for n in sorted(names)]

    async def _close_credential(self) -> None:
        if self._owns_credential and self._credential is not None:
            credential, self._credential, self._owns_credential = self._credential, None, False
            await asyncio.to_thread(credential.close)

    async def aclose(self) -> None:
        await super().aclose()
        await self._close_credential()
