"""Engine settings: :class:`EngineConfig` and its :class:`RetryPolicy`, frozen dataclasses validated at
construction (a bad value is a ``ValueError`` when the dataset is built, not at the first batch). Every size
option has a floor, and ``chunk_bytes`` a ceiling, that keep the process bounded (:data:`SIZE_LIMITS`, with
the reasons).

Defaults are deliberate:

* ``max_connections="auto"`` lets the engine find the knee of the store it talks to at run time, between
  ``min_connections`` and ``connection_cap`` (see :mod:`wds_async.engine.autotune`; ``wds-async tune`` measures the
  same curve by hand). A :class:`~wds_async.WebDataset` hands the engine this process's share of the node
  budgets (:mod:`wds_async.node`), not these values as given.
* ``max_buffered_bytes`` bounds the bytes the engine holds whatever the consumer does; the engine also lowers
  the concurrency to what half of it can hold in transport buffers.
* ``max_sample_bytes`` (1 GiB) bounds what a single sample may hold: a tar header announcing more fails the
  shard before its bytes are buffered (:class:`~wds_async.errors.SampleTooLarge`), so a corrupt or hostile
  header cannot grow memory until the process dies.
* ``read_timeout`` is a per-read stall timeout (aiohttp's ``sock_read``); it replaces aiohttp's 5-minute
  *total* timeout, which would kill any shard that takes longer than that to stream.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

__all__ = ["SIZE_LIMITS", "EngineConfig", "RetryPolicy", "check_size"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# -- the limits of the size options -------------------------------------------------------------------------------
# Each byte-count option has a floor below which the process is no longer bounded by what the options say
# (or the option no longer means anything), and a ceiling where a larger value multiplies memory. A value
# outside is a ValueError at construction naming the option, the value, the range and the fix; the node
# service checks its clients' settings by building an EngineConfig, so this is the one place.

#: The smallest ``part_bytes`` other than 0 (never split). The engine plans every part of an object when its
#: first answer arrives, about 1.8 KB of bookkeeping each (measured: a part with its chunk queue and event),
#: so the plan costs about 1.8 KB / part_bytes of the object's size. At ``part_bytes=1`` a 16 MB shard is 16
#: million parts, about 29 GB: the MemoryError, and through the service the 16 GB that stalled every other
#: client. At 32 KiB that shard is at most 512 parts (under 1 MiB of plan), a 1 GiB shard 32768 parts (about
#: 57 MiB), and the plan never exceeds 5.6% of the object (0.01% at the 16 MiB default); parts this small are
#: already more request round trips than bytes. 32 KiB and not more: it is the size the backend contract, the
#: cache and the service tests pass on purpose to exercise ranged parts on shards of a few hundred KiB.
MIN_PART_BYTES = 32 * KiB
#: The smallest ``chunk_bytes``: each chunk is a ``bytes`` object (33 bytes of header) in a queue, plus a
#: parser call and a budget update; at 1 byte a 256 MiB budget would take some 12 GiB of overhead. At 4 KiB
#: (a page) the overhead stays under about 1.5%.
MIN_CHUNK_BYTES = 4 * KiB
#: The largest ``chunk_bytes``: every reader may hold one chunk beyond ``max_buffered_bytes`` (the overdraft
#: that keeps a full budget from blocking the bytes the consumer waits for), so memory can reach the budget
#: plus connections x chunk_bytes; 64 MiB x 256 connections is already 16 GiB, and larger reads gain no
#: throughput (a socket read returns a few MiB at most).
MAX_CHUNK_BYTES = 64 * MiB
#: The smallest ``max_buffered_bytes``, ``max_sample_bytes`` and ``handoff_max_bytes``: two tar blocks (a
#: header and one block of data). A budget below one sample still works (the overdraft lets one sample
#: through at a time; a test runs the engine at exactly 1 KiB for that), but below two blocks every read
#: overdraws and the option bounds nothing; so small a value is most likely a unit slip (256 meant as MiB).
#: No ceiling: each of these is itself the bound on memory (and the hand-off is at most an eighth of the
#: budget whatever it says).
MIN_BYTES = 1 * KiB

#: ``name: (floor, ceiling or None, what the option is)`` of every size option of :class:`EngineConfig`. The
#: counts (connections, ``handoff_max_samples``) only need to be positive ints.
SIZE_LIMITS: dict[str, tuple[int, int | None, str]] = {
    "part_bytes": (MIN_PART_BYTES, None, ""),
    "chunk_bytes": (MIN_CHUNK_BYTES, MAX_CHUNK_BYTES, "the most read in one step; the default, 1 MiB, suits "
                    "every store"),
    "max_buffered_bytes": (MIN_BYTES, None, "the engine's memory budget; the default is 256 MiB"),
    "max_sample_bytes": (MIN_BYTES, None, "the largest sample accepted; the default is 1 GiB"),
    "handoff_max_bytes": (MIN_BYTES, None, "the most bytes handed to the consumer at once; the default is 16 MiB"),
}


def _size_text(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def check_size(name: str, value: object, *, shown: str | None = None, zero: bool | None = None) -> int:
    """``value`` when it is an int in the range :data:`SIZE_LIMITS` gives ``name`` (or 0 where ``zero``, by
    default for ``part_bytes``: never split), else a ValueError naming the option (``shown``, default
    ``EngineConfig.<name>``), the value, the range and what to do. Also for options elsewhere that feed these
    settings (``wds-async tune --part-bytes``, with ``zero=False``)."""
    low, high, what = SIZE_LIMITS[name]
    zero = name == "part_bytes" if zero is None else zero
    if not isinstance(value, int) or isinstance(value, bool):
        fix = "pass a whole number of bytes"
    elif value < low and not (value == 0 and zero):
        fix = f"raise it to {_size_text(low)} or more"
    elif high is not None and value > high:
        fix = f"lower it to {_size_text(high)} or less"
    else:
        return value
    span = f"{_size_text(low)} to {_size_text(high)}" if high is not None else f"at least {_size_text(low)}"
    if zero:
        span, what = f"0 (never split) or {span}", "or pass 0 to read every object in one stream"
    raise ValueError(f"{shown or 'EngineConfig.' + name}={value!r} is out of range: it takes {span}. To fix, {fix}"
                     + (f" ({what})." if what else "."))


def _positive_int(name: str, value: object, alternative: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"EngineConfig.{name} must be a positive int{' ' + alternative if alternative else ''}, "
                         f"got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures (5xx, 429, resets, stalls, short bodies) are retried.

    Each retry resumes at the byte where the stream stopped. Delays grow exponentially from
    ``base_delay`` up to ``max_delay`` with full jitter; a shard gives up after ``attempts`` tries in
    total or once ``deadline`` seconds have passed since its first failure.
    """

    attempts: int = 8
    base_delay: float = 0.1
    max_delay: float = 10.0
    deadline: float = 300.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("RetryPolicy needs 0 <= base_delay <= max_delay")
        if self.deadline <= 0:
            raise ValueError(f"RetryPolicy.deadline must be > 0, got {self.deadline}")

    def delay(self, failures: int) -> float:
        """Seconds to wait before the next try after ``failures`` failures in a row (full jitter)."""
        return _JITTER.uniform(0, min(self.max_delay, self.base_delay * 2 ** (failures - 1)))


#: The retry jitter's own generator. Retries run in the engine's thread while the consumer may draw from the
#: global ``random`` (an unseeded ``RandomMix`` draws its sources there, as webdataset's does, repeatable after
#: ``random.seed(n)``): jitter taken from the global generator would change which sources a run picks whenever
#: a request is retried.
_JITTER = random.Random()


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to know about concurrency, memory and time.

    Attributes:
        max_connections: requests in flight at once (HTTP requests, subprocesses, file readers; a large
            shard read as ranged parts takes one per part). ``"auto"`` (the default) lets the autotuner
            choose at run time, between ``min_connections`` and ``connection_cap``, starting at
            ``start_connections``; an int fixes it.
        min_connections / start_connections / connection_cap: the autotuner's floor, first value and
            ceiling (the node budget lowers the ceiling to this process's share). A list of local files
            starts at ``min_connections`` unless ``start_connections`` was changed (see docs/tuning.md).
        early_start: the autotuner's start-up (see docs/tuning.md): at the default start level, 8 requests
            first, and the start level only if no answer came within 10 ms (a store on the same host keeps 8);
            while no request has been answered and items wait for a token, the level doubles every 0.1 s (at
            most three times); once the first
            answers stream, where requests mostly wait for their first byte, the level jumps at once (for a
            known list, to at least half the items left) instead of ramping: a short epoch is over before a
            ramp from 32 finds its level. A dataset's next epoch, which starts at the level the last one
            settled at, turns them off.
        part_bytes: a shard larger than this is fetched as concurrent ranged parts of this size, fed to
            its parser in order (0: never split; else at least 32 KiB, see :data:`MIN_PART_BYTES`). ``pipe:``
            sources are always read sequentially.
        max_buffered_bytes: global bound on bytes read from sources and not yet handed to the consumer,
            across all shards. A single sample larger than this still passes, one at a time, up to
            ``max_sample_bytes``. At least 1 KiB.
        max_sample_bytes: the largest member, and the largest sample (its fields summed), accepted. A tar
            header that announces more fails its shard with :class:`~wds_async.errors.SampleTooLarge`
            (url, offset, key) before any of those bytes is buffered; the handler decides as for any shard
            error. The 1 GiB default is far above real samples (a long video clip) yet small enough that a
            corrupt size field, or a stream of zeros behind a header claiming gigabytes, fails fast and
            clearly instead of growing memory until the process dies with a bare ``MemoryError``; raise it
            for larger samples. Memory per sample can still reach about twice this: a member is read whole
            (and joined into one ``bytes``) before the sample's sum is checked.
        chunk_bytes: largest read from a source in one step (4 KiB to 64 MiB).
        handoff_max_samples / handoff_max_bytes: the most the bridge hands to the consumer thread in one
            batch (the batch in the consumer's hand is outside ``max_buffered_bytes``).
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds without a single byte before a stream counts as stalled.
        deterministic: deliver samples shard by shard in shard-list order, as webdataset does (the default;
            downloads still run in parallel and the shards after a slow one wait in the byte budget). False
            interleaves the shards in flight as their bytes arrive: no sample waits behind a slow shard, at the
            price of an order that changes from run to run; for pipelines that shuffle anyway.
        retry: the retry policy for transient errors.
    """

    max_connections: int | str = "auto"
    min_connections: int = 2
    start_connections: int = 32
    early_start: bool = True
    connection_cap: int = 256
    part_bytes: int = 16 * MiB
    max_buffered_bytes: int = 256 * MiB
    max_sample_bytes: int = 1 * GiB
    chunk_bytes: int = 1 * MiB
    handoff_max_samples: int = 1024
    handoff_max_bytes: int = 16 * MiB
    connect_timeout: float = 30.0
    read_timeout: float = 60.0
    deterministic: bool = True
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.max_connections != "auto":
            _positive_int("max_connections", self.max_connections, 'or "auto"')
        for name in ("min_connections", "start_connections", "connection_cap", "handoff_max_samples"):
            _positive_int(name, getattr(self, name))
        for name in SIZE_LIMITS:  # floors and ceilings of the byte counts, with their reasons above
            check_size(name, getattr(self, name))
        if self.min_connections > self.connection_cap:
            raise ValueError(f"EngineConfig.min_connections ({self.min_connections}) is above connection_cap "
                             f"({self.connection_cap})")
        for name in ("connect_timeout", "read_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineConfig.{name} must be > 0 seconds")

    @property
    def autotune(self) -> bool:
        """True when the engine chooses the concurrency at run time (``max_connections="auto"``)."""
        return self.max_connections == "auto"

    @property
    def connections(self) -> int:
        """The most requests ever in flight: the fixed ``max_connections``, or the autotuner's ceiling."""
        return self.connection_cap if isinstance(self.max_connections, str) else self.max_connections

    @property
    def first_connections(self) -> int:
        """The concurrency the engine starts at."""
        if isinstance(self.max_connections, int):
            return self.max_connections
        return max(self.min_connections, min(self.start_connections, self.connection_cap))

    def replace(self, **changes: object) -> EngineConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def starting_at(self, level: int) -> EngineConfig:
        """This config for reads that start where an earlier run of them settled (a dataset's next epoch, a
        DataLoader worker after the last epoch's): the autotuner starts at ``level`` with no start-up check. Itself
        where the concurrency is fixed or ``level`` is 0 (nothing learned)."""
        if not (self.autotune and level > 0):
            return self
        return self.replace(start_connections=level, early_start=False)

    @property
    def handoff_bytes(self) -> int:
        """Bytes per hand-off: at most an eighth of the budget so the batch in hand stays small."""
        return max(1, min(self.handoff_max_bytes, self.max_buffered_bytes // 8))
