"""What a dataset checks and sends when it reads through a node service (client side, no I/O)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..config import EngineConfig

__all__ = ["check_service_options", "service_settings"]


def check_service_options(service: str, select_files: Any, rename_files: Any, backends: Any,
                           backend_options: dict[str, Any]) -> None:
    """ValueError for options a node service cannot run: callables and backend instances stay in this process."""
    refused = [name for name, value in (("select_files", select_files), ("rename_files", rename_files),
                                        ("backends", backends)) if value is not None]
    if refused:
        raise ValueError(f"service={service!r} cannot be used with {', '.join(refused)}: the node service runs in "
                         "another process and cannot call this process's functions or objects; drop them, or "
                         "read in-process (service=None)")
    try:
        json.dumps(backend_options)
    except TypeError as exc:
        raise ValueError(f"service={service!r} needs backend_options made of plain values (they are sent to the "
                         f"service): {exc}") from None


def service_settings(config: EngineConfig, processes: int, explicit: frozenset[str]) -> dict[str, Any]:
    """What a node service session needs of this dataset's engine settings (see ``Service.session_config``)."""
    settings: dict[str, Any] = {name: getattr(config, name) for name in (
        "max_sample_bytes", "deterministic", "part_bytes", "read_timeout", "connect_timeout", "chunk_bytes",
        "handoff_max_samples", "handoff_max_bytes")}
    settings["retry"] = dataclasses.asdict(config.retry)
    settings["processes"] = processes
    if "max_buffered_bytes" in explicit:
        settings["max_buffered_bytes"] = config.max_buffered_bytes
    if "max_connections" in explicit and isinstance(config.max_connections, int):
        settings["max_connections"] = config.max_connections
    return settings
