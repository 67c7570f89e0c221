"""The picklable stage wrapper that both pipeline forms use.

A :class:`Stage` is ``iterator -> iterator``: a module-level function plus its bound arguments, so a
pipeline of stages pickles into spawned DataLoader workers (a closure or a lambda would not).
:func:`pipelinefilter` curries a stage function into webdataset's pipeline form:
``wds.shuffle(1000)`` is ``Stage(shuffle, 1000)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["Stage", "pipelinefilter"]


class Stage:
    """A picklable ``iterator -> iterator`` step: ``fn(data, *args, **kwargs)``."""

    def __init__(self, fn: Callable[..., Iterator[Any]], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        return self.fn(data, *self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"{getattr(self.fn, '__name__', self.fn)}{self.args or ''}"


def pipelinefilter(fn: Callable[..., Iterator[Any]]) -> Callable[..., Stage]:
    """Curry a stage function for the pipeline form: ``pipelinefilter(f)(*a, **k)(data) == f(data, *a, **k)``."""

    def make(*args: Any, **kwargs: Any) -> Stage:
        return Stage(fn, *args, **kwargs)

    make.__name__ = getattr(fn, "__name__", "stage")
    make.__doc__ = fn.__doc__
    return make
