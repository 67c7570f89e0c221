"""Scheme registry: lazy loading, install hints for missing extras, Azure host routing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from wds_async.backends import backend_class, backend_key, supported_schemes
from wds_async.errors import UrlError


@pytest.mark.parametrize(("module", "url", "extra"), [("boto3", "s3://bkt/x.tar", "s3"),
                                                      ("google.auth", "gs://bkt/x.tar", "gcs"),
                                                      ("azure.storage.blob", "az://ctr/x.tar", "azure")])
def test_missing_sdk_names_the_extra_to_install(module: str, url: str, extra: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # as if the SDK were not installed\n"
        "import wds_async as wds\n"
        "try:\n"
        f"    wds.WebDataset([{url!r}])  # construction, not iteration, finds it\n"
        "except wds.MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert f"pip install 'wds-async[{extra}]'" in out.stdout, out.stdout + out.stderr
    assert url in out.stdout


def test_unknown_scheme() -> None:
    with pytest.raises(UrlError, match="unknown URL scheme 'ftp'"):
        backend_class("ftp", "ftp://h/x")
    assert "s3" in supported_schemes() and "azure" not in supported_schemes()


@pytest.mark.parametrize(("url", "key"), [("https://acct.blob.core.windows.net/c/b.tar", "azure"),
                                          ("https://example.org/b.tar", "https"), ("gs://b/k", "gs"),
                                          ("/local/x.tar", "file")])
def test_backend_key(url: str, key: str) -> None:
    assert backend_key(url) == key
