"""The process's S3 SDK objects for :mod:`~wds_async.backends.s3` and the S3 writers: boto3 sessions and clients,
and the credential chain's answers, each built once per process and settings, off the caller's thread.

Building a client loads S3's service model and endpoint rules (about 0.1 to 0.3 s of CPU), so :func:`client_future`
builds it in a daemon thread and hands a future; :func:`credentials_future` resolves the credential chain alone
(no model loaded) for the signatures the backend makes without a client. One boto3 Session per profile and AWS
environment is shared by the process: a second client from a warm session costs about 20 ms. A fork waits for a
build in progress (``os.register_at_fork``): a DataLoader worker inherits a warm session, never a half-built one,
and builds its own clients (they are per process).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any

import boto3
import botocore.session
from botocore import UNSIGNED
from botocore.config import Config

__all__ = ["client_future", "credentials_future", "env_endpoint", "make_client"]


def make_client(*, endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                anonymous: bool = False, retries: int = 2, max_pool_connections: int = 4,
                verify: str | None = None) -> tuple[Any, str]:
    """A boto3 S3 client configured as the backend's (profile, region, endpoint with path-style addressing,
    unsigned when anonymous) and the name of its credential source, for messages (never a key). The
    writers (:mod:`wds_async.write.sinks`) use it too; ``retries`` caps botocore's own retries of a failed call
    (0: none), ``verify`` is a CA bundle for an https endpoint. Blocking (the SDK loads its models, the credential
    chain may ask a metadata service): call it from a thread. Made from the process's shared session for the
    profile and the current AWS environment."""
    config = Config(
        signature_version=UNSIGNED if anonymous else "s3v4",
        s3={"addressing_style": "path"} if (endpoint_url or env_endpoint()) else {},
        retries={"max_attempts": retries, "mode": "standard"},  # botocore's max_attempts counts retries
        max_pool_connections=max_pool_connections,
    )
    env = _aws_env()
    with _SDK_LOCK:  # a boto3 Session is not thread-safe: its clients are made one at a time
        session = _SESSIONS.get((profile, env))
        if session is None:
            session = boto3.Session(profile_name=profile) if profile else boto3.Session()
        client = session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config, verify=verify)
        creds = None if anonymous else session.get_credentials()
        if _aws_env() == env:  # not if the environment changed meanwhile: the session may have read either
            _SESSIONS[(profile, env)] = session
    if anonymous:
        return client, "anonymous (unsigned requests)"
    return client, creds.method if creds is not None else "none found"


def env_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _aws_env() -> tuple[tuple[str, str], ...]:
    """The AWS_* environment: what a session's credentials, region and endpoints come from besides its files."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))


# -- the process's sessions and clients, built off the loop --------------------------------------------------

#: boto3 Sessions by (profile, AWS environment); a warm session makes its next client in ~20 ms.
_SESSIONS: dict[tuple[str | None, tuple[tuple[str, str], ...]], Any] = {}
#: Clients built or being built, by (process, settings, AWS environment), with their credential source.
_CLIENTS: dict[tuple[Any, ...], concurrent.futures.Future[tuple[Any, str]]] = {}
#: The credential chain's answers, by (process, AWS environment), for the signatures made without a client.
_CREDENTIALS: dict[tuple[Any, ...], concurrent.futures.Future[Any]] = {}
_LOCK = threading.Lock()  # guards _CLIENTS and _CREDENTIALS
_SDK_LOCK = threading.Lock()  # held while a session makes a client; a fork waits for it


def client_future(*, endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                  anonymous: bool = False) -> concurrent.futures.Future[tuple[Any, str]]:
    """``make_client(...)``'s result for these settings, shared by the process: built once, in a daemon thread
    started now (never on the caller's thread), and again when the AWS environment differs."""
    key = (os.getpid(), endpoint_url, region, profile, anonymous, _aws_env())
    with _LOCK:
        found = _CLIENTS.get(key)
        if found is not None and not (found.done() and found.exception() is not None):
            return found
        future: concurrent.futures.Future[tuple[Any, str]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # shared: a cancelled waiter must not cancel it (see credentials_future)
        _CLIENTS[key] = future

    def build() -> None:
        try:
            future.set_result(make_client(endpoint_url=endpoint_url, region=region, profile=profile,
                                          anonymous=anonymous))
        except BaseException as exc:  # handed to whoever awaits the client
            future.set_exception(exc)

    threading.Thread(target=build, name="wds-async-s3-client", daemon=True).start()
    return future


def _before_fork() -> None:
    # A child must not inherit a session half-way through making a client (its lock held by a thread that does
    # not exist there): wait for the build in progress, bounded.
    if _SDK_LOCK.acquire(timeout=30):
        _FORK_HELD.set()


def _after_fork_in_parent() -> None:
    if _FORK_HELD.is_set():
        _FORK_HELD.clear()
        _SDK_LOCK.release()


def _after_fork_in_child() -> None:
    global _LOCK, _SDK_LOCK, _FORK_HELD
    _LOCK, _SDK_LOCK, _FORK_HELD = threading.Lock(), threading.Lock(), threading.Event()
    _CLIENTS.clear()  # the parent's clients stay the parent's; the warm sessions are kept
    _CREDENTIALS.clear()


_FORK_HELD = threading.Event()
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


def credentials_future() -> concurrent.futures.Future[Any]:
    """The credential chain's answer (botocore's ``Credentials`` or None) for the current environment, resolved
    once per process and environment in a daemon thread, without loading any service model."""
    key = (os.getpid(), _aws_env())
    with _LOCK:
        found = _CREDENTIALS.get(key)
        if found is not None:
            return found
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        # Running from the start, so that it cannot be cancelled: a backend awaits it through asyncio.wrap_future,
        # which cancels the future when its task is cancelled (a consumer that left), and a cancelled future kept
        # here would fail every later S3 read of the process with CancelledError.
        future.set_running_or_notify_cancel()
        _CREDENTIALS[key] = future

    def resolve() -> None:
        try:
            future.set_result(botocore.session.Session().get_credentials())
        except BaseException as exc:  # handed to the awaiting backend, which then waits for its client
            future.set_exception(exc)

    threading.Thread(target=resolve, name="wds-async-s3-credentials", daemon=True).start()
    return future
