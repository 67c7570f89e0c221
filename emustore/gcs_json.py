"""GCS's wire formats for the emulated store: JSON errors, object resources, JSON request bodies,
generation preconditions and ``x-goog-hash`` headers.

An object's ``generation`` is its file's mtime in ns and its ``metageneration`` always 1.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import web

from emustore.http import StoreError, iso
from emustore.objects import Digests, content_type, etag_for

__all__ = ["check_generation", "file_generation", "gcs_error", "goog_hash", "json_body", "object_json",
           "parse_goog_hash"]

_GCS_REASONS = {400: "invalid", 404: "notFound", 405: "methodNotAllowed", 409: "conflict",
                412: "conditionNotMet", 416: "requestedRangeNotSatisfiable", 501: "notImplemented",
                503: "backendError"}


def gcs_error(err: StoreError) -> web.Response:
    reason = _GCS_REASONS.get(err.status, "backendError" if err.status >= 500 else "invalid")
    detail = {"message": err.message, "domain": "global", "reason": reason}
    return web.json_response({"error": {"code": err.status, "message": err.message, "errors": [detail]}},
                             status=err.status, headers=err.headers)


def object_json(request: web.BaseRequest, bucket: str, name: str, size: int, mtime_ns: int,
                digests: Digests | None) -> dict[str, Any]:
    """The JSON of an object (``storage#object``)."""
    base = f"{request.scheme}://{request.host}"
    quoted, where = quote(name, safe=""), quote(bucket, safe="")
    generation, stamp = str(mtime_ns), iso(mtime_ns)
    meta: dict[str, Any] = {
        "kind": "storage#object", "id": f"{bucket}/{name}/{generation}",
        "selfLink": f"{base}/storage/v1/b/{where}/o/{quoted}",
        "mediaLink": f"{base}/download/storage/v1/b/{where}/o/{quoted}?generation={generation}&alt=media",
        "name": name, "bucket": bucket, "generation": generation, "metageneration": "1",
        "contentType": content_type(name),
        "storageClass": "STANDARD", "size": str(size), "etag": etag_for(size, mtime_ns).strip('"'),
        "timeCreated": stamp, "updated": stamp, "timeStorageClassUpdated": stamp,
    }
    if digests is not None:
        meta["md5Hash"] = digests[0]
        if digests[1] is not None:
            meta["crc32c"] = digests[1]
    return meta


def json_body(body: bytes) -> dict[str, Any]:
    """A JSON object request body ({} when empty); 400 InvalidArgument for anything else."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except ValueError:
        raise StoreError(400, "InvalidArgument", "the request body is not JSON") from None
    if not isinstance(value, dict):
        raise StoreError(400, "InvalidArgument", "the request body is not a JSON object")
    return value


def file_generation(path: str) -> int:
    """The GCS generation of a file (its mtime in ns), 0 when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_mtime_ns if stat.S_ISREG(st.st_mode) else 0


def check_generation(query: Mapping[str, str], generation: int, name: str) -> None:
    """GCS's ``generation`` and ``if(Meta)Generation(Not)Match`` (0: the object must not exist)."""
    def number(key: str) -> int | None:
        value = query.get(key)
        if value is None:
            return None
        if not value.lstrip("-").isdigit():
            raise StoreError(400, "InvalidArgument", f"Invalid argument {key}={value!r}")
        return int(value)

    wanted = number("generation")
    if wanted is not None and wanted != generation:
        raise StoreError(404, "NoSuchKey", f"No such object: {name}")
    match, differ = number("ifGenerationMatch"), number("ifGenerationNotMatch")
    meta_match, meta_differ = number("ifMetagenerationMatch"), number("ifMetagenerationNotMatch")
    metageneration = 1 if generation else 0
    if (match is not None and match != generation) or (meta_match is not None and meta_match != metageneration):
        raise StoreError(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
    if (differ is not None and differ == generation) or (meta_differ is not None and meta_differ == metageneration):
        raise StoreError(304, "NotModified", "Not Modified")


def goog_hash(digests: Digests) -> str:
    """The ``x-goog-hash`` header of an object's digests."""
    md5, crc = digests
    return f"crc32c={crc},md5={md5}" if crc is not None else f"md5={md5}"


def parse_goog_hash(header: str) -> dict[str, str]:
    """``crc32c=..,md5=..`` as the metadata keys ``crc32c`` and ``md5Hash``."""
    found = {}
    for item in header.split(","):
        kind, _, value = item.strip().partition("=")
        if kind in ("crc32c", "md5") and value:
            found["md5Hash" if kind == "md5" else "crc32c"] = value
    return found
