"""``s3://bucket/key``: data over aiohttp, signed by botocore.

botocore does what it is made for: the credential chain (environment, shared config and profiles,
``AWS_PROFILE``, assumed roles, container and instance metadata), region, custom endpoints
(``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` or the ``endpoint_url`` option, for MinIO and other
S3-compatible stores) and SigV4. Each download is a *presigned* GET: the signature covers the method,
bucket and key, so the ``Range`` header can be added freely and the bytes stream over the engine's
shared aiohttp session, with no thread per download. Presigning reads the (refreshable) credentials,
and a refresh may block on STS or the metadata service, so it runs in a thread via ``asyncio.to_thread``;
that is one hop per request, not per chunk. Listing uses the SDK's paginator, off the loop too.

Throttling (``503 SlowDown``) and 5xx are transient and retried by the engine; 403 names the
credential source botocore used (``env``, ``shared-credentials-file``, ``assume-role``, ...), never a key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from botocore import UNSIGNED
from botocore.config import Config

from wds_async.errors import BackendError, NotFound, PermissionDenied, Throttled, TransientError, UrlError

from .base import glob_prefix, glob_regex
from .http import HttpBackend

__all__ = ["S3Backend", "split_s3_url"]

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

    #: The store's API serves byte ranges on every object, whether or not an answer says Accept-Ranges.
    ranges_guaranteed = True

    def __init__(self, *, endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                 anonymous: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.endpoint_url = endpoint_url
        self.region = region
        self.profile = profile
        self.anonymous = anonymous
        self._client: Any = None
        self._client_lock: asyncio.Lock | None = None
        self.credential_source = "not resolved yet"

    # -- the SDK, off the loop -------------------------------------------------------------------
    def _make_client(self) -> Any:
        session = boto3.Session(profile_name=self.profile) if self.profile else boto3.Session()
        config = Config(
            signature_version=UNSIGNED if self.anonymous else "s3v4",
            s3={"addressing_style": "path"} if (self.endpoint_url or _env_endpoint()) else {},
            retries={"max_attempts": 2, "mode": "standard"},
            max_pool_connections=4,
        )
        client = session.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        if self.anonymous:
            self.credential_source = "anonymous (unsigned requests)"
        else:
            creds = session.get_credentials()
            self.credential_source = creds.method if creds is not None else "none found"
        return client

    async def _sdk(self, fn: Callable[..., T], *args: Any, url: str, **kwargs: Any) -> T:
        """Run a blocking SDK call in a thread and translate its errors at this boundary."""
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:
            if self._client is None:
                self._client = await asyncio.to_thread(self._make_client)
        try:
            return await asyncio.to_thread(fn, self._client, *args, **kwargs)
        except botocore.exceptions.NoCredentialsError:
            raise PermissionDenied(
                "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or pass "
                "backend_options={'anonymous': True} for a public bucket", url=url) from None
        except botocore.exceptions.ClientError as exc:
            raise self._client_error(exc, url) from None
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionClosedError,
                botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError) as exc:
            raise TransientError(f"S3 request failed: {exc}", url=url) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise BackendError(f"S3 client error: {exc}", url=url) from None

    def _client_error(self, exc: botocore.exceptions.ClientError, url: str) -> Exception:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("NoSuchBucket", "NoSuchKey", "404") or status == 404:
            return NotFound(f"S3 {code or 'HTTP 404'}: check the bucket and key", url=url)
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status in (401, 403):
            return PermissionDenied(f"S3 {code or 'HTTP 403'}: access denied [{self.auth_description()}]", url=url)
        if code in ("SlowDown", "ServiceUnavailable", "TooManyRequests") or status in (429, 503):
            return Throttled(f"S3 {code or status}: the store asks to slow down", url=url)
        if code in ("RequestTimeout", "InternalError") or status >= 500:
            return TransientError(f"S3 {code or status}: the store is throttling or failing", url=url)
        return BackendError(f"S3 {code or status}: {exc}", url=url)

    # -- HttpBackend hooks -------------------------------------------------------------------------
    async def resolve(self, url: str, start: int, end: int | None, method: str = "GET") -> tuple[str, dict[str, str]]:
        bucket, key = split_s3_url(url)
        operation = "head_object" if method == "HEAD" else "get_object"
        target = await self._sdk(_presign, operation, bucket, key, url=url)
        return target, await self.request_headers(url, start, end)

    def auth_description(self) -> str:
        return f"AWS credentials: {self.credential_source}"

    async def list(self, pattern: str) -> list[str]:
        bucket, key_pattern = split_s3_url(pattern)
        keys = await self._sdk(_list_keys, bucket, glob_prefix(key_pattern), url=pattern)
        regex = glob_regex(key_pattern)
        return [f"s3://{bucket}/{k}" for k in sorted(keys) if regex.match(k)]


def _env_endpoint() -> str | None:
    import os

    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _presign(client: Any, operation: str, bucket: str, key: str) -> str:
    return str(client.generate_presigned_url(operation, Params={"Bucket": bucket, "Key": key},
                                             ExpiresIn=PRESIGN_SECONDS))


def _list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", ()))
    return keys
