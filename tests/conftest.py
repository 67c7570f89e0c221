"""Shared fixtures: small synthetic shards, the emulated store on 127.0.0.1, leak probes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import sys
import tarfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.emulators import azurite, gcs_emulator, moto_server, unavailable

N_SHARDS = 8


#: The test files that take longest, started first. ``scripts/test.sh`` runs the suite with pytest-xdist, each file
#: whole on one process; xdist's own order hands out the files with the most tests first, which left the torchrun
#: files (a few tests of 10-45 s each) to start last and run on alone: on a clean clone (2026-11-28, 3 processes on 2
#: cores) the last 4% of the tests took about 3 of the suite's 8.7 minutes. With this order the next clean run took
#: 558 s for 1,573 s of test time, 524 s a process. Seconds of test time in that run (``--durations=0``): torchrun
#: 144, mix_torchrun 122, without_torch 92, mix_resume 82, resume 65, cache_processes 62, hardening 57, seeds 42,
#: memory 40, cli 40; the rest below 40. An order only: a file missing here runs after them (a test checks that each
#: one exists).
LONGEST_FIRST = (
    "torch/test_torchrun.py",
    "torch/test_mix_torchrun.py",
    "integration/test_without_torch.py",
    "torch/test_mix_resume.py",
    "torch/test_resume.py",
    "engine/test_cache_processes.py",
    "service/test_hardening.py",
    "parity/test_seeds.py",
    "engine/test_memory.py",
    "integration/test_cli.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in that order; the rest after them in their usual order (a stable
    sort: within a file, tests keep theirs). ``scripts/test.sh`` passes ``--no-loadscope-reorder`` so that
    pytest-xdist keeps this order."""
    root = Path(__file__).parent
    rank = {(root / name).resolve(): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.resolve(), len(rank)))


@pytest.fixture(autouse=True)
def _scrub_cloud_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may pick up a developer's real credentials or endpoints."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "AZURE_", "STORAGE_EMULATOR", "WDS_ASYNC_")):
            monkeypatch.delenv(name, raising=False)
    # google-cloud-storage 3.x (the client some tests check the emulated store with) fetches a bucket's metadata in
    # a daemon thread of its own on the first request to the bucket, with its default retry: against a store that
    # answers 503 that thread retried for two minutes, under later modules' tests, drawing its backoff jitter from
    # the global ``random`` (hypothesis then failed a fuzz test in CI: "Do not use the random module inside
    # strategies"). The tests do not need that metadata (it feeds the client's OpenTelemetry attributes).
    monkeypatch.setenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")


@pytest.fixture(scope="module", autouse=True)
def _no_thread_outlives_its_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A leak probe: every thread a test module started (an engine's loop thread, a bridge, a client library's
    background thread) has ended once the module's objects are gone. A thread left running keeps what it holds
    (an engine its connections) for the rest of the process, and whatever it still does (a retry's backoff, its
    draws from the global ``random``) runs under the next modules' tests."""
    import gc

    before = set(threading.enumerate())

    def started_here() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before and t.is_alive()]

    yield
    gc.collect()
    if not wait_until(lambda: not started_here(), timeout=10):
        left = started_here()
        frames = sys._current_frames()
        where = "\n".join(f"--- {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident])[-6:])
                          for t in left if t.ident in frames)
        pytest.fail(f"{request.module.__name__} left {len(left)} thread(s) running "
                    f"({', '.join(sorted(t.name for t in left))}):\n{where}", pytrace=False)


def _emulator(start: Callable[[], AbstractContextManager[str]], what: str) -> Iterator[str]:
    """The endpoint of an emulator started for one test module; its failure to start skips the module's tests
    (fails them under CI=true, see :func:`tests.emulators.unavailable`)."""
    with ExitStack() as stack:
        try:
            endpoint = stack.enter_context(start())
        except RuntimeError as exc:
            unavailable(f"{what}: {exc}")
        yield endpoint


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto in server mode (S3) on 127.0.0.1."""
    yield from _emulator(moto_server, "moto server")


@pytest.fixture(scope="module")
def gcs_endpoint() -> Iterator[str]:
    """gcp-storage-emulator on 127.0.0.1, as ``http://HOST:PORT``."""
    yield from _emulator(gcs_emulator, "gcp-storage-emulator")


@pytest.fixture(scope="module")
def azurite_endpoint() -> Iterator[str]:
    """Azurite's blob endpoint on 127.0.0.1."""
    yield from _emulator(azurite, "Azurite")


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 shards of ~256 KiB with ~8 KiB samples, plus manifest.json (expected sample counts)."""
    root = tmp_path_factory.mktemp("shards")
    make_shards(root, n_shards=N_SHARDS, shard_bytes=256 << 10, sample_bytes=8 << 10, seed=1)
    return root


@pytest.fixture(scope="session")
def manifest(shard_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((shard_dir / "manifest.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def store(shard_dir: Path) -> Iterator[StoreProcess]:
    """The emulated object store serving ``shard_dir`` (knobs per request via URL query)."""
    with StoreProcess(shard_dir, Knobs(seed=7)) as server:
        yield server


@pytest.fixture(scope="session")
def pattern(store: StoreProcess) -> str:
    return store.base_url + f"shard-{{000000..{N_SHARDS - 1:06d}}}.tar"


def sample_digest(samples: Iterable[dict]) -> tuple[int, str]:  # type: ignore[type-arg]
    """Sample count and one hash over every sample's key and fields (``__url__`` aside), in delivery order:
    equal digests mean the same samples, the same bytes, the same order."""
    h = hashlib.sha256()
    n = 0
    for s in samples:
        n += 1
        for k in sorted(s):
            if k != "__url__":
                h.update(k.encode())
                h.update(s[k] if isinstance(s[k], bytes) else str(s[k]).encode())
    return n, h.hexdigest()


def write_tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> Path:
    """A tar at ``path`` holding ``members`` (name, data) in order."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for a server or a torchrun rendezvous the test starts next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until true or ``timeout``; cleanup is asynchronous in places (reaping)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def queued_in(channel) -> list[tuple[object, int]]:  # type: ignore[no-untyped-def]
    """What a :class:`~wds_async.engine.channel.SampleChannel` holds for its consumer, as (item, bytes), taken
    under its lock (a white-box look: no public counter tells what is queued, or a queued error)."""
    with channel._lock:
        queues = [channel._ready, *(slot.queue for _, slot in channel._slots)]
        return [entry for queue in queues for entry in zip(queue.items[queue.head:], queue.sizes[queue.head:])]


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "wds-async-engine"]


def doc_block(page: Path, heading: str) -> str:
    """The first python code block under ``heading`` in a docs page."""
    text = page.read_text()
    section = text[text.index(f"\n{heading}\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"no python block under {heading!r}"
    return match.group(1)


def break_second_write(writer: Any) -> None:
    """Make a TarWriter's output raise ``KeyboardInterrupt`` at its second write call from now on, as a Ctrl-C in
    the middle of a sample would: the sample's first piece gets out, the rest does not."""
    real_write, calls = writer._out.write, []

    def interrupted(data: Any) -> Any:
        calls.append(data)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_write(data)

    writer._out.write = interrupted
