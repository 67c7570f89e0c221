from __future__ import annotations

import pytest

import wds_async as wds
from wds_async.errors import UrlError
from wds_async.io.urlcheck import check_url
from wds_async.urls import braceexpand, expand_env, expand_urls, redact_url, scheme_of


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
        ("http:///a.tar", "names no host"),
        ("http:/a.tar", "two slashes after 'http:'"),
        ("pipe:", "needs a command after 'pipe:'"),
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


# -- ${NAME} (webdataset's rule: WDS_NAME, braced form only) ------------------------------------------


def test_expand_env_reads_wds_prefixed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_BUCKET", "s3://data")
    monkeypatch.setenv("WDS_SPLIT", "train")
    monkeypatch.setenv("WDS_NESTED", "${BUCKET}/${SPLIT}")
    assert expand_env("${BUCKET}/${SPLIT}-{0..1}.tar") == "s3://data/train-{0..1}.tar"
    assert expand_env("${NESTED}/x.tar") == "s3://data/train/x.tar"
    assert expand_env("$BUCKET/x.tar") == "$BUCKET/x.tar"  # unbraced: left alone, as webdataset does
    assert expand_urls("${BUCKET}/a{0..1}.tar::${SPLIT}.tar") == ["s3://data/a0.tar", "s3://data/a1.tar", "train.tar"]
    assert expand_urls(["${SPLIT}-{0..1}.tar"]) == ["train-0.tar", "train-1.tar"]  # sequences too (webdataset: not)


def test_expand_env_cycle_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_LOOP", "${LOOP}")
    assert expand_env("${LOOP}") == "${LOOP}"  # ten rounds, then left as it is (then braceexpand objects)


def test_unset_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WDS_MISSING", raising=False)
    with pytest.raises(UrlError, match=r"\$\{MISSING\} in 's3://b/\$\{MISSING\}.tar' .*WDS_MISSING, which is not set"):
        expand_urls("s3://b/${MISSING}.tar")


def test_escaped_dollar_brace_is_literal() -> None:
    assert expand_urls(r"/data/$\{x\}.tar") == ["/data/${x}.tar"]


# -- check_url: shapes per scheme, no I/O -----------------------------------------------------------


@pytest.mark.parametrize("url", ["/data/a.tar", "rel/a.tar", "file:///data/a.tar", "file://localhost/data/a.tar",
                                 "pipe:cat a.tar", "http://h/a.tar", "https://h:8443/a.tar?sig=1", "s3://b/k.tar",
                                 "s3://b/dir/*.tar", "gs://b/k.tar", "az://c/k.tar", "azure://c/k.tar",
                                 "ftp://h/x.tar"])
def test_check_url_accepts(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(("url", "fragment"), [
    ("s3://", "names no bucket"), ("s3:///k.tar", "names no bucket"), ("s3://b", "no object"),
    ("s3://b/", "no object"), ("gs://", "names no bucket"), ("gs://b", "no object"), ("az://", "no container"),
    ("azure://c/", "no object"), ("s3:/b/k.tar", "two slashes"), ("gs:b/k.tar", "two slashes"),
    ("http://", "no host"), ("https:///k.tar", "no host"), ("http://[::1/x", "no host"), ("https:h/x", "two slashes"),
    ("file://", "names no file"), ("file:", "names no file"), ("file://nas/x.tar", "local files only"),
    ("pipe:", "needs a command"), ("pipe:   ", "needs a command"),
])
def test_check_url_rejects_with_the_fix(url: str, fragment: str) -> None:
    with pytest.raises(UrlError) as info:
        check_url(url)
    assert fragment in info.value.message and info.value.url == url
    assert "write" in info.value.message or "as in" in info.value.message


def test_check_url_pipe_policy() -> None:
    check_url("pipe:cat a.tar", allow_pipe=True)
    with pytest.raises(UrlError, match="disabled"):
        check_url("pipe:cat a.tar", allow_pipe=False)


def test_check_url_redacts_secrets() -> None:
    with pytest.raises(UrlError) as info:
        check_url("s3:/b/k.tar?X-Amz-Signature=secret")
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("url", ["https://h/train-*.tar", "http://h/a/[ab]-000.tar"])
def test_an_http_glob_fails_at_construction(url: str) -> None:
    # http has no listing: the glob would reach the server literally and fail as a 404 at the first epoch
    with pytest.raises(UrlError, match="brace") as info:
        wds.WebDataset(url)
    assert info.value.url == url


def test_an_http_query_question_mark_is_not_a_glob() -> None:
    assert wds.WebDataset("https://h/train-000.tar?x=1").urls == ["https://h/train-000.tar?x=1"]
