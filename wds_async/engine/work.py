"""Work items: what the engine reads, and what a checkpoint names.

A :class:`WorkItem` is a byte range of one shard that starts and ends at sample boundaries: a whole
shard (``start=0, end=None``), a shard resumed at the first sample its consumer has not received, the
samples of an index share, or one sample re-read to refill a shuffle buffer. Offsets are positions in
the *tar* stream (after decompression for ``.tar.gz``); a compressed item is inflated from byte 0 and
the samples before ``start`` are dropped, since gzip cannot be entered in the middle. ``compressed=None``
means unknown: the engine then looks at the object's first two bytes before entering it mid-way.

An item's ``id`` is its position in this process's plan for the epoch, the key its progress is saved
under; ``shard`` is the shard's index in the dataset's URL list, so that a checkpoint never stores a
URL (a signed URL may have expired by the time the job resumes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..io import ObjectIdentity

__all__ = ["ItemDone", "WorkItem"]


@dataclass(frozen=True)
class WorkItem:
    """Samples ``[start, end)`` of shard ``shard`` at ``url`` (see the module docstring)."""

    id: int
    shard: int
    url: str
    start: int = 0
    end: int | None = None
    compressed: bool | None = None
    expect: ObjectIdentity | None = None
    #: Which consumer the item's samples go to when several share one engine (a mix's sources); None: the only one.
    route: int | None = None

    def __post_init__(self) -> None:
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"bad work item range [{self.start}, {self.end})")

    def routed(self, route: int, id: int | None = None) -> WorkItem:
        """This item for ``route`` (and with ``id``, when given): a copy of its fields, already checked.
        ``dataclasses.replace`` looks up every field and runs the checks again (2.2 us against 0.4 us here), on the
        consumer thread of a mix, which routes every item it submits."""
        item = object.__new__(WorkItem)
        fields = item.__dict__
        fields.update(self.__dict__)
        fields["route"] = route
        if id is not None:
            fields["id"] = id
        return item


@dataclass(frozen=True)
class ItemDone:
    """In-band marker after an item's last sample: every sample of item ``id`` has been handed over."""

    id: int
