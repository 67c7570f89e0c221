"""wids' public API on wds-async: ``from wds_async import wids``, then ``wids.ShardListDataset(...)``.

Code written for the ``wids`` package changes its import and nothing else. The implementation is
:mod:`wds_async.compat.wids` (it sits in the compatibility layer, over :class:`~wds_async.IndexedWebDataset`);
this module gives it the short name, and is the same objects: ``wds_async.wids.ShardListDataset is
wds_async.compat.wids.ShardListDataset``. Under :func:`~wds_async.install_as_webdataset`, ``webdataset.wids`` is that
module too.
"""

from __future__ import annotations

from .compat.wids import *  # noqa: F403  (its __all__: one list of the drop-in's names, kept there)
from .compat.wids import __all__ as __all__
