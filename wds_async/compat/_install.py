"""``install_as_webdataset()``: make ``import webdataset`` (and ``webdataset.X``) give wds-async's shim.

The shim modules are imported and entered into ``sys.modules`` under webdataset's names, so ``import webdataset``,
``import webdataset.filters`` and ``from webdataset.tariterators import url_opener`` find them there, and a finder
first on ``sys.meta_path`` answers for every other ``webdataset.X``: a module webdataset has that the shim does not
provide raises :class:`~wds_async.compat._names.NotProvided` with the reason, any other name a plain
``ModuleNotFoundError``. Nothing of the real webdataset is imported, whether or not it is installed.

Calling it again is a no-op. Calling it after the real webdataset was imported raises :class:`RuntimeError`: the
objects already made from webdataset's classes (a ``PipelineStage`` subclass, a ``DataPipeline``) would mix with
wds-async's in one program, and nothing could swap them safely; the error says to call it before that import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from ._names import NotProvided

__all__ = ["MODULES", "install_as_webdataset", "installed"]

#: ``webdataset.X`` -> the shim module that stands for it.
MODULES: dict[str, str] = {
    "webdataset": "wds_async.compat.top",
    **{f"webdataset.{name}": f"wds_async.compat.{name}" for name in (
        "autodecode", "cache", "compat", "extradatasets", "filters", "gopen", "handlers", "mix", "pipeline",
        "pytorch", "shardlists", "tariterators", "utils", "wids", "writer")},
}

#: Modules of webdataset (1.0.2, or the 0.2 series that open_clip pins) that the shim leaves out, and why.
NOT_PROVIDED: dict[str, str] = {
    "webdataset.multi": "webdataset's ZMQ MultiLoader is not provided; use a torch DataLoader with num_workers",
    "webdataset.tenbin": "webdataset's tenbin module (its own array container) is not provided; wds-async decodes "
                         "and encodes .ten fields (decode() and TarWriter) without it",
    "webdataset.typecheck": "a webdataset-internal module",
    "webdataset.downloader": "a webdataset-internal module",
    "webdataset.mock": "removed from webdataset; MockDataset is webdataset.MockDataset",
    "webdataset.dataset": "the pre-0.2 module layout; its names are at the top: webdataset.WebDataset",
    "webdataset.iterators": "the pre-0.2 module layout; use webdataset.filters",
    "webdataset.fluid": "the pre-0.2 module layout; use webdataset.compat",
    "webdataset.tariterators_old": "a webdataset-internal module",
}


class _ShimLoader(importlib.abc.Loader):
    """Loads ``webdataset.X`` as the shim module already imported for it."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        return None  # the shim module ran when it was imported


class WebdatasetFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: answers for ``webdataset`` and every ``webdataset.X``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "webdataset" and not fullname.startswith("webdataset."):
            return None
        shim = MODULES.get(fullname)
        if shim is not None:
            return importlib.machinery.ModuleSpec(fullname, _ShimLoader(shim))
        reason = NOT_PROVIDED.get(fullname)
        if reason is not None:
            raise NotProvided(f"{fullname} is not provided by wds-async: {reason}", name=fullname)
        raise ModuleNotFoundError(f"No module named {fullname!r} (webdataset is wds-async's shim here, which has "
                                  f"{', '.join(sorted(MODULES))})", name=fullname)


def installed() -> bool:
    """Whether :func:`install_as_webdataset` has run in this process."""
    return any(isinstance(finder, WebdatasetFinder) for finder in sys.meta_path)


def _real_webdataset() -> list[str]:
    """The names of real webdataset modules already imported."""
    return sorted(name for name, module in list(sys.modules.items())
                  if (name == "webdataset" or name.startswith("webdataset.")) and module is not None
                  and not getattr(module, "__name__", "").startswith("wds_async."))


def install_as_webdataset() -> None:
    """Make ``import webdataset`` and ``from webdataset.<module> import <name>`` resolve to wds-async, for code
    written against webdataset (open_clip, timm) that you do not change. Call it once, before that code imports
    webdataset::

        import wds_async
        wds_async.install_as_webdataset()
        from open_clip_train.data import get_wds_dataset   # its `import webdataset as wds` is wds-async now

    A name wds-async does not provide raises :class:`ImportError` naming it and saying why, at the import that asks
    for it. Calling this again does nothing. Calling it after the real webdataset was imported raises
    :class:`RuntimeError` (objects of both libraries would mix); DataLoader workers started with ``fork`` inherit
    the installation, and with ``spawn`` or ``forkserver`` the call must sit at the top of the main module (or of a
    module the workers import) so that it runs in each worker too."""
    if installed():
        return
    real = _real_webdataset()
    if real:
        raise RuntimeError(
            f"install_as_webdataset() was called after the real webdataset was imported ({', '.join(real)}): objects "
            "made from it would mix with wds-async's. Call wds_async.install_as_webdataset() before anything imports "
            "webdataset (at the top of your main module)")
    modules = {name: importlib.import_module(target) for name, target in MODULES.items()}
    sys.meta_path.insert(0, WebdatasetFinder())
    for name, module in modules.items():
        sys.modules[name] = module
        # As the import system does for a package's submodule: `import webdataset.wids` then `webdataset.wids.X`,
        # and `from webdataset import wids`, need the attribute on the parent (the shim's top module imports the
        # others itself; wids it does not, to stay light). A name the top already binds stays: `webdataset.gopen`
        # is the function, in webdataset as here.
        parent, _, child = name.rpartition(".")
        if parent and child not in vars(modules[parent]):
            setattr(modules[parent], child, module)
