"""One suite for the store sinks (:mod:`wds_async.write.sinks`), run by each store's test module on its emulator.

A store's module subclasses :class:`UploadContract` and provides the ``up`` fixture: an :class:`UploadEnv`
whose environment points the SDK at a :class:`~tests.backends.upload_faults.FaultProxy` in front of the
emulator, plus what the suite needs to look behind it (the store's own SDK, straight to the emulator).
The suite checks: multi-part shards written by ShardWriter read back sample for sample, with an index
written to the store that a reader loads and trusts; a transient part failure retried, a part whose answer
was lost sent again; a producer error mid-shard and a persistent server failure each leaving no object and
no pending upload; and the sink's buffered bytes staying under three parts for a large object.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

import wds_async as wds
from tests.backends.upload_faults import Fault, FaultProxy, faults
from wds_async.config import RetryPolicy
from wds_async.errors import TransientError
from wds_async.write.sinks import open_sink

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


@dataclass
class UploadEnv:
    url: Callable[[str], str]                  # object name -> store URL
    read: Callable[[str], bytes | None]        # the object's bytes (None: absent), from the emulator itself
    proxy: FaultProxy                          # what the SDK talks to
    is_part: Callable[[str, str], bool]        # (method, path): a part / chunk / block upload
    transient: tuple[int, dict[str, str], bytes]   # how the store says "busy, try again"
    broken: tuple[int, dict[str, str], bytes]      # how it says "internal error"
    part_bytes: int                            # the smallest part the store takes (or a small one)
    pending: Callable[[], list[str]] = field(default=lambda: [])  # uploads neither completed nor aborted
    memory_parts: int = 24                     # the memory check writes this many parts' worth


def make_samples(count: int, size: int, seed: int = 0) -> list[dict[str, bytes | str]]:
    rng = random.Random(seed)
    return [{"__key__": f"s{i:05d}", "bin": rng.randbytes(size), "txt": f"sample {i}"} for i in range(count)]


def read_back(urls: list[str], **kw: object) -> list[tuple[str, bytes, bytes]]:
    return [(s["__key__"], s["bin"], s["txt"]) for s in wds.WebDataset(urls, deterministic=True, **kw)]


def expected(samples: list[dict[str, bytes | str]]) -> list[tuple[str, bytes, bytes]]:
    return [(str(s["__key__"]), bytes(s["bin"]), str(s["txt"]).encode()) for s in samples]


class UploadContract:
    """Subclasses provide the ``up`` fixture (see the module docstring)."""

    def test_sharded_multipart_round_trip_with_index(self, up: UploadEnv) -> None:
        part = up.part_bytes
        samples = make_samples(50, part // 8)  # shards of 20, 20 and 10 samples: 3, 3 and 2 parts
        pattern, index = up.url("train-%03d.tar"), up.url("train.index.jsonl")
        with wds.ShardWriter(pattern, maxsize=2.5 * part, verbose=0, part_bytes=part, index=index,
                             mtime=1) as writer:
            for sample in samples:
                writer.write(sample)
        urls = [pattern % n for n in range(3)]
        assert up.proxy.requests(up.is_part) >= 8
        assert read_back(urls) == expected(samples)
        loaded = wds.ShardIndex.load(index)
        assert [e.nsamples for e in loaded.shards] == [20, 20, 10]
        for entry, url in zip(loaded.shards, urls, strict=True):
            stored = up.read(url.rpartition("/")[2])
            assert stored is not None and entry.size == len(stored) and (entry.etag or entry.generation)
        assert read_back(urls, index=index) == expected(samples)  # the identities hold for a reader

    @pytest.mark.parametrize("lost", [False, True], ids=["refused", "answer-lost"])
    def test_one_failed_part_is_sent_again(self, up: UploadEnv, lost: bool) -> None:
        status, headers, body = up.transient
        samples = make_samples(28, up.part_bytes // 8, seed=1)  # 3.5 parts
        rule = Fault(up.is_part, which={2}, status=status, headers=headers, body=body,
                     forward=(lambda h, b: (h, b)) if lost else None)
        with faults(up.proxy, rule):
            writer = wds.TarWriter(up.url("retried.tar"), part_bytes=up.part_bytes, retry=FAST, mtime=1)
            with writer:
                for sample in samples:
                    writer.write(sample)
        assert (rule.failed, writer.stream.retries) == (1, 1), (rule.failed, rule.seen, writer.stream.retries)
        stored = up.read("retried.tar")
        assert stored is not None and writer.identity.size == len(stored)
        assert read_back([up.url("retried.tar")]) == expected(samples)

    def test_producer_error_mid_shard_leaves_nothing(self, up: UploadEnv) -> None:
        part = up.part_bytes
        pattern, index = up.url("cut-%03d.tar"), up.url("cut.index.jsonl")
        with pytest.raises(RuntimeError, match="producer"):
            with wds.ShardWriter(pattern, maxsize=2.5 * part, verbose=0, part_bytes=part, index=index) as writer:
                for sample in make_samples(32, part // 8, seed=2):
                    writer.write(sample)
                assert writer.tarstream is not None and writer.tarstream.stream.parts >= 1  # mid-upload
                raise RuntimeError("the producer failed")
        assert up.read("cut-000.tar") is not None  # closed before the error: kept
        assert up.read("cut-001.tar") is None and up.read("cut.index.jsonl") is None
        assert up.pending() == []

    def test_persistent_failure_names_the_url_and_leaves_nothing(self, up: UploadEnv) -> None:
        status, headers, body = up.broken
        url = up.url("doomed.tar")
        rule = Fault(up.is_part, status=status, headers=headers, body=body)
        with faults(up.proxy, rule), pytest.raises(TransientError, match="giving up") as caught:
            with wds.TarWriter(url, part_bytes=up.part_bytes, retry=FAST) as writer:
                for sample in make_samples(40, up.part_bytes // 8, seed=3):
                    writer.write(sample)
        assert caught.value.url == url and f"HTTP {status}" in str(caught.value)
        assert rule.failed >= FAST.attempts
        assert up.read("doomed.tar") is None and up.pending() == []

    def test_buffered_bytes_stay_under_three_parts(self, up: UploadEnv) -> None:
        part = up.part_bytes
        data = random.Random(4).randbytes(up.memory_parts * part + 12345)
        sink = open_sink(up.url("big.tar"), part_bytes=part)
        view, pos = memoryview(data), 0
        for size in [64 << 10] * 40 + [5 * part] + [part // 3] * 10:  # small writes, one of five parts
            sink.write(view[pos:pos + size])
            pos += size
        while pos < len(data):
            sink.write(view[pos:pos + (1 << 20)])
            pos += 1 << 20
        sink.close()
        assert part <= sink.peak_buffered_bytes <= 3 * part and sink.buffered_bytes == 0
        assert sink.identity is not None and sink.identity.size == len(data)
        stored = up.read("big.tar")
        assert stored is not None and hashlib.sha256(stored).digest() == hashlib.sha256(data).digest()
