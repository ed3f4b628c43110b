"""How the platform calls other systems: every call ends within a deadline, and credentials go
only to the origin they were issued for.

- HTTP (`requests`: VTEX, Meta's SDK, the alert webhook) goes through `BoundedSession`. Its
  requests time out per read like any `requests` call, and also end as a whole within
  `Deadlines.total_seconds`, connect, headers, redirects and body included: a watchdog thread
  shuts down the socket of a request past its deadline, which ends whatever read is blocked on
  it (a server dripping a byte every few seconds never trips a per-read timeout).
- Redirects are followed only within the origin (scheme, host, port) the request was sent to,
  at most `MAX_REDIRECTS` times. A redirect elsewhere fails naming the target's host: requests
  strips only `Authorization` when it follows one, and would hand VTEX's `X-VTEX-API-AppKey` and
  `X-VTEX-API-AppToken` (or a URL's access token) to whoever the answer names.
- gRPC (Google) takes a deadline per call (`timeout=`); Postgres sessions take a connect timeout
  and a statement timeout (`lib/database.py`).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

MAX_REDIRECTS = 3


class OutboundError(RuntimeError):
    """A call refused or ended by the outbound policy."""


class DeadlineExceeded(OutboundError, requests.Timeout):
    """A request got no complete answer within its total deadline (a timeout, for retries)."""


class RequestAborted(OutboundError):
    """A request ended because its session was aborted (the step is stopping)."""


class RedirectRefused(OutboundError):
    """An answer redirected to another origin, or too many times."""


@dataclass(frozen=True)
class Deadlines:
    """How long one call may take: to connect, between two reads, and as a whole."""

    connect_seconds: float = 10.0
    read_seconds: float = 30.0
    total_seconds: float = 180.0

    def __post_init__(self) -> None:
        if not min(self.connect_seconds, self.read_seconds, self.total_seconds) > 0:
            raise ValueError("deadlines must be positive numbers of seconds")

    def per_read(self) -> tuple[float, float]:
        """`requests`' (connect, read) timeout, neither longer than the whole."""
        return (
            min(self.connect_seconds, self.total_seconds),
            min(self.read_seconds, self.total_seconds),
        )


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default_port = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or default_port


def described(method: str, url: str) -> str:
    """`METHOD host/path` of a request, without its query (which may carry a token)."""
    parts = urlsplit(url)
    return f"{method} {parts.hostname or ''}{parts.path}"


# -- the watchdog ------------------------------------------------------------------------------


class _Guard:
    """One request in flight: its deadline and the sockets it has used so far."""

    __slots__ = ("deadline", "ended_by", "owner", "sockets")

    def __init__(self, seconds: float, owner: object) -> None:
        self.deadline = time.monotonic() + seconds
        self.owner = owner
        self.sockets: list[socket.socket] = []
        self.ended_by: str | None = None  # "deadline" or "abort" once the watchdog ended it

    def end(self, reason: str) -> None:
        self.ended_by = reason
        for sock in self.sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, even under TLS: it wakes a read blocked in another thread,
    # which SSLSocket's own shutdown (a TLS close) would not do safely.
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread per process ending the requests whose deadline passed."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # A forked child gets none of the parent's threads, and maybe a lock held by one.
        self._cond = threading.Condition(threading.Lock())
        self._active: set[_Guard] = set()
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    @contextmanager
    def watching(self, guard: _Guard) -> Iterator[_Guard]:
        with self._cond:
            self._active.add(guard)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="outbound-deadlines", daemon=True
                )
                self._thread.start()
            elif guard.deadline < self._wake_at:
                self._cond.notify()
        outer = getattr(self._local, "guard", None)
        self._local.guard = guard
        try:
            yield guard
        finally:
            self._local.guard = outer
            with self._cond:
                self._active.discard(guard)

    def attach(self, sock: socket.socket) -> None:
        """Count `sock` as used by this thread's request in flight, if any."""
        guard = getattr(self._local, "guard", None)
        if guard is None:
            return
        with self._cond:
            guard.sockets.append(sock)
            if guard.ended_by is not None:
                _shut(sock)

    def abort(self, owner: object) -> None:
        """End every request of `owner` in flight now."""
        with self._cond:
            for guard in [g for g in self._active if g.owner is owner]:
                self._active.discard(guard)
                guard.end("abort")

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for guard in [g for g in self._active if g.deadline <= now]:
                    self._active.discard(guard)
                    guard.end("deadline")
                self._wake_at = min((g.deadline for g in self._active), default=math.inf)
                self._cond.wait(None if self._wake_at == math.inf else self._wake_at - now)


_watchdog = _Watchdog()


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _watchdog.attach(sock)  # before TLS and proxy handshakes, which it bounds too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:  # a pooled connection, reused
            _watchdog.attach(self.sock)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _WATCHED_POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools are classes of their own
            manager.pool_classes_by_scheme = _WATCHED_POOLS
        return manager


# -- the session -------------------------------------------------------------------------------


class BoundedSession(requests.Session):
    """A `requests` session under the outbound policy: each request ends within `deadlines`
    (raising `DeadlineExceeded`, a `requests.Timeout`) and follows redirects only within its
    origin (else `RedirectRefused`)."""

    def __init__(self, deadlines: Deadlines, *, pool_maxsize: int = 10) -> None:
        super().__init__()
        self.deadlines = deadlines
        self.max_redirects = MAX_REDIRECTS
        adapter = _WatchedAdapter(pool_connections=1, pool_maxsize=pool_maxsize)
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(  # type: ignore[override]
        self, method: str, url: str, *args: Any, timeout: Any = None, **kwargs: Any
    ) -> requests.Response:
        guard = _Guard(self.deadlines.total_seconds, owner=self)
        try:
            with _watchdog.watching(guard):
                kwargs["timeout"] = timeout or self.deadlines.per_read()
                response = super().request(method, url, *args, **kwargs)
        except requests.TooManyRedirects as error:
            raise RedirectRefused(
                f"{described(method, url)} was redirected more than {self.max_redirects} times"
                f" (last to {_location_host(error.response)}): not followed further"
            ) from None
        except requests.RequestException:
            if guard.ended_by is None:
                raise
            response = None
        if guard.ended_by == "abort":
            raise RequestAborted(f"{described(method, url)}: stopped, its step is ending")
        if guard.ended_by == "deadline":
            # A body read until the connection closes ends quietly, cut short, when the
            # socket is shut: an answer is never trusted once its deadline passed.
            raise DeadlineExceeded(
                f"{described(method, url)}: no complete answer within"
                f" {self.deadlines.total_seconds:g} s"
            )
        assert response is not None
        return response

    def abort(self) -> None:
        """End this session's requests in flight now (they raise `RequestAborted`)."""
        _watchdog.abort(self)

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        target = super().get_redirect_target(resp)
        if target is not None and origin(urljoin(resp.url, target)) != origin(resp.url):
            method = (resp.request.method if resp.request is not None else None) or "?"
            resp.close()
            raise RedirectRefused(
                f"{described(method, resp.url)} answered HTTP {resp.status_code}, a redirect to"
                f" another origin ({_location_host(resp)}): not followed, so the credentials"
                " stay with the origin they are for"
            )
        return target


def _location_host(response: requests.Response | None) -> str:
    """The host a redirect points to (never its path or query, which may carry anything)."""
    if response is None or "location" not in response.headers:
        return "?"
    return urlsplit(urljoin(response.url, response.headers["location"])).hostname or "?"
