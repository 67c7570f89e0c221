"""An emulated object store: a lean aiohttp server that serves one folder read-only over loopback.

It stands in for S3/GCS/Azure in tests and benchmarks, with faults and slowness injected by knobs::

    python -m benchmarks.store --root DIR --port 0 --bw 20e6 --ttfb 0.05 --port-file PORT
    python -m benchmarks.store --root DIR --https --cert-dir CERTS   # TLS; clients trust CERTS/ca.pem

    with StoreProcess(root, knobs=Knobs(fail_rate=0.1)) as store:
        store.url("shard-000000.tar", ttfb=0.05, bw=20e6)   # per-request overrides in the query

Server knobs (`Knobs`, CLI flags, and query parameters of the same names): ``ttfb``, ``bw``,
``total_bw`` (server-wide only), ``fail_rate``, ``drop_rate``, ``ignore_range``, ``seed``, and
``max_concurrent``: an object request that arrives while that many requests are being served (from
arrival until the last byte is written) is answered at once with S3's ``503 SlowDown`` and
``Retry-After: 1``, counted as ``throttled``. In a query it is the limit that one request is judged by.
Per-request only: ``status`` (force a status), ``stall`` (pause after half the body; with
``stall_rate`` only that fraction of requests stalls), ``html``
(answer 200 with an HTML error page). An unknown query parameter is a 400, so a typo never passes
silently. GETs honour ``If-Match`` (412 on another ETag). ``GET /?list`` or ``/?prefix=P`` lists names as JSON; ``GET /_stats`` returns counters
(``requests``, ``throttled``, ``active``, ``peak_active``, ...) at any moment, uncounted and never throttled.

``--https`` serves TLS with a certificate for 127.0.0.1 and localhost, issued at start by a throwaway
CA (trustme); the CA's PEM is written to ``--cert-dir``/ca.pem. ``SSL_CERT_FILE=<that file>`` in the
environment a client starts with makes aiohttp (so wds-async) and curl trust it; boto3 reads
``AWS_CA_BUNDLE`` instead.

Files are memory-mapped once and served as memoryview slices; a file rewritten in place while
mapped is undefined (write a new file and rename it over the old one, as ``make_shards`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import email.utils
import ipaddress
import logging
import math
import mmap
import os
import random
import signal
import ssl
import stat
import tempfile
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["CA_FILE", "Knobs", "check_host", "main", "server_tls", "start_store"]

_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
_MIN_CHUNK = 64 << 10
_MAX_CHUNK = 256 << 10
_PER_REQUEST = frozenset({"status", "stall", "stall_rate", "html"})
_LISTING = frozenset({"list", "prefix"})
_TRUE = frozenset({"", "1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_TYPES = {".tar": "application/x-tar", ".gz": "application/gzip", ".json": "application/json"}
_INT_PARAMS = frozenset({"seed", "status", "max_concurrent"})
_SLOW_DOWN = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              "<Message>Please reduce your request rate.</Message></Error>")
CA_FILE = "ca.pem"


@dataclasses.dataclass(frozen=True)
class Knobs:
    """How the store misbehaves. Validated at construction; every default means "behave well"."""

    ttfb: float = 0.0  # seconds before the response headers are sent
    bw: float = 0.0  # bytes/s per response, 0 = unlimited
    total_bw: float = 0.0  # bytes/s shared by every response of the server, 0 = unlimited
    fail_rate: float = 0.0  # probability of "503 Slow Down" with Retry-After: 0
    drop_rate: float = 0.0  # probability that the body is cut short and the connection closed
    ignore_range: bool = False  # answer 200 with the whole object even when Range is sent
    seed: int | None = None  # RNG seed for the fault decisions; None = random per server
    max_concurrent: int = 0  # requests served at once before "503 SlowDown" answers, 0 = no limit

    def __post_init__(self) -> None:
        for name in ("ttfb", "bw", "total_bw", "fail_rate", "drop_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("fail_rate", "drop_rate"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} is a probability, got {getattr(self, name)!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        limit = self.max_concurrent
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"max_concurrent must be an int >= 0, got {limit!r}")

    def to_args(self) -> list[str]:
        """The CLI flags that reproduce these knobs (defaults are left out)."""
        args: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value == field.default:
                continue
            flag = "--" + field.name.replace("_", "-")
            args += [flag] if isinstance(value, bool) else [flag, repr(value)]
        return args


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


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """One request's knobs after the query overrides."""

    knobs: Knobs
    rng: random.Random
    status: int = 0
    stall: float = 0.0
    html: bool = False


@dataclasses.dataclass(slots=True)
class _Object:
    size: int
    mtime_ns: int
    view: memoryview
    etag: str
    last_modified: str


class _SharedClock:
    """A reservation clock for ``total_bw``: each chunk books the next free slot on one timeline."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._free_at = 0.0

    def reserve(self, now: float, nbytes: int) -> float:
        self._free_at = max(self._free_at, now) + nbytes / self.rate
        return self._free_at


class _Store:
    """The request handler and its counters; one per server."""

    def __init__(self, root: Path, knobs: Knobs) -> None:
        self.root = root
        self.root_prefix = os.path.join(root, "")
        self.knobs = knobs
        self.rng = random.Random(knobs.seed)
        self.clock = _SharedClock(knobs.total_bw) if knobs.total_bw else None
        self.objects: dict[str, _Object] = {}
        self.status = Counter[int]()
        self.requests = self.bytes_sent = self.dropped = self.failed = self.active = 0
        self.throttled = self.peak_active = 0

    def stats(self) -> dict[str, Any]:
        """Counters since start; requests for ``/_stats`` itself are not counted."""
        return {
            "requests": self.requests,
            "bytes_sent": self.bytes_sent,
            "status": {str(code): n for code, n in sorted(self.status.items())},
            "dropped": self.dropped,
            "failed": self.failed,
            "throttled": self.throttled,
            "active": self.active,
            "peak_active": self.peak_active,
        }

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
        if request.method not in ("GET", "HEAD"):
            return _text(405, "method not allowed\n", {"Allow": "GET, HEAD"})
        try:
            plan = self._plan(request.query)
        except ValueError as exc:
            return _text(400, f"bad query: {exc}\n")
        listing = request.path == "/" and not _LISTING.isdisjoint(request.query)
        if not listing:
            # No await since handle() counted this request, so ``active`` includes it and no other
            # request has seen it; a refused one leaves before anything else runs.
            if plan.knobs.max_concurrent and self.active > plan.knobs.max_concurrent:
                self.throttled += 1
                return web.Response(status=503, reason="Slow Down", text=_SLOW_DOWN,
                                    content_type="application/xml", headers={"Retry-After": "1"})
            self.peak_active = max(self.peak_active, self.active)
        if plan.knobs.ttfb:
            await asyncio.sleep(plan.knobs.ttfb)
        if plan.status:
            return _text(plan.status, f"forced status {plan.status}\n")
        if plan.html:
            page = "<html><head><title>Error</title></head><body><h1>Service error</h1></body></html>\n"
            return web.Response(text=page, content_type="text/html")
        if plan.knobs.fail_rate and plan.rng.random() < plan.knobs.fail_rate:
            self.failed += 1
            body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            return web.Response(status=503, reason="Slow Down", text=body,
                                content_type="application/xml", headers={"Retry-After": "0"})
        if listing:
            return web.json_response(self._list(request.query.get("prefix", "")))
        obj = self._lookup(request.path)
        if obj is None:
            return _text(404, "no such key\n")
        return await self._serve(request, obj, plan)

    def _plan(self, query: Any) -> _Plan:
        if not query:
            return _Plan(self.knobs, self.rng)
        overrides: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in query.items():
            if key in _LISTING:
                continue
            if key == "total_bw":
                raise ValueError("total_bw is shared by the whole server; set it at startup")
            if key in ("ignore_range", "html"):
                parsed: Any = _parse_bool(key, value)
            elif key in _INT_PARAMS:
                parsed = int(value)
            elif key in _PER_REQUEST or key in _KNOB_NAMES:
                parsed = float(value)
            else:
                raise ValueError(f"unknown parameter {key!r}")
            (extra if key in _PER_REQUEST else overrides)[key] = parsed
        knobs = dataclasses.replace(self.knobs, **overrides)  # validates
        status = extra.get("status", 0)
        if status and not 200 <= status <= 599:
            raise ValueError(f"status must be 200..599, got {status}")
        stall = extra.get("stall", 0.0)
        if not math.isfinite(stall) or stall < 0:
            raise ValueError(f"stall must be a finite number >= 0, got {stall}")
        rng = random.Random(knobs.seed) if "seed" in overrides else self.rng
        stall_rate = extra.get("stall_rate", 1.0)
        if not 0 <= stall_rate <= 1:
            raise ValueError(f"stall_rate must be in [0, 1], got {stall_rate}")
        if stall and stall_rate < 1 and rng.random() >= stall_rate:
            stall = 0.0  # this request does not stall
        return _Plan(knobs, rng, status, stall, extra.get("html", False))

    def _lookup(self, path: str) -> _Object | None:
        """Map a URL path to a mapped file under the root, or None (missing, unsafe, not a file)."""
        parts = path[1:].split("/")
        if any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
            return None
        real = os.path.realpath(os.path.join(self.root, *parts))
        if not real.startswith(self.root_prefix):
            return None  # a symlink that leaves the root
        try:
            st = os.stat(real)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        obj = self.objects.get(real)
        if obj is None or obj.size != st.st_size or obj.mtime_ns != st.st_mtime_ns:
            obj = self.objects[real] = _map(real, st)
        return obj

    def _list(self, prefix: str) -> list[str]:
        names = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                if rel.startswith(prefix) and self._lookup("/" + rel) is not None:
                    names.append(rel)
        return sorted(names)

    async def _serve(self, request: web.BaseRequest, obj: _Object, plan: _Plan) -> web.StreamResponse:
        size = obj.size
        headers = {"ETag": obj.etag, "Last-Modified": obj.last_modified,
                   "Content-Type": _TYPES.get(os.path.splitext(request.path)[1], "application/octet-stream")}
        start, end, status = 0, size, 200
        wanted = request.headers.get("If-Match")
        if wanted is not None and wanted.strip() != "*" and obj.etag not in (t.strip() for t in wanted.split(",")):
            return _text(412, "precondition failed: the object's ETag does not match If-Match\n")
        if not plan.knobs.ignore_range:
            headers["Accept-Ranges"] = "bytes"
            span = _parse_range(request.headers.get("Range"), size)
            if span == "unsatisfiable":
                return _text(416, "range not satisfiable\n", {"Content-Range": f"bytes */{size}"})
            if span is not None:
                start, end, status = span[0], span[1], 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        cut = None
        if request.method == "GET" and end > start and plan.knobs.drop_rate:
            if plan.rng.random() < plan.knobs.drop_rate:
                cut = start + plan.rng.randrange(end - start)
        stall_at = start + (end - start) // 2 if plan.stall else -1
        try:
            # A client that gave up during the time to first byte (a benchmark ending its window) is
            # gone by the time the headers are written: prepare() raises like a write.
            await resp.prepare(request)
            if request.method == "HEAD" or end == start:
                return resp
            await self._send(resp, obj.view, start, cut if cut is not None else end, plan, stall_at)
        except ConnectionError:
            return resp  # the client went away; aiohttp finishes quietly
        if cut is not None and request.transport is not None:
            self.dropped += 1
            request.transport.close()  # flushes what was written, then FIN: a short body
        return resp

    async def _send(self, resp: web.StreamResponse, view: memoryview, pos: int, stop: int,
                    plan: _Plan, stall_at: int) -> None:
        """Write view[pos:stop] paced by a per-response clock started at the first byte."""
        loop = asyncio.get_running_loop()
        bw = plan.knobs.bw
        chunk = int(min(max(bw / 20, _MIN_CHUNK), _MAX_CHUNK)) if bw else _MAX_CHUNK
        t0 = loop.time()
        sent = 0
        while pos < stop:
            if pos == stall_at:
                await asyncio.sleep(plan.stall)
                t0 += plan.stall  # no catch-up burst after the stall
            n = min(chunk, stop - pos)
            if pos < stall_at < pos + n:
                n = stall_at - pos
            slept = False
            if bw:
                delay = t0 + (sent + n) / bw - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    slept = True
            if self.clock is not None:
                delay = self.clock.reserve(loop.time(), n) - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    slept = True
            await resp.write(view[pos:pos + n])
            pos += n
            sent += n
            self.bytes_sent += n
            if not slept:
                await asyncio.sleep(0)  # write() only yields when the transport is paused


_KNOB_NAMES = frozenset(f.name for f in dataclasses.fields(Knobs))


def _text(status: int, body: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=body, headers=headers)


def _parse_bool(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{key} must be a boolean, got {value!r}")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """One ``bytes=`` range as a half-open (start, end); None to serve it all; "unsatisfiable".

    Malformed and multi-range headers are ignored (RFC 9110 allows answering them with 200).
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[6:].strip().partition("-")
    if not sep or not (first.isdigit() or last.isdigit()):
        return None
    if not first:  # suffix: the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(size - n, 0), size
    if last and not last.isdigit():
        return None
    start = int(first)
    if last and int(last) < start:
        return None  # invalid, so ignored
    if start >= size:
        return "unsatisfiable"
    return start, min(int(last) + 1, size) if last else size


def _map(path: str, st: os.stat_result) -> _Object:
    if st.st_size == 0:
        view = memoryview(b"")
    else:
        with open(path, "rb") as f:
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
    return _Object(st.st_size, st.st_mtime_ns, view, etag, email.utils.formatdate(st.st_mtime, usegmt=True))


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
                      knobs: Knobs = Knobs(), *, verbose: bool = False,
                      ssl_context: ssl.SSLContext | None = None) -> tuple[web.BaseRunner, int]:
    """Start serving ``root`` on the running loop; return the runner (``await runner.cleanup()``) and port.

    With ``ssl_context`` (see :func:`server_tls`) it serves https.
    """
    host = check_host(host)
    real_root = Path(os.path.realpath(root))
    if not real_root.is_dir():
        raise NotADirectoryError(f"store root is not a directory: {root}")
    store = _Store(real_root, knobs)
    access_log = logging.getLogger("aiohttp.access") if verbose else None
    server = web.Server(store.handle, handler_cancellation=True, access_log=access_log)
    # A short shutdown grace: in-flight (stalled, paced) responses are cut, not waited for.
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
            with open(tmp, "w") as f:
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
            except asyncio.TimeoutError:
                if parent is not None and os.getppid() != parent:
                    break  # orphaned: the test or benchmark that started us is gone
    finally:
        await runner.cleanup()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.store", description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="folder to serve read-only")
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
