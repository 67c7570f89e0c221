"""An emulated object store: a lean aiohttp server that serves one folder over loopback, three ways.

It stands in for S3/GCS/Azure in tests and benchmarks, with faults and slowness injected by knobs::

    python -m emustore --root DIR --port 0 --bw 20e6 --ttfb 0.05 --port-file PORT
    python -m emustore --root DIR --https --cert-dir CERTS   # TLS; clients trust CERTS/ca.pem

    with StoreProcess(root, knobs=Knobs(fail_rate=0.1)) as store:
        store.url("shard-000000.tar", ttfb=0.05, bw=20e6)   # per-request overrides in the query
        boto3.client("s3", endpoint_url=store.s3_endpoint, ...)            # the S3 face
        storage.Client(client_options={"api_endpoint": store.gcs_endpoint})  # the GCS face

**Plain face**: ``GET/HEAD /path`` serves ROOT/path (Range, ``If-Match``, ``If-None-Match``, ETag);
``GET /?list`` or ``/?prefix=P`` lists every file as JSON. An unknown query parameter is a 400, so a typo
never passes silently.

**S3 face** (path style, ``http(s)://127.0.0.1:PORT/BUCKET/KEY``): bucket B, key K is the file ROOT/B/K
(a key's ``/`` are subfolders). A request is S3's when it is signed (``Authorization``, ``X-Amz-*`` query
parameters, ``x-amz-*`` headers), carries one of S3's query parameters (``list-type``, ``uploads``,
``x-id``, ...), or writes (PUT, POST, DELETE). Signatures are never checked and S3's other parameters
are ignored, knobs are still read. Served: GetObject/HeadObject, ListObjectsV2 and ListObjects (sorted,
paginated, ``delimiter``, ``encoding-type=url``), ListBuckets, HeadBucket, GetBucketLocation
(us-east-1), CreateBucket, DeleteBucket, PutObject (plain or ``aws-chunked`` bodies, signed or with
trailing checksums), DeleteObject(s), and multipart uploads (create, parts, complete, abort, list).
Errors are S3's XML (``NoSuchKey``, ``NoSuchBucket``, ...; no body on HEAD), on the plain face too.

**GCS face** (the JSON API, ``/storage/v1/...``, as google-cloud-storage and gsutil call it): bucket
list/get/insert/delete, object metadata (``generation`` is the file's mtime in ns, ``md5Hash`` and
``crc32c`` are computed once per file version, off the loop), listing (``prefix``, ``delimiter``,
``maxResults``, ``pageToken``, ``startOffset``, ``endOffset``), media downloads (``?alt=media`` on the
object, or ``/download/storage/v1/...``) with ``x-goog-hash`` and ``x-goog-generation``, the
``generation``/``ifGenerationMatch`` family of conditions, delete, and uploads of ``uploadType=media``,
``multipart`` and ``resumable`` (308 ``Range: bytes=0-N`` between chunks). Errors are GCS's JSON.
A top folder named ``storage``, ``download`` or ``upload`` is therefore not reachable as ``/storage/v1/...``.

Server knobs (`Knobs`, CLI flags, and query parameters of the same names): ``ttfb``, ``bw``,
``total_bw`` (server-wide only), ``fail_rate``, ``drop_rate``, ``ignore_range``, ``seed``, and
``max_concurrent``: an object read (GET/HEAD of an object, or a GCS media download) that arrives while
that many requests are being served (from arrival until the last byte is written) is answered at once
with ``503 SlowDown`` (S3's XML, or GCS's JSON on that face) and ``Retry-After: 1``, counted as
``throttled``. In a query it is the limit that one request is judged by. Per-request only: ``status``
(force a status), ``stall`` (pause after half the body; with ``stall_rate`` only that fraction of
requests stalls), ``html`` (answer 200 with an HTML error page). Listings and metadata get ``ttfb`` and
the faults but are never refused by ``max_concurrent`` nor paced by ``bw``. Writes get no knob at all:
only the reading path is what a benchmark measures. ``GET /_stats`` returns counters (``requests``,
``bytes_sent``, ``bytes_received`` (object bytes written), ``throttled``, ``active``, ``peak_active``,
``cpu_s`` (this process's user+system CPU seconds), ...) at any moment, uncounted and never throttled.

``--https`` serves TLS with a certificate for 127.0.0.1 and localhost, issued at start by a throwaway
CA (trustme); the CA's PEM is written to ``--cert-dir``/ca.pem. ``SSL_CERT_FILE=<that file>`` in the
environment a client starts with makes aiohttp (so wds-async) and curl trust it; boto3 reads
``AWS_CA_BUNDLE`` instead, requests (so google-cloud-storage) ``REQUESTS_CA_BUNDLE``.

Files are memory-mapped once and served as memoryview slices; a file rewritten in place while
mapped is undefined (write a new file and rename it over the old one, as ``make_shards`` does). The
store's own writes do so: the body goes to a hidden ``.wds-tmp-*`` file beside the target, renamed over
it when complete; multipart parts and resumable sessions wait in ROOT/.wds-uploads. Names starting with
``.wds-`` are never listed nor served.

One job per module, imported downward only (this entry point imports the faces, the faces the layers
under them): ``server`` routes a request to its face, applies its knobs and answers ``/_stats``;
``knobs`` holds `Knobs` and one request's plan; ``http`` routed calls, error answers and request
bodies; ``objects`` the file layer; ``listing`` sorted pages of keys; ``sender`` the paced GET/HEAD of
an object; ``fastpath`` that GET/HEAD answered without aiohttp where nothing else is asked of it (a server
whose knobs inject no fault, over plain http: the rest of every such connection goes to aiohttp once it asks
anything else); ``s3`` and ``s3_wire`` the S3 and plain faces; ``gcs``, ``gcs_json`` and ``gcs_upload`` the
GCS face. The package's docstring (:mod:`emustore`) is the map of the whole package.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import random
import resource
import signal
import ssl
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

from emustore.fastpath import FastGets, FastRunner, fast_enabled
from emustore.gcs import GCS_ROOTS, Gcs
from emustore.gcs_json import gcs_error
from emustore.http import CONTINUED, OBJECT, WRITE, StoreError, expects_continue
from emustore.knobs import Knobs, Plan, plan_for
from emustore.objects import Files
from emustore.s3 import S3, S3_QUERY, S3_UNSUPPORTED
from emustore.s3_wire import SLOW_DOWN_XML, s3_error
from emustore.sender import Sender

__all__ = ["CA_FILE", "Knobs", "check_host", "main", "server_tls", "start_store"]

CA_FILE = "ca.pem"
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def check_host(host: str) -> str:
    """Return the address to bind; refuse anything that is not IPv4 loopback."""
    if host == "localhost":
        return "127.0.0.1"  # not "localhost": that would bind ::1 as well
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    if addr is None or addr.version != 4 or addr not in _LOOPBACK:
        raise ValueError(f"refusing to bind {host!r}: the store serves only 127.0.0.0/8")
    return host


class _Store:
    """The request handler and its request counters; one per server (bytes are counted where they
    move: ``bytes_sent`` and ``dropped`` by the `Sender`, ``bytes_received`` by the `Files`)."""

    def __init__(self, root: Path, knobs: Knobs) -> None:
        self.knobs = knobs
        self.rng = random.Random(knobs.seed)
        self.files = Files(root)
        self.sender = Sender(knobs.total_bw)
        self.s3 = S3(self.files, self.sender, self.request_id)
        self.gcs = Gcs(self.files, self.sender)
        self.status = Counter[int]()
        self.requests = self.failed = self.active = self.throttled = self.peak_active = 0

    def stats(self) -> dict[str, Any]:
        """Counters since start; requests for ``/_stats`` itself are not counted."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "requests": self.requests,
            "bytes_sent": self.sender.bytes_sent,
            "bytes_received": self.files.bytes_received,
            "status": {str(code): n for code, n in sorted(self.status.items())},
            "dropped": self.sender.dropped,
            "failed": self.failed,
            "throttled": self.throttled,
            "active": self.active,
            "peak_active": self.peak_active,
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 6),
        }

    def request_id(self) -> str:
        """S3's ``x-amz-request-id`` for the latest request."""
        return f"{self.requests:016X}"

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/_stats":
            return web.json_response(self.stats())
        self.requests += 1
        self.active += 1
        try:
            resp = await self._respond(request)
        finally:
            self.active -= 1
        self.status[resp.status] += 1
        return resp

    async def _respond(self, request: web.BaseRequest) -> web.StreamResponse:
        face = _face(request)
        try:
            resp = await self._answer(request, face)
        except StoreError as err:
            resp = self._render(face, err)
        except OSError as exc:  # the filesystem under a write or a listing (a race, a full disk)
            resp = self._render(face, StoreError(500, "InternalError", f"the store failed: {exc}"))
        if not resp.prepared:
            if face == "s3":
                resp.headers.setdefault("x-amz-request-id", self.request_id())
            if expects_continue(request) and CONTINUED not in request:
                # The client holds the body back until "100 Continue", which this answer never sent: a
                # connection kept alive would read the next request's first bytes as this body.
                resp.force_close()
        return resp

    async def _answer(self, request: web.BaseRequest, face: str) -> web.StreamResponse:
        """Route the request, apply the knobs that its kind takes, run it."""
        try:
            plan = plan_for(request.query, self.knobs, self.rng, lenient=face != "plain")
        except ValueError as exc:
            raise StoreError(400, "InvalidArgument", f"bad query: {exc}") from None
        call = self.gcs.route(request) if face == "gcs" else self.s3.route(request, face)
        if call.kind == OBJECT:
            # No await since handle() counted this request, so ``active`` includes it and no other
            # request has seen it; a refused one leaves before anything else runs.
            if plan.knobs.max_concurrent and self.active > plan.knobs.max_concurrent:
                self.throttled += 1
                return _slow_down(face, "1")
            self.peak_active = max(self.peak_active, self.active)
        if call.kind != WRITE:
            early = await self._faults(plan, face)
            if early is not None:
                return early
        return await call.run(request, plan)

    async def _faults(self, plan: Plan, face: str) -> web.StreamResponse | None:
        """The answer the knobs give instead of the real one (after ``ttfb``), or None."""
        if plan.knobs.ttfb:
            await asyncio.sleep(plan.knobs.ttfb)
        if plan.status:
            if face == "gcs":
                return gcs_error(StoreError(plan.status, "Forced", f"forced status {plan.status}"))
            return _text(plan.status, f"forced status {plan.status}\n")
        if plan.html:
            page = "<html><head><title>Error</title></head><body><h1>Service error</h1></body></html>\n"
            return web.Response(text=page, content_type="text/html")
        if plan.knobs.fail_rate and plan.rng.random() < plan.knobs.fail_rate:
            self.failed += 1
            return _slow_down(face, "0")
        return None

    def _render(self, face: str, err: StoreError) -> web.Response:
        if face == "gcs":
            return gcs_error(err)
        return s3_error(err, self.request_id())


def _face(request: web.BaseRequest) -> str:
    """"gcs" (a JSON API path), "s3" (signed, S3's parameters, or a write) or "plain"."""
    if request.path.startswith(GCS_ROOTS):
        return "gcs"
    if request.method not in ("GET", "HEAD"):
        return "s3"
    for name in request.headers:
        lowered = name.lower()
        if lowered == "authorization" or lowered.startswith("x-amz-"):
            return "s3"
    for key in request.query:
        if key in S3_QUERY or key in S3_UNSUPPORTED or key.lower().startswith(("x-amz-", "response-")):
            return "s3"
    return "plain"


def _text(status: int, body: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=body, headers=headers)


def _slow_down(face: str, retry_after: str) -> web.Response:
    """503 SlowDown: S3's XML, or GCS's JSON on that face."""
    if face == "gcs":
        resp = gcs_error(StoreError(503, "SlowDown", "Please reduce your request rate."))
        resp.headers["Retry-After"] = retry_after
        return resp
    return web.Response(status=503, reason="Slow Down", text=SLOW_DOWN_XML, content_type="application/xml",
                        headers={"Retry-After": retry_after})


def server_tls(cert_dir: str | os.PathLike[str], host: str = "127.0.0.1") -> ssl.SSLContext:
    """A server TLS context for ``host``, 127.0.0.1 and localhost, signed by a new throwaway CA whose
    certificate is written to ``cert_dir``/ca.pem (the file clients are told to trust)."""
    try:
        import trustme
    except ImportError:
        raise ValueError("--https needs the trustme package: pip install trustme (it is in the dev extra)") from None
    ca = trustme.CA(organization_name="wds-async emulated store")
    names = dict.fromkeys([check_host(host), "127.0.0.1", "localhost"])
    leaf = ca.issue_cert(*names)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    leaf.configure_cert(context)
    path = os.path.join(cert_dir, CA_FILE)
    ca.cert_pem.write_to_path(path + ".tmp")
    os.replace(path + ".tmp", path)
    return context


async def start_store(root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0,
                      knobs: Knobs = Knobs(),  # noqa: B008 - frozen, so one shared default is safe
                      *, verbose: bool = False, ssl_context: ssl.SSLContext | None = None,
                      fast: bool = True) -> tuple[web.BaseRunner, int]:
    """Start serving ``root`` on the running loop; return the runner (``await runner.cleanup()``) and port.

    With ``ssl_context`` (see :func:`server_tls`) it serves https. ``fast=False`` serves every request through
    aiohttp (:mod:`emustore.fastpath` answers the plainest reads by itself where the knobs allow).
    """
    host = check_host(host)
    # Once, at startup, before anything is served: nothing on the loop waits for these two stats.
    real_root = Path(os.path.realpath(root))  # noqa: ASYNC240
    if not real_root.is_dir():  # noqa: ASYNC240
        raise NotADirectoryError(f"store root is not a directory: {root}")
    store = _Store(real_root, knobs)
    access_log = logging.getLogger("aiohttp.access") if verbose else None
    server = web.Server(store.handle, handler_cancellation=True, access_log=access_log)
    # A short shutdown grace: in-flight (stalled, paced) responses are cut, not waited for.
    runner: web.ServerRunner
    if fast and fast_enabled(knobs, ssl_context is not None) and not verbose:  # verbose: aiohttp's access log of every request
        runner = FastRunner(server, FastGets(store, server, GCS_ROOTS), shutdown_timeout=0.5)
    else:
        runner = web.ServerRunner(server, shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]


async def _run_server(args: argparse.Namespace, knobs: Knobs, context: ssl.SSLContext | None) -> None:
    runner, port = await start_store(args.root, args.host, args.port, knobs, verbose=args.verbose,
                                     ssl_context=context)
    try:
        if args.port_file:
            tmp = args.port_file + ".tmp"
            with open(tmp, "w") as f:  # noqa: ASYNC230 - a few bytes, once, before serving
                f.write(f"{port}\n")
            os.replace(tmp, args.port_file)  # the poller never sees a half-written file
        if args.print_port:
            print(port, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        parent = os.getppid() if args.exit_with_parent else None
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                if parent is not None and os.getppid() != parent:
                    break  # orphaned: the test or benchmark that started us is gone
    finally:
        await runner.cleanup()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m emustore", description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="folder to serve (its subfolders are the buckets)")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (127.0.0.0/8 only)")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--print-port", action="store_true", help="print the bound port on stdout")
    p.add_argument("--verbose", action="store_true", help="log access lines on stderr")
    p.add_argument("--exit-with-parent", action="store_true", help="shut down when orphaned")
    p.add_argument("--ttfb", type=float, default=0.0, help="seconds before response headers")
    p.add_argument("--bw", type=float, default=0.0, help="bytes/s per response (0 = unlimited)")
    p.add_argument("--total-bw", "--total_bw", type=float, default=0.0, help="bytes/s for the server")
    p.add_argument("--fail-rate", "--fail_rate", type=float, default=0.0, help="P(503 Slow Down)")
    p.add_argument("--drop-rate", "--drop_rate", type=float, default=0.0, help="P(body cut short)")
    p.add_argument("--ignore-range", "--ignore_range", action="store_true", help="answer 200 to Range")
    p.add_argument("--seed", type=int, default=None, help="RNG seed for fault decisions")
    p.add_argument("--max-concurrent", "--max_concurrent", type=int, default=0,
                   help="answer 503 SlowDown to requests beyond this many in service (0 = no limit)")
    p.add_argument("--https", action="store_true", help="serve TLS with a certificate from a throwaway CA")
    p.add_argument("--cert-dir", help="with --https: write the CA certificate here as ca.pem (default: a "
                   "temporary folder, named on stderr and removed on exit)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    try:
        knobs = Knobs(args.ttfb, args.bw, args.total_bw, args.fail_rate, args.drop_rate,
                      args.ignore_range, args.seed, args.max_concurrent)
        with tempfile.TemporaryDirectory(prefix="wds-store-ca-") as scratch:
            context = None
            if args.https:
                cert_dir = args.cert_dir or scratch
                context = server_tls(cert_dir, args.host)
                if not args.cert_dir:
                    ca_file = os.path.join(cert_dir, CA_FILE)
                    print(f"store: CA certificate {ca_file} (clients: SSL_CERT_FILE={ca_file})", file=sys.stderr)
            elif args.cert_dir:
                raise ValueError("--cert-dir needs --https")
            try:
                import uvloop
            except ImportError:
                asyncio.run(_run_server(args, knobs, context))
            else:
                uvloop.run(_run_server(args, knobs, context))
    except (ValueError, OSError) as exc:
        print(f"store: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
