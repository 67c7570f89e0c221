"""``webdataset.pytorch``: torch's ``DataLoader``, ``IterableDataset`` and ``Tensor`` under webdataset's names.

These are torch's own classes when torch is installed, as in webdataset. Without torch (wds-async installed without
the ``torch`` extra) they are the stand-ins of :mod:`wds_async.data._torch`: a plain iterable base, and a
``DataLoader``/``Tensor`` that raise :class:`~wds_async.errors.MissingDependency` naming the extra when constructed,
so ``import webdataset`` after :func:`~wds_async.install_as_webdataset` works in a job that only writes or reads
shards without torch.
"""

from __future__ import annotations

from ..data._torch import DataLoader, IterableDataset
from ..data._torch import Tensor as TorchTensor

__all__ = ["DataLoader", "IterableDataset", "TorchTensor"]
