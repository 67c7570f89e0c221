"""Whether torch is installed, decided once: the data layer's one view of torch.

torch is an extra (``pip install 'wds-async[torch]'``). With it, :class:`IterableDataset`, :class:`DataLoader` and
:class:`Tensor` are torch's own, so :class:`~wds_async.WebDataset`, :class:`~wds_async.DataPipeline`, the mixes and
the shard lists are ``torch.utils.data.IterableDataset`` subclasses exactly as when torch was required. Without it
they are stand-ins: a plain iterable base class, and a ``DataLoader`` and a ``Tensor`` of which no object exists
(so ``isinstance`` is always False); everything that needs torch itself calls :func:`require_torch` where it is
used, which raises :class:`~wds_async.errors.MissingDependency` naming the extra.

The question is "is torch installed", not "does it import": a torch that is installed but broken raises its own
error here instead of silently turning the datasets into plain iterables. Importing this module does not import
torch: the three names above do, on first use (so ``wds_async.Decoder`` alone stays cheap). ``import wds_async``
and the command line never load it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependency

__all__ = ["HAVE_TORCH", "INSTALL_HINT", "DataLoader", "IterableDataset", "NoDataLoader", "NoTensor", "PlainIterable",
           "Tensor", "require_torch"]

#: How to get torch, as every error about its absence says it.
INSTALL_HINT = "pip install 'wds-async[torch]'"

#: True when the ``torch`` package is installed in this interpreter.
HAVE_TORCH: bool = importlib.util.find_spec("torch") is not None


def require_torch(what: str) -> None:
    """Return when torch is installed; otherwise raise :class:`MissingDependency` saying that ``what``
    (``"WebLoader"``, ``"the 'torchrgb' image decoder"``) needs it and how to install it."""
    if not HAVE_TORCH:
        raise MissingDependency(f"{what} needs torch, which is not installed: {INSTALL_HINT}")


class PlainIterable:
    """The datasets' base class without torch: a plain iterable (subclasses define ``__iter__``)."""

    def __iter__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define __iter__")


class NoDataLoader:
    """Stands in for ``torch.utils.data.DataLoader`` without torch: constructing one raises, so nothing is one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require_torch("DataLoader")


class NoTensor:
    """Stands in for ``torch.Tensor`` without torch: constructing one raises, so no value is one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require_torch("Tensor")


if TYPE_CHECKING:
    from torch import Tensor
    from torch.utils.data import DataLoader, IterableDataset
else:

    def __getattr__(name: str) -> Any:
        # Resolved on first use, so that a module which only calls require_torch (the decoders) imports no torch.
        if name not in ("IterableDataset", "DataLoader", "Tensor"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        if HAVE_TORCH:
            import torch.utils.data

            found = {"IterableDataset": torch.utils.data.IterableDataset, "DataLoader": torch.utils.data.DataLoader,
                     "Tensor": torch.Tensor}
        else:
            found = {"IterableDataset": PlainIterable, "DataLoader": NoDataLoader, "Tensor": NoTensor}
        globals().update(found)
        return found[name]
