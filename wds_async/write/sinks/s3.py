"""``s3://bucket/key``: a boto3 multipart upload, parts sent in the background.

The client is the reading backend's (:func:`wds_async.backends.s3.make_client`: the credential chain,
``AWS_PROFILE``, ``AWS_ENDPOINT_URL``/``endpoint_url``, region, ``anonymous``) with botocore's own retries
off: each call is retried by the sink's RetryPolicy instead. ``create_multipart_upload`` is sent when the
first part is full; ``upload_part`` for each part (at most two at once); ``complete_multipart_upload``
on ``close()``, or a single ``put_object`` for an object smaller than one part. ``abort()`` (and any failure)
sends ``abort_multipart_upload``, so no object and no pending upload remain.

Parts are 8 MiB unless told (S3 takes 5 MiB to 5 GiB, and 10,000 parts): the part size doubles every
1,000 parts, so that 5 TiB (S3's largest object) fits in 10,000 parts starting from 8 MiB ones (the last
are 4 GiB); the memory held stays about three parts of the size in use.
"""

from __future__ import annotations

import logging
from typing import Any

import botocore.exceptions

from ...backends.s3 import make_client, split_s3_url
from ...config import RetryPolicy
from ...errors import BackendError, PermissionDenied, TransientError, WdsError
from ...io import ObjectIdentity
from ...io.backend import status_error
from ...urls import redact_text
from ._parts import PartSink

__all__ = ["MIN_PART_BYTES", "S3Sink"]

#: S3's smallest part (all but the last).
MIN_PART_BYTES = 5 << 20

log = logging.getLogger("wds_async")

#: Aborting is best effort and must not hold up the error that caused it for long.
_ABORT_POLICY = RetryPolicy(attempts=3, base_delay=0.2, max_delay=1.0, deadline=10.0)


class S3Sink(PartSink):
    """A :class:`~wds_async.write.sinks.Sink` for ``s3://`` (see the module docstring)."""

    max_parts = 10_000
    part_name = "part"

    def __init__(self, url: str, options: dict[str, Any], *, part_bytes: int,
                 policy: RetryPolicy | None = None) -> None:
        super().__init__(url, part_bytes=part_bytes, policy=policy)
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"S3 parts are at least {MIN_PART_BYTES} bytes (5 MiB), not {part_bytes}")
        self.bucket, self.key = split_s3_url(url)
        self._client, self.credential_source = make_client(
            endpoint_url=options.get("endpoint_url"), region=options.get("region"), profile=options.get("profile"),
            anonymous=bool(options.get("anonymous", False)), retries=0, max_pool_connections=self.in_flight + 2,
            verify=options.get("ca_file"))
        self.upload_id: str | None = None
        self._etags: dict[int, str] = {}

    def _begin(self) -> None:
        answer = self._client.create_multipart_upload(Bucket=self.bucket, Key=self.key,
                                                      ContentType="application/x-tar")
        self.upload_id = str(answer["UploadId"])

    def _put(self, number: int, data: bytearray) -> None:
        answer = self._client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                          PartNumber=number, Body=data)
        self._etags[number] = str(answer["ETag"])

    def _finish(self, last: bytearray) -> ObjectIdentity:
        if self.upload_id is None:  # smaller than one part: one request, nothing to clean up after it
            answer = self._call("uploading the object", self._put_object, last)
            return ObjectIdentity(size=self.size, etag=str(answer["ETag"]))
        if last or not self._etags:  # S3 completes no upload of zero parts
            self._call(f"part {self.parts + 1}", self._put, self.parts + 1, last)
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in sorted(self._etags.items())]
        answer = self._call("completing the upload", self._complete, parts)
        return ObjectIdentity(size=self.size, etag=str(answer["ETag"]))

    def _put_object(self, data: bytearray) -> Any:
        return self._client.put_object(Bucket=self.bucket, Key=self.key, Body=data,
                                       ContentType="application/x-tar")

    def _complete(self, parts: list[dict[str, Any]]) -> Any:
        return self._client.complete_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                                      MultipartUpload={"Parts": parts})

    def _cancel(self) -> None:
        if self.upload_id is None:
            return
        try:
            self._call("aborting the upload", self._abort_upload, stoppable=False, policy=_ABORT_POLICY)
        except WdsError as exc:
            # S3 keeps the parts (and bills them) until an abort succeeds or a lifecycle rule removes them.
            log.warning("could not abort the multipart upload %s of %s: %s; remove it with 'aws s3api "
                        "abort-multipart-upload'", self.upload_id, self.url, exc)

    def _abort_upload(self) -> None:
        self._client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)

    def _translate(self, exc: Exception) -> WdsError:
        if isinstance(exc, botocore.exceptions.ClientError):
            error = exc.response.get("Error", {})
            code, message = str(error.get("Code", "")), redact_text(str(error.get("Message", "")))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            auth = f"AWS credentials: {self.credential_source}" if status in (401, 403) else ""
            return status_error(status, self.url, f"S3 {code}" if code else "", code=code, notes=(message, auth))
        if isinstance(exc, botocore.exceptions.NoCredentialsError):
            return PermissionDenied("no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                                    "AWS_PROFILE (the same as for reading)", url=self.url)
        if isinstance(exc, botocore.exceptions.HTTPClientError):
            return TransientError(f"S3 request failed: {redact_text(str(exc))}", url=self.url)
        if isinstance(exc, botocore.exceptions.BotoCoreError):
            return BackendError(f"S3 client error: {redact_text(str(exc))}", url=self.url)
        return BackendError(f"S3 upload failed: {type(exc).__name__}: {redact_text(str(exc))}", url=self.url)
