"""What the environment adds to an http(s) request, looked up once: the proxies of the environment (``http_proxy``,
``https_proxy``; ``no_proxy`` bypasses them) and ``.netrc`` logins (``NETRC`` or ``~/.netrc``) for the hosts and the
proxies. :class:`~wds_async.backends.http.HttpBackend` asks :class:`Environment` for every request it sends, through
either client (aiohttp's ``trust_env`` would read them again on every request)."""

from __future__ import annotations

import base64
import logging
import netrc
import os
import urllib.parse
import urllib.request

__all__ = ["Environment"]

log = logging.getLogger("wds_async")


class Environment:
    """What aiohttp's ``trust_env=True`` looks up for every request, looked up once per session: the proxies of the
    environment (``http_proxy``, ``https_proxy``; ``no_proxy`` bypasses them) and ``.netrc`` credentials (``NETRC`` or
    ``~/.netrc``) for the hosts and the proxies. Answers are kept per (scheme, host)."""

    EMPTY: Environment

    def __init__(self, *, empty: bool = False) -> None:
        self.proxies: dict[str, str] = {} if empty else {
            k: v for k, v in urllib.request.getproxies().items() if k in ("http", "https")}
        self.netrc = None if empty else _read_netrc()
        self._answers: dict[tuple[str, str, bool], tuple[str | None, dict[str, str] | None, str | None]] = {}

    def _login(self, host: str | None) -> str | None:
        """The ``Basic`` credentials .netrc holds for ``host``, as a header value."""
        found = self.netrc.authenticators(host) if self.netrc is not None and host else None
        if found is None:
            return None
        login, account, password = found
        return "Basic " + base64.b64encode(f"{login or account or ''}:{password or ''}".encode()).decode("ascii")

    def for_url(self, url: str, authorized: bool) -> tuple[str | None, dict[str, str] | None, str | None]:
        """``(proxy, proxy_headers, authorization)`` for a request to ``url`` (``authorized``: it carries its own
        Authorization header, so no .netrc login is added)."""
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.hostname or "", authorized)
        answer = self._answers.get(key)
        if answer is None:
            proxy = self.proxies.get(parts.scheme)
            if proxy is not None and parts.hostname and urllib.request.proxy_bypass(parts.hostname):
                proxy = None
            proxy_headers = None
            if proxy is not None and not urllib.parse.urlsplit(proxy).username:
                login = self._login(urllib.parse.urlsplit(proxy).hostname)
                proxy_headers = {"Proxy-Authorization": login} if login else None
            answer = (proxy, proxy_headers, None if authorized else self._login(parts.hostname))
            self._answers[key] = answer
        return answer


Environment.EMPTY = Environment(empty=True)


def _read_netrc() -> netrc.netrc | None:
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        return netrc.netrc(path)
    except (OSError, netrc.NetrcParseError) as exc:
        log.warning("wds-async: cannot read %s (%s); requests go without its logins", path, exc)
        return None
