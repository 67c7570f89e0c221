"""One conformance suite that every backend inherits.

A backend's test module subclasses :class:`BackendContract` and provides the ``env`` fixture: a
:class:`ContractEnv` with a factory for a fresh backend (created inside the test's event loop), a
function from an object name to its URL, and a synchronous ``put`` that uploads through the store's own
SDK. The suite checks: open from 0, from an offset, a bounded range, size, glob listing, not-found,
cancellation mid-stream releasing the connection, and end-to-end use through ``WebDataset`` with 0
and 2 DataLoader workers.

A case that does not apply to a source is skipped with the reason, decided by what the backend declares
(``capabilities_of(backend).conditional_reads``) or by the env's flags (``lists``, ``sized``, ``ranged``, ``honours_preconditions``);
where the source answers otherwise (no listing, no size), the suite checks that answer instead.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import tarfile
from collections import Counter
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import wds_async as wds
from wds_async.io.backend import ObjectIdentity, capabilities_of
from wds_async.io.reader import RangeReader

DATA = os.urandom(300_000)


@dataclass
class ContractEnv:
    make_backend: Callable[..., Any]           # (max_connections=...) -> backend, called inside a running loop
    url: Callable[[str], str]                  # object name -> URL
    put: Callable[[str, bytes], None]          # upload through the store's SDK
    dataset_options: dict[str, Any]            # extra WebDataset(...) keyword arguments (backend_options=...)
    honours_preconditions: bool = True         # the emulator answers 412 to If-Match / ifGenerationMatch
    lists: bool = True                         # list() expands globs (else it raises BackendError)
    sized: bool = True                         # size() knows the size (else it answers None)
    ranged: bool = True                        # a large shard is read as concurrent ranged parts
    missing: type[Exception] = wds.NotFound    # what reading an object that does not exist raises


def put_in_folder(root: Path) -> Callable[[str, bytes], None]:
    """``ContractEnv.put`` for sources that read local files (file, pipe): write ``root/name``."""

    def put(name: str, data: bytes) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return put


def make_shard(index: int, samples: int = 5) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(samples):
            for ext, payload in (("txt", f"shard {index} sample {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{index:03d}_{i:03d}.{ext}")
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


async def _read(backend: Any, url: str, **kw: Any) -> bytes:
    async with backend.open(url, **kw) as stream:
        return b"".join([chunk async for chunk in stream])


class BackendContract:
    """Subclass and define an ``env`` fixture returning a :class:`ContractEnv`."""

    @pytest.fixture()
    def data_url(self, env: ContractEnv) -> str:
        env.put("contract/data.bin", DATA)
        return env.url("contract/data.bin")

    @pytest.mark.asyncio
    async def test_open_from_zero(self, env: ContractEnv, data_url: str) -> None:
        backend = env.make_backend()
        try:
            assert await _read(backend, data_url) == DATA
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_open_from_offset(self, env: ContractEnv, data_url: str) -> None:
        backend = env.make_backend()
        try:
            assert await _read(backend, data_url, start=123_457) == DATA[123_457:]
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_bounded_range(self, env: ContractEnv, data_url: str) -> None:
        backend = env.make_backend()
        try:
            assert await _read(backend, data_url, start=1000, end=70_000) == DATA[1000:70_000]
            assert await _read(backend, data_url, start=0, end=1) == DATA[:1]
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_size(self, env: ContractEnv, data_url: str) -> None:
        backend = env.make_backend()
        try:
            assert await backend.size(data_url) == (len(DATA) if env.sized else None)
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_listing_with_glob(self, env: ContractEnv) -> None:
        for name in ("list/a-000.tar", "list/a-001.tar", "list/b-000.tar", "list/sub/a-002.tar"):
            env.put(name, b"x")
        backend = env.make_backend()
        try:
            if not env.lists:
                with pytest.raises(wds.BackendError, match="list"):
                    await backend.list(env.url("list/a-*.tar"))
                pytest.skip("this source has no listing API: it refuses to list, as checked")
            assert await backend.list(env.url("list/a-*.tar")) == [env.url("list/a-000.tar"), env.url("list/a-001.tar")]
            assert await backend.list(env.url("list/**/a-*.tar")) == [
                env.url("list/a-000.tar"), env.url("list/a-001.tar"), env.url("list/sub/a-002.tar")]
            assert await backend.list(env.url("list/nothing-*.tar")) == []
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_not_found(self, env: ContractEnv) -> None:
        url = env.url("contract/does-not-exist.tar")
        backend = env.make_backend()
        try:
            with pytest.raises(env.missing) as info:
                await _read(backend, url)
            assert "does-not-exist.tar" in str(info.value)
            if env.sized:
                with pytest.raises(env.missing):
                    await backend.size(url)
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_cancel_mid_stream_releases_the_connection(self, env: ContractEnv, data_url: str) -> None:
        backend = env.make_backend(max_connections=1)
        try:
            for _ in range(3):  # with one connection, a leaked one would make the next open hang
                async with backend.open(data_url) as stream:
                    async for _chunk in stream:
                        break
            reader = asyncio.ensure_future(_read(backend, data_url))
            await asyncio.sleep(0)
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            assert await asyncio.wait_for(_read(backend, data_url), 30) == DATA
        finally:
            await backend.aclose()

    @pytest.mark.asyncio
    async def test_conditional_opens_refuse_another_version(self, env: ContractEnv, data_url: str) -> None:
        """Where the backend sends preconditions (If-Match, ifGenerationMatch), the store honours them: the
        version seen reads as before, another one is a 412, which is ObjectChanged."""
        backend = env.make_backend()
        try:
            if not capabilities_of(backend).conditional_reads:
                pytest.skip("this backend checks identities after the answer only")
            async with backend.open(data_url, start=0, end=10) as stream:
                seen = stream.identity
                assert b"".join([c async for c in stream]) == DATA[:10]
            assert await _read(backend, data_url, start=10, end=20, expect=seen) == DATA[10:20]
            if seen.etag is None and seen.generation is None:
                pytest.skip("this emulator's answers carry no version (no ETag, no generation) to pin")
            other = ObjectIdentity(size=seen.size, etag='"not-this-version"' if seen.etag else None,
                                   generation="1" if seen.generation else None)
            # Through the reader, a version mismatch fails whether the store refuses (412) or answers.
            reader = RangeReader(backend, data_url, start=10, end=20, expect=other)
            with pytest.raises(wds.ObjectChanged):
                async with aclosing(reader.chunks()) as chunks:
                    async for _chunk in chunks:
                        pass
            if env.honours_preconditions:
                with pytest.raises(wds.ObjectChanged, match="412"):
                    await _read(backend, data_url, start=10, end=20, expect=other)
        finally:
            await backend.aclose()

    def test_dataset_reads_a_large_shard_as_parts(self, env: ContractEnv) -> None:
        env.put("parts/big-000000.tar", make_shard(7, samples=400))
        url = env.url("parts/big-000000.tar")
        whole = [s["__key__"] for s in wds.WebDataset(url, part_bytes=0, deterministic=True, **env.dataset_options)]
        parted = wds.WebDataset(url, part_bytes=32 << 10, deterministic=True, **env.dataset_options)
        assert [s["__key__"] for s in parted] == whole and len(whole) == 400
        if not env.ranged:  # the same samples, read as one stream: this source has no byte ranges
            assert parted.stats()["parts"] == 0
            pytest.skip("this source cannot serve ranges: the shard was read whole, as checked")
        assert parted.stats()["parts"] > 0

    @pytest.fixture()
    def shard_pattern(self, env: ContractEnv) -> str:
        for i in range(4):
            env.put(f"e2e/shards-{i:06d}.tar", make_shard(i))
        return env.url("e2e/shards-{000000..000003}.tar")

    @pytest.mark.parametrize("workers", [0, 2])
    def test_dataset_end_to_end(self, env: ContractEnv, shard_pattern: str, workers: int) -> None:
        ds = wds.WebDataset(shard_pattern, **env.dataset_options).to_tuple("__url__", "__key__")
        kw: dict[str, Any] = {"multiprocessing_context": multiprocessing.get_context("fork")} if workers else {}
        seen = Counter(tuple(x) for x in DataLoader(ds, batch_size=None, num_workers=workers, **kw))
        assert len(seen) == 20 and set(seen.values()) == {1}

    def test_dataset_glob(self, env: ContractEnv, shard_pattern: str) -> None:
        if not env.lists:
            pytest.skip("this source has no listing API, so no glob URLs")
        ds = wds.WebDataset(env.url("e2e/shards-*.tar"), **env.dataset_options)
        assert ds.urls == wds.expand_urls(shard_pattern)
        assert sum(1 for _ in ds) == 20

    def test_cli_ls_and_bench(self, env: ContractEnv, shard_pattern: str) -> None:
        """``wds-async ls`` expands the glob through the store; ``wds-async bench`` runs on its URLs."""
        import subprocess
        import sys

        cli = [sys.executable, "-m", "wds_async.cli"]
        if env.lists:  # (without a listing API, ``ls`` of a glob has nothing to ask; bench still runs)
            listed = subprocess.run([*cli, "ls", "-l", env.url("e2e/shards-*.tar")], capture_output=True, text=True,
                                    timeout=120)
            assert listed.returncode == 0, listed.stderr
            lines = listed.stdout.splitlines()
            assert [line.split()[-1] for line in lines] == wds.expand_urls(shard_pattern)
            assert all(int(line.split()[0]) > 0 for line in lines)
        bench = subprocess.run([*cli, "bench", shard_pattern, "-c", "2"], capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr
        assert "exactly once" in bench.stdout and "yes" in bench.stdout
