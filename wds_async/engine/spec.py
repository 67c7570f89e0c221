"""One engine run's settings, validated once and handed down whole.

The dataset (or the pipeline's tar stage, or the node service for a client) builds a :class:`StreamSpec` from
what the user passed; :func:`wds_async.data.pipeline.stream_samples`, the :class:`~wds_async.engine.bridge.Bridge`
and the :class:`~wds_async.engine.engine.Engine` receive it as one frozen object instead of relaying a dozen
keyword arguments each. The numeric settings live in its :class:`~wds_async.config.EngineConfig` (validated at
construction); the rest says where bytes come from and what happens to errors and members:

* ``handler(exc) -> bool``: what an error ending a shard or a sample becomes (True: skip it, counted; False: stop
  the data there; raise: the error reaches the consumer at that position);
* ``select_files(name) -> bool`` / ``rename_files(name) -> str``: members kept and their names, before grouping;
* ``backends``: backend instances or factories by scheme, in place of the registry's; ``backend_options``: options
  for the registry's backends, per scheme (checked where the dataset is built);
* ``cache``: the shard cache the engine's items are read through (None: straight from the stores);
* ``log_interval``: seconds between progress lines on the ``wds_async`` logger (None: none);
* ``service``: the socket of the node service that reads for this process (None: read in-process, in this
  process's own engine), with ``service_settings``, the engine settings the service applies to this client's
  session (its share of the node, its timeouts and sizes: see :mod:`wds_async.service.options`);
* ``routes``: for an engine shared by several consumers (a mix's sources), one spec per route whose ``handler``,
  ``select_files`` and ``rename_files`` apply to the items of that route (``WorkItem.route``); a handler's stop
  or raise then ends that route only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..cache.disk import ShardCache
from ..config import EngineConfig

__all__ = ["Handler", "StreamSpec", "reraise"]

#: ``handler(exc) -> bool``: True to skip and continue, False to stop, raise to propagate.
Handler = Callable[[BaseException], bool]


def reraise(exc: BaseException) -> bool:
    """The default handler: every error reaches the consumer."""
    raise exc


@dataclass(frozen=True)
class StreamSpec:
    """See the module docstring."""

    config: EngineConfig = field(default_factory=EngineConfig)
    handler: Handler = reraise
    select_files: Callable[[str], bool] | None = None
    rename_files: Callable[[str], str] | None = None
    backends: Mapping[str, Any] | None = None
    backend_options: Mapping[str, Any] | None = None
    cache: ShardCache | None = None
    log_interval: float | None = None
    service: str | None = None
    service_settings: Mapping[str, Any] | None = None
    routes: tuple[StreamSpec, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, not {type(self.config).__name__}")
