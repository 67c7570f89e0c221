"""The node service's sans-IO pieces: frames, work items and errors on the wire, the ring's accounting."""

from __future__ import annotations

import os
import struct

import pytest

from wds_async.engine.work import WorkItem
from wds_async.errors import EngineError, NotFound, SampleTooLarge, ServiceError, WdsError
from wds_async.io import ObjectIdentity
from wds_async.service.protocol import (
    MAX_FRAME,
    FrameDecoder,
    encode,
    error_from_json,
    error_to_json,
    item_from_json,
    item_to_json,
)
from wds_async.service.ring import Ring, RingReader, one_shot


def test_frames_survive_any_split() -> None:
    messages = [{"type": "batch", "entries": [["d", n]], "span": n * 7} for n in range(50)]
    stream = b"".join(encode(m) for m in messages)
    for step in (1, 3, 4, 5, 17, len(stream)):
        decoder = FrameDecoder()
        got = []
        for i in range(0, len(stream), step):
            got.extend(decoder.feed(stream[i:i + step]))
        assert got == messages and decoder.pending == 0


def test_a_large_frame_in_pieces() -> None:
    message = {"type": "open", "items": [[n, n, "http://h/" + "x" * 200, 0, None, None, None] for n in range(20000)]}
    data = encode(message)
    assert len(data) > 4 << 20
    decoder = FrameDecoder()
    assert decoder.feed(data[:1000]) == []
    assert decoder.feed(data[1000:]) == [message]


def test_garbage_is_a_clear_error() -> None:
    with pytest.raises(ServiceError, match=r"announced .* bytes"):
        FrameDecoder("the service at /x.sock").feed(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(ServiceError, match="not JSON"):
        FrameDecoder().feed(struct.pack(">I", 3) + b"\xff\xfe{")
    with pytest.raises(ServiceError, match="'type'"):
        FrameDecoder().feed(struct.pack(">I", 2) + b"[]")
    with pytest.raises(ServiceError, match="over the limit"):
        encode({"type": "x", "blob": "y" * (MAX_FRAME + 1)})


def test_work_items_round_trip() -> None:
    items = [WorkItem(id=3, shard=1, url="s3://b/k.tar", start=1536, end=9216, compressed=False,
                      expect=ObjectIdentity(size=10240, etag='"abc"', generation=None, last_modified="x")),
             WorkItem(id=0, shard=0, url="/data/a.tar")]
    assert [item_from_json(item_to_json(i)) for i in items] == items
    with pytest.raises(ServiceError, match="bad work item"):
        item_from_json([1, 2])


def test_errors_round_trip_with_their_context() -> None:
    err = SampleTooLarge("too big", url="http://h/a.tar", offset=512, member="k.bin", key="k", size=9, limit=8)
    back = error_from_json(error_to_json(err))
    assert type(back) is SampleTooLarge and str(back) == str(err) and (back.size, back.limit) == (9, 8)
    nf = error_from_json(error_to_json(NotFound("no such object", url="http://h/b.tar")))
    assert isinstance(nf, NotFound) and isinstance(nf, FileNotFoundError) and nf.url == "http://h/b.tar"
    foreign = error_from_json({"type": "KeyError", "message": "'x'"})
    assert isinstance(foreign, EngineError) and "KeyError" in str(foreign)
    assert isinstance(error_from_json(error_to_json(MemoryError("out of memory"))), MemoryError)
    assert issubclass(ServiceError, WdsError) and issubclass(ServiceError, ConnectionError)


def test_ring_never_hands_out_unacknowledged_bytes() -> None:
    ring = Ring(4096)
    try:
        first = ring.allocate(1500)
        second = ring.allocate(1500)
        assert first == (0, 1500) and second == (1500, 1500)
        assert ring.allocate(1500) is None  # 1096 left at the end, and nothing acknowledged
        ring.ack(1500)
        third = ring.allocate(1500)  # does not fit before the end: starts at 0, the tail counts as used
        assert third == (0, 1096 + 1500) and ring.used == 1500 + 1096 + 1500
        assert ring.allocate(1) is None
        with pytest.raises(ServiceError, match="acknowledged"):
            ring.ack(ring.used + 1)
        ring.ack(ring.used)
        assert ring.used == 0 and ring.fits(2048) and not ring.fits(2049)
    finally:
        ring.close()


def test_ring_bytes_reach_the_reader() -> None:
    ring = Ring(8192)
    reader = RingReader(os.dup(ring.fd), ring.size)
    try:
        at, _ = ring.allocate(11)  # type: ignore[misc]
        ring.write(at, b"hello world")
        assert reader.read(at, 11) == b"hello world"
        with pytest.raises(ServiceError, match="outside the ring"):
            reader.read(8000, 500)
    finally:
        reader.close()
        ring.close()


def test_a_large_sample_goes_in_a_file_of_its_own() -> None:
    blocks = [b"a" * 100, b"", os.urandom(300_000)]
    fd, offsets = one_shot(blocks)
    try:
        assert [os.pread(fd, len(b), o) for b, o in zip(blocks, offsets)] == blocks
    finally:
        os.close(fd)


def test_the_ring_is_sealed_against_resizing() -> None:
    """A client holds the ring's descriptor: shrinking it would make the service's next write a SIGBUS."""
    import fcntl

    from wds_async.service.ring import SEALS

    ring = Ring(8192)
    try:
        assert fcntl.fcntl(ring.fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        for size in (0, 4096, 1 << 30):
            with pytest.raises(PermissionError):
                os.ftruncate(ring.fd, size)
        with pytest.raises(PermissionError):  # and the seals cannot be taken off or added to
            fcntl.fcntl(ring.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        assert os.fstat(ring.fd).st_size == 8192
    finally:
        ring.close()


def test_work_items_with_bad_fields_are_refused() -> None:
    good = [0, 0, "/data/a.tar", 0, None, None, None]
    assert item_from_json(good) == WorkItem(id=0, shard=0, url="/data/a.tar")
    for index, value in [(0, "0"), (0, -1), (0, 1.5), (0, float("inf")), (0, True), (2, 7), (2, ""), (3, -1),
                         (4, -2), (5, "yes"), (6, "etag"), (6, {"size": "big"}), (6, {"colour": "red"})]:
        bad = list(good)
        bad[index] = value
        with pytest.raises(ServiceError, match="bad work item"):
            item_from_json(bad)
    with pytest.raises(ServiceError, match="end is before start"):
        item_from_json([0, 0, "/a", 10, 5, None, None])


def test_deep_json_is_a_clear_error() -> None:
    with pytest.raises(ServiceError, match="nested too deeply"):
        FrameDecoder().feed(struct.pack(">I", 200_000) + b"[" * 100_000 + b"]" * 100_000)


def test_open_frames_are_packed_small_in_order() -> None:
    """A long item list goes in several open frames, each within OPEN_FRAME_BYTES, none lost or reordered;
    relative paths leave absolute (``~`` expanded), pipe: frames carry this process's directory and
    environment."""
    from wds_async.service.client import _open_frames
    from wds_async.service.protocol import OPEN_FRAME_BYTES

    items = [WorkItem(id=n, shard=n, url=f"http://h/{'x' * 200}/{n}.tar") for n in range(5000)]
    frames = list(_open_frames(items, {"settings": {}}))
    assert len(frames) > 1 and all(len(frame) <= OPEN_FRAME_BYTES for _, frame in frames)
    assert [i for part, _ in frames for i in part] == items
    decoded = [FrameDecoder().feed(frame)[0] for _, frame in frames]
    assert [row[0] for message in decoded for row in message["items"]] == list(range(5000))
    assert all("context" not in message for message in decoded)
    local = [WorkItem(id=0, shard=0, url="a.tar"), WorkItem(id=1, shard=1, url="file:b.tar"),
             WorkItem(id=2, shard=2, url="~/c.tar"), WorkItem(id=3, shard=3, url="/d.tar"),
             WorkItem(id=4, shard=4, url="pipe:cat e.tar")]
    (_, frame), = _open_frames(local, {})
    message = FrameDecoder().feed(frame)[0]
    assert [row[2] for row in message["items"]] == [os.path.join(os.getcwd(), "a.tar"),
                                                   os.path.join(os.getcwd(), "b.tar"),
                                                   os.path.expanduser("~/c.tar"), "/d.tar", "pipe:cat e.tar"]
    assert message["context"] == {"cwd": os.getcwd(), "env": dict(os.environ)}
