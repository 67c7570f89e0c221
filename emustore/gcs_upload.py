"""The emulated store's GCS uploads: ``/upload/storage/v1/b/BUCKET/o`` with ``uploadType`` ``media``,
``multipart`` (JSON metadata, then the media) or ``resumable``.

A resumable session is a staging folder of the file layer whose ``data`` file grows chunk by chunk
(``Content-Range: bytes a-b/total``); it answers 308 with ``Range: bytes=0-N`` until the last byte,
then publishes the object. Every upload is checked against the hashes the client sent (``md5Hash``,
``crc32c``, ``x-goog-hash``) and the request's generation preconditions before it replaces the file.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import BodyPartReader, web

from emustore.gcs_json import (
    check_generation,
    file_generation,
    json_body,
    object_json,
    parse_goog_hash,
)
from emustore.http import (
    BODY_CHUNK,
    BODY_ERRORS,
    WRITE,
    Call,
    StoreError,
    method_not_allowed,
    read_body,
    send_continue,
)
from emustore.knobs import Plan
from emustore.objects import Files, file_digests, unlink_quiet

__all__ = ["GcsUploads"]

_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)")


class GcsUploads:
    """The upload endpoints of the GCS JSON API: ``POST`` starts one, ``PUT`` feeds a resumable
    session, ``DELETE`` cancels it."""

    def __init__(self, files: Files) -> None:
        self.files = files

    def route(self, request: web.BaseRequest) -> Call:
        path, method = request.path, request.method
        segments = path[len("/upload/storage/v1/"):].split("/")
        if len(segments) != 3 or segments[0] != "b" or segments[2] != "o":
            raise StoreError(404, "NotFound", f"Not Found: {path}")
        handlers = {"POST": self.upload_start, "PUT": self.upload_chunk, "DELETE": self.upload_cancel}
        if method not in handlers:
            raise method_not_allowed()
        return Call(WRITE, functools.partial(handlers[method], bucket=segments[1]))

    async def upload_start(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        """``POST /upload/storage/v1/b/B/o?uploadType=media|multipart|resumable``."""
        kind = request.query.get("uploadType", "media")
        if kind == "media":
            name = request.query.get("name", "")
            final = self._upload_target(bucket, name)
            tmp = await self.files.receive(request, final, request.content.iter_chunked(BODY_CHUNK))
            return await self._finish(request, bucket, name, tmp, final, {}, request.query)
        if kind == "multipart":
            return await self._multipart(request, bucket)
        if kind == "resumable":
            return await self._begin_resumable(request, bucket)
        raise StoreError(400, "InvalidArgument", f"unknown uploadType {kind!r}")

    def _upload_target(self, bucket: str, name: str) -> str:
        if not name:
            raise StoreError(400, "InvalidArgument", "Required parameter: name")
        return self.files.target(bucket, name)

    async def _multipart(self, request: web.BaseRequest, bucket: str) -> web.StreamResponse:
        """``uploadType=multipart``: a multipart/related body, JSON metadata then the media."""
        try:
            await send_continue(request)
            reader = await request.multipart()
            first = await reader.next()
            meta = json_body(await first.read()) if isinstance(first, BodyPartReader) else {}
            media = await reader.next()
        except BODY_ERRORS as exc:
            raise StoreError(400, "InvalidArgument", f"malformed multipart upload: {exc}") from None
        if not isinstance(media, BodyPartReader):
            raise StoreError(400, "InvalidArgument", "a multipart upload needs a metadata part and a media part")
        name = str(meta.get("name") or request.query.get("name", ""))
        final = self._upload_target(bucket, name)
        tmp = await self.files.receive(request, final, _part_chunks(media))
        expected: dict[str, str] = {k: str(meta[k]) for k in ("md5Hash", "crc32c") if k in meta}
        return await self._finish(request, bucket, name, tmp, final, expected, request.query)

    async def _begin_resumable(self, request: web.BaseRequest, bucket: str) -> web.StreamResponse:
        """``uploadType=resumable``: a session; its URL (``Location``) takes the bytes in chunks."""
        meta = json_body(await read_body(request))
        name = str(meta.get("name") or request.query.get("name", ""))
        self._upload_target(bucket, name)
        length = request.headers.get("X-Upload-Content-Length")
        conditions = {k: v for k, v in request.query.items() if k.startswith("if")}
        upload_id, folder = self.files.new_upload({
            "api": "gcs", "bucket": bucket, "name": name, "conditions": conditions,
            "total": int(length) if length and length.isdigit() else None})
        open(os.path.join(folder, "data"), "wb").close()  # noqa: ASYNC230 - an empty local file
        location = (f"{request.scheme}://{request.host}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
                    f"?uploadType=resumable&upload_id={upload_id}")
        return web.Response(headers={"Location": location, "X-GUploader-UploadID": upload_id})

    def _session(self, request: web.BaseRequest, bucket: str) -> tuple[str, dict[str, Any]]:
        staged = self.files.upload(request.query.get("upload_id"), "gcs")
        if staged is None or staged[1].get("bucket") != bucket:
            raise StoreError(404, "NoSuchUpload", "No such upload session")
        return staged

    async def upload_chunk(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        """A PUT to a resumable session: ``Content-Range: bytes a-b/total`` (or ``/*``), or a status query
        ``bytes */total``; 308 with ``Range: bytes=0-N`` until the last byte, then 200 with the object."""
        folder, meta = self._session(request, bucket)
        data = os.path.join(folder, "data")
        have = os.path.getsize(data)  # noqa: ASYNC240 - one local stat per chunk, beside the chunk's writes
        first, last, total = _content_range(request.headers.get("Content-Range"))
        if first is not None:
            if first > have:
                raise StoreError(400, "InvalidArgument", f"the chunk starts at byte {first}; {have} bytes are stored")
            have = first + await self._append(request, data, first)
            if last is not None and have != last + 1:
                raise StoreError(400, "InvalidArgument", "the chunk's length differs from its Content-Range")
        if total == -1:  # a single PUT without Content-Range: the whole object
            total = have
        total = total if total is not None else meta.get("total")
        if total is not None and have >= total:
            if have != total:
                raise StoreError(400, "InvalidArgument", f"{have} bytes received for an object of {total}")
            name = str(meta["name"])
            final = self._upload_target(bucket, name)
            expected = parse_goog_hash(request.headers.get("x-goog-hash", ""))
            resp = await self._finish(request, bucket, name, data, final, expected, meta.get("conditions", {}))
            shutil.rmtree(folder, ignore_errors=True)
            return resp
        headers = {"Range": f"bytes=0-{have - 1}"} if have else {}
        return web.Response(status=308, reason="Resume Incomplete", headers=headers)

    async def _append(self, request: web.BaseRequest, data: str, offset: int) -> int:
        """Write the request's body into the session's file at ``offset``; the number of bytes."""
        written = 0
        try:
            with open(data, "r+b") as f:  # noqa: ASYNC230 - a local file, written as the body arrives
                f.seek(offset)
                f.truncate()
                await send_continue(request)
                async for chunk in request.content.iter_chunked(BODY_CHUNK):
                    f.write(chunk)
                    written += len(chunk)
                    self.files.bytes_received += len(chunk)
        except BODY_ERRORS as exc:
            raise StoreError(400, "IncompleteBody", f"the request body could not be read: {exc}") from None
        return written

    async def upload_cancel(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        folder, _ = self._session(request, bucket)
        shutil.rmtree(folder, ignore_errors=True)
        return web.Response(status=499, reason="Client Closed Request")

    async def _finish(self, request: web.BaseRequest, bucket: str, name: str, tmp: str, final: str,
                      expected: Mapping[str, str], conditions: Mapping[str, str]) -> web.StreamResponse:
        """Check the received file's hashes and the request's conditions, then publish it."""
        try:
            digests = await asyncio.to_thread(file_digests, tmp)
            mismatch = [k for k, v in (("md5Hash", digests[0]), ("crc32c", digests[1]))
                        if k in expected and v is not None and expected[k] != v]
            if mismatch:
                raise StoreError(400, "InvalidArgument",
                                 f"Provided {mismatch[0]} doesn't match calculated {mismatch[0]}.")
            check_generation(conditions, file_generation(final), f"{bucket}/{name}")
        except BaseException:
            unlink_quiet(tmp)
            raise
        st = self.files.commit(tmp, final)
        obj = self.files.lookup(f"/{bucket}/{name}")
        if obj is not None and obj.mtime_ns == st.st_mtime_ns and obj.hashing is None:
            obj.hashing = asyncio.get_running_loop().create_future()
            obj.hashing.set_result(digests)
        return web.json_response(object_json(request, bucket, name, st.st_size, st.st_mtime_ns, digests))


def _content_range(header: str | None) -> tuple[int | None, int | None, int | None]:
    """(first, last, total) of a resumable chunk; first None for ``bytes */T``, total None for ``/*``,
    and (0, None, -1) without the header (one PUT carrying the whole object)."""
    if header is None:
        return 0, None, -1
    match = _CONTENT_RANGE.fullmatch(header.strip())
    if match is None:
        raise StoreError(400, "InvalidArgument", f"malformed Content-Range {header!r}")
    first, last, total = match.groups()
    if first is not None and int(last) < int(first):
        raise StoreError(400, "InvalidArgument", f"malformed Content-Range {header!r}")
    return (int(first) if first is not None else None, int(last) if last is not None else None,
            int(total) if total != "*" else None)


async def _part_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    """The bytes of one multipart/related body part."""
    while True:
        chunk = await part.read_chunk(BODY_CHUNK)
        if not chunk:
            return
        yield chunk

