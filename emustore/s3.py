"""The emulated store's S3 face: S3's REST API, path style (``/BUCKET/KEY``), and the plain face.

`S3.route` picks the operation from the method, the path and S3's query parameters; the plain face
(``GET/HEAD /path``, ``GET /?list``) shares its paths and its handlers. Objects are read and written
through the file layer (:mod:`emustore.objects`), their bytes sent by the paced path
(:mod:`emustore.sender`), and answers written in S3's XML (:mod:`emustore.s3_wire`).
Multipart uploads stage their parts in the file layer until completed or aborted.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import time
from collections.abc import Callable, Mapping
from urllib.parse import quote

from aiohttp import web

from emustore.http import (
    META,
    OBJECT,
    WRITE,
    Call,
    StoreError,
    int_param,
    iso,
    method_not_allowed,
    not_implemented,
    read_body,
)
from emustore.knobs import LISTING, Plan
from emustore.listing import (
    decode_token,
    encode_token,
    holds_file,
    list_page,
    walk_keys,
)
from emustore.objects import Files, collision, concat, etag_for, safe_parts
from emustore.s3_wire import (
    check_decoded_length,
    checksums,
    child_text,
    element,
    listed_parts,
    local_name,
    parse_xml,
    s3_body,
    same,
    url_encode,
    xml_response,
)
from emustore.sender import Sender

__all__ = ["S3", "S3_QUERY", "S3_UNSUPPORTED"]

#: Query parameters that only S3 sends: their presence makes a request S3's (``prefix`` is not here: it
#: is also the plain listing's).
S3_QUERY = frozenset({
    "x-id", "list-type", "delimiter", "max-keys", "continuation-token", "start-after", "encoding-type",
    "fetch-owner", "marker", "uploads", "uploadId", "partNumber", "versionId", "location", "delete",
    "versioning", "max-uploads", "key-marker", "upload-id-marker", "part-number-marker", "max-parts",
    "AWSAccessKeyId", "Signature", "Expires", "versions", "version-id-marker", "max-buckets",
    "bucket-region",
})
#: S3 subresources this store does not implement: 501 NotImplemented rather than a wrong answer.
S3_UNSUPPORTED = frozenset({
    "acl", "policy", "policyStatus", "cors", "lifecycle", "tagging", "website", "logging", "notification",
    "replication", "encryption", "ownershipControls", "publicAccessBlock", "object-lock", "accelerate",
    "requestPayment", "analytics", "metrics", "inventory", "intelligent-tiering", "versions",
    "legal-hold", "retention", "restore", "select", "torrent", "attributes", "renameObject",
})
_S3_BUCKET_QUERY = frozenset({"list-type", "location", "uploads", "versioning", "delete", "delimiter",
                              "marker", "max-keys", "continuation-token", "start-after", "encoding-type"})
_RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type", "response-content-language": "Content-Language",
    "response-expires": "Expires", "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition", "response-content-encoding": "Content-Encoding",
}


class S3:
    """The S3 REST API, path style (``/BUCKET/KEY``), and the plain face that shares its paths.

    ``request_id`` gives the ``x-amz-request-id`` of the request being answered.
    """

    def __init__(self, files: Files, sender: Sender, request_id: Callable[[], str]) -> None:
        self.files = files
        self.sender = sender
        self.request_id = request_id

    # -- routing ------------------------------------------------------------------------------------

    def route(self, request: web.BaseRequest, face: str) -> Call:
        path, method, query = request.path, request.method, request.query
        if path == "/":
            return self._service(method, query, face)
        bucket, slash, key = path[1:].partition("/")
        if key:
            return self._object(method, query, request.headers, bucket, key, face)
        if slash or method not in ("GET", "HEAD"):
            return self._bucket(method, query, bucket)
        if face == "plain":  # GET /name is a file of the root; HEAD /folder is HeadBucket
            if method == "HEAD" and os.path.isdir(self.files.bucket_path(bucket)):
                return self._bucket(method, query, bucket)
            return Call(OBJECT, functools.partial(self.get_object, bucket=bucket, key="", face=face))
        if _S3_BUCKET_QUERY.isdisjoint(query) and self.files.lookup(path) is not None:
            return Call(OBJECT, functools.partial(self.get_object, bucket=bucket, key="", face=face))
        return self._bucket(method, query, bucket)

    def _service(self, method: str, query: Mapping[str, str], face: str) -> Call:
        if method not in ("GET", "HEAD"):
            raise method_not_allowed()
        if face == "s3":
            return Call(META, self.list_buckets)
        if not LISTING.isdisjoint(query):
            return Call(META, self.plain_listing)
        return Call(OBJECT, functools.partial(self.get_object, bucket="", key="", face=face))

    def _object(self, method: str, query: Mapping[str, str], headers: Mapping[str, str], bucket: str,
                key: str, face: str) -> Call:
        bind = functools.partial
        if not S3_UNSUPPORTED.isdisjoint(query):
            return Call(META, not_implemented)
        if method in ("GET", "HEAD"):
            if "uploadId" in query:
                return Call(META, not_implemented)  # ListParts
            return Call(OBJECT, bind(self.get_object, bucket=bucket, key=key, face=face))
        if method == "PUT":
            if "x-amz-copy-source" in headers:
                return Call(WRITE, not_implemented)  # CopyObject, UploadPartCopy
            if "uploadId" in query or "partNumber" in query:
                return Call(WRITE, bind(self.upload_part, bucket=bucket, key=key))
            return Call(WRITE, bind(self.put_object, bucket=bucket, key=key))
        if method == "POST" and "uploads" in query:
            return Call(WRITE, bind(self.create_upload, bucket=bucket, key=key))
        if method == "POST" and "uploadId" in query:
            return Call(WRITE, bind(self.complete_upload, bucket=bucket, key=key))
        if method == "DELETE" and "uploadId" in query:
            return Call(WRITE, bind(self.abort_upload, bucket=bucket, key=key))
        if method == "DELETE":
            return Call(WRITE, bind(self.delete_object, bucket=bucket, key=key))
        raise method_not_allowed()

    def _bucket(self, method: str, query: Mapping[str, str], bucket: str) -> Call:
        bind = functools.partial
        if not S3_UNSUPPORTED.isdisjoint(query):
            return Call(META if method in ("GET", "HEAD") else WRITE, not_implemented)
        if method == "GET":
            if "location" in query:
                return Call(META, bind(self.location, bucket=bucket))
            if "uploads" in query:
                return Call(META, bind(self.list_uploads, bucket=bucket))
            if "versioning" in query:
                return Call(META, bind(self.versioning, bucket=bucket))
            return Call(META, bind(self.list_objects, bucket=bucket, v2=query.get("list-type") == "2"))
        if method == "HEAD":
            return Call(META, bind(self.head_bucket, bucket=bucket))
        if method == "PUT" and "versioning" not in query:
            return Call(WRITE, bind(self.create_bucket, bucket=bucket))
        if method == "DELETE":
            return Call(WRITE, bind(self.delete_bucket, bucket=bucket))
        if method == "POST" and "delete" in query:
            return Call(WRITE, bind(self.delete_objects, bucket=bucket))
        if method in ("PUT", "POST"):
            return Call(WRITE, not_implemented)
        raise method_not_allowed()

    # -- reading ------------------------------------------------------------------------------------

    async def get_object(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str,
                         face: str) -> web.StreamResponse:
        """GetObject / HeadObject, and every GET of the plain face."""
        files = self.files
        obj = files.lookup(request.path)
        if obj is None:
            # Only on a miss, to name the error: one local stat, as the lookup itself does.
            if key and safe_parts(bucket) is not None and not os.path.isdir(  # noqa: ASYNC240
                    os.path.join(files.root, bucket)):
                raise StoreError(404, "NoSuchBucket", "The specified bucket does not exist", bucket)
            raise StoreError(404, "NoSuchKey", "The specified key does not exist.", request.path)
        if face == "plain":
            return await self.sender.serve(request, obj, plan)
        extra = {"x-amz-request-id": self.request_id()}
        for param, header in _RESPONSE_OVERRIDES.items():
            if param in request.query:
                extra[header] = request.query[param]
        return await self.sender.serve(request, obj, plan, extra)

    async def plain_listing(self, request: web.BaseRequest, plan: Plan) -> web.StreamResponse:
        """``GET /?list`` or ``/?prefix=P``: every served file's path, as a JSON list."""
        return web.json_response(self.files.names(request.query.get("prefix", "")))

    async def list_buckets(self, request: web.BaseRequest, plan: Plan) -> web.StreamResponse:
        prefix = request.query.get("prefix", "")
        entries = "".join(f"<Bucket>{element('Name', name)}{element('CreationDate', iso(mtime))}</Bucket>"
                          for name, mtime in self.files.buckets() if name.startswith(prefix))
        owner = "<Owner><ID>wds-async</ID><DisplayName>wds-async</DisplayName></Owner>"
        return xml_response("ListAllMyBucketsResult", f"{owner}<Buckets>{entries}</Buckets>")

    async def head_bucket(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        self.files.bucket_dir(bucket)
        return web.Response(headers={"x-amz-bucket-region": "us-east-1"})

    async def location(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        self.files.bucket_dir(bucket)
        return xml_response("LocationConstraint", "")  # empty: us-east-1

    async def versioning(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        self.files.bucket_dir(bucket)
        return xml_response("VersioningConfiguration", "")  # never enabled

    async def list_objects(self, request: web.BaseRequest, plan: Plan, bucket: str, v2: bool) -> web.StreamResponse:
        """ListObjectsV2 (``list-type=2``) or ListObjects: sorted keys, pages of ``max-keys``."""
        folder = self.files.bucket_dir(bucket)
        query = request.query
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        limit = int_param(query, "max-keys", 1000, 0, None)
        encoding = query.get("encoding-type")
        if encoding not in (None, "url"):
            raise StoreError(400, "InvalidArgument", f"Invalid Encoding Method specified in Request: {encoding}")
        enc: Callable[[str], str] = url_encode if encoding else same
        token = query.get("continuation-token") if v2 else None
        start = query.get("start-after", "") if v2 else query.get("marker", "")
        after = decode_token(token) if token else start
        keys = walk_keys(folder, prefix, delimiter, self.files.root_prefix)
        items, truncated = list_page(keys, prefix, delimiter, after, min(limit, 1000))
        head = [element("Name", bucket), element("Prefix", enc(prefix))]
        if delimiter:
            head.append(element("Delimiter", enc(delimiter)))
        head += [element("MaxKeys", limit), element("IsTruncated", "true" if truncated else "false")]
        if encoding:
            head.append(element("EncodingType", "url"))
        if v2:
            head.append(element("KeyCount", len(items)))
            if token:
                head.append(element("ContinuationToken", token))
            if truncated:
                head.append(element("NextContinuationToken", encode_token(items[-1][0])))
            if start:
                head.append(element("StartAfter", enc(start)))
        else:
            head.append(element("Marker", enc(start)))
            if truncated:
                head.append(element("NextMarker", enc(items[-1][0])))
        body = [*head, *self._entries(folder, items, enc)]
        return xml_response("ListBucketResult", "".join(body))

    def _entries(self, folder: str, items: list[tuple[str, bool]], enc: Callable[[str], str]) -> list[str]:
        """<Contents> of the keys and <CommonPrefixes> of the prefixes of one listing page."""
        out = []
        for name, is_prefix in items:
            if is_prefix:
                out.append(f"<CommonPrefixes>{element('Prefix', enc(name))}</CommonPrefixes>")
                continue
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue  # deleted since the walk
            out.append(f"<Contents>{element('Key', enc(name))}{element('LastModified', iso(st.st_mtime_ns))}"
                       f"{element('ETag', etag_for(st.st_size, st.st_mtime_ns))}{element('Size', st.st_size)}"
                       "<StorageClass>STANDARD</StorageClass></Contents>")
        return out

    async def list_uploads(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        """ListMultipartUploads: every upload begun and neither completed nor aborted."""
        self.files.bucket_dir(bucket)
        prefix = request.query.get("prefix", "")
        found = sorted((meta["key"], meta.get("initiated", ""), upload_id)
                       for upload_id, meta in self.files.uploads("s3")
                       if meta.get("bucket") == bucket and str(meta.get("key", "")).startswith(prefix))
        entries = "".join(f"<Upload>{element('Key', key)}{element('UploadId', upload_id)}"
                          f"{element('Initiated', initiated)}<StorageClass>STANDARD</StorageClass></Upload>"
                          for key, initiated, upload_id in found)
        head = f"{element('Bucket', bucket)}{element('Prefix', prefix)}<MaxUploads>1000</MaxUploads>"
        head += "<IsTruncated>false</IsTruncated>"
        return xml_response("ListMultipartUploadsResult", head + entries)

    # -- writing ------------------------------------------------------------------------------------

    async def create_bucket(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        path = self.files.bucket_path(bucket)
        # Local stats per (rare) bucket creation; os.makedirs below is as quick.
        if os.path.lexists(path) and not os.path.isdir(path):  # noqa: ASYNC240
            raise StoreError(409, "BucketAlreadyExists", "The requested bucket name is not available.", bucket)
        os.makedirs(path, exist_ok=True)  # us-east-1 answers 200 to a bucket one already owns
        return web.Response(headers={"Location": f"/{bucket}"})

    async def delete_bucket(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        folder = self.files.bucket_dir(bucket)
        if holds_file(folder, self.files.root_prefix):
            raise StoreError(409, "BucketNotEmpty", "The bucket you tried to delete is not empty", bucket)
        shutil.rmtree(folder)
        return web.Response(status=204)

    async def put_object(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str) -> web.StreamResponse:
        files = self.files
        final = files.target(bucket, key)
        trailers: dict[str, str] = {}
        tmp = await files.receive(request, final, s3_body(request, trailers))
        check_decoded_length(request, tmp)
        st = files.commit(tmp, final)
        return web.Response(headers={"ETag": etag_for(st.st_size, st.st_mtime_ns), **checksums(request, trailers)})

    async def delete_object(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str) -> web.StreamResponse:
        folder = self.files.bucket_dir(bucket)
        parts = safe_parts(key)
        if parts is not None:
            self.files.remove(folder, os.path.join(folder, *parts))
        return web.Response(status=204)  # S3 answers 204 whether or not the key existed

    async def delete_objects(self, request: web.BaseRequest, plan: Plan, bucket: str) -> web.StreamResponse:
        """DeleteObjects: ``<Delete><Object><Key>..`` in the body; every key reported deleted."""
        folder = self.files.bucket_dir(bucket)
        doc = parse_xml(await read_body(request))
        quiet = (child_text(doc, "Quiet") or "").lower() == "true"
        done = []
        for item in doc:
            if local_name(item.tag) != "Object":
                continue
            key = child_text(item, "Key") or ""
            parts = safe_parts(key)
            if parts is not None:
                self.files.remove(folder, os.path.join(folder, *parts))
            if not quiet:
                done.append(f"<Deleted>{element('Key', key)}</Deleted>")
        return xml_response("DeleteResult", "".join(done))

    # -- multipart uploads --------------------------------------------------------------------------

    async def create_upload(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str) -> web.StreamResponse:
        self.files.target(bucket, key)  # the bucket exists and the key can be a file
        upload_id, _ = self.files.new_upload({"api": "s3", "bucket": bucket, "key": key,
                                              "initiated": iso(time.time_ns())})
        headers = {}
        algorithm = request.headers.get("x-amz-checksum-algorithm")
        if algorithm:
            headers["x-amz-checksum-algorithm"] = algorithm
        body = f"{element('Bucket', bucket)}{element('Key', key)}{element('UploadId', upload_id)}"
        return xml_response("InitiateMultipartUploadResult", body, headers=headers)

    def _staged(self, query: Mapping[str, str], bucket: str, key: str) -> str:
        """The staging folder of ``uploadId``; 404 NoSuchUpload unless it is an upload of this key."""
        staged = self.files.upload(query.get("uploadId"), "s3")
        if staged is None or staged[1].get("bucket") != bucket or staged[1].get("key") != key:
            raise StoreError(404, "NoSuchUpload", "The specified multipart upload does not exist.",
                             f"{bucket}/{key}")
        return staged[0]

    async def upload_part(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str) -> web.StreamResponse:
        folder = self._staged(request.query, bucket, key)
        number = int_param(request.query, "partNumber", None, 1, 10000)
        part = os.path.join(folder, f"part-{number:05d}")
        trailers: dict[str, str] = {}
        tmp = await self.files.receive(request, part, s3_body(request, trailers))
        check_decoded_length(request, tmp)
        os.replace(tmp, part)
        st = os.stat(part)
        return web.Response(headers={"ETag": etag_for(st.st_size, st.st_mtime_ns), **checksums(request, trailers)})

    async def complete_upload(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str) -> web.StreamResponse:
        """CompleteMultipartUpload: the listed parts, in order, concatenated into the object."""
        folder = self._staged(request.query, bucket, key)
        listed = listed_parts(parse_xml(await read_body(request)))
        paths = [_check_part(folder, number, etag) for number, etag in listed]
        final = self.files.target(bucket, key)
        try:
            tmp = await asyncio.to_thread(concat, paths, os.path.dirname(final))
        except OSError as exc:
            raise collision(final, exc) from None
        st = self.files.commit(tmp, final)
        shutil.rmtree(folder, ignore_errors=True)
        location = f"{request.scheme}://{request.host}/{bucket}/{quote(key)}"
        body = (f"{element('Location', location)}{element('Bucket', bucket)}{element('Key', key)}"
                f"{element('ETag', etag_for(st.st_size, st.st_mtime_ns))}")
        return xml_response("CompleteMultipartUploadResult", body)

    async def abort_upload(self, request: web.BaseRequest, plan: Plan, bucket: str, key: str) -> web.StreamResponse:
        shutil.rmtree(self._staged(request.query, bucket, key), ignore_errors=True)
        return web.Response(status=204)


def _check_part(folder: str, number: int, etag: str) -> str:
    """The staged file of part ``number``; 400 InvalidPart when missing or of another ETag."""
    path = os.path.join(folder, f"part-{number:05d}")
    try:
        st = os.stat(path)
    except OSError:
        raise StoreError(400, "InvalidPart", f"Part {number} was never uploaded.") from None
    if etag and etag != etag_for(st.st_size, st.st_mtime_ns).strip('"'):
        raise StoreError(400, "InvalidPart", f"Part {number}'s ETag does not match the uploaded part.")
    return path
