"""``az://container/blob``, ``azure://...`` and Azure Blob https URLs: staged blocks, one commit.

Credentials are resolved by the reading backend (:meth:`AzureBackend.sdk_client_args
<wds_async.backends.azure.AzureBackend.sdk_client_args>`: ``backend_options``, then
``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT``/``KEY``/``SAS_TOKEN``, a SAS in the URL, or a
token credential; azure-identity's ``DefaultAzureCredential`` when nothing else is configured) and handed
to azure-storage-blob's ``BlobClient``, whose own retries are off (the sink's RetryPolicy retries).
Each block (8 MiB unless told) is staged with ``stage_block`` in the background, at most two at once, its
MD5 checked by the service; ``close()`` commits the block list. Until then the blob does not change:
staged blocks are invisible, and the service drops uncommitted ones after a week, so ``abort()`` has
nothing to remove. Block ids are ``wds-<random>-<number>``, one length for every writer of this library.
"""

from __future__ import annotations

import inspect
import secrets
from typing import Any

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobBlock, BlobClient, ContentSettings

from ...backends.azure import AzureBackend, parse_url
from ...config import RetryPolicy
from ...errors import BackendError, MissingDependency, PermissionDenied, TransientError, WdsError
from ...io import ObjectIdentity
from ...io.backend import status_error
from ._parts import PartSink

__all__ = ["AzureSink"]

#: Azure's largest block.
MAX_BLOCK_BYTES = 4000 << 20


class AzureSink(PartSink):
    """A :class:`~wds_async.write.sinks.Sink` for Azure Blob Storage (see the module docstring)."""

    max_parts = 50_000
    part_name = "block"

    def __init__(self, url: str, options: dict[str, Any], *, part_bytes: int,
                 policy: RetryPolicy | None = None) -> None:
        super().__init__(url, part_bytes=part_bytes, policy=policy)
        if not 0 < part_bytes <= MAX_BLOCK_BYTES:
            raise ValueError(f"Azure blocks hold 1 byte to {MAX_BLOCK_BYTES} bytes (4000 MiB), not {part_bytes}")
        backend = AzureBackend(**options)  # nothing opened: it only resolves the credential
        kwargs, mode = backend.sdk_client_args(url)
        self._owned_credential: Any = None
        if mode == "token" and kwargs["credential"] is None:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError:
                raise MissingDependency("writing to Azure without a key or SAS needs azure-identity: pip install "
                                        "'wds-async[azure]'", url=self.url) from None
            kwargs["credential"] = self._owned_credential = DefaultAzureCredential()
        credential = kwargs["credential"]
        if inspect.iscoroutinefunction(getattr(credential, "get_token", None)):
            raise ValueError("writing to Azure takes a synchronous token credential (azure.identity, not "
                             "azure.identity.aio)")
        self.credential_source = backend.credential_source(parse_url(url))
        if mode == "token" and self._owned_credential is not None:
            self.credential_source = "DefaultAzureCredential"
        extra = {"connection_verify": options["ca_file"]} if options.get("ca_file") else {}
        self._client = BlobClient(**kwargs, retry_total=0, **extra)
        self._prefix = f"wds-{secrets.token_hex(8)}-"
        self._blocks: dict[int, str] = {}

    def _block_id(self, number: int) -> str:
        return f"{self._prefix}{number:08d}"

    def _send_part(self, number: int, part: bytearray) -> None:
        data = bytes(part)  # the SDK checks an MD5 of bytes only; the part's own buffer is freed now
        del part[:]
        self._call(f"block {number}", self._put, number, data)

    def _put(self, number: int, data: bytes | bytearray) -> None:
        block_id = self._block_id(number)
        self._client.stage_block(block_id, bytes(data), length=len(data), validate_content="md5")
        self._blocks[number] = block_id

    def _finish(self, last: bytearray) -> ObjectIdentity:
        if last:
            self._call(f"block {self.parts + 1}", self._put, self.parts + 1, last)
        blocks = [BlobBlock(block_id=block_id) for _, block_id in sorted(self._blocks.items())]
        answer = self._call("committing the block list", self._commit, blocks)
        etag = answer.get("etag")
        return ObjectIdentity(size=self.size, etag=str(etag) if etag else None)

    def _commit(self, blocks: list[BlobBlock]) -> dict[str, Any]:
        return dict(self._client.commit_block_list(
            blocks, content_settings=ContentSettings(content_type="application/x-tar")))

    def _release(self) -> None:
        super()._release()
        self._client.close()
        if self._owned_credential is not None:
            self._owned_credential.close()

    def _translate(self, exc: Exception) -> WdsError:
        if isinstance(exc, ClientAuthenticationError) and exc.status_code is None:
            return PermissionDenied(f"{self.credential_source} could not get a token: "
                                    f"{str(exc.message).splitlines()[0] if exc.message else exc}", url=self.url)
        if isinstance(exc, HttpResponseError) and exc.status_code:
            code = getattr(exc, "error_code", None)
            return status_error(exc.status_code, self.url, str(exc.reason or ""), code=code,
                                notes=(f"x-ms-error-code: {code}" if code else "", f"credential: {self.credential_source}"))
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
            return TransientError(f"Azure request failed: {type(exc).__name__}", url=self.url)
        return BackendError(f"Azure upload failed: {type(exc).__name__}: {str(exc)[:300]}", url=self.url)

