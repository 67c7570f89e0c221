"""The emulated store's knobs: `Knobs`, how one server misbehaves, and `Plan`, one request's knobs.

Query parameters named like a knob override it for one request; ``status``, ``stall``, ``stall_rate``
and ``html`` exist per request only, ``total_bw`` per server only. :mod:`emustore.server` documents
what each knob does.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

__all__ = ["LISTING", "Knobs", "Plan", "plan_for"]

#: The plain face's listing parameters (``GET /?list``, ``/?prefix=P``): never knobs.
LISTING = frozenset({"list", "prefix"})
_PER_REQUEST = frozenset({"status", "stall", "stall_rate", "html"})
_TRUE = frozenset({"", "1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_INT_PARAMS = frozenset({"seed", "status", "max_concurrent"})


@dataclasses.dataclass(frozen=True)
class Knobs:
    """How the store misbehaves. Validated at construction; every default means "behave well"."""

    ttfb: float = 0.0  # seconds before the response headers are sent
    bw: float = 0.0  # bytes/s per response, 0 = unlimited
    total_bw: float = 0.0  # bytes/s shared by every response of the server, 0 = unlimited
    fail_rate: float = 0.0  # probability of "503 Slow Down" with Retry-After: 0
    drop_rate: float = 0.0  # probability that the body is cut short and the connection closed
    ignore_range: bool = False  # answer 200 with the whole object even when Range is sent
    seed: int | None = None  # RNG seed for the fault decisions; None = random per server
    max_concurrent: int = 0  # requests served at once before "503 SlowDown" answers, 0 = no limit

    def __post_init__(self) -> None:
        for name in ("ttfb", "bw", "total_bw", "fail_rate", "drop_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("fail_rate", "drop_rate"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} is a probability, got {getattr(self, name)!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        limit = self.max_concurrent
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"max_concurrent must be an int >= 0, got {limit!r}")

    def to_args(self) -> list[str]:
        """The CLI flags that reproduce these knobs (defaults are left out)."""
        args: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value == field.default:
                continue
            flag = "--" + field.name.replace("_", "-")
            args += [flag] if isinstance(value, bool) else [flag, repr(value)]
        return args


_KNOB_NAMES = frozenset(f.name for f in dataclasses.fields(Knobs))


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One request's knobs after the query overrides."""

    knobs: Knobs
    rng: random.Random
    status: int = 0
    stall: float = 0.0
    html: bool = False


def plan_for(query: Any, knobs: Knobs, rng: random.Random, lenient: bool = False) -> Plan:
    """The plan of a request with ``query`` on a server with ``knobs`` and fault RNG ``rng``.

    ``lenient`` skips parameters that are not knobs (an API's own); otherwise they are a ValueError,
    as is a malformed value.
    """
    if not query:
        return Plan(knobs, rng)
    overrides: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in query.items():
        if key in LISTING:
            continue
        if key == "total_bw":
            raise ValueError("total_bw is shared by the whole server; set it at startup")
        if key in ("ignore_range", "html"):
            parsed: Any = _parse_bool(key, value)
        elif key in _INT_PARAMS:
            parsed = int(value)
        elif key in _PER_REQUEST or key in _KNOB_NAMES:
            parsed = float(value)
        elif lenient:
            continue
        else:
            raise ValueError(f"unknown parameter {key!r}")
        (extra if key in _PER_REQUEST else overrides)[key] = parsed
    if not overrides and not extra:
        return Plan(knobs, rng)
    knobs = dataclasses.replace(knobs, **overrides)  # validates
    status = extra.get("status", 0)
    if status and not 200 <= status <= 599:
        raise ValueError(f"status must be 200..599, got {status}")
    stall = extra.get("stall", 0.0)
    if not math.isfinite(stall) or stall < 0:
        raise ValueError(f"stall must be a finite number >= 0, got {stall}")
    if "seed" in overrides:
        rng = random.Random(knobs.seed)
    stall_rate = extra.get("stall_rate", 1.0)
    if not 0 <= stall_rate <= 1:
        raise ValueError(f"stall_rate must be in [0, 1], got {stall_rate}")
    if stall and stall_rate < 1 and rng.random() >= stall_rate:
        stall = 0.0  # this request does not stall
    return Plan(knobs, rng, status, stall, extra.get("html", False))


def _parse_bool(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{key} must be a boolean, got {value!r}")
