from __future__ import annotations

import pytest

import wds_async as wds
from wds_async.errors import UrlError
from wds_async.urls import braceexpand, expand_urls, redact_url, scheme_of


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("a.tar", ["a.tar"]),
        ("train-{000000..000002}.tar", ["train-000000.tar", "train-000001.tar", "train-000002.tar"]),
        ("x{a,b}y", ["xay", "xby"]),
        ("x{a,b{1..2}}y", ["xay", "xb1y", "xb2y"]),
        ("{1..3}{a,b}", ["1a", "1b", "2a", "2b", "3a", "3b"]),
        ("{9..11}", ["9", "10", "11"]),
        ("{08..10}", ["08", "09", "10"]),
        ("{3..1}", ["3", "2", "1"]),
        ("{0..6..3}", ["0", "3", "6"]),
        ("{a..c}", ["a", "b", "c"]),
        (r"lit\{x\}", ["lit{x}"]),
        ("{,b}", ["", "b"]),
    ],
)
def test_braceexpand(pattern: str, expected: list[str]) -> None:
    assert braceexpand(pattern) == expected


@pytest.mark.parametrize("pattern", ["a{1,2", "a}b", "{abc}", "{}", "x{0..9..0}"])
def test_malformed_brace_pattern_names_it(pattern: str) -> None:
    with pytest.raises(UrlError) as info:
        braceexpand(pattern)
    assert pattern in str(info.value) or "step 0" in str(info.value)


def test_expand_urls_forms() -> None:
    assert expand_urls("a{0..1}.tar::b.tar") == ["a0.tar", "a1.tar", "b.tar"]
    assert expand_urls(["a{0..1}.tar", "c.tar"]) == ["a0.tar", "a1.tar", "c.tar"]
    assert expand_urls(("x.tar",)) == ["x.tar"]


@pytest.mark.parametrize("urls", ["", [], "::", "  "])
def test_empty_url_list(urls: object) -> None:
    with pytest.raises(UrlError, match="empty"):
        expand_urls(urls)  # type: ignore[arg-type]


def test_non_string_entries() -> None:
    with pytest.raises(UrlError, match="str"):
        expand_urls(["a.tar", 3])  # type: ignore[list-item]
    with pytest.raises(UrlError):
        expand_urls(b"a.tar")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "scheme"),
    [("/x/a.tar", "file"), ("a.tar", "file"), ("file:///x/a.tar", "file"), ("pipe:cat a.tar", "pipe"),
     ("http://h/a.tar", "http"), ("HTTPS://h/a.tar", "https"), ("s3://b/k", "s3"), ("ftp://h/x", "ftp"),
     ("weird:thing", "weird")],
)
def test_scheme_of(url: str, scheme: str) -> None:
    assert scheme_of(url) == scheme


def test_redact_url_hides_secrets() -> None:
    shown = redact_url("https://user:pw@h/x.tar?X-Amz-Signature=abc&sig=zzz&keep=1")
    assert "pw" not in shown and "abc" not in shown and "zzz" not in shown
    assert "keep=1" in shown and "user" in shown


@pytest.mark.parametrize(
    ("urls", "fragment"),
    [
        ("ftp://host/a.tar", "unknown URL scheme 'ftp'"),
        ("gopher://h/{0..1}.tar", "supported:"),
        ("http:///a.tar", "needs a host"),
        ("http:/a.tar", "needs a host"),
        ("pipe:", "no command"),
        ("a{0..2", "unbalanced"),
        ([], "empty"),
    ],
)
def test_dataset_rejects_bad_urls_at_construction(urls: object, fragment: str) -> None:
    with pytest.raises(UrlError) as info:
        wds.WebDataset(urls)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    if isinstance(urls, str) and "{" not in urls and urls:
        assert urls in str(info.value)
