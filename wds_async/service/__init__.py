"""The node-level loader service: one engine per node feeding every rank and DataLoader worker.

* :mod:`~wds_async.service.server`: ``serve()`` / ``wds-async serve``: the Unix socket server, the shared
  limiter, autotuner and backends;
* :mod:`~wds_async.service.session`: one client connection: its engine, byte budget and ring;
* :mod:`~wds_async.service.client`: ``service_batches()``, what ``WebDataset(service=...)`` reads through;
* :mod:`~wds_async.service.protocol`: the frames (sans-IO); :mod:`~wds_async.service.ring`: the shared
  memory the sample bytes travel in; :mod:`~wds_async.service.paths`: socket paths and permissions;
* :mod:`~wds_async.service.launch`: ``start_service()`` for launchers;
* :mod:`~wds_async.service.limits`: what one client can make the service hold (connections, time, request
  bytes); :mod:`~wds_async.service.validate`: what is checked in a client's requests before any engine sees
  them, and where ``pipe:`` commands run (``docs/service-security.md``).
"""

from __future__ import annotations

from .client import service_answers, service_batches, service_status
from .launch import ServiceHandle, start_service
from .paths import default_socket_path
from .server import serve

__all__ = ["ServiceHandle", "default_socket_path", "serve", "service_answers", "service_batches", "service_status",
           "start_service"]
