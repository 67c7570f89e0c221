"""What the service checks in a client's ``open`` frame before any of it reaches an engine.

A refused ``open`` ends the session with an ``error`` frame (a :class:`~wds_async.errors.ServiceError` naming
the socket, the option and what to do); nothing of it is run.

* **Settings** (``settings``): only the names in :data:`CLIENT_SETTINGS` and :data:`SHARE_SETTINGS`, each of
  the JSON type it must have, each then checked by :class:`~wds_async.config.EngineConfig` itself (the
  validation an in-process dataset meets at construction), one at a time so the error names the option. The
  service honours every one it accepts: the engine settings go into the session's engine config, the
  backend ones (``connect_timeout``, ``read_timeout``, ``chunk_bytes``) into the backends that read the
  session's items (sessions with equal settings share one connection pool).
* **Backend options** (``backend_options``): plain values, checked against the constructor of the backend
  that will receive them, as in-process. For ``pipe:`` only ``allow_pipe`` and ``kill_grace`` are accepted:
  where and how a command runs is the service's rule below, not an option.
* **Cache** (``cache``): ``{"dir": absolute path, "max_bytes": int or null, "validate": bool}``.
* **Local paths** must be absolute. The client makes relative paths absolute against its own working
  directory before sending them; a relative path reaching the service (an older or foreign client) is
  refused, because the service's working directory is not the client's.
* **pipe: commands** run with the *client's* working directory and environment, which the client sends
  beside the items (``context``: ``{"cwd", "env"}``) whenever a chunk holds a ``pipe:`` URL. So
  ``pipe:cat shard.tar`` reads the file the client meant, and the command sees the client's credentials
  and ``PATH``, exactly as in-process. An ``open`` with ``pipe:`` items and no such context is refused.
  The operator's switch wins: a service started with ``WDS_ASYNC_NO_PIPE=1`` (or ``--no-pipe``) refuses
  every ``pipe:`` item whatever the client's ``allow_pipe`` says; a client's ``allow_pipe=False`` is
  honoured too. Running the command with the client's cwd, rather than refusing relative commands, is the
  rule because a shell command's paths cannot be told apart from its other words.

The service acts with its own user's rights: whatever a client sends, it reads files and runs commands as
the service's user, in the service's namespaces (see ``docs/service-security.md``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from typing import Any

from ..config import EngineConfig, RetryPolicy
from ..engine.work import WorkItem
from ..errors import MissingDependency, ServiceError, UrlError
from ..io.registry import scheme_options
from ..urls import redact_url, scheme_of

__all__ = ["CLIENT_SETTINGS", "SHARE_SETTINGS", "ClientSettings", "PipeContext", "check_backend_options",
           "check_cache", "check_items", "check_settings", "pipe_context"]

#: Engine settings a client chooses for its own items, with the JSON type each must have.
CLIENT_SETTINGS: dict[str, tuple[type, ...]] = {
    "max_sample_bytes": (int,), "deterministic": (bool,), "part_bytes": (int,), "read_timeout": (int, float),
    "connect_timeout": (int, float), "chunk_bytes": (int,), "handoff_max_samples": (int,),
    "handoff_max_bytes": (int,)}
#: Settings that size the client's share of the node budgets (see ``Service.session_config``).
SHARE_SETTINGS: dict[str, tuple[type, ...]] = {
    "processes": (int,), "max_buffered_bytes": (int,), "max_connections": (int,), "retry": (dict,)}
#: The engine settings the backends are built with: sessions that differ in them get their own backends.
BACKEND_SETTINGS = ("connect_timeout", "read_timeout", "chunk_bytes")
#: ``pipe:`` backend options a client may send; the rest of how a command runs is decided here.
PIPE_OPTIONS: dict[str, tuple[type, ...]] = {"allow_pipe": (bool,), "kill_grace": (int, float)}
#: The longest grace a client may ask between SIGTERM and SIGKILL of its commands (the in-process default is
#: 1 s); commands of a session that ended are gone within it.
MAX_KILL_GRACE = 30.0


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """A client's settings, checked: ``changes`` to the service's engine config, the node-share inputs."""

    changes: dict[str, Any]
    processes: int
    explicit: frozenset[str]
    max_connections: int | None


@dataclasses.dataclass(frozen=True)
class PipeContext:
    """Where and with what environment a client's ``pipe:`` commands run."""

    cwd: str
    env: dict[str, str]


def _refused(socket_path: str, what: str, why: str) -> ServiceError:
    return ServiceError(f"the wds-async service at {socket_path} refused the client's {what}: {why}; fix it in "
                        "the dataset's arguments (the same value fails in-process too, unless said otherwise)",
                        url=socket_path)


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    """``value`` is of one of ``types`` (a bool is not an int; a float must be finite)."""
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, float):
        return float in types and math.isfinite(value)
    return (isinstance(value, int) and int in types) or (isinstance(value, dict) and dict in types)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join({"int": "an int", "float": "a number", "bool": "true or false", "dict": "an object"}
                       [t.__name__] for t in types)


def check_settings(settings: Any, base: EngineConfig, socket_path: str) -> ClientSettings:
    """Check a client's ``settings`` against ``base`` (the service's engine config): ServiceError naming the
    first bad option; nothing of a refused frame reaches an engine."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise _refused(socket_path, "settings", f"expected an object, got {type(settings).__name__}")
    for name, value in settings.items():
        types = CLIENT_SETTINGS.get(name) or SHARE_SETTINGS.get(name)
        if types is None:
            raise _refused(socket_path, f"setting {name!r}", "the service does not know it (a client of another "
                           "wds-async version?); it honours " + ", ".join(sorted({*CLIENT_SETTINGS, *SHARE_SETTINGS})))
        if not _typed(value, types):
            raise _refused(socket_path, f"setting {name}={_short(value)}", f"it must be {_type_names(types)}")
    changes: dict[str, Any] = {}
    for name in CLIENT_SETTINGS:
        if name in settings:
            changes[name] = _engine_check(base, name, settings[name], socket_path)
    if "retry" in settings:
        try:
            if not all(_typed(v, (int, float)) for v in settings["retry"].values()):
                raise ValueError("every field must be a finite number")
            changes["retry"] = RetryPolicy(**settings["retry"])
        except (TypeError, ValueError) as exc:
            raise _refused(socket_path, f"setting retry={_short(settings['retry'])}", str(exc)) from None
    if "max_buffered_bytes" in settings:
        changes["max_buffered_bytes"] = _engine_check(base, "max_buffered_bytes", settings["max_buffered_bytes"],
                                                      socket_path)
    max_connections = settings.get("max_connections")
    if max_connections is not None:
        _engine_check(base, "max_connections", max_connections, socket_path)
    processes = settings.get("processes", 1)
    if processes < 1:
        raise _refused(socket_path, f"setting processes={processes}", "it must be a positive int (the loader "
                       "processes sharing the node)")
    try:
        base.replace(**changes)  # the combination, as the session will build it
    except (TypeError, ValueError) as exc:
        raise _refused(socket_path, "settings", str(exc)) from None
    explicit = frozenset(k for k in ("max_buffered_bytes",) if k in settings)
    return ClientSettings(changes=changes, processes=processes, explicit=explicit, max_connections=max_connections)


def _engine_check(base: EngineConfig, name: str, value: Any, socket_path: str) -> Any:
    try:
        base.replace(**{name: value})
    except (TypeError, ValueError) as exc:
        raise _refused(socket_path, f"setting {name}={_short(value)}", str(exc)) from None
    return value


def check_backend_options(options: Any, items: Iterable[WorkItem], socket_path: str
                          ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``(options, pipe_options)``: the client's ``backend_options``, checked against the backends its items
    use (ServiceError if not), and those of them that concern ``pipe:`` (flat or per scheme)."""
    if options is None:
        return None, {}
    if not isinstance(options, dict):
        raise _refused(socket_path, "backend_options", f"expected an object, got {type(options).__name__}")
    urls = {item.url for item in items}
    try:
        checked = scheme_options(options, urls)
    except (UrlError, MissingDependency) as exc:
        raise _refused(socket_path, "backend_options", exc.message) from None
    for name, value in (checked.get("pipe") or {}).items():
        types = PIPE_OPTIONS.get(name)
        if types is None:
            raise _refused(socket_path, f"pipe: option {name!r}", "through the service only allow_pipe and "
                           "kill_grace are accepted: commands run in the client's working directory and "
                           "environment, which the client sends itself")
        if not _typed(value, types) or (name == "kill_grace" and not 0 <= value <= MAX_KILL_GRACE):
            raise _refused(socket_path, f"pipe: option {name}={_short(value)}",
                           f"it must be {_type_names(types)}" + (f" from 0 to {MAX_KILL_GRACE:.0f} seconds"
                                                                 if name == "kill_grace" else ""))
    return options, dict(checked.get("pipe") or {})


def check_cache(spec: Any, socket_path: str) -> dict[str, Any] | None:
    """The client's cache spec (``{"dir", "max_bytes", "validate"}``), checked; None or {} for none."""
    if not spec:
        return None
    ok = (isinstance(spec, dict) and set(spec) <= {"dir", "max_bytes", "validate"}
          and isinstance(spec.get("dir"), str) and os.path.isabs(spec["dir"])
          and (spec.get("max_bytes") is None or (_typed(spec["max_bytes"], (int,)) and spec["max_bytes"] > 0))
          and isinstance(spec.get("validate", True), bool))
    if not ok:
        raise _refused(socket_path, f"cache {_short(spec)}", 'expected {"dir": an absolute path, "max_bytes": a '
                       'positive int or null, "validate": true or false}')
    return dict(spec)


def pipe_context(value: Any, socket_path: str) -> PipeContext | None:
    """The client's ``context`` (``{"cwd", "env"}``) checked, or None when it sent none."""
    if value is None:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("cwd"), str) and os.path.isabs(value["cwd"])
            and isinstance(value.get("env"), dict)
            and all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
                    for k, v in value["env"].items())):
        raise _refused(socket_path, "context", 'expected {"cwd": an absolute path, "env": an object of '
                       "strings} (the client's working directory and environment, for pipe: commands)")
    return PipeContext(cwd=value["cwd"], env=dict(value["env"]))


def check_items(items: list[WorkItem], context: PipeContext | None, pipes_allowed: bool, socket_path: str) -> None:
    """Refuse relative local paths, and ``pipe:`` items that the operator forbids or that came without the
    client's working directory and environment (see the module docstring)."""
    for item in items:
        scheme = scheme_of(item.url)
        if scheme == "file" and not _absolute_local(item.url):
            raise ServiceError(f"the wds-async service at {socket_path} refused the relative path {item.url!r}: "
                               "it would be read from the service's working directory, not the client's; name "
                               "shards by absolute path (a client of this version does so itself)", url=socket_path)
        if scheme == "pipe":
            if not pipes_allowed:
                raise ServiceError(f"the wds-async service at {socket_path} does not run pipe: commands (its "
                                   f"operator set WDS_ASYNC_NO_PIPE or --no-pipe), so it refused "
                                   f"{redact_url(item.url)!r}; read such shards in-process (service=None) or name "
                                   "them by path or store URL", url=socket_path)
            if context is None:
                raise ServiceError(f"the wds-async service at {socket_path} refused {redact_url(item.url)!r}: a "
                                   "pipe: command runs in the client's working directory and environment, and the "
                                   "client sent neither (a client of another wds-async version?)", url=socket_path)


def _absolute_local(url: str) -> bool:
    if url.startswith("file://"):
        return True  # file://HOST/PATH: the path after the host is absolute by construction
    return url.removeprefix("file:").startswith("/")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
