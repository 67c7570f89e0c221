"""wds_async._aio: atomic writes through aiofiles, and what a cancellation leaves behind."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiofiles
import pytest
import pytest_asyncio

from wds_async._aio import PARTIAL_SUFFIX, AsyncFileWriter, is_partial, open_file
from wds_async.errors import BackendError

pytestmark = pytest.mark.asyncio


class GatedExecutor(ThreadPoolExecutor):
    """Once armed, holds the next call it runs at a gate until released; records every call's error and
    the calls submitted while one is held."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.errors: list[BaseException] = []
        self.while_held: list[Future[Any]] = []
        self.submitted: list[Future[Any]] = []

    async def cancel_then_release(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` while the held call waits; let whatever the cancellation submits right away (a
        close, in a broken implementation) run to the end; then open the gate."""
        task.cancel()
        for _ in range(100):  # loop steps, not time: the cancellation's own work, without the held call
            await asyncio.sleep(0)
        if self.while_held:
            await asyncio.wait([asyncio.wrap_future(f) for f in self.while_held])
        self.gate.set()

    async def drain(self) -> None:
        """Wait for every call submitted so far, then for those their completions submit (a cleanup)."""
        for _ in range(3):
            await asyncio.wait([asyncio.wrap_future(f) for f in self.submitted])
            for _ in range(100):  # loop steps: the completions' callbacks run and submit what they submit
                await asyncio.sleep(0)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        hold, self.armed = self.armed, False
        held = self.entered.is_set() and not self.gate.is_set()

        def call() -> Any:
            if hold:
                self.entered.set()
                self.gate.wait(30)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                self.errors.append(exc)
                raise

        future = super().submit(call)
        self.submitted.append(future)
        if held:
            self.while_held.append(future)
        return future


@pytest_asyncio.fixture()
async def gated() -> GatedExecutor:
    executor = GatedExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    return executor


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_commit_publishes_the_bytes_in_order(tmp_path: Path) -> None:
    target = tmp_path / "shard.tar"
    async with AsyncFileWriter(target, buffer_bytes=100) as out:
        assert is_partial(out.path) and os.path.dirname(out.path) == str(tmp_path)
        for i in range(50):
            await out.write(bytes([i]) * 7)  # gathered into writes of >= 100 bytes
        await out.write(b"B" * 300)
        assert not target.exists()
        await out.commit()
    assert target.read_bytes() == b"".join(bytes([i]) * 7 for i in range(50)) + b"B" * 300
    assert out.position == 650
    assert os.listdir(tmp_path) == ["shard.tar"]


async def test_pwrite_and_commit_elsewhere_replacing_a_file(tmp_path: Path) -> None:
    final = tmp_path / "other.tar"
    final.write_bytes(b"old")
    out = await AsyncFileWriter(tmp_path / "shard.tar").open()
    await asyncio.gather(out.pwrite(b"world", 5), out.pwrite(b"hello", 0))
    await out.commit(final)
    assert final.read_bytes() == b"helloworld"
    assert sorted(os.listdir(tmp_path)) == ["other.tar"]


async def test_discard_removes_the_file_and_never_raises(tmp_path: Path) -> None:
    target = tmp_path / "shard.tar"
    target.write_bytes(b"old")
    out = await AsyncFileWriter(target).open()
    await out.write(b"new" * 1000)
    await out.flush()
    os.unlink(out.path)  # gone already: discard still succeeds
    await out.discard()
    await out.discard()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["shard.tar"]
    with pytest.raises(ValueError, match="not open"):
        await out.write(b"x")


async def test_an_error_in_the_block_discards(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with AsyncFileWriter(tmp_path / "shard.tar") as out:
            await out.write(b"x" * 10)
            await out.flush()
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


async def test_leaving_without_commit_discards(tmp_path: Path) -> None:
    async with AsyncFileWriter(tmp_path / "shard.tar") as out:
        await out.write(b"x" * 10)
    assert os.listdir(tmp_path) == []


async def test_a_missing_directory_is_a_backend_error_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(BackendError, match="cannot create a file next to the target") as info:
        await AsyncFileWriter(tmp_path / "file" / "shard.tar").open()
    assert info.value.url is not None and info.value.url.endswith(PARTIAL_SUFFIX)


async def test_cancelled_mid_write_leaves_no_file(tmp_path: Path, gated: GatedExecutor) -> None:
    target = tmp_path / "shard.tar"

    async def fill() -> None:
        async with AsyncFileWriter(target) as out:
            gated.armed = True  # the next executor call, the write below, waits at the gate
            await out.write(b"x" * (2 << 20))
            await out.commit()

    task = asyncio.create_task(fill())
    await _until(gated.entered.is_set)
    await gated.cancel_then_release(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert os.listdir(tmp_path) == []
    assert gated.errors == []  # the write finished before the close: never a write to a closed file


async def test_cancelled_open_removes_the_file_it_creates(tmp_path: Path, gated: GatedExecutor) -> None:
    gated.armed = True  # the open waits at the gate
    task = asyncio.create_task(AsyncFileWriter(tmp_path / "shard.tar").open())
    await _until(gated.entered.is_set)
    await gated.cancel_then_release(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    await gated.drain()  # the open, which created the file after all, then its removal
    assert os.listdir(tmp_path) == []


async def test_cancelled_open_of_a_reader_closes_the_file(
    tmp_path: Path, gated: GatedExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"abc")
    opened: list[Any] = []
    real_open = aiofiles.open

    async def spy(*args: Any, **kwargs: Any) -> Any:
        opened.append(await real_open(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(aiofiles, "open", spy)
    gated.armed = True  # the open waits at the gate
    task = asyncio.create_task(open_file(str(path), "rb"))
    await _until(gated.entered.is_set)
    await gated.cancel_then_release(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: bool(opened) and opened[0].closed)


async def test_file_backend_closes_after_a_cancelled_read(
    tmp_path: Path, gated: GatedExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wds_async.backends import file as file_backend

    monkeypatch.setattr(file_backend, "_cached", lambda fd, pos, n: False)  # every read a page-cache miss
    path = tmp_path / "shard.tar"
    path.write_bytes(b"x" * (3 << 20))
    backend = file_backend.FileBackend()

    async def read() -> None:
        async with backend.open(str(path)) as stream:
            gated.armed = True  # the first read waits at the gate
            async for _ in stream:
                pass

    task = asyncio.create_task(read())
    await _until(gated.entered.is_set)
    await gated.cancel_then_release(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gated.errors == []  # the read returned before the close ran


async def _read_range(backend: Any, path: Path, start: int, end: int) -> bytes:
    async with backend.open(str(path), start=start, end=end) as stream:
        return b"".join([chunk async for chunk in stream])


async def test_file_backend_reads_a_page_cached_range_with_one_hop(
    tmp_path: Path, gated: GatedExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range of a file in the page cache costs one executor call, the open: it is read at its offset (no
    seek) and closed on the loop (a reader's close writes nothing back)."""
    from wds_async.backends import file as file_backend

    monkeypatch.setattr(file_backend, "_cached", lambda fd, pos, n: True)
    data = os.urandom(200_000)
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    fds = len(os.listdir("/proc/self/fd"))
    got = await _read_range(file_backend.FileBackend(chunk_bytes=30_000), path, 70_001, 150_000)
    assert got == data[70_001:150_000]
    assert len(gated.submitted) == 1  # the open; before: the open, a seek and the close
    assert len(os.listdir("/proc/self/fd")) == fds  # closed


async def test_close_reader_without_the_wrapped_file_closes_through_aiofiles() -> None:
    """Should aiofiles stop exposing the file it wraps, a reader is still closed (through its own close)."""
    from wds_async._aio import close_reader

    class Wrapper:
        closed = False

        async def close(self) -> None:
            self.closed = True

    f = Wrapper()
    await close_reader(f)  # type: ignore[arg-type]
    assert f.closed


@pytest.mark.parametrize("pread", [True, False], ids=["pread", "seek-and-read"])
async def test_file_backend_reads_ranges_at_their_offset_from_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pread: bool
) -> None:
    """Page-cache misses read in the executor at their offset, chunk after chunk, where the platform has no
    ``pread`` too; the file is closed after them."""
    from wds_async.backends import file as file_backend

    monkeypatch.setattr(file_backend, "_cached", lambda fd, pos, n: False)
    if not pread:
        monkeypatch.setattr(file_backend, "_PREAD", None)
    data = os.urandom(200_000)
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    backend = file_backend.FileBackend(chunk_bytes=30_000)
    fds = len(os.listdir("/proc/self/fd"))
    assert await _read_range(backend, path, 5, 199_990) == data[5:199_990]
    assert await _read_range(backend, path, 123_456, 123_457) == data[123_456:123_457]
    async with backend.open(str(path), start=190_000) as stream:  # to the end of the file
        assert b"".join([chunk async for chunk in stream]) == data[190_000:]
    assert len(os.listdir("/proc/self/fd")) == fds


async def test_a_failed_commit_removes_the_temporary_file(tmp_path: Path) -> None:
    out = await AsyncFileWriter(tmp_path / "shard.tar").open()
    await out.write(b"x" * 10)
    with pytest.raises(BackendError, match="cannot publish the file") as info:
        await out.commit(tmp_path / "missing" / "shard.tar")
    assert info.value.url == str(tmp_path / "missing" / "shard.tar")
    assert os.listdir(tmp_path) == []
