"""Running the probes of :mod:`tests.service.probes` in processes of their own, from the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Self

REPO = str(Path(__file__).resolve().parents[2])
PROBE_TIMEOUT = 180  # a hang guard: every probe ends in seconds


def _command(name: str, socket: str, args: dict[str, Any]) -> tuple[list[str], str]:
    fd, path = tempfile.mkstemp(prefix="wds-probe-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(args, fh)
    return [sys.executable, "-m", "tests.service.probes", name, socket, "@" + path], path


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _result(stdout: str, stderr: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"result"'):
            return json.loads(line)["result"]  # type: ignore[no-any-return]
    raise AssertionError(f"the probe printed no result; stdout: {stdout[-2000:]!r}; stderr: {stderr[-4000:]}")


def probe(name: str, socket: str, args: dict[str, Any], *, cwd: str | None = None,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run probe ``name`` to its end and return its result."""
    command, path = _command(name, socket, args)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT, cwd=cwd or REPO,
                              env=_env(env), check=False)
    finally:
        os.unlink(path)
    return _result(done.stdout, done.stderr)


class HeldProbe:
    """A probe that holds its connections until :meth:`finish` (``hold`` without ``wait``, ``exhaust``, ``read``
    with ``announce``): started, then waited for until it prints its ``ready`` line."""

    def __init__(self, name: str, socket: str, args: dict[str, Any]) -> None:
        command, self._path = _command(name, socket, args)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                        text=True, cwd=REPO, env=_env(None))
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith('{"ready"'):
            errors = self._errors()
            self.__exit__()
            raise AssertionError(f"the probe did not get ready: {line!r} {errors}")
        self.ready: dict[str, Any] = json.loads(line)

    def _errors(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-4000:].decode(errors="replace")

    def finish(self) -> dict[str, Any]:
        """Let the probe close its connections (its stdin closes) and report."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        out = self.process.stdout.read()  # through the same reader as the ready line: nothing buffered is lost
        self.process.wait(PROBE_TIMEOUT)
        return _result(out, self._errors())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(PROBE_TIMEOUT)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._stderr.close()
        if os.path.exists(self._path):
            os.unlink(self._path)
