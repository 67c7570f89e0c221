"""Scheme registry: lazy loading, install hints for missing extras, Azure host routing, custom backends
(register_backend), and backend options checked per scheme at construction."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import ClassVar

import pytest

import wds_async as wds
from tests.conftest import write_tar
from wds_async import register_backend
from wds_async.config import EngineConfig
from wds_async.errors import UrlError
from wds_async.io import (
    BackendSet,
    ByteStream,
    ObjectIdentity,
    backend_class,
    backend_key,
    scheme_options,
    supported_schemes,
)


@pytest.mark.parametrize("dataset", ["WebDataset({urls})", "IndexedWebDataset({urls}, nsamples=[1])"])
@pytest.mark.parametrize(("module", "url", "extra"), [("boto3", "s3://bkt/x.tar", "s3"),
                                                      ("google.auth", "gs://bkt/x.tar", "gcs"),
                                                      ("azure.storage.blob", "az://ctr/x.tar", "azure")])
def test_missing_sdk_names_the_extra_to_install(module: str, url: str, extra: str, dataset: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # as if the SDK were not installed\n"
        "import wds_async as wds\n"
        "try:\n"
        f"    wds.{dataset.format(urls=repr([url]))}  # construction, not iteration, finds it\n"
        "except wds.MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert f"pip install 'wds-async[{extra}]'" in out.stdout, out.stdout + out.stderr
    assert url in out.stdout


@pytest.mark.parametrize("dataset", ["WebDataset({urls})", "IndexedWebDataset({urls}, nsamples=[1])"])
def test_a_dataset_imports_its_backends_at_construction_for_forked_workers_to_inherit(dataset: str) -> None:
    """A backend's module is imported once in the parent, not again in every forked DataLoader worker of every
    epoch, at its first batch. aiohttp (about 0.2 CPU s to import) is not among those imports: the builtin client,
    which sends the GETs, does not need it (proxies, redirects, ``client="aiohttp"`` and listings import it at
    their first use)."""
    code = (
        "import sys\n"
        "import wds_async as wds\n"
        f"wds.{dataset.format(urls=repr(['http://127.0.0.1:9/x.tar']))}\n"
        "print('wds_async.backends.http' in sys.modules, 'wds_async.backends._h1' in sys.modules, "
        "'aiohttp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "False"], out.stdout + out.stderr


def test_unknown_scheme() -> None:
    with pytest.raises(UrlError, match="unknown URL scheme 'ftp'"):
        backend_class("ftp", "ftp://h/x")
    assert "s3" in supported_schemes() and "azure" not in supported_schemes()


@pytest.mark.parametrize(("url", "key"), [("https://acct.blob.core.windows.net/c/b.tar", "azure"),
                                          ("https://example.org/b.tar", "https"), ("gs://b/k", "gs"),
                                          ("/local/x.tar", "file"),
                                          # the host is read by slicing: credentials, port, case, query
                                          ("https://u:p@ACCT.Blob.core.windows.net:443/c/b?x=1", "azure"),
                                          ("https://h/x?next=a.blob.core.windows.net", "https"),
                                          ("https://h#a.blob.core.windows.net/", "https"),
                                          ("https://[::1]:8443/c/b.tar", "https")])
def test_backend_key(url: str, key: str) -> None:
    assert backend_key(url) == key


# -- custom backends ---------------------------------------------------------------------------------


class DirBackend:
    """A custom store: ``dirtest://NAME`` is the file NAME under ``root``, streamed in small chunks."""

    instances: ClassVar[list[DirBackend]] = []

    def __init__(self, *, root: str, chunk_bytes: int = 1 << 20, label: str = "") -> None:
        self.root, self.chunk_bytes, self.label = Path(root), min(chunk_bytes, 4096), label
        self.closed = False
        DirBackend.instances.append(self)

    def _path(self, url: str) -> Path:
        return self.root / url.split("://", 1)[1]

    @asynccontextmanager
    async def open(self, url: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[ByteStream]:
        data = self._path(url).read_bytes()[start:end]

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(data), self.chunk_bytes):
                await asyncio.sleep(0)
                yield data[i:i + self.chunk_bytes]

        yield ByteStream(chunks(), start=start, identity=ObjectIdentity(size=self._path(url).stat().st_size))

    async def size(self, url: str) -> int | None:
        return self._path(url).stat().st_size

    async def list(self, pattern: str) -> list[str]:
        raise NotImplementedError

    async def aclose(self) -> None:
        self.closed = True


register_backend("dirtest", DirBackend)


@pytest.fixture()
def tars(tmp_path: Path) -> Path:
    for i in range(2):
        write_tar(tmp_path / f"shard-{i}.tar",
                  [(f"k{i}_{j}.{ext}", f"{i}/{j}/{ext}".encode() * 100) for j in range(5) for ext in ("txt", "cls")])
    return tmp_path


def test_a_registered_scheme_streams_a_real_tar(tars: Path) -> None:
    DirBackend.instances.clear()
    ds = wds.WebDataset("dirtest://shard-{0..1}.tar", backend_options={"dirtest": {"root": str(tars)}},
                        max_connections=2, shardshuffle=False, deterministic=True)
    got = [(s["__key__"], s["txt"], s["cls"]) for s in ds]
    reference = wds.WebDataset(str(tars / "shard-{0..1}.tar"), shardshuffle=False, deterministic=True)
    assert got == [(s["__key__"], s["txt"], s["cls"]) for s in reference]
    assert len(got) == 10 and got[0] == ("k0_0", b"0/0/txt" * 100, b"0/0/cls" * 100)
    assert [b.closed for b in DirBackend.instances] == [True]  # one instance per iteration, closed at its end
    assert "dirtest" in supported_schemes()


def test_custom_backend_options_are_checked_at_construction(tars: Path) -> None:
    with pytest.raises(UrlError, match=r"'rot' is not known to the dirtest:// backend .*accepts: label, root"):
        wds.WebDataset("dirtest://shard-0.tar", backend_options={"rot": str(tars)})
    with pytest.raises(UrlError, match=r"'chunk_bytes' .* is an engine setting"):
        wds.WebDataset("dirtest://shard-0.tar", backend_options={"dirtest": {"root": "x", "chunk_bytes": 5}})


def test_a_factory_gets_the_engine_settings_its_signature_takes(tars: Path) -> None:
    seen: dict[str, object] = {}

    def factory(**kwargs: object) -> DirBackend:
        seen.update(kwargs)
        return DirBackend(root=str(kwargs.pop("where")))

    register_backend("dirfactory", factory)
    ds = wds.WebDataset("dirfactory://shard-1.tar", backend_options={"where": str(tars)}, max_connections=3)
    assert len(list(ds)) == 5
    assert seen["where"] == str(tars) and seen["max_connections"] == 3 and "chunk_bytes" in seen


@pytest.mark.asyncio
async def test_a_factory_that_returns_no_backend_is_named() -> None:
    register_backend("notabackend", lambda: object())
    backends = BackendSet(EngineConfig())
    try:
        with pytest.raises(TypeError, match="notabackend:// backend factory returned object, which lacks"):
            backends.for_url("notabackend://x.tar")
    finally:
        await backends.aclose()


def test_registering_is_explicit_about_replacing() -> None:
    register_backend("dirtest", DirBackend)  # the same factory again: nothing happens
    with pytest.raises(ValueError, match="already has a backend; pass replace=True"):
        register_backend("dirtest", lambda **kw: DirBackend(**kw))
    with pytest.raises(ValueError, match="s3:// scheme already has a backend"):
        register_backend("s3", DirBackend)
    with pytest.raises(ValueError, match="a scheme is lowercase"):
        register_backend("Bad Scheme", DirBackend)
    with pytest.raises(TypeError, match="needs a Backend class or factory"):
        register_backend("nothing", "module:Class")  # type: ignore[arg-type]


# -- backend options ---------------------------------------------------------------------------------


def test_unknown_options_name_the_option_the_scheme_and_what_it_accepts() -> None:
    with pytest.raises(UrlError) as info:
        wds.WebDataset("s3://bkt/x.tar", backend_options={"endpont_url": "http://127.0.0.1:9"})
    text = str(info.value)
    assert "'endpont_url'" in text and "s3://" in text and "endpoint_url" in text and "anonymous" in text
    with pytest.raises(UrlError, match=r"'region' is not known to the gs:// backend .*credentials, endpoint_url"):
        wds.WebDataset(["s3://bkt/x.tar", "gs://bkt/y.tar"], backend_options={"gs": {"region": "x"}})
    with pytest.raises(UrlError, match="'anonymous' is not known to the http:// backend"):
        wds.WebDataset("http://127.0.0.1:9/x.tar", backend_options={"anonymous": True})


def test_flat_options_need_one_backend_and_forms_do_not_mix(tmp_path: Path) -> None:
    with pytest.raises(UrlError, match="these URLs use gs, s3"):
        wds.WebDataset(["s3://bkt/x.tar", "gs://bkt/y.tar"], backend_options={"anonymous": True})
    with pytest.raises(UrlError, match=r"mixes per-scheme entries \('s3'\) with options outside any scheme "
                                       r"\('anonymous'\)"):
        wds.WebDataset("s3://bkt/x.tar", backend_options={"s3": {}, "anonymous": True})
    # http and https share a backend, so one flat dict serves both
    ds = wds.WebDataset(["http://127.0.0.1:9/a.tar", "https://127.0.0.1:9/b.tar"],
                        backend_options={"headers": {"X-Test": "1"}})
    assert ds._backend_options == {"http": {"headers": {"X-Test": "1"}}, "https": {"headers": {"X-Test": "1"}}}


@pytest.mark.asyncio
async def test_each_scheme_gets_its_own_options() -> None:
    options = scheme_options({"s3": {"endpoint_url": "http://127.0.0.1:9", "region": "eu-west-1"},
                              "gs": {"anonymous": True, "endpoint_url": "http://127.0.0.1:8"},
                              "http": {"headers": {"X-Test": "1"}}},
                             ["s3://b/k.tar", "gs://b/k.tar", "https://h/k.tar"])
    backends = BackendSet(EngineConfig(max_connections=3, chunk_bytes=1 << 16), options=options)
    try:
        s3, gs = backends.for_url("s3://b/k.tar"), backends.for_url("gs://b/k.tar")
        http, https = backends.for_url("http://h/x.tar"), backends.for_url("https://h/x.tar")
        assert (s3.endpoint_url, s3.region, s3.max_connections) == ("http://127.0.0.1:9", "eu-west-1", 3)  # type: ignore[attr-defined]
        assert gs.endpoint == "http://127.0.0.1:8" and gs.max_connections == 3  # type: ignore[attr-defined]
        assert http is https and http.headers == {"X-Test": "1"}  # type: ignore[attr-defined]
        assert backends.for_url("file:///x.tar").chunk_bytes == 1 << 16  # type: ignore[attr-defined]
    finally:
        await backends.aclose()


@pytest.mark.asyncio
async def test_a_backend_set_without_urls_checks_flat_options_when_it_creates_a_backend() -> None:
    backends = BackendSet(EngineConfig(), options={"region": "eu-west-1"})
    try:
        assert backends.for_url("s3://b/k.tar").region == "eu-west-1"  # type: ignore[attr-defined]
        with pytest.raises(UrlError, match="'region' is not known to the file:// backend"):
            backends.for_url("/data/x.tar")
    finally:
        await backends.aclose()


def test_allow_pipe_still_reaches_the_pipe_backend(tars: Path) -> None:
    url = f"pipe:cat {tars / 'shard-0.tar'}"
    assert len(list(wds.WebDataset([url], allow_pipe=True))) == 5
    with pytest.raises(UrlError, match="pipe: URLs are disabled"):
        list(wds.WebDataset([url], allow_pipe=False))
    mixed = wds.WebDataset([url, str(tars / "shard-1.tar")], allow_pipe=True,
                           backend_options={"pipe": {"kill_grace": 0.5}})
    assert mixed._backend_options == {"pipe": {"kill_grace": 0.5, "allow_pipe": True}}
    assert len(list(mixed)) == 10
