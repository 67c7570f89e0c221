"""What a shim module says about a webdataset name it does not provide: an :class:`ImportError` that names it.

Each shim module lists the webdataset 1.0.2 names it leaves out, with the reason, in a ``dict`` handed to
:func:`refusing`; the module's ``__getattr__`` raises :class:`NotProvided` for them, so
``from webdataset.gopen import gopen_ais`` fails at import with that reason instead of yielding ``None`` or a
bare "cannot import name". Any other missing name is a plain :class:`AttributeError`, as for any module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["NotProvided", "refusing"]


class NotProvided(ImportError):
    """A webdataset name that wds-async's shim does not provide; the message names it and says why.

    An :class:`ImportError`, so that ``from webdataset.X import name`` reports it at import with this message
    (Python turns an ``AttributeError`` from a module into its own "cannot import name" and drops the reason)."""


def refusing(module: str, missing: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the shim of ``module`` (``"webdataset.gopen"``): :class:`NotProvided` for the
    names in ``missing`` (name -> reason), :class:`AttributeError` for any other."""

    def __getattr__(name: str) -> Any:
        reason = missing.get(name)
        if reason is None:
            raise AttributeError(f"module {module!r} (wds-async's shim) has no attribute {name!r}")
        raise NotProvided(f"{module}.{name} is not provided by wds-async: {reason}", name=module)

    return __getattr__
