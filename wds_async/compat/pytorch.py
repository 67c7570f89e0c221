"""``webdataset.pytorch``: torch's ``DataLoader``, ``IterableDataset`` and ``Tensor`` under webdataset's names.

These are torch's own classes, as in webdataset; the shim needs torch (webdataset's dataset side does too).
"""

from __future__ import annotations

from torch import Tensor as TorchTensor
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["DataLoader", "IterableDataset", "TorchTensor"]
