"""The builtin HTTP/1.1 client's framing (``backends/_h1frame.py``) without a socket: answer heads, the chunked
coding, a Range's size, ``Host`` and the request's bytes."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from wds_async.backends._h1 import MalformedAnswer
from wds_async.backends._h1frame import Dechunk, host_header, parse_head, range_size, request_bytes


def test_the_chunked_decoder_refuses_bad_sizes_and_missing_crlf() -> None:
    with pytest.raises(MalformedAnswer, match="bad chunk size"):
        Dechunk().feed(b"zz\r\n")
    with pytest.raises(MalformedAnswer, match="not followed by CRLF"):
        Dechunk().feed(b"2\r\nabX\r\n")
    d = Dechunk()
    assert b"".join(d.feed(b"3\r\nabc\r\n0\r\n\r\n")) == b"abc" and d.state == "done"


def test_the_framing_without_a_socket() -> None:
    version, status, reason, headers = parse_head(b"HTTP/1.0 206 Partial Content\r\nETag: \"x\"\r\nX-A: 1\r\nx-a:  2 ")
    assert (version, status, reason) == (0, 206, "Partial Content")
    assert headers["etag"] == '"x"' and headers.getall("X-A") == ["1", "2"]
    assert parse_head(b"HTTP/1.1 404")[1:3] == (404, "")
    with pytest.raises(MalformedAnswer, match="bad header line"):
        parse_head(b"HTTP/1.1 200 OK\r\n folded: value")  # obsolete line folding is refused, not guessed at
    assert host_header("::1", 8080, False) == "[::1]:8080" and host_header("h.example", 443, True) == "h.example"
    assert [range_size(r) for r in ("bytes=0-9", "bytes=100-", "bytes=-5", "bytes=0-1,5-9", "items=0-9", None)] == \
        [10, None, None, None, None, None]
    sent = request_bytes("/b/k?x=1", CIMultiDict({"Host": "h", "Range": "bytes=0-9"}))
    assert sent == b"GET /b/k?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n\r\n"
