"""The emulated object store of the tests, the demo and the benchmarks (not part of the wds-async wheel).

A lean aiohttp server that serves one folder on 127.0.0.1 through a plain face, an S3 face and a GCS
face, with knobs for latency, bandwidth, 503s and dropped connections::

    python -m emustore --root DIR --port 0 --ttfb 0.05 --bw 20e6 --port-file PORT

    from emustore import Knobs, StoreProcess
    with StoreProcess(root, Knobs(ttfb=0.05)) as store:
        store.url("shard-000000.tar", bw=20e6)

The map of the package, one job per module, each importing only the ones below it:

* ``__main__``: ``python -m emustore``, which runs :func:`emustore.server.main`.
* ``process``: `StoreProcess`, the store in a child process (``python -m emustore``) for a ``with`` block.
* ``server``: the server itself (`start_store`, `server_tls`, `check_host`, the CLI); routes a request
  to its face, applies its knobs and answers ``/_stats``. Its docstring documents every face and knob.
* ``s3`` and ``s3_wire``: the S3 face (and the plain face), and S3's XML.
* ``gcs``, ``gcs_json`` and ``gcs_upload``: the GCS face (the JSON API), its JSON, and its uploads.
* ``fastpath``: the plainest reads (a plain-face GET/HEAD of an object, no query, no condition) answered on the
  connection without aiohttp where the knobs inject no fault; any other request hands the connection to aiohttp.
* ``sender``: the hot path, a paced and faulted GET/HEAD of one mapped object.
* ``listing``: a bucket's keys in sorted pages.
* ``objects``: the file layer (objects are files under the root, mapped once, replaced whole).
* ``http``: what the faces share: routed calls, error answers, request bodies.
* ``knobs``: `Knobs` (how one server misbehaves) and one request's plan.
* ``emulators``: beside the store, the launchers of the real emulators the backend tests use on
  127.0.0.1 (moto server, gcp-storage-emulator, Azurite); independent of the modules above.

The names below are imported on first use, not here: ``python -m emustore`` imports this package before
its ``__main__``, and every test and benchmark starts that child, so it imports only what the server needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emustore.knobs import Knobs
    from emustore.process import StoreProcess
    from emustore.server import CA_FILE, check_host, server_tls, start_store

__all__ = ["CA_FILE", "Knobs", "StoreProcess", "check_host", "server_tls", "start_store"]

_HOMES = {
    "CA_FILE": "emustore.server",
    "Knobs": "emustore.knobs",
    "StoreProcess": "emustore.process",
    "check_host": "emustore.server",
    "server_tls": "emustore.server",
    "start_store": "emustore.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'emustore' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
