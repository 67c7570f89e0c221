"""The contract suite and Azure specifics, against Azurite on 127.0.0.1.

Azurite serves plain http and path-style URLs (``http://127.0.0.1:PORT/devstoreaccount1``), so the
``https://ACCOUNT.blob.core.windows.net`` form and the bearer-token path are checked without network:
what URL and headers a request would carry.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

import wds_async as wds
import wds_async.backends.azure as azure_mod
from tests.backends.contract import BackendContract, ContractEnv
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, azurite_connection_string
from wds_async.backends.azure import AzureBackend, parse_url

WRONG_KEY = base64.b64encode(b"not the azurite key, but valid base64 of 64 bytes............").decode()
SIG_VALUE = re.compile(r"sig=(?!\*\*\*)", re.IGNORECASE)


@pytest.fixture()
def service(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[BlobServiceClient]:
    """The SDK client used to set up data; the env var is what the backend (and forked workers) read."""
    conn = azurite_connection_string(azurite_endpoint)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    with BlobServiceClient.from_connection_string(conn) as client:
        yield client


@pytest.fixture()
def container(service: BlobServiceClient) -> Iterator[str]:
    name = f"wds{uuid.uuid4().hex[:16]}"
    service.create_container(name)
    yield name
    service.delete_container(name)


def _put(service: BlobServiceClient, container: str) -> Any:
    def put(name: str, data: bytes) -> None:
        service.get_container_client(container).upload_blob(name, data, overwrite=True)

    return put


async def _read(backend: AzureBackend, url: str, **kw: Any) -> bytes:
    async with backend.open(url, **kw) as stream:
        return b"".join([chunk async for chunk in stream])


def _container_sas(container: str, **permissions: bool) -> str:
    return generate_container_sas(AZURITE_ACCOUNT, container, account_key=AZURITE_KEY,
                                  permission=ContainerSasPermissions(**permissions),
                                  expiry=datetime.now(UTC) + timedelta(hours=1))


class TestAzureBackend(BackendContract):
    @pytest.fixture()
    def env(self, service: BlobServiceClient, container: str) -> ContractEnv:
        return ContractEnv(
            make_backend=lambda max_connections=32: AzureBackend(max_connections=max_connections),
            url=lambda name: f"az://{container}/{name}",
            put=_put(service, container),
            dataset_options={},
        )


# -- against Azurite -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_identity_encoding_and_error_code(service: BlobServiceClient, container: str) -> None:
    name = "dir/odd name #1+%.tar"
    _put(service, container)(name, b"0123456789")
    backend = AzureBackend()
    try:
        async with backend.open(f"az://{container}/{name}", start=4) as stream:
            assert b"".join([c async for c in stream]) == b"456789"
            assert stream.identity.size == 10 and stream.identity.etag and stream.identity.last_modified
        assert await backend.list(f"az://{container}/dir/*.tar") == [f"az://{container}/{name}"]
        with pytest.raises(wds.NotFound) as info:
            await _read(backend, f"az://{container}/dir/missing.tar")
        assert "x-ms-error-code: BlobNotFound" in str(info.value) and "missing.tar" in str(info.value)
        with pytest.raises(wds.NotFound):
            await backend.list(f"az://no-such-{container}/*.tar")
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_listing_follows_next_marker(service: BlobServiceClient, container: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        _put(service, container)(f"page/p-{i}.tar", b"x")
    _put(service, container)("page/other.bin", b"x")
    monkeypatch.setattr(azure_mod, "LIST_PAGE", 2)
    backend = AzureBackend()
    try:
        assert await backend.list(f"az://{container}/page/p-*.tar") == [
            f"az://{container}/page/p-{i}.tar" for i in range(5)]
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_wrong_account_key_is_permission_denied_without_secrets(
        azurite_endpoint: str, service: BlobServiceClient, container: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _put(service, container)("k/data.bin", b"payload")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       azurite_connection_string(azurite_endpoint).replace(AZURITE_KEY, WRONG_KEY))
    caplog.set_level("DEBUG")
    backend = AzureBackend()
    try:
        for call in (lambda: _read(backend, f"az://{container}/k/data.bin"),
                     lambda: backend.size(f"az://{container}/k/data.bin"),
                     lambda: backend.list(f"az://{container}/k/*.bin")):
            with pytest.raises(wds.PermissionDenied) as info:
                await call()
            message = str(info.value)
            assert "403" in message and "account key" in message and f"az://{container}/k/" in message
            assert WRONG_KEY not in message and not SIG_VALUE.search(message)
    finally:
        await backend.aclose()
    assert WRONG_KEY not in caplog.text and not SIG_VALUE.search(caplog.text)


@pytest.mark.asyncio
async def test_sas_only_connection_string(azurite_endpoint: str, service: BlobServiceClient, container: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        _put(service, container)(f"s/shard-{i}.tar", bytes(range(100)))
    sas = _container_sas(container, read=True, list=True)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"BlobEndpoint={azurite_endpoint}/{AZURITE_ACCOUNT};SharedAccessSignature={sas}")
    backend = AzureBackend()
    try:
        assert backend.credential_source(parse_url(f"az://{container}/x")) == "SAS token"
        assert await _read(backend, f"az://{container}/s/shard-1.tar", start=10, end=20) == bytes(range(10, 20))
        assert await backend.size(f"az://{container}/s/shard-2.tar") == 100
        assert await backend.list(f"az://{container}/s/*.tar") == [f"az://{container}/s/shard-{i}.tar"
                                                                    for i in range(3)]
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_sas_from_account_env_and_blob_endpoint_option(
        azurite_endpoint: str, service: BlobServiceClient, container: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _put(service, container)("e/a.tar", b"abc")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?" + _container_sas(container, read=True))
    backend = AzureBackend(blob_endpoint=f"{azurite_endpoint}/{AZURITE_ACCOUNT}/")
    try:
        assert await _read(backend, f"az://{container}/e/a.tar") == b"abc"
        with pytest.raises(wds.PermissionDenied) as info:  # the SAS has no list permission
            await backend.list(f"az://{container}/e/*.tar")
        assert "SAS token" in str(info.value) and not SIG_VALUE.search(str(info.value))
    finally:
        await backend.aclose()


def test_backend_options_reach_the_backend(azurite_endpoint: str, service: BlobServiceClient, container: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(2):
        _put(service, container)(f"o/shard-{i:06d}.tar", b"")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    options = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY,
               "blob_endpoint": f"{azurite_endpoint}/{AZURITE_ACCOUNT}"}
    ds = wds.WebDataset(f"az://{container}/o/shard-*.tar", backend_options=options)
    assert ds.urls == [f"az://{container}/o/shard-{i:06d}.tar" for i in range(2)]


# -- no network ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["az://", "az://container", "az://container/", "az:///blob.tar", "az://c/blob.tar",
                                 "az://Upper/blob.tar", "az://a--b/blob.tar",
                                 "https://example.com/c/b.tar", "https://acct.blob.core.windows.net/container",
                                 "http://acct.blob.core.windows.net/cont/b.tar"])
def test_malformed_urls(url: str) -> None:
    with pytest.raises(wds.UrlError):
        AzureBackend(anonymous=True).request_url(url)


@pytest.mark.asyncio
async def test_malformed_url_through_open_and_list() -> None:
    backend = AzureBackend(anonymous=True)
    try:
        with pytest.raises(wds.UrlError) as info:
            await _read(backend, "az://just-a-container")
        assert "az://just-a-container" in str(info.value)
        with pytest.raises(wds.UrlError):
            await backend.list("az://container")
    finally:
        await backend.aclose()


def test_https_urls_map_to_their_account(monkeypatch: pytest.MonkeyPatch) -> None:
    # A key for devstoreaccount1 (the connection string) signs URLs of that account only.
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string("http://127.0.0.1:9"))
    backend = AzureBackend()
    url = "https://devstoreaccount1.blob.core.windows.net/data/dir/a%20b.tar"
    target = parse_url(url)
    assert (target.account, target.container, target.blob) == ("devstoreaccount1", "data", "dir/a b.tar")
    signed = backend.request_url(url)
    assert signed.startswith("https://devstoreaccount1.blob.core.windows.net/data/dir/a%20b.tar?")
    assert "sr=b" in signed and "sig=" in signed and backend.credential_source(target) == "account key"
    other = "https://other.blob.core.windows.net/cont/x.tar"
    assert backend.request_url(other) == other
    assert backend.credential_source(parse_url(other)) == "DefaultAzureCredential"
    assert AzureBackend(anonymous=True).request_url(url) == url
    assert AzureBackend(anonymous=True).credential_source(target) == "anonymous"
    with_sas = "https://other.blob.core.windows.net/cont/x.tar?sv=2021-08-06&sr=b&sp=r&sig=abc"
    assert backend.request_url(with_sas) == with_sas
    assert backend.credential_source(parse_url(with_sas)) == "SAS token (in the URL)"


def test_az_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    assert AzureBackend(account_name="acct", anonymous=True).request_url("az://cont/dir/a b#1.tar") == \
        "https://acct.blob.core.windows.net/cont/dir/a%20b%231.tar"
    conn = (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={AZURITE_KEY};"
            "EndpointSuffix=core.chinacloudapi.cn")
    assert AzureBackend(connection_string=conn).request_url("az://cont/b.tar").startswith(
        "https://acct.blob.core.chinacloudapi.cn/cont/b.tar?")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "envacct")
    monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)
    backend = AzureBackend()
    assert backend.request_url("az://cont/b.tar").startswith("https://envacct.blob.core.windows.net/cont/b.tar?se=")
    assert backend.credential_source(parse_url("az://cont/b.tar")) == "account key"
    assert backend.request_url("az://cont/b.tar") == backend.request_url("az://cont/b.tar")  # cached signature
    with pytest.raises(wds.BackendError, match="no Azure storage account"):
        monkeypatch.delenv("AZURE_STORAGE_ACCOUNT")
        AzureBackend(anonymous=True).request_url("az://cont/b.tar")


class FakeCredential:
    """A TokenCredential that counts calls and notes the thread it ran on."""

    def __init__(self, lifetime: float = 3600, fail: bool = False) -> None:
        self.calls, self.lifetime, self.fail = 0, lifetime, fail
        self.threads: set[threading.Thread] = set()

    def get_token(self, *scopes: str, **_: Any) -> AccessToken:
        assert scopes == ("https://storage.azure.com/.default",)
        self.calls += 1
        self.threads.add(threading.current_thread())
        time.sleep(0.05)
        if self.fail:
            raise ClientAuthenticationError("no secret-token-here for you")
        return AccessToken(f"token-{self.calls}", int(time.time() + self.lifetime))


@pytest.mark.asyncio
async def test_bearer_token_is_cached_and_refreshed_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)  # an explicit credential outranks the environment
    credential = FakeCredential()
    backend = AzureBackend(account_name="acct", credential=credential)
    try:
        assert backend.request_url("az://cont/b.tar") == "https://acct.blob.core.windows.net/cont/b.tar"
        all_headers = await asyncio.gather(*(backend.request_headers("az://cont/b.tar", 5, None) for _ in range(8)))
        assert credential.calls == 1 and threading.main_thread() not in credential.threads
        assert all(h["Authorization"] == "Bearer token-1" and h["Range"] == "bytes=5-" and h["x-ms-version"]
                   for h in all_headers)
        assert backend.credential_source(parse_url("az://cont/b.tar")) == "FakeCredential"
    finally:
        await backend.aclose()
    short = FakeCredential(lifetime=60)  # within 5 minutes of expiry: every request refreshes
    backend = AzureBackend(account_name="acct", credential=short)
    try:
        await backend.request_headers("az://cont/b.tar", 0, None)
        headers = await backend.request_headers("az://cont/b.tar", 0, None)
        assert short.calls == 2 and headers["Authorization"] == "Bearer token-2"
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_failing_token_credential_is_permission_denied() -> None:
    backend = AzureBackend(account_name="acct", credential=FakeCredential(fail=True))
    try:
        with pytest.raises(wds.PermissionDenied) as info:
            await _read(backend, "az://cont/b.tar")
        assert "FakeCredential" in str(info.value) and "az://cont/b.tar" in str(info.value)
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_no_account_is_said_with_the_url_before_any_credential_is_sought() -> None:
    """An ``az://`` URL with no account anywhere: the error names the URL and what to set, and no credential chain
    runs first (azure-identity's DefaultAzureCredential printed its whole chain of failures before it)."""
    credential = FakeCredential()
    backend = AzureBackend(credential=credential)
    try:
        with pytest.raises(wds.BackendError, match=r"no Azure storage account configured: set "
                                                   r"AZURE_STORAGE_CONNECTION_STRING.+\(url=az://cont/b.tar\)"):
            await _read(backend, "az://cont/b.tar")
        assert credential.calls == 0
    finally:
        await backend.aclose()
    with pytest.raises(wds.BackendError, match=r"no Azure storage account.+\(url=az://cont/b.tar\)"):
        list(wds.WebDataset("az://cont/b.tar"))
