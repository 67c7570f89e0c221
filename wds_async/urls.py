"""Turning what users pass as ``urls`` into a list of shard URLs, and naming their schemes.

Accepted forms: a string with ``{a,b}`` / ``{000..099}`` brace patterns, several such strings joined by
``::``, or any sequence of strings (each brace-expanded too). Schemes: bare paths and ``file://``,
``pipe:CMD``, ``http://``, ``https://`` (cloud schemes are registered in :mod:`wds_async.io`).

Before brace expansion, ``${NAME}`` is replaced by the environment variable ``WDS_NAME``, as webdataset
does (only the braced form, only ``WDS_``-prefixed variables; a value may hold ``${...}`` again, up to 10
rounds). Unlike webdataset, which takes a list of URLs literally, every entry of a sequence gets the same
treatment as a string. :func:`wds_async.io.urlcheck.check_url` checks each resulting URL's shape.

Brace expansion is a small function of our own rather than a dependency: the grammar is tiny, and we
want a malformed pattern to raise :class:`~wds_async.errors.UrlError` naming the pattern instead of
being taken literally.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from urllib.parse import SplitResult, urlsplit, urlunsplit

from .errors import UrlError, scrub_secrets

__all__ = ["braceexpand", "expand_env", "expand_urls", "redact_text", "redact_url", "scheme_of", "url_key"]

#: Hard cap on how many URLs one pattern may produce, so a typo cannot eat all memory.
MAX_EXPANSION = 10_000_000

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$")
_ALPHA_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.(-?\d+))?$")


def _find_group(pattern: str) -> tuple[int, int] | None:
    """Return (open, close) indices of the first top-level brace group, None if there is none."""
    depth, start, i = 0, -1, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            if depth == 0:
                raise UrlError(f"unbalanced '}}' at position {i} in brace pattern {pattern!r}")
            depth -= 1
            if depth == 0:
                return start, i
        i += 1
    if depth:
        raise UrlError(f"unbalanced '{{' at position {start} in brace pattern {pattern!r}")
    return None


def _split_alternatives(body: str) -> list[str]:
    parts, depth, last, i = [], 0, 0, 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[last:i])
            last = i + 1
        i += 1
    parts.append(body[last:])
    return parts


def _expand_range(body: str, pattern: str) -> list[str] | None:
    m = _RANGE.match(body)
    if m:
        lo_s, hi_s, step_s = m.groups()
        lo, hi = int(lo_s), int(hi_s)
        step = abs(int(step_s)) if step_s else 1
        if step == 0:
            raise UrlError(f"range step 0 in brace pattern {pattern!r}")
        # Zero padding follows the endpoints as written: {000..099} -> 000, 001, ..., 099.
        padded = any(len(s.lstrip("-")) > 1 and s.lstrip("-").startswith("0") for s in (lo_s, hi_s))
        width = max(len(lo_s), len(hi_s)) if padded else 0
        values = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        if len(values) > MAX_EXPANSION:
            raise UrlError(f"brace range {{{body}}} expands to {len(values)} items (limit {MAX_EXPANSION})")
        return [f"{v:0{width}d}" for v in values]
    m = _ALPHA_RANGE.match(body)
    if m:
        lo, hi = ord(m.group(1)), ord(m.group(2))
        step = abs(int(m.group(3))) if m.group(3) else 1
        if step == 0:
            raise UrlError(f"range step 0 in brace pattern {pattern!r}")
        codes = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [chr(c) for c in codes]
    return None


_ENV_REF = re.compile(r"\$\{(\w+)\}")

#: Rounds of ``${NAME}`` substitution, as webdataset: a value may name another variable, a cycle stops here.
ENV_ROUNDS = 10


def expand_env(pattern: str) -> str:
    """Replace every ``${NAME}`` in ``pattern`` by the environment variable ``WDS_NAME`` (webdataset's rule).

    An unset variable raises :class:`UrlError` naming it; write ``$\\{`` for a literal ``${``."""
    text = pattern
    for _ in range(ENV_ROUNDS):
        if "${" not in text:
            break
        text = _ENV_REF.sub(lambda m: _env_value(m.group(1), pattern), text)
    return text


def _env_value(name: str, pattern: str) -> str:
    value = os.environ.get("WDS_" + name)
    if value is None:
        raise UrlError(f"${{{name}}} in {pattern!r} stands for the environment variable WDS_{name}, which is not "
                       f"set: set it, or escape a literal '${{' as '$\\{{'")
    return value


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def braceexpand(pattern: str) -> list[str]:
    """Expand shell-style braces: ``a{1,2}b`` -> a1b, a2b; ``{08..10}`` -> 08, 09, 10; nesting allowed.

    A group that is neither a comma list nor a range (``{abc}``, ``{}``) raises :class:`UrlError`;
    use a backslash to write a literal brace.
    """
    group = _find_group(pattern)
    if group is None:
        return [_unescape(pattern)]
    start, end = group
    head, body, tail = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    alternatives = _split_alternatives(body)
    if len(alternatives) == 1:
        expanded = _expand_range(body, pattern)
        if expanded is None:
            raise UrlError(
                f"brace group {{{body}}} in {pattern!r} is neither a list like {{a,b}} nor a range like "
                "{000..099}; escape literal braces with a backslash"
            )
        middles = expanded
    else:
        middles = [m for alt in alternatives for m in braceexpand(alt)]
    tails = braceexpand(tail)
    if len(middles) * len(tails) > MAX_EXPANSION:
        raise UrlError(f"brace pattern {pattern!r} expands to more than {MAX_EXPANSION} items")
    prefix = _unescape(head)
    return [prefix + m + t for m in middles for t in tails]


def expand_urls(urls: str | Iterable[str]) -> list[str]:
    """Return the flat list of shard URLs for ``urls`` (string with ``::`` and braces, or a sequence).

    Each pattern gets :func:`expand_env`, then :func:`braceexpand`. Raises :class:`UrlError` for an empty
    result, a non-string entry, an unset variable or a malformed pattern. Schemes are checked by
    :func:`~wds_async.io.urlcheck.check_url` and the backend registry, not here.
    """
    if isinstance(urls, (bytes, bytearray)):
        raise UrlError(f"urls must be str or a sequence of str, got {type(urls).__name__}")
    if isinstance(urls, str):
        patterns: Sequence[str] = urls.split("::")
    else:
        patterns = list(urls)
    result: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise UrlError(f"every URL must be a str, got {type(pattern).__name__}: {pattern!r}")
        pattern = expand_env(pattern).strip()
        if not pattern:
            continue
        result.extend(braceexpand(pattern))
    if not result:
        raise UrlError(f"no shard URLs in {urls!r}: the list is empty")
    return result


_SCHEME_SLASHES = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_SCHEME_COLON = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(?!//)")


def scheme_of(url: str) -> str:
    """The scheme that selects a backend: ``file`` for bare paths, ``pipe`` for ``pipe:CMD``."""
    if url.startswith("pipe:"):
        return "pipe"
    m = _SCHEME_SLASHES.match(url)
    if m:
        return m.group(1).lower()
    m = _SCHEME_COLON.match(url)
    if m and "/" not in m.group(1):
        # Something like "foo:bar" that is not a path: a scheme we may not know.
        return m.group(1).lower()
    return "file"


_BLANK = re.compile(r"\s")


def _network_parts(url: str) -> SplitResult | None:
    """The parts of a URL with a ``scheme://`` authority; None for paths, ``pipe:`` and unparsable text."""
    if url.startswith("pipe:") or "://" not in url:
        return None
    try:
        return urlsplit(url)
    except ValueError:
        return None


def redact_url(url: str) -> str:
    """``url`` as it may be shown and stored: passwords in the userinfo, and the values of signing, SAS and token
    parameters in its query, ``;``-parameters and fragment, replaced by ``***`` (see
    :func:`~wds_async.errors.scrub_secrets`, the project's one scrubber). Text-level: a URL no parser accepts
    (``http://u:pw@[::1/x``) is scrubbed the same way. A URL with nothing to hide comes back unchanged.

    A ``pipe:`` command is scrubbed as text (every URL and ``name=value`` in it): it is shown in logs, reports and
    errors, and stored as a shard's name in an index and the shard cache, none of which may keep a credential. An
    index matches its entries to a job's commands by :func:`url_key`, which is computed from this form."""
    if url.startswith("pipe:"):
        return scrub_secrets(url)
    return scrub_secrets(url, one_url=_BLANK.search(url) is None)


def redact_text(text: str) -> str:
    """Any text (an exception message from a client library, a traceback, a ``pipe:`` command, a repr) with
    every credential in it replaced by ``***``: userinfo passwords of the URLs in it, secret ``name=value``
    parameters inside or outside a URL, ``Bearer`` tokens and JSON Web Tokens."""
    return scrub_secrets(text)


def url_key(url: str) -> str:
    """``url`` without query, fragment and userinfo (scheme and host lower-cased): what names a shard in an
    index or a checkpoint, so a job may come back with freshly signed URLs for the same objects. ``pipe:``
    commands are kept as they are, and so are paths (unless they hold something shaped like a credential).

    Computed from :func:`redact_url`'s form, so that a URL and its redacted copy (what an index stores) have
    the same key: a secret ``;``-parameter in the path is masked in both, and a URL that cannot be parsed is
    its redacted text."""
    shown = redact_url(url)
    parts = _network_parts(shown)
    if parts is None:
        return shown
    host = parts.netloc.rsplit("@", 1)[-1].lower()
    return urlunsplit((parts.scheme.lower(), host, parts.path, "", ""))
