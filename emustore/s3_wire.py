"""S3's wire formats for the emulated store: XML answers and errors, XML request documents, and
request payloads, plain or ``aws-chunked`` (signed chunks, trailing checksums; signatures unchecked).
"""

from __future__ import annotations

import itertools
import os
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote
from xml.sax.saxutils import escape

from aiohttp import StreamReader, web

from emustore.http import BODY_CHUNK, StoreError
from emustore.objects import unlink_quiet

__all__ = [
    "SLOW_DOWN_XML", "check_decoded_length", "checksums", "child_text", "element", "listed_parts",
    "local_name", "parse_xml", "s3_body", "s3_error", "same", "url_encode", "xml_response",
]

SLOW_DOWN_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 "<Message>Please reduce your request rate.</Message></Error>")
_S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_QUOTE = {'"': "&quot;"}

# -- answers -------------------------------------------------------------------------------------------


def element(tag: str, value: object) -> str:
    """One XML element with escaped text (quotes too: S3 writes ETags as &quot;...&quot;)."""
    return f"<{tag}>{escape(str(value), _QUOTE)}</{tag}>"


def xml_response(root: str, body: str, headers: Mapping[str, str] | None = None) -> web.Response:
    text = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{_S3_NS}">{body}</{root}>'
    return web.Response(text=text, content_type="application/xml", headers=headers)


def s3_error(err: StoreError, request_id: str) -> web.Response:
    where = element("Resource", err.where) if err.where else ""
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error>{element("Code", err.code)}'
            f'{element("Message", err.message)}{where}{element("RequestId", request_id)}</Error>')
    return web.Response(status=err.status, text=body, content_type="application/xml", headers=err.headers)


def same(text: str) -> str:
    return text


def url_encode(text: str) -> str:
    """S3's ``encoding-type=url`` (botocore decodes it with unquote_plus: '+' must be escaped)."""
    return quote(text, safe="/~")


# -- request documents ---------------------------------------------------------------------------------


def parse_xml(body: bytes) -> ET.Element:
    try:
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise StoreError(400, "MalformedXML", f"The XML you provided was not well-formed: {exc}") from None


def local_name(tag: str) -> str:
    return tag.rpartition("}")[2]


def child_text(parent: ET.Element, name: str) -> str | None:
    for child in parent:
        if local_name(child.tag) == name:
            return child.text or ""
    return None


def listed_parts(doc: ET.Element) -> list[tuple[int, str]]:
    """(part number, ETag) of a CompleteMultipartUpload body, checked to be ascending."""
    parts = []
    for item in doc:
        if local_name(item.tag) == "Part":
            number = child_text(item, "PartNumber") or ""
            if not number.isdigit():
                raise StoreError(400, "MalformedXML", "a Part without a PartNumber")
            parts.append((int(number), (child_text(item, "ETag") or "").strip().strip('"')))
    if not parts:
        raise StoreError(400, "MalformedXML", "You must specify at least one part")
    if any(a[0] >= b[0] for a, b in itertools.pairwise(parts)):
        raise StoreError(400, "InvalidPartOrder", "The list of parts was not in ascending order.")
    return parts


# -- payloads ------------------------------------------------------------------------------------------


def s3_body(request: web.BaseRequest, trailers: dict[str, str]) -> AsyncIterator[bytes]:
    """The payload of a PutObject/UploadPart body: plain, or decoded from ``aws-chunked``."""
    sha = request.headers.get("x-amz-content-sha256", "")
    if sha.startswith("STREAMING-") or "aws-chunked" in request.headers.get("Content-Encoding", ""):
        return _aws_chunked(request.content, trailers)
    return request.content.iter_chunked(BODY_CHUNK)


async def _aws_chunked(content: StreamReader, trailers: dict[str, str]) -> AsyncIterator[bytes]:
    """Decode ``hex-size[;chunk-signature=..]\\r\\n data \\r\\n ... 0[;..]\\r\\n trailers \\r\\n``;
    the trailers (``x-amz-checksum-crc32:..``) go to ``trailers``. Signatures are not checked."""
    while True:
        line = await content.readline()
        if not line.endswith(b"\n"):
            raise ValueError("the aws-chunked body ends inside a chunk header")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            break
        while size:
            data = await content.read(min(size, BODY_CHUNK))
            if not data:
                raise ValueError("the aws-chunked body ends inside a chunk")
            size -= len(data)
            yield data
        if await content.readexactly(2) != b"\r\n":
            raise ValueError("an aws-chunked chunk is not followed by CRLF")
    while True:
        line = (await content.readline()).strip()
        if not line:
            return
        name, _, value = line.decode("latin-1").partition(":")
        trailers[name.strip().lower()] = value.strip()


def check_decoded_length(request: web.BaseRequest, tmp: str) -> None:
    """400 IncompleteBody (and ``tmp`` removed) when the payload is not ``x-amz-decoded-content-length``."""
    declared = request.headers.get("x-amz-decoded-content-length")
    if declared is not None and declared.isdigit() and int(declared) != os.path.getsize(tmp):
        unlink_quiet(tmp)
        raise StoreError(400, "IncompleteBody", "You did not provide the number of bytes specified by the "
                         "x-amz-decoded-content-length header")


def checksums(request: web.BaseRequest, trailers: Mapping[str, str]) -> dict[str, str]:
    """The ``x-amz-checksum-<algorithm>`` values a client sent (header or trailer), to echo back."""
    found = {k.lower(): v for k, v in request.headers.items()
             if k.lower().startswith("x-amz-checksum-") and k.lower() not in ("x-amz-checksum-algorithm",
                                                                            "x-amz-checksum-type")}
    found.update((k, v) for k, v in trailers.items() if k.startswith("x-amz-checksum-"))
    return found
