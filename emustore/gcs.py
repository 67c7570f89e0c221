"""The emulated store's GCS face: the JSON API (``/storage/v1/...``) as google-cloud-storage and gsutil
call it.

`Gcs.route` serves buckets (list, get, insert, delete), object metadata, listing and delete, and media
downloads (``?alt=media`` on the object, or ``/download/storage/v1/...``) through the paced path
(:mod:`emustore.sender`) with ``x-goog-hash`` and ``x-goog-generation``; ``/upload/storage/v1/``
goes to the uploads (:mod:`emustore.gcs_upload`). The JSON itself is in
:mod:`emustore.gcs_json`.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import web

from emustore.gcs_json import (
    check_generation,
    file_generation,
    goog_hash,
    json_body,
    object_json,
)
from emustore.gcs_upload import GcsUploads
from emustore.http import (
    META,
    OBJECT,
    WRITE,
    Call,
    Handler,
    StoreError,
    int_param,
    iso,
    method_not_allowed,
    not_implemented,
    read_body,
)
from emustore.knobs import Plan
from emustore.listing import (
    decode_token,
    encode_token,
    holds_file,
    list_page,
    walk_keys,
)
from emustore.objects import Files, StoredObject, finished, safe_parts
from emustore.sender import Sender

__all__ = ["GCS_ROOTS", "Gcs"]

#: The paths of the GCS face: a top folder named ``storage``, ``download`` or ``upload`` is not
#: reachable as ``/storage/v1/...``.
GCS_ROOTS = ("/storage/v1/", "/download/storage/v1/", "/upload/storage/v1/")


class Gcs:
    """The GCS JSON API: ``/storage/v1/b/...``, ``/download/storage/v1/...``, ``/upload/storage/v1/...``."""

    def __init__(self, files: Files, sender: Sender) -> None:
        self.files = files
        self.sender = sender
        self.uploads = GcsUploads(files)

    # -- routing ------------------------------------------------------------------------------------

    def route(self, request: web.BaseRequest) -> Call:
        path, method = request.path, request.method
        bind = functools.partial
        if path.startswith("/upload/"):
            return self.uploads.route(request)
        media = path.startswith("/download/")
        segments = path[len("/download/storage/v1/" if media else "/storage/v1/"):].split("/", 3)
        if segments[0] != "b" or (len(segments) >= 3 and segments[2] != "o"):
            raise StoreError(404, "NotFound", f"Not Found: {path}")
        if len(segments) == 4 and segments[2] == "o":
            return self._object(method, request.query, segments[1], segments[3], media)
        if len(segments) == 3:
            return self._methods(method, {"GET": (META, bind(self.list_objects, bucket=segments[1]))})
        if len(segments) == 2:
            return self._methods(method, {"GET": (META, bind(self.get_bucket, bucket=segments[1])),
                                          "DELETE": (WRITE, bind(self.delete_bucket, bucket=segments[1]))})
        return self._methods(method, {"GET": (META, self.list_buckets), "POST": (WRITE, self.insert_bucket)})

    def _object(self, method: str, query: Mapping[str, str], bucket: str, name: str, media: bool) -> Call:
        bind = functools.partial
        if method in ("GET", "HEAD"):
            if media or query.get("alt") == "media":
                return Call(OBJECT, bind(self.media, bucket=bucket, name=name))
            return Call(META, bind(self.get_object, bucket=bucket, name=name))
        if method == "DELETE":
            return Call(WRITE, bind(self.delete_object, bucket=bucket, name=name))
        if method in ("PATCH", "PUT", "POST"):
            return Call(WRITE, not_implemented)  # patch, compose, rewrite, copyTo
        raise method_not_allowed()

    @staticmethod
    def _methods(method: str, table: Mapping[str, tuple[str, Handler]]) -> Call:
        if method == "HEAD" and "GET" in table:
            method = "GET"
        if method not in table:
            raise method_not_allowed()
        return Call(*table[method])

    # -- objects ------------------------------------------------------------------------------------

    def _lookup(self, bucket: str, name: str) -> StoredObject:
        obj = self.files.lookup(f"/{bucket}/{name}")
        if obj is None:
            self.files.bucket_dir(bucket)
            raise StoreError(404, "NoSuchKey", f"No such object: {bucket}/{name}")
        return obj

    async def get_object(self, request: web.BaseRequest, plan: Plan, bucket: str, name: str) -> web.StreamResponse:
        obj = self._lookup(bucket, name)
        check_generation(request.query, obj.mtime_ns, f"{bucket}/{name}")
        digests = await self.files.digests(obj)
        return web.json_response(object_json(request, bucket, name, obj.size, obj.mtime_ns, digests))

    async def media(self, request: web.BaseRequest, plan: Plan, bucket: str, name: str) -> web.StreamResponse:
        """A media download: the object's bytes, like a plain GET, with GCS's headers."""
        obj = self._lookup(bucket, name)
        check_generation(request.query, obj.mtime_ns, f"{bucket}/{name}")
        extra = {"x-goog-generation": str(obj.mtime_ns), "x-goog-metageneration": "1",
                 "x-goog-stored-content-length": str(obj.size), "x-goog-stored-content-encoding": "identity",
                 "x-goog-storage-class": "STANDARD"}
        whole = plan.knobs.ignore_range or "Range" not in request.headers
        digests = await self.files.digests(obj) if whole else finished(obj.hashing)
        if digests is not None:  # clients check the hash of whole downloads only; never computed for ranges
            extra["x-goog-hash"] = goog_hash(digests)
        return await self.sender.serve(request, obj, plan, extra)

    async def list_objects(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        """``objects.list``: sorted names, ``prefixes`` with a delimiter, pages of ``maxResults``."""
        files = self.files
        folder = files.bucket_dir(bucket)
        query = request.query
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        if "matchGlob" in query:
            raise StoreError(501, "NotImplemented", "matchGlob is not supported by the emulated store")
        limit = int_param(query, "maxResults", 1000, 1, None)
        token = query.get("pageToken")
        keys = walk_keys(folder, prefix, delimiter, files.root_prefix)
        first, stop = query.get("startOffset", ""), query.get("endOffset")
        if first or stop:
            keys = [k for k in keys if k >= first and (not stop or k < stop)]
        items, truncated = list_page(keys, prefix, delimiter, decode_token(token) if token else "", min(limit, 1000))
        out: dict[str, Any] = {"kind": "storage#objects"}
        objects = []
        for name, is_prefix in items:
            if is_prefix:
                out.setdefault("prefixes", []).append(name)
                continue
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            digests = files.cached_digests(path, st.st_size, st.st_mtime_ns)
            objects.append(object_json(request, bucket, name, st.st_size, st.st_mtime_ns, digests))
        if objects:
            out["items"] = objects
        if truncated:
            out["nextPageToken"] = encode_token(items[-1][0])
        return web.json_response(out)

    async def delete_object(self, request: web.BaseRequest, plan: Plan, bucket: str, name: str) -> web.StreamResponse:
        folder = self.files.bucket_dir(bucket)
        parts = safe_parts(name)
        path = os.path.join(folder, *parts) if parts is not None else ""
        if parts is not None:
            current = file_generation(path)
            check_generation(request.query, current, f"{bucket}/{name}")
        if not path or not self.files.remove(folder, path):
            raise StoreError(404, "NoSuchKey", f"No such object: {bucket}/{name}")
        return web.Response(status=204)

    # -- buckets ------------------------------------------------------------------------------------

    def _bucket_json(self, request: web.BaseRequest, bucket: str, mtime_ns: int) -> dict[str, Any]:
        stamp = iso(mtime_ns)
        return {"kind": "storage#bucket", "id": bucket, "name": bucket, "projectNumber": "0",
                "selfLink": f"{request.scheme}://{request.host}/storage/v1/b/{quote(bucket, safe='')}",
                "metageneration": "1", "location": "US", "locationType": "multi-region",
                "storageClass": "STANDARD", "etag": "CAE=", "timeCreated": stamp, "updated": stamp}

    async def get_bucket(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        folder = self.files.bucket_dir(bucket)
        return web.json_response(self._bucket_json(request, bucket, os.stat(folder).st_mtime_ns))

    async def list_buckets(self, request: web.BaseRequest, plan: Plan) -> web.StreamResponse:
        prefix = request.query.get("prefix", "")
        items = [self._bucket_json(request, name, mtime) for name, mtime in self.files.buckets()
                 if name.startswith(prefix)]
        return web.json_response({"kind": "storage#buckets", **({"items": items} if items else {})})

    async def insert_bucket(self, request: web.BaseRequest, plan: Plan) -> web.StreamResponse:
        meta = json_body(await read_body(request))
        name = str(meta.get("name") or "")
        path = self.files.bucket_path(name)
        if os.path.lexists(path):  # noqa: ASYNC240 - one local stat per (rare) bucket creation
            raise StoreError(409, "BucketAlreadyOwnedByYou",
                             "Your previous request to create the named bucket succeeded and you already own it.")
        os.mkdir(path)
        return web.json_response(self._bucket_json(request, name, os.stat(path).st_mtime_ns))

    async def delete_bucket(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        folder = self.files.bucket_dir(bucket)
        if holds_file(folder, self.files.root_prefix):
            raise StoreError(409, "BucketNotEmpty", f"The bucket you tried to delete is not empty: {bucket}")
        shutil.rmtree(folder)
        return web.Response(status=204)
