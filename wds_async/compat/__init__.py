"""Running code written for webdataset, unchanged: ``wds_async.install_as_webdataset()`` makes ``import webdataset``
and ``from webdataset.<module> import <name>`` give wds-async.

One module here per webdataset 1.0.2 module, under its name (``filters``, ``tariterators``, ``gopen``, ...),
holding the names user code takes from it, built on wds-async's own pieces: the engine's tar parser and key rule,
the pipeline stages, the dataset, the writers and the backends. :mod:`.top` is the ``webdataset`` package itself.
Names a module does not provide raise :class:`~wds_async.compat._names.NotProvided` (an ``ImportError``) saying
why. See ``docs/webdataset.md``, "Running code written for webdataset".
"""

from __future__ import annotations

from ._install import install_as_webdataset, installed
from ._names import NotProvided

__all__ = ["NotProvided", "install_as_webdataset", "installed"]
