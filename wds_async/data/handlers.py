"""Error policies, under webdataset's names.

A handler receives the exception and returns True to skip the failing unit (a shard, or one sample)
and continue, False to end the data there, or raises to propagate. Unlike webdataset's warn handlers,
ours never sleep. Every skip is counted in ``stats()``.
"""

from __future__ import annotations

import logging

__all__ = [
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "resolve_handler",
    "warn_and_continue",
    "warn_and_stop",
]

log = logging.getLogger("wds_async")


def reraise_exception(exn: BaseException) -> bool:
    """The default: raise the error in the consumer's thread."""
    raise exn


def warn_and_continue(exn: BaseException) -> bool:
    """Log a warning and skip."""
    log.warning("wds-async skipping after error: %s", exn)
    return True


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip silently (still counted in ``stats()``)."""
    return True


def warn_and_stop(exn: BaseException) -> bool:
    """Log a warning and end the data here."""
    log.warning("wds-async stopping after error: %s", exn)
    return False


def ignore_and_stop(exn: BaseException) -> bool:
    """End the data here without a word."""
    return False


_BY_NAME = {f.__name__: f for f in (reraise_exception, warn_and_continue, ignore_and_continue, warn_and_stop,
                                    ignore_and_stop)}


def resolve_handler(handler: object):  # type: ignore[no-untyped-def]
    """Accept a handler callable or one of the names above."""
    if handler is None:
        return reraise_exception
    if isinstance(handler, str):
        try:
            return _BY_NAME[handler]
        except KeyError:
            raise ValueError(f"unknown handler {handler!r}; use one of {sorted(_BY_NAME)} or a callable") from None
    if not callable(handler):
        raise TypeError(f"handler must be callable or a name, got {handler!r}")
    return handler
