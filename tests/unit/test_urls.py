from __future__ import annotations

import pickle
import string
import traceback

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wds_async as wds
from wds_async.errors import BackendError, NotFound, PipeError, SampleTooLarge, TransientError, UrlError
from wds_async.io.urlcheck import check_url
from wds_async.urls import braceexpand, expand_env, expand_urls, redact_text, redact_url, scheme_of, url_key


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


# -- the scrubber: text-level, whatever the URL's shape (item 9) ----------------------------------------------------

#: The probe's strings and their neighbours: userinfo before a host no parser accepts, a ``;``-parameter, ``jwt=``
#: and a ``#``-fragment, none of which the urlsplit-based scrubber caught.
@pytest.mark.parametrize(("url", "shown"), [
    ("http://u:PASS@[::1/x.tar?sig=S", "http://u:***@[::1/x.tar?sig=***"),
    ("http://h/x.tar;sig=SEMI", "http://h/x.tar;sig=***"),
    ("http://h/x.tar?jwt=JWTVALUE", "http://h/x.tar?jwt=***"),
    ("http://h/x.tar#sig=FRAG", "http://h/x.tar#sig=***"),
    ("http://h/x.tar?a=1#access_token=T&token_type=bearer", "http://h/x.tar?a=1#access_token=***&token_type=bearer"),
    ("http://u:p@ss:w@rd@h/x", "http://u:***@h/x"),  # an unencoded @ in the password
    ("http:/u:PASS@h/x.tar", "http:/u:***@h/x.tar"),  # one slash: malformed, still scrubbed
    ("http:u:PASS@h/x.tar", "http:***@h/x.tar"),
    ("u:PASS@h/x.tar", "u:***@h/x.tar"),  # no scheme at all
    ("//u:PASS@h/x.tar", "//u:***@h/x.tar"),
    ("https://h/x.tar?SIG=A&Sig=B&X-AMZ-SIGNATURE=C", "https://h/x.tar?SIG=***&Sig=***&X-AMZ-SIGNATURE=***"),
    ("https://h/x.tar?GoogleAccessId=sa%40p.iam&Expires=9&Signature=s",
     "https://h/x.tar?GoogleAccessId=***&Expires=9&Signature=***"),
    ("https://h/x?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2024&X-Amz-Date=20240101T000000Z"
     "&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=ab12",
     "https://h/x?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Date=20240101T000000Z"
     "&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=***"),
    ("https://h/x?x-goog-security-token=t&X-Goog-Date=d", "https://h/x?x-goog-security-token=***&X-Goog-Date=d"),
    ("https://a.blob.core.windows.net/c/b?sv=1&skoid=o&sktid=t&sig=s", "https://a.blob.core.windows.net/c/b?sv=***"
     "&skoid=***&sktid=***&sig=***"),
    ("https://h/x?token=eyJhbGciOi.eyJzdWIiOiIx.c2lnbmF0dXJl/with+slash==", "https://h/x?token=***"),
    ("https://h/x/eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_part/y.tar", "https://h/x/***/y.tar"),
])
def test_redact_url_does_not_depend_on_url_parsing(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # idempotent
    assert redact_text(url) == shown


@pytest.mark.parametrize("url", [
    "s3://bucket/date=2024-01-01/key=3/part-000.tar",  # hive-style partitions: data, not credentials
    "https://h/x.tar?X-Amz-Date=20240101T000000Z&X-Amz-Expires=900&Expires=1700000000&alt=media&part=3",
    "https://user@h/x.tar",  # a user name alone is shown, as before
    "https://h:8443/a%20b/x.tar?response-content-type=application/x-tar",
    "pipe:cat /data/shard-000000.tar",  # a pipe: command without credentials is kept as it is
    "gs:///no-bucket",
])
def test_what_is_safe_to_show_stays(url: str) -> None:
    assert redact_url(url) == url


def test_redact_text_scrubs_a_pipe_command_and_headers() -> None:
    cmd = "pipe:curl -s -H 'Authorization: Bearer tok123' https://u:pw@h/x.tar?sig=abc"
    assert redact_text(cmd) == "pipe:curl -s -H 'Authorization: Bearer ***' https://u:***@h/x.tar?sig=***"
    # redact_url too: a pipe: command is logged, reported and stored (index, cache names) in this form
    assert redact_url(cmd) == redact_text(cmd)
    assert url_key(cmd) == url_key(redact_url(cmd))


def test_redact_text_stops_at_the_quotes_of_a_repr() -> None:
    text = "failed: URL('https://h/c/b?sv=1&sig=S%3D') (url='http://h/x;token=T', 'http://u:P@[::1/y')"
    assert redact_text(text) == ("failed: URL('https://h/c/b?sv=***&sig=***') (url='http://h/x;token=***', "
                                 "'http://u:***@[::1/y')")


def test_url_key_matches_a_url_and_its_redacted_copy() -> None:
    for url in ("http://h/x.tar;sig=A", "https://u:p@H/x.tar?sig=1#sig=2", "http://u:PASS@[::1/x.tar?sig=S",
                "/data/a.tar", "pipe:cat /data/a.tar", "s3://b/key=3/x.tar"):
        assert url_key(url) == url_key(redact_url(url))
    assert url_key("http://h/x.tar;sig=A") == url_key("http://h/x.tar;sig=B") == "http://h/x.tar;sig=***"
    assert url_key("s3://b/key=3/x.tar") != url_key("s3://b/key=4/x.tar")  # partitions keep their identity


# -- errors scrub their own message and url -------------------------------------------------------------------------

def test_an_error_scrubs_what_it_is_given_and_what_it_is_given_later() -> None:
    url = "http://u:PASS@[::1/x.tar;sig=SEMI#sig=FRAG"
    err = UrlError(f"cannot read {url!r} (jwt=JWTSECRET)", url=url, offset=3)
    later = BackendError("x", url="http://h/x.tar")
    later.message = "retrying http://u:LATERPASS@h/x.tar?X-Amz-Signature=LATERSIG"
    later.url = "http://h/x.tar;token=LATERTOKEN"
    pipe = PipeError("exited 1", url="pipe:curl -s https://u:PIPEPASS@h/x", returncode=1,
                     stderr_tail="curl: (22) https://h/x?sig=TAILSIG: 403")
    for error in (err, later, pipe):
        shown = "\n".join([str(error), repr(error), str(error.url), error.message, str(error.args),
                           str(pickle.loads(pickle.dumps(error))), repr(pickle.loads(pickle.dumps(error))),
                           "".join(traceback.format_exception(error)), getattr(error, "stderr_tail", "")])
        for secret in ("PASS", "SEMI", "FRAG", "JWTSECRET", "LATERPASS", "LATERSIG", "LATERTOKEN", "PIPEPASS",
                       "TAILSIG"):
            assert secret not in shown, (secret, shown)
    assert err.url == "http://u:***@[::1/x.tar;sig=***#sig=***" and err.offset == 3
    assert later.args == (later.message,) == ("retrying http://u:***@h/x.tar?X-Amz-Signature=***",)


def test_an_error_rebuilt_from_the_service_protocol_is_scrubbed() -> None:
    from wds_async.service.protocol import error_from_json

    err = error_from_json({"type": "NotFound", "message": "HTTP 404 for http://u:PW@h/x?sig=S1",
                           "url": "http://h/x;sig=S2"})
    assert isinstance(err, NotFound)
    assert "PW" not in str(err) + repr(err) and "S1" not in str(err) + repr(err) and "S2" not in str(err)


def test_sample_errors_keep_their_context() -> None:
    err = SampleTooLarge("member too large", url="http://h/x.tar?sig=S", offset=512, key="token=abc", size=9,
                         limit=1)
    assert str(err) == "member too large (url=http://h/x.tar?sig=***, offset=512, key=token=abc)"


# -- hypothesis: a secret in any of those positions never shows, whatever else the URL holds --------------------------

#: Characters a secret may hold. In a single URL (redact_url, an error's url): everything a query value or a
#: userinfo may hold by RFC 3986, and more; free text ends a value at a quote or bracket too, so those are left out
#: of the values put into messages.
_URL_VALUE = string.ascii_letters + string.digits + "-._~!$*+,=:@/?%'()[]{}|^`"
_TEXT_VALUE = string.ascii_letters + string.digits + "-._~!$*+,=:@/?%{}|^`"
_PASSWORD = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:%@[]"
_NAMES = ["sig", "Sig", "SIGNATURE", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
          "x-amz-security-token", "X-Goog-Signature", "X-Goog-Credential", "token", "access_token", "jwt", "JWT",
          "key", "api_key", "apikey", "AWSAccessKeyId", "GoogleAccessId", "password", "passwd", "credential",
          "secret", "client_secret", "auth", "SharedAccessSignature", "AccountKey", "se", "sp", "sv"]
_MARK = "QX7"  # starts every secret; nothing else a strategy draws can hold it


@st.composite
def _secret_urls(draw: st.DrawFn, value_chars: str) -> tuple[str, str, str]:
    """A URL with secrets in the userinfo and in a query / ;-parameter / fragment position, the same URL with
    other secrets, and with the secrets replaced by a plain letter: redaction must give all three the same."""
    scheme = draw(st.sampled_from(["http://", "https://", "s3://", "gs://", "az://", "HTTP://", "http:/", "//"]))
    user = draw(st.text("abcdefgh0123456789._-", max_size=6))
    host = draw(st.sampled_from(["h", "127.0.0.1:9", "[::1", "[::1]:8080", "[bad", "acct.blob.core.windows.net", ""]))
    path = draw(st.text("abcdefgh0123456789/._-", max_size=12))
    name = draw(st.sampled_from(_NAMES))
    where = draw(st.sampled_from(["?", "?a=1&", ";", "?a=1#", "#", "?a=1;", "#a=1&"]))
    tail = draw(st.sampled_from(["", "&keep=1", "#frag", ";v=2", "&X-Amz-Date=20240101"]))
    userinfo = draw(st.booleans())
    secrets = [[_MARK + draw(st.text(value_chars, max_size=20)) for _ in range(2)] for _ in range(2)]

    def build(password: str, value: str) -> str:
        auth = f"{user}:{password}@" if userinfo else ""
        return f"{scheme}{auth}{host}/{path}{where}{name}={value}{tail}"

    pw_chars = set(_PASSWORD)
    secrets[0][0] = _MARK + "".join(c for c in secrets[0][0][len(_MARK):] if c in pw_chars)
    secrets[1][0] = _MARK + "".join(c for c in secrets[1][0][len(_MARK):] if c in pw_chars)
    return build(*secrets[0]), build(*secrets[1]), build("Z", "Z")


@settings(max_examples=600, deadline=None)
@given(urls=_secret_urls(_URL_VALUE))
def test_no_secret_survives_redact_url(urls: tuple[str, str, str]) -> None:
    one, other, plain = urls
    shown = redact_url(one)
    assert _MARK not in shown, (one, shown)
    assert shown == redact_url(other) == redact_url(plain), (one, other)  # nothing of the secret is left
    assert url_key(one) == url_key(other) == url_key(redact_url(one))


@settings(max_examples=400, deadline=None)
@given(urls=_secret_urls(_URL_VALUE))
def test_no_secret_survives_in_an_errors_url(urls: tuple[str, str, str]) -> None:
    def shown(url: str) -> str:
        err = TransientError("stalled", url=url, offset=7)
        return "\n".join([str(err), repr(err), str(pickle.loads(pickle.dumps(err)))])

    one, other, _plain = urls
    assert _MARK not in shown(one), shown(one)
    assert shown(one) == shown(other)


@settings(max_examples=400, deadline=None)
@given(urls=_secret_urls(_TEXT_VALUE), quote=st.sampled_from(["{!r}", "'{}'", '"{}"', "({})", "<{}>", "[{}]", "{}"]))
def test_no_secret_survives_in_free_text(urls: tuple[str, str, str], quote: str) -> None:
    def shown(url: str) -> str:
        text = "GET " + quote.format(url) + " failed: 403, message='Forbidden'"
        err = BackendError(text, url=None)
        return "\n".join([redact_text(text), str(err), repr(err)])

    one, other, _plain = urls
    assert _MARK not in shown(one), shown(one)
    assert shown(one) == shown(other)


@settings(max_examples=2000, deadline=None)
@given(text=st.text(st.sampled_from(list("ab:@/?#=&;sig %'\"()[]eyJ.-_\\\n")), max_size=60) | st.text(max_size=60),
       one_url=st.booleans())
def test_scrubbing_any_text_is_idempotent(text: str, one_url: bool) -> None:
    from wds_async.errors import scrub_secrets

    once = scrub_secrets(text, one_url=one_url)
    assert scrub_secrets(once, one_url=one_url) == once  # the caller's and the error's scrub agree
    assert redact_url(redact_url(text)) == redact_url(text) and redact_text(redact_text(text)) == redact_text(text)
