"""webdataset's grouping rules: tar members -> samples.

* key = the member path up to the first dot of its basename; extension = the rest, lower-cased
  (``a/b.c/img.seg.PNG`` -> key ``a/b.c/img``, extension ``seg.png``); a basename that starts with a dot
  has its folder path as the key when the folder's own name has no dot (``q/.hidden.txt`` -> key ``q/``,
  extension ``hidden.txt``; ``a.b/.x`` has none), exactly as webdataset's ``base_plus_ext`` regex splits;
* consecutive members with the same key form one sample;
* members whose basename has no dot, and metadata members (``__*__`` names) are skipped, as webdataset
  does; unlike webdataset, macOS resource forks (``__MACOSX/`` and ``._*``) are skipped too;
* a repeated extension within one sample is a :class:`~wds_async.errors.SampleError`, routed to the
  error handler: when the handler chooses to continue, that whole sample is dropped (and counted);
* a sample whose fields sum past ``max_sample_bytes`` raises :class:`~wds_async.errors.SampleTooLarge`,
  which ends the shard (a single member that large is refused earlier, by the tar parser, from its header).

A :class:`Sample` is a plain ``dict`` (``__key__``, ``__url__``, one ``bytes`` value per extension), as
webdataset yields, that also carries its source position: ``url`` and ``offset``, the byte offset of
its first member's first tar header, from which a resumed reader can restart the shard.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ..errors import SampleError, SampleTooLarge, WdsError
from .tarstream import Member

__all__ = ["Grouper", "Sample", "split_key"]

#: webdataset's ``base_plus_ext`` rule, which :func:`split_key` implements without a regex match.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")


def split_key(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` for a member name, or None for names that carry no sample field.

    The rule is ``_KEY_RE`` (webdataset's); this is the same rule in string operations, which cost a third
    of a regex match (a test checks the two agree on arbitrary names). The split is at the first dot of the
    basename. The regex also needs a run of non-dots just before that dot that starts at the name's start
    or just after a slash, with no newline before that slash (``.*`` does not cross one): for ``a.b/c.d``
    the run is ``c``; for ``q/.x`` it is ``q/`` (key ``q/``); ``a.b/.x`` has none."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot <= 0:
        return None
    dotted = name.rfind(".", 0, dot)  # the last dot in the folder path: the run starts after a slash past it
    if dotted >= 0:
        slash = name.find("/", dotted)
        if slash + 1 >= dot or name.find("\n", 0, slash) >= 0:
            return None
    return name[:dot], name[dot + 1 :]


def _skipped(name: str) -> bool:
    if name.startswith("__MACOSX/") or "/__MACOSX/" in name:
        return True
    if name.startswith("._", name.rfind("/") + 1):
        return True
    return name.startswith("__") and _META_RE.match(name) is not None


class Sample(dict):  # type: ignore[type-arg]
    """A sample dict that remembers where it lies in its shard: ``url``, ``offset`` (its first member's
    first header) and ``end`` (just past its last member's padding), so ``[offset, end)`` re-reads it.
    ``item`` is the engine's work item it came from (set by the engine; None elsewhere).

    The four default to None at class level, so building one is a plain ``dict`` construction."""

    url: str | None = None
    offset: int | None = None
    end: int | None = None
    item: int | None = None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_sample, (dict(self), self.url, self.offset, self.end, self.item))

    def __copy__(self) -> Sample:
        # A DataLoader with batch_size=None runs default_convert on every sample, which copy.copy()s a mapping:
        # through __reduce__ that took 2.6 us per sample, this 0.6 (default_convert itself: about 12).
        clone = Sample()
        clone.update(self)
        clone.__dict__.update(self.__dict__)  # the positions that were set; the rest stay None at class level
        return clone


def _rebuild_sample(data: dict, url: str | None, offset: int | None, end: int | None = None,  # type: ignore[type-arg]
                    item: int | None = None) -> Sample:
    s = Sample(data)
    s.url, s.offset, s.end, s.item = url, offset, end, item
    return s


def sample_nbytes(sample: dict) -> int:  # type: ignore[type-arg]
    """Bytes a sample holds in its binary fields (what the byte budget counts)."""
    n = 0
    for v in sample.values():  # a loop, not sum() over a generator: this runs once per sample
        if type(v) is bytes or isinstance(v, (bytes, bytearray, memoryview)):
            n += len(v)
    return n


class Grouper:
    """Incrementally groups members of one shard into samples.

    ``rename_files(name)`` and ``select_files(name)`` (webdataset's constructor options) see each member
    name first, in that order, as webdataset applies them. ``on_error(err)`` is called with a
    :class:`SampleError` for a repeated extension; it either raises (the error propagates) or returns, in
    which case the offending sample is dropped. A sample whose fields sum past ``max_sample_bytes`` raises
    :class:`SampleTooLarge` from :meth:`push`.
    """

    def __init__(self, url: str, on_error: Callable[[WdsError], None], *,
                 select_files: Callable[[str], bool] | None = None,
                 rename_files: Callable[[str], str] | None = None, max_sample_bytes: int | None = None) -> None:
        self.url = url
        self.max_sample_bytes = max_sample_bytes if max_sample_bytes is not None else 1 << 63
        self._select = select_files
        self._rename = rename_files
        self._on_error = on_error
        self._current: Sample | None = None
        self._bad_key: str | None = None
        self.pending_bytes = 0

    def push(self, members: Iterable[Member]) -> list[Sample]:
        """Feed members in archive order; return the samples they complete."""
        done: list[Sample] = []
        url, rename, select = self.url, self._rename, self._select
        # The loop runs once per member: its state lives in locals, written back however it ends.
        current, bad_key, pending, limit = self._current, self._bad_key, self.pending_bytes, self.max_sample_bytes
        try:
            for name, offset, data, end in members:
                if ("__" in name or "._" in name) and _skipped(name):
                    continue
                if rename is not None:
                    name = rename(name)
                if select is not None and not select(name):
                    continue
                parts = split_key(name)
                if parts is None:
                    continue
                key, ext = parts
                ext = ext.lower()
                if key == bad_key:
                    continue
                if current is None or current["__key__"] != key:
                    if current is not None:
                        done.append(current)
                    bad_key = None
                    current = Sample(__key__=key, __url__=url)
                    current.url, current.offset = url, offset
                    pending = 0
                if ext in current:
                    current, bad_key, pending = None, key, 0
                    self._on_error(
                        SampleError(
                            f"repeated extension {ext!r} in sample {key!r} (member {name!r})",
                            url=url, offset=offset, member=name,
                        )
                    )
                    continue
                current[ext] = data
                current.end = end
                pending += len(data)
                if pending > limit:
                    raise SampleTooLarge(
                        f"a sample holds {pending} bytes with member {name!r}, more than max_sample_bytes={limit}; "
                        "raise max_sample_bytes if samples this large are intended",
                        url=url, offset=current.offset, member=name, key=key, size=pending, limit=limit)
        finally:
            self._current, self._bad_key, self.pending_bytes = current, bad_key, pending
        return done

    def key_of(self, name: str) -> str | None:
        """The sample key a member name maps to here (after ``rename_files``), or None if it has none."""
        if self._rename is not None:
            name = self._rename(name)
        parts = split_key(name)
        return parts[0] if parts is not None else None

    def finish(self) -> list[Sample]:
        """End of shard: return the last sample, if any."""
        last, self._current = self._current, None
        self.pending_bytes = 0
        return [last] if last is not None else []
