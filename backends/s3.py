"""``s3://bucket/key``: data over HttpBackend's GETs (the builtin HTTP/1.1 client), signed by botocore.

botocore does what it is made for: the credential chain (environment, shared config and profiles,
``AWS_PROFILE``, assumed roles, container and instance metadata), region, custom endpoints
(``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` or the ``endpoint_url`` option, for MinIO and other
S3-compatible stores) and SigV4. Each download is a *presigned* GET: the signature covers the method,
bucket and key, so the ``Range`` header can be added freely and the bytes stream over the backend's
connection pool on the engine's loop, with no thread per download. Presigning reads the (refreshable) credentials,
and a refresh may block on STS or the metadata service, so it runs in a thread via ``asyncio.to_thread``;
that is one hop per request, not per chunk. Listing uses the SDK's paginator, off the loop too.

A bucket in another region than the one configured needs no setting: S3 answers a request signed for
the wrong region with ``301 PermanentRedirect`` (the region in the ``x-amz-bucket-region`` header) or
``400 AuthorizationHeaderMalformed`` (in the XML ``<Region>``), a HEAD with 301/400 and the header. The
backend then remembers the bucket's region (per instance), signs again for it (and, on AWS, for its
regional endpoint) and retries once; later requests for the bucket are signed for it from the start.
Listing goes through the SDK, whose own region redirector (always on for S3 clients) does the same.

Start-up. Building a client is the SDK's slow step (it loads S3's service model and endpoint rules: about 0.1 to
0.3 s of CPU), so it is kept off the first sample's path and off the event loop. For an explicit endpoint
(``endpoint_url`` or ``AWS_ENDPOINT_URL[_S3]``, path-style) in a known region (the ``region`` option or
``AWS_DEFAULT_REGION``), downloads are presigned with botocore's own SigV4 query signer and credentials resolved
in a thread of their own (the credential chain's first resolution; no model loaded), and the client is built only
when something needs it (listing, a bucket in another region). Building it anyway, in a thread once the first
request was on its way (as this backend first did), cost the first second of a short epoch 0.1-0.3 s of CPU under
the GIL: 16 shards of 16 MB over https read at 0.83-0.84x ``s5cmd cp`` with that build and 0.93-0.99x without it.
Otherwise the client's build starts in the backend's constructor and the first request awaits it. Sessions,
clients and the credential chain's answers are the process's, shared by every backend with the same settings, so
each new epoch (a new backend) finds its client ready (:mod:`wds_async.backends.s3_clients`, fork-safe).

Throttling (``503 SlowDown``) and 5xx are transient and retried by the engine; 403 names the
credential source botocore used (``env``, ``shared-credentials-file``, ``assume-role``, ...), never a key.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import botocore.exceptions
import botocore.session
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest

from wds_async.errors import BackendError, PermissionDenied, TransientError, UrlError
from wds_async.io.backend import ByteStream, ObjectIdentity, glob_prefix, glob_regex, status_error
from wds_async.urls import redact_text

from ._errors import client_errors
from .http import Answer, HttpBackend
from .s3_clients import client_future, credentials_future, env_endpoint, make_client

__all__ = ["S3Backend", "WrongRegion", "client_future", "make_client", "split_s3_url"]

log = logging.getLogger("wds_async")

T = TypeVar("T")

#: Seconds a presigned URL stays valid: long enough for a slow shard to *start* (the signature is checked
#: when the request arrives, not while the body streams).
PRESIGN_SECONDS = 3600


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); raises UrlError when either part is missing."""
    parts = urlsplit(url)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if parts.scheme != "s3" or not bucket or not key:
        raise UrlError("malformed S3 URL: expected s3://bucket/key", url=url)
    return bucket, key


class S3Backend(HttpBackend):
    """Streams S3 (and S3-compatible) objects with presigned, ranged GETs."""

    #: The store's API serves byte ranges on every object, whether or not an answer says Accept-Ranges, and
    #: lists objects by prefix.
    capabilities = dataclasses.replace(HttpBackend.capabilities, ranges_guaranteed=True, listing=True)

    def __init__(self, *, endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                 anonymous: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.endpoint_url = endpoint_url
        self.region = region
        self.profile = profile
        self.anonymous = anonymous
        #: signing region (None: the configured one) -> the client being built or built for it
        self._clients: dict[str | None, concurrent.futures.Future[tuple[Any, str]]] = {}
        #: bucket -> the region the store named for it in a redirect; requests for it are signed for that.
        self.bucket_regions: dict[str, str] = {}
        self.credential_source = "not resolved yet"
        #: Requests to an explicit endpoint in a known region are signed with credentials resolved on their own
        #: (a thread too), without the client: see :meth:`_early_presign`.
        self._early: concurrent.futures.Future[Any] | None = None
        ignore_env = os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true"
        endpoint = endpoint_url or (None if ignore_env else env_endpoint())
        region = region or os.environ.get("AWS_DEFAULT_REGION")  # the one botocore reads (not AWS_REGION)
        if endpoint and region and not anonymous and not profile:
            self._early_target = (endpoint.rstrip("/"), region)
            self._early = credentials_future()
        else:
            self._future(None)  # the configured region's client: its build starts now, in a thread

    # -- the SDK, off the loop -------------------------------------------------------------------
    def _future(self, region: str | None) -> concurrent.futures.Future[tuple[Any, str]]:
        found = self._clients.get(region)
        if found is None or (found.done() and found.exception() is not None):  # a failed build is tried again
            found = self._clients[region] = client_future(endpoint_url=self.endpoint_url,
                                                          region=region or self.region, profile=self.profile,
                                                          anonymous=self.anonymous)
        return found

    async def _client(self, region: str | None) -> Any:
        client, self.credential_source = await asyncio.wrap_future(self._future(region))
        return client

    async def _sdk(self, fn: Callable[..., T], *args: Any, url: str, region: str | None = None, **kwargs: Any) -> T:
        """Run a blocking SDK call in a thread, with the client signing for ``region`` (None: the configured
        one), and translate its errors (the client's build included) at this boundary."""
        try:
            client = await self._client(region)
            return await asyncio.to_thread(fn, client, *args, **kwargs)
        except botocore.exceptions.NoCredentialsError:
            raise PermissionDenied(
                "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or pass "
                "backend_options={'anonymous': True} for a public bucket", url=url) from None
        except botocore.exceptions.ClientError as exc:
            raise self._client_error(exc, url) from None
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionClosedError,
                botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError) as exc:
            raise TransientError(f"S3 request failed: {redact_text(str(exc))}", url=url) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise BackendError(f"S3 client error: {redact_text(str(exc))}", url=url) from None

    def _client_error(self, exc: botocore.exceptions.ClientError, url: str) -> Exception:
        """An error answer to an SDK call, mapped by ``status_error`` as the byte path's answers are."""
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), redact_text(str(error.get("Message", "")))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        auth = self.auth_description() if status in (401, 403) else ""
        return status_error(status, url, f"S3 {code}" if code else "", code=code, notes=(message, auth))

    # -- HttpBackend hooks -------------------------------------------------------------------------
    async def resolve(self, url: str, start: int, end: int | None, method: str = "GET") -> tuple[str, dict[str, str]]:
        bucket, key = split_s3_url(url)
        target = await self._early_presign(method, bucket, key)
        if target is None:
            operation = "head_object" if method == "HEAD" else "get_object"
            target = await self._sdk(_presign, operation, bucket, key, url=url,
                                     region=self.bucket_regions.get(bucket))
        return target, await self.request_headers(url, start, end)

    async def _early_presign(self, method: str, bucket: str, key: str) -> str | None:
        """The presigned URL of a request, without the SDK client (it loads the S3 models: ~0.1 to 0.3 s of CPU),
        for an explicit endpoint (path-style, as the client addresses it) in a region given by the ``region``
        option or ``AWS_DEFAULT_REGION``: signed with botocore's own SigV4 query signer, so the URL is the one the
        client makes (tests/backends/test_s3_startup.py compares them). None for a bucket whose region was learnt,
        or without credentials (the client's path then reports that)."""
        early = self._early
        if early is None or method not in ("GET", "HEAD") or bucket in self.bucket_regions:
            return None
        try:
            creds = await asyncio.wrap_future(early)
        except Exception:  # the client's build meets the same problem and reports it
            self._early = None
            return None
        if creds is None:
            return None
        endpoint, region = self._early_target
        self.credential_source = creds.method
        return await asyncio.to_thread(_sign_path_style, creds, method, endpoint, region, bucket, key)

    # -- a bucket in another region: learn it from the answer, sign again, retry once ------------------
    @asynccontextmanager
    async def open(self, url: str, *, start: int = 0, end: int | None = None,
                   expect: ObjectIdentity | None = None) -> AsyncIterator[ByteStream]:
        opened = False
        try:
            async with super().open(url, start=start, end=end, expect=expect) as stream:
                opened = True
                yield stream
            return
        except WrongRegion as exc:
            if opened:  # not ours: raised by the caller's code while it read the stream
                raise
            self._learn_region(url, exc.region)
        async with super().open(url, start=start, end=end, expect=expect) as stream:
            yield stream

    async def size(self, url: str) -> int | None:
        try:
            return await super().size(url)
        except WrongRegion as exc:
            self._learn_region(url, exc.region)
        return await super().size(url)

    def _learn_region(self, url: str, region: str) -> None:
        bucket, _ = split_s3_url(url)
        log.debug("S3 bucket %s is in region %s; signing its requests for that region (backend_options "
                  "{'s3': {'region': %r}} avoids this first redirect)", bucket, region, region)
        self.bucket_regions[bucket] = region

    async def response_error(self, response: Answer, shown: str, offset: int) -> Exception:
        """A :class:`WrongRegion` when S3 names another region for the bucket than the one the request was
        signed for (301/307 or 400, from the ``x-amz-bucket-region`` header or the XML ``<Region>``)."""
        if response.status not in (301, 307, 400):
            return await super().response_error(response, shown, offset)
        body = b""
        if response.method != "HEAD":
            failed: tuple[type[BaseException], ...] = (TimeoutError, *client_errors())
            try:
                body = await response.content.read(4096)
            except failed:
                pass
        code = _xml(body, "Code") or str(response.status)
        region = response.headers.get("x-amz-bucket-region") or _xml(body, "Region")
        signed = _signed_region(str(response.url), response.request_info.headers.get("Authorization", ""))
        if region and region != signed:
            return WrongRegion(f"S3 {code}: the bucket is in region {region!r}, the request was signed for "
                               f"{signed!r}; backend_options={{'s3': {{'region': {region!r}}}}} names it",
                               region=region, url=shown, offset=offset)
        err = status_error(response.status, shown, response.reason or "", offset=offset)
        if isinstance(err, BackendError):
            named = f"; refused although signed for the region the store names, {region!r}" if region else ""
            err.message = f"{err.message} [{code}{named}]"
        return err

    def auth_description(self) -> str:
        return f"AWS credentials: {self.credential_source}"

    async def list(self, pattern: str) -> list[str]:
        bucket, key_pattern = split_s3_url(pattern)
        keys = await self._sdk(_list_keys, bucket, glob_prefix(key_pattern), url=pattern,
                               region=self.bucket_regions.get(bucket))
        regex = glob_regex(key_pattern)
        return [f"s3://{bucket}/{k}" for k in sorted(keys) if regex.match(k)]


class WrongRegion(BackendError):
    """S3 named another region for the bucket (``region``) than the request was signed for. The backend
    retries once signed for it; this reaches the caller only when that retry is refused too."""

    def __init__(self, message: str, *, region: str, url: str | None = None, offset: int | None = None) -> None:
        super().__init__(message, url=url, offset=offset)
        self.region = region


def _xml(body: bytes, tag: str) -> str:
    """The text of the first ``<tag>`` in an S3 error body, or ''."""
    m = re.search(rb"<" + tag.encode() + rb">([^<]{1,200})</" + tag.encode() + rb">", body)
    return m.group(1).decode("utf-8", "replace").strip() if m else ""


def _signed_region(url: str, authorization: str) -> str | None:
    """The region in a SigV4 credential scope (``AKID/DATE/REGION/s3/aws4_request``): the presigned URL's
    ``X-Amz-Credential``, else the ``Authorization`` header's ``Credential=``; None when unsigned."""
    scope = parse_qs(urlsplit(url).query).get("X-Amz-Credential", [""])[0]
    if not scope:
        m = re.search(r"Credential=([^,\s]+)", authorization)
        scope = m.group(1) if m else ""
    parts = scope.split("/")
    return parts[2] if len(parts) >= 5 else None


def _sign_path_style(creds: Any, method: str, endpoint: str, region: str, bucket: str, key: str) -> str:
    """``endpoint/bucket/key`` presigned for ``method`` as the client presigns it (SigV4 query, host signed)."""
    request = AWSRequest(method=method, url=f"{endpoint}/{bucket}/{quote(key, safe='/~')}")
    S3SigV4QueryAuth(creds.get_frozen_credentials(), "s3", region, expires=PRESIGN_SECONDS).add_auth(request)
    return str(request.prepare().url)


def _presign(client: Any, operation: str, bucket: str, key: str) -> str:
    return str(client.generate_presigned_url(operation, Params={"Bucket": bucket, "Key": key},
                                             ExpiresIn=PRESIGN_SECONDS))


def _list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", ()))
    return keys
