"""``wds-async serve``: one loader service for every rank and DataLoader worker of this node.

Runs until SIGTERM or Ctrl-C, then removes its socket. Clients are datasets built with
``WebDataset(urls, service="unix://PATH")`` (or ``WDS_ASYNC_SERVICE=unix://PATH``; ``service="auto"`` uses
the default path when a service answers there, else reads in-process). See :mod:`wds_async.service`.

Exit status 0 after a clean stop; 2 when it cannot start (a service already answers on the socket, a
directory of another user, a bad option).

The service reads files and runs ``pipe:`` commands with its own user's rights for any client that can
connect (only that same user can): see ``docs/service-security.md``. ``--no-pipe`` (or
``WDS_ASYNC_NO_PIPE=1`` in its environment) makes it refuse every ``pipe:`` URL, whatever a client asks.
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "command"]


def _connections(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: 'auto' or a positive number")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds > 0")
    return value


def _size(text: str) -> int:
    from ..node import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", help="the Unix socket to listen on (default: $XDG_RUNTIME_DIR/wds-async/"
                        "service-$WDS_ASYNC_JOB.sock, else /tmp/wds-async-$UID/...; the job id is also read from "
                        "TORCHELASTIC_RUN_ID)")
    parser.add_argument("--max-connections", default="auto", type=_connections,
                        help="requests in flight on the node: 'auto' (tuned at run time up to --node-connections) "
                             "or a fixed number")
    parser.add_argument("--node-connections", type=int, default=None,
                        help="the autotuner's ceiling (default $WDS_ASYNC_NODE_CONNECTIONS, else 256)")
    parser.add_argument("--node-buffered-bytes", default=None, type=_size,
                        help="bytes buffered for all clients together, shared out per loader process "
                             "(default $WDS_ASYNC_NODE_BUFFERED_BYTES, else 2GiB)")
    parser.add_argument("--ring-bytes", default=16 << 20, type=_size, help="each client's shared-memory ring (default 16MiB)")
    parser.add_argument("--cache-dir", default=None, help="keep a copy of every remote shard here (shard cache)")
    parser.add_argument("--cache-size", default=None, help="the most bytes the cache takes (e.g. 200GB)")
    parser.add_argument("--no-pipe", action="store_true",
                        help="refuse every pipe: URL whatever a client's allow_pipe says (also: WDS_ASYNC_NO_PIPE=1)")
    parser.add_argument("--max-clients", type=_positive_int, default=None,
                        help="connections one user may hold open at once (default 1024, fewer when the "
                             "descriptor limit is low); one more is refused with an error saying so")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve the service's counters in Prometheus' format at http://127.0.0.1:PORT/metrics "
                             "(needs wds-async[metrics]; docs/metrics.md)")
    parser.add_argument("--handshake-timeout", type=_seconds, default=None,
                        help="seconds a new connection has to send its first request (default 10)")


def command(args: argparse.Namespace) -> int:
    """Run the service in the foreground until it is stopped."""
    import os

    from ..node import parse_bytes
    from ..service.server import serve

    env = os.environ.get
    node_bytes = args.node_buffered_bytes or (parse_bytes(env("WDS_ASYNC_NODE_BUFFERED_BYTES", ""),
                                                          "WDS_ASYNC_NODE_BUFFERED_BYTES")
                                              if env("WDS_ASYNC_NODE_BUFFERED_BYTES") else None)
    node_connections = args.node_connections or (int(env("WDS_ASYNC_NODE_CONNECTIONS", ""))
                                                 if env("WDS_ASYNC_NODE_CONNECTIONS") else None)
    extra = {} if args.handshake_timeout is None else {"handshake_timeout": args.handshake_timeout}
    serve(args.socket, max_connections=args.max_connections, node_connections=node_connections,
          node_buffered_bytes=node_bytes, ring_bytes=args.ring_bytes, cache_dir=args.cache_dir,
          cache_size=args.cache_size, allow_pipe=False if args.no_pipe else None, max_clients=args.max_clients,
          metrics_port=args.metrics_port, **extra)
    return 0
