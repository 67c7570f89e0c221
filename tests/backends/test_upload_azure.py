"""The upload suite for Azure Blob Storage (staged blocks, one commit) on Azurite, behind a fault proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobServiceClient

import wds_async as wds
from tests.backends.upload_contract import UploadContract, UploadEnv
from tests.backends.upload_faults import FaultProxy, query
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, azurite_connection_string
from wds_async.write.sinks import open_sink

_XML = {"Content-Type": "application/xml"}
_ERROR = b'<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>injected</Message></Error>'
BLOCK = 256 << 10  # small blocks: Azure has no lower bound


def is_block(method: str, path: str) -> bool:
    return method == "PUT" and query(path).get("comp") == ["block"]


@pytest.fixture(scope="module")
def proxy(azurite_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(azurite_endpoint) as server:
        yield server


@pytest.fixture()
def container(azurite_endpoint: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # What the sinks and readers use: the proxy; the test's own client goes to Azurite itself.
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(proxy.url))
    with BlobServiceClient.from_connection_string(azurite_connection_string(azurite_endpoint)) as service:
        client = service.create_container(f"wds{uuid.uuid4().hex[:16]}")
        yield client
        client.delete_container()


@pytest.fixture()
def up(container: Any, proxy: FaultProxy) -> UploadEnv:
    def read(name: str) -> bytes | None:
        try:
            return container.download_blob(name).readall()  # type: ignore[no-any-return]
        except ResourceNotFoundError:
            return None

    return UploadEnv(url=lambda name: f"az://{container.container_name}/{name}", read=read, proxy=proxy,
                     is_part=is_block, transient=(503, {**_XML, "x-ms-error-code": "ServerBusy"}, _ERROR % b"ServerBusy"),
                     broken=(500, {**_XML, "x-ms-error-code": "InternalError"}, _ERROR % b"InternalError"),
                     part_bytes=BLOCK)


class TestAzureUpload(UploadContract):
    pass


def test_azure_scheme_and_options(up: UploadEnv, container: Any, proxy: FaultProxy,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``azure://`` takes ``az`` options and the account from them alone; blob names keep odd characters."""
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    options = {"az": {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY,
                      "blob_endpoint": f"{proxy.url}/{AZURITE_ACCOUNT}"}}
    name = "dir/odd name #1+%.tar"
    sink = open_sink(f"azure://{container.container_name}/{name}", options=options, part_bytes=BLOCK)
    sink.write(bytes(range(256)) * 2000)
    sink.close()
    assert up.read(name) == bytes(range(256)) * 2000 and sink.identity is not None and sink.identity.etag


def test_wrong_key_is_permission_denied_naming_the_url(up: UploadEnv, container: Any, proxy: FaultProxy) -> None:
    options = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY[::-1],
               "blob_endpoint": f"{proxy.url}/{AZURITE_ACCOUNT}"}
    url = up.url("denied.tar")
    sink = open_sink(url, options=options, part_bytes=BLOCK)
    with pytest.raises(wds.PermissionDenied, match="account key") as caught:
        sink.write(bytes(3 * BLOCK))
        sink.close()
    assert caught.value.url == url and up.read("denied.tar") is None


def test_block_ids_have_one_length(up: UploadEnv) -> None:
    sink = open_sink(up.url("ids.tar"), part_bytes=BLOCK)
    ids = {sink._block_id(n) for n in (1, 99, 50_000)}  # type: ignore[attr-defined]
    assert len({len(i) for i in ids}) == 1 and len(ids) == 3
    sink.abort()


def test_https_urls_reach_their_account_with_their_own_sas() -> None:
    """The https form, checked without a request: the client's account, container, blob and credential."""
    url = "https://acct.blob.core.windows.net/cont/dir/a%20b.tar?sv=2021-08-06&sp=cw&sig=SECRET"
    sink = open_sink(url, part_bytes=BLOCK)
    client = sink._client  # type: ignore[attr-defined]
    assert (client.account_name, client.container_name, client.blob_name) == ("acct", "cont", "dir/a b.tar")
    assert client.primary_hostname == "acct.blob.core.windows.net" and "sig=SECRET" in client.url
    assert "SECRET" not in sink.url and "SECRET" not in str(sink.credential_source)  # type: ignore[attr-defined]
    sink.abort()
