"""Engine settings as one frozen, validated dataclass.

Defaults are deliberate: ``max_connections="auto"`` lets the engine find the knee of the store it talks to
(see :mod:`wds_async.autotune`; ``wds-async tune`` measures the same curve by hand), ``max_buffered_bytes`` bounds the memory the
engine may hold whatever the consumer does, and the read timeout replaces aiohttp's 5-minute *total*
timeout, which would kill any shard that takes longer than that to stream.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["EngineConfig", "RetryPolicy"]

MiB = 1 << 20


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


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to know about concurrency, memory and time.

    Attributes:
        max_connections: requests in flight at once (HTTP requests, subprocesses, file readers; a large
            shard read as ranged parts takes one per part). ``"auto"`` (the default) lets the autotuner
            choose at run time, between ``min_connections`` and ``connection_cap``, starting at
            ``start_connections``; an int fixes it.
        min_connections / start_connections / connection_cap: the autotuner's floor, first value and
            ceiling (the node budget lowers the ceiling to this process's share).
        part_bytes: a shard larger than this is fetched as concurrent ranged parts of this size, fed to
            its parser in order (0: never split). ``pipe:`` sources are always read sequentially.
        max_buffered_bytes: global bound on bytes read from sources and not yet handed to the consumer,
            across all shards. A single sample larger than this still passes, one at a time.
        chunk_bytes: largest read from a source in one step.
        handoff_max_samples / handoff_max_bytes: the most the bridge hands to the consumer thread in one
            batch (the batch in the consumer's hand is outside ``max_buffered_bytes``).
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds without a single byte before a stream counts as stalled.
        deterministic: deliver samples shard by shard in shard-list order instead of as they arrive.
        retry: the retry policy for transient errors.
    """

    max_connections: int | str = "auto"
    min_connections: int = 2
    start_connections: int = 32
    connection_cap: int = 256
    part_bytes: int = 16 * MiB
    max_buffered_bytes: int = 256 * MiB
    chunk_bytes: int = 1 * MiB
    handoff_max_samples: int = 1024
    handoff_max_bytes: int = 16 * MiB
    connect_timeout: float = 30.0
    read_timeout: float = 60.0
    deterministic: bool = False
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.max_connections != "auto":
            _positive_int("max_connections", self.max_connections, 'or "auto"')
        for name in ("min_connections", "start_connections", "connection_cap", "max_buffered_bytes",
                     "chunk_bytes", "handoff_max_samples", "handoff_max_bytes"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.part_bytes, int) or isinstance(self.part_bytes, bool) or self.part_bytes < 0:
            raise ValueError(f"EngineConfig.part_bytes must be an int >= 0 (0: no parts), got {self.part_bytes!r}")
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

    @property
    def handoff_bytes(self) -> int:
        """Bytes per hand-off: at most an eighth of the budget so the batch in hand stays small."""
        return max(1, min(self.handoff_max_bytes, self.max_buffered_bytes // 8))
