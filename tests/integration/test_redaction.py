"""Credentials never reach what wds-async shows, whatever shape the URL has: the command line's output and
errors, Python's tracebacks, ``repr(ds)`` and log lines. Each case runs the real command or a real child
process against the emulated store on 127.0.0.1 and looks for the secrets in everything it printed.

The probe's strings: ``wds-async verify 'http://u:PASS@[::1/x.tar?sig=S'`` printed both secrets (the host
cannot be parsed, and the scrubber parsed the URL); a ``;sig=`` parameter reached the error, the traceback
and ``repr(ds)``; ``jwt=`` and a ``#sig=`` fragment were not redacted at all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from emustore import StoreProcess

CLI = [sys.executable, "-m", "wds_async.cli"]
#: Every secret the URLs below carry; none may appear in anything printed.
SECRETS = ("PASS", "hunter2", "SEMISECRET", "JWTSECRET", "FRAGSECRET", "AMZSECRET", "TOKSECRET")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (secret, text)


def _signed(store: StoreProcess) -> list[str]:
    """URLs that fail at once (a 404 for a missing object, a 400 for a query parameter the store does not
    take; neither is retried), with secrets in every position: userinfo, a ``;``-parameter, ``jwt=``, a
    ``#``-fragment, a presigned query."""
    base = store.base_url.replace("http://", "http://user:hunter2@")
    return [base + "missing-0.tar;sig=SEMISECRET",
            store.base_url + "missing-1.tar?jwt=JWTSECRET#sig=FRAGSECRET",
            store.base_url + "missing-2.tar?X-Amz-Date=20240101&X-Amz-Signature=AMZSECRET;token=TOKSECRET"]


def test_verify_of_an_unparsable_url_names_it_without_its_secrets() -> None:
    out = _run("verify", "http://u:PASS@[::1/x.tar?sig=S")
    assert out.returncode == 2, out.stderr
    text = out.stdout + out.stderr
    _no_secret(text)
    assert "sig=S" not in text
    assert "url=http://u:***@[::1/x.tar?sig=***" in out.stderr  # still names the URL and the problem
    assert "no host" in out.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_verify_of_failing_shards_prints_no_secret(store: StoreProcess, as_json: bool) -> None:
    out = _run("verify", *(["--json"] if as_json else []), *_signed(store))
    assert out.returncode == 1, out.stderr
    _no_secret(out.stdout + out.stderr)
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        if as_json:
            report = json.loads(line)
            assert report["ok"] is False and report["error_type"] in ("NotFound", "BackendError")
            line = report["url"] + " " + report["error"]
        assert f"missing-{i}.tar" in line and "HTTP 40" in line and "***" in line  # the shard is still named


def test_verify_of_a_pipe_command_hides_the_urls_in_it() -> None:
    out = _run("verify", "pipe:curl -s -f https://user:hunter2@127.0.0.1:9/x.tar?sig=SEMISECRET")
    _no_secret(out.stdout + out.stderr)
    assert "pipe:curl -s -f https://user:***@127.0.0.1:9/x.tar?sig=***" in out.stdout


#: A child that builds a dataset over ``sys.argv[1]``, prints its repr, and iterates it without catching
#: anything: Python itself prints the traceback.
_UNCAUGHT = """
import sys
import wds_async as wds
ds = wds.WebDataset([sys.argv[1]], retry=wds.RetryPolicy(attempts=1), nodesplitter=None, workersplitter=None)
print(repr(ds), flush=True)
for _ in ds:
    pass
"""


@pytest.mark.parametrize("index", [0, 1, 2])
def test_an_uncaught_error_and_repr_show_no_secret(store: StoreProcess, index: int) -> None:
    url = _signed(store)[index]
    out = subprocess.run([sys.executable, "-c", _UNCAUGHT, url], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert out.stdout.startswith("WebDataset('http://") and "***" in out.stdout
    assert "Traceback (most recent call last)" in out.stderr and "HTTP 40" in out.stderr
    assert f"missing-{index}.tar" in out.stderr
    _no_secret(out.stdout + out.stderr)


#: A child that runs the command with its verify step replaced by one that fails unexpectedly (a bug) or
#: logs: what the command prints for it must be scrubbed too.
_COMMAND = """
import logging, sys
import wds_async.cli.main as cli
from wds_async.cli import verify

def broken(args):
    raise RuntimeError("unexpected while reading " + args.urls[0])

def noisy(args):
    logging.getLogger("wds_async").info("retrying %s in 0.1 s", args.urls[0])
    logging.getLogger("wds_async").warning("cache: not caching " + args.urls[0])
    return 0

verify.command = broken if sys.argv[1] == "broken" else noisy
sys.exit(cli.main(sys.argv[2:]))
"""


def test_the_command_scrubs_an_unexpected_traceback(store: StoreProcess) -> None:
    url = _signed(store)[0]
    out = subprocess.run([sys.executable, "-c", _COMMAND, "broken", "verify", url], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr and "RuntimeError: unexpected while reading" in out.stderr
    assert "missing-0.tar;sig=***" in out.stderr
    _no_secret(out.stdout + out.stderr)


def test_the_commands_log_lines_are_scrubbed(store: StoreProcess) -> None:
    url = _signed(store)[1]
    out = subprocess.run([sys.executable, "-c", _COMMAND, "noisy", "-v", "verify", url], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "retrying http://" in out.stderr and "cache: not caching" in out.stderr
    _no_secret(out.stdout + out.stderr)
