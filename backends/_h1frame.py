"""HTTP/1.1 framing for the builtin client (:mod:`._h1`), sans I/O: a GET's bytes, an answer's head, the chunked
transfer coding. Pure functions and one small state machine over ``bytes``, tested without a socket, as the tar
parser is; the client feeds them what its connections receive.
"""

from __future__ import annotations

import re

from multidict import CIMultiDict

__all__ = ["MAX_HEAD_BYTES", "ClientConnectionError", "ClientError", "ClientPayloadError", "Dechunk", "InvalidURL",
           "MalformedAnswer", "ServerDisconnectedError", "host_header", "parse_head", "range_size", "request_bytes"]

#: An answer's head (status line and headers) larger than this is refused as malformed.
MAX_HEAD_BYTES = 64 << 10
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: ([^\r\n]*))?")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SPLITS = re.compile(r"[\r\n\0]")  # what a header value must not hold: it would end the line or the request


class ClientError(Exception):
    """What the builtin client raises for a failed request: the error table of the backends
    (:mod:`._errors`) reads each subclass as the aiohttp exception of the same name, so an error reads the same
    whichever client sent the request.

    Types of its own rather than aiohttp's, so that the builtin client's path (every GET of a shard by default) never
    imports aiohttp: that import is most of what a process's first http(s), ``s3://`` or ``gs://`` dataset costs
    before its first request (about 190 ms on the 2-core machine, measured with ``-X importtime``)."""


class ClientConnectionError(ClientError):
    """The connection failed or was lost (aiohttp's ``ClientConnectionError``)."""


class ServerDisconnectedError(ClientConnectionError):
    """The server closed the connection before its answer's head (aiohttp's ``ServerDisconnectedError``)."""

    def __init__(self, message: str = "Server disconnected") -> None:
        super().__init__(message)


class ClientPayloadError(ClientError):
    """The connection closed before the end of the body (aiohttp's ``ClientPayloadError``)."""


class InvalidURL(ClientError):
    """A URL the client cannot send a request to (aiohttp's ``InvalidURL``)."""


class MalformedAnswer(ClientError):
    """The server's bytes are not an HTTP/1.x answer (a bad status line, header or chunk size)."""


class Dechunk:
    """The chunked transfer coding (RFC 9112 section 7.1), sans I/O: ``feed`` bytes of the wire, get bytes of
    the body; ``done`` after the last chunk and its trailer."""

    def __init__(self) -> None:
        self.line = b""       # a size or trailer line being gathered
        self.left = 0         # data bytes left in the current chunk
        self.state = "size"   # size, data, crlf, trailer, done

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        i, n = 0, len(data)
        while i < n and self.state != "done":
            if self.state == "data":
                take = min(self.left, n - i)
                out.append(data[i : i + take] if (i or take < n) else data)
                i += take
                self.left -= take
                if not self.left:
                    self.state = "crlf"
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self.line += data[i:]
                if len(self.line) > 4096:
                    raise MalformedAnswer("chunked body: a chunk size or trailer line over 4 KiB")
                break
            line, self.line, i = (self.line + data[i:end]).rstrip(b"\r"), b"", end + 1
            if self.state == "crlf":
                if line:
                    raise MalformedAnswer("chunked body: chunk data not followed by CRLF")
                self.state = "size"
            elif self.state == "size":
                digits = line.split(b";", 1)[0].strip()
                if not digits or len(digits) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in digits):
                    raise MalformedAnswer(f"chunked body: bad chunk size {line[:40]!r}")
                self.left = int(digits, 16)
                self.state = "data" if self.left else "trailer"
            elif not line:  # trailer: header lines until an empty one
                self.state = "done"
        return out


def host_header(host: str, port: int, default_port: bool) -> str:
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return host if default_port else f"{host}:{port}"


def request_bytes(path: str, headers: CIMultiDict[str]) -> bytes:
    """``GET path HTTP/1.1`` and the headers, refusing a name or value that would split the request."""
    lines = [f"GET {path or '/'} HTTP/1.1\r\n"]
    token, splits = _TOKEN.fullmatch, _SPLITS.search
    for name, value in headers.items():
        value = str(value)
        if token(name) is None or splits(value) is not None:
            raise ValueError(f"a request header cannot be sent as it is: {name!r}")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def range_size(value: str | None) -> int | None:
    """The bytes a ``Range: bytes=A-B`` header asks for (None for any other form: open-ended, suffix, several)."""
    if value is None or not value.startswith("bytes="):
        return None
    first, sep, last = value[6:].partition("-")
    if not sep or not first.isdigit() or not last.isdigit():
        return None
    return max(0, int(last) - int(first) + 1)


def parse_head(head: bytes) -> tuple[int, int, str, CIMultiDict[str]]:
    """(minor version, status, reason, headers) of an answer's head, without its final blank line."""
    status_line, _, rest = head.partition(b"\r\n")
    m = _STATUS_LINE.fullmatch(status_line)
    if m is None:
        raise MalformedAnswer(f"not an HTTP/1.x status line: {status_line[:60]!r}")
    fields = []
    # decoded once, split once: a per-line decode and CIMultiDict.add cost a ranged GET's answer more than its I/O
    for line in rest.decode("latin-1").split("\r\n") if rest else ():
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise MalformedAnswer(f"bad header line {line[:60].encode('latin-1')!r}")
        fields.append((name, value.strip(" \t")))
    return int(m.group(1)), int(m.group(2)), (m.group(3) or b"").decode("latin-1"), CIMultiDict(fields)
