"""VTEX REST client on `requests`: pooled sessions, timeouts, retries and a rate limit.

Retries use exponential backoff with full jitter and honour `Retry-After` on 429; 5xx,
408, connection resets, read timeouts and bodies that do not parse are retried too.
401/403 are never retried: they fail the tenant at once with a message naming no secret.
"""

from __future__ import annotations

import email.utils
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import orjson
import requests
from requests.adapters import HTTPAdapter

from cdp_assets.tenants.registry import Credentials

LIST_PAGE_SIZE = 100
LIST_MAX_PAGES = 30  # VTEX serves at most 30 pages x 100 orders per list query
CATALOG_WINDOW = 250
SKU_PAGE_SIZE = 1000
SCROLL_SIZE = 1000
MIN_LIST_WINDOW = timedelta(seconds=1)
FEED_MAX_LOT = 10  # events per feed read; VTEX serves at most 10
FEED_VISIBILITY_SECONDS = 240  # VTEX's documented example
# The longest VTEX allows: a platform outage shorter than this loses no feed event.
FEED_RETENTION_SECONDS = 1_209_600
# What downstream models use; `_all` is discouraged by VTEX for bulk reads.
CUSTOMER_FIELDS = (
    "id,userId,email,firstName,lastName,document,documentType,phone,isCorporate,"
    "isNewsletterOptIn,localeDefault,createdIn,updatedIn"
)

T = TypeVar("T")
R = TypeVar("R")


class VtexError(RuntimeError):
    pass


class VtexAuthError(VtexError):
    """The account refused our credentials (401/403)."""


class VtexRequestFailed(VtexError):
    """A request still failed after every retry."""


class MalformedBody(VtexError):
    """A 200 response whose body never parsed as JSON, kept for quarantine."""

    def __init__(self, path: str, raw: bytes) -> None:
        super().__init__(f"GET {path}: response body is not valid JSON")
        self.raw = raw


@dataclass
class RequestStats:
    requests: int = 0
    throttled: int = 0  # 429 responses
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, *, requests: int = 0, throttled: int = 0, retries: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.throttled += throttled
            self.retries += retries


class RateLimiter:
    """Token bucket shared by every thread of this process that calls one account."""

    _by_account: dict[str, RateLimiter] = {}
    _registry_lock = threading.Lock()

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate)
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    @classmethod
    def for_account(cls, account: str, rate: float) -> RateLimiter:
        with cls._registry_lock:
            limiter = cls._by_account.get(account)
            if limiter is None or limiter.rate != rate:
                limiter = cls._by_account[account] = cls(rate)
            return limiter

    def acquire(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
                self.updated = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.rate
            time.sleep(wait)


@dataclass(frozen=True)
class Reply:
    data: Any
    raw: bytes
    headers: requests.structures.CaseInsensitiveDict


def format_vtex_instant(moment: datetime) -> str:
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(UTC)).total_seconds())


class VtexClient:
    """Calls one VTEX account. Thread-safe: each thread gets its own pooled session."""

    def __init__(
        self,
        account: str,
        base_url: str,
        credentials: Credentials,
        *,
        requests_per_second: float = 80.0,
        max_workers: int = 8,
        timeout_seconds: float = 30.0,
        max_retries: int = 6,
        backoff_base_seconds: float = 1.0,
        backoff_cap_seconds: float = 60.0,
    ) -> None:
        self.account = account
        self.base_url = base_url.rstrip("/")
        self._headers = {
            "X-VTEX-API-AppKey": credentials.app_key,
            "X-VTEX-API-AppToken": credentials.app_token,
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        self.max_workers = max_workers
        self.timeout = (min(10.0, timeout_seconds), timeout_seconds)
        self.max_retries = max_retries
        self.backoff_base = backoff_base_seconds
        self.backoff_cap = backoff_cap_seconds
        self.limiter = RateLimiter.for_account(account, requests_per_second)
        self.stats = RequestStats()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"VtexClient(account={self.account!r}, base_url={self.base_url!r})"

    # -- transport ---------------------------------------------------------------------

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            adapter = HTTPAdapter(pool_connections=1, pool_maxsize=self.max_workers)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            session.headers.update(self._headers)
            # The environment (proxies, CA bundle) is read once, here: with trust_env on,
            # requests looks for ~/.netrc and re-reads the proxy variables on every call,
            # a fifth of the client's CPU in a profile of a full-history order sync.
            proxies = requests.utils.get_environ_proxies(self.base_url)
            session.proxies.update({k: v for k, v in proxies.items() if k != "no"})
            session.verify = (
                os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
            )
            session.trust_env = False
            self._local.session = session
        return session

    def _backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        not_found_ok: bool = False,
    ) -> Reply | None:
        """One API call with retries; None for a 404 when `not_found_ok`."""
        url = self.base_url + path
        body = orjson.dumps(json_body) if json_body is not None else None
        malformed: bytes | None = None
        failure = ""
        delay = 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.count(retries=1)
                time.sleep(delay)
            self.limiter.acquire()
            self.stats.count(requests=1)
            malformed = None
            try:
                response = self._session().request(
                    method, url, params=params, data=body, headers=headers, timeout=self.timeout
                )
                content = response.content
            except (
                requests.ConnectionError,
                requests.Timeout,
                requests.exceptions.ChunkedEncodingError,  # connection dropped mid-body
            ) as error:
                failure = type(error).__name__
                delay = self._backoff(attempt)
                continue
            status = response.status_code
            if status in (401, 403):
                raise VtexAuthError(
                    f"VTEX account {self.account!r} refused the credentials (HTTP {status}) on"
                    f" {method} {path}: check the app key and token the tenant references"
                )
            if status == 429:
                self.stats.count(throttled=1)
                waited = retry_after_seconds(response.headers.get("Retry-After"))
                delay = (
                    min(self.backoff_cap, waited) + random.uniform(0, self.backoff_base)
                    if waited is not None
                    else self._backoff(attempt)
                )
                failure = "HTTP 429"
                continue
            if status == 408 or status >= 500:
                failure = f"HTTP {status}"
                delay = self._backoff(attempt)
                continue
            if status == 404 and not_found_ok:
                return None
            if status >= 400:
                raise VtexError(f"{method} {path} answered HTTP {status}: {content[:300]!r}")
            if not content:
                return Reply(None, content, response.headers)
            try:
                return Reply(orjson.loads(content), content, response.headers)
            except orjson.JSONDecodeError:
                malformed, failure = content, "body is not valid JSON"
                delay = self._backoff(attempt)
        if malformed is not None:
            raise MalformedBody(path, malformed)
        raise VtexRequestFailed(
            f"{method} {path} on account {self.account!r} failed after"
            f" {self.max_retries + 1} attempts (last: {failure})"
        )

    def get(self, path: str, **kwargs: Any) -> Reply | None:
        return self.request("GET", path, **kwargs)

    def map_concurrent(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """`fn` over `items` on at most `max_workers` threads, results in input order.

        At most twice `max_workers` calls are in flight, so memory stays bounded.
        """
        with ThreadPoolExecutor(self.max_workers, thread_name_prefix="vtex") as pool:
            pending: list[Future[R]] = []
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * self.max_workers:
                    yield pending.pop(0).result()
            for future in pending:
                yield future.result()

    # -- orders ------------------------------------------------------------------------

    def _list_page(self, start: datetime, end: datetime, page: int) -> dict[str, Any]:
        window = f"creationDate:[{format_vtex_instant(start)} TO {format_vtex_instant(end)}]"
        reply = self.get(
            "/api/oms/pvt/orders",
            params={
                "f_creationDate": window,
                "orderBy": "creationDate,asc",
                "page": page,
                "per_page": LIST_PAGE_SIZE,
            },
        )
        return reply.data

    def list_order_ids(self, start: datetime, end: datetime) -> list[str]:
        """Every order id created in [start, end], splitting windows past the 3,000 cap.

        A window is split when VTEX reports more orders than 30 pages can serve, or when
        its pages yielded fewer distinct orders than it reported (silent truncation).
        """
        found: set[str] = set()
        windows = [(start, end)]
        while windows:
            lo, hi = windows.pop()
            first = self._list_page(lo, hi, 1)
            total = int(first["paging"]["total"])
            can_split = hi - lo > MIN_LIST_WINDOW
            if total > LIST_PAGE_SIZE * LIST_MAX_PAGES and can_split:
                windows.extend(_halves(lo, hi))
                continue
            ids = {order["orderId"] for order in first["list"]}
            pages = min(int(first["paging"]["pages"]), LIST_MAX_PAGES)
            for page in range(2, pages + 1):
                ids.update(order["orderId"] for order in self._list_page(lo, hi, page)["list"])
            if len(ids) < total and can_split:
                windows.extend(_halves(lo, hi))
                continue
            found |= ids
        return sorted(found)

    def get_order(self, order_id: str) -> Reply | None:
        return self.get(f"/api/oms/pvt/orders/{order_id}", not_found_ok=True)

    # -- orders feed v3 (one feed per appKey) -------------------------------------------

    def configure_feed(
        self,
        statuses: Sequence[str] | None = None,
        *,
        visibility_timeout_seconds: int = FEED_VISIBILITY_SECONDS,
        retention_seconds: int = FEED_RETENTION_SECONDS,
    ) -> None:
        """Create or replace the feed with a FromWorkflow filter on `statuses`.

        None leaves the filter out, which delivers every status change. VTEX does not
        validate status names: a misspelt one silently never matches.
        """
        body: dict[str, Any] = {
            "queue": {
                "visibilityTimeoutInSeconds": visibility_timeout_seconds,
                "MessageRetentionPeriodInSeconds": retention_seconds,
            }
        }
        if statuses is not None:
            body["filter"] = {"type": "FromWorkflow", "status": list(statuses)}
        self.request("POST", "/api/orders/feed/config", json_body=body)

    def feed_config(self) -> dict[str, Any] | None:
        """The feed's settings plus `quantity` and `approximateAgeOfOldestMessageInSeconds`;
        None when no feed exists (never configured, or deleted by VTEX after a whole
        retention period without events)."""
        reply = self.get("/api/orders/feed/config", not_found_ok=True)
        return None if reply is None else reply.data

    def delete_feed(self) -> bool:
        """Delete the feed and its queued events; False when there was none."""
        return self.request("DELETE", "/api/orders/feed/config", not_found_ok=True) is not None

    def read_feed(self, maxlot: int = FEED_MAX_LOT) -> list[dict[str, Any]]:
        """Up to `maxlot` events; VTEX hides them for the visibility timeout, then shows them
        again unless their handles were committed."""
        return self.get("/api/orders/feed", params={"maxlot": maxlot}).data or []

    def commit_feed(self, handles: Sequence[str]) -> None:
        """Delete delivered events by handle.

        VTEX documents no maximum per call; chunks of one lot are what a read hands out.
        """
        for start in range(0, len(handles), FEED_MAX_LOT):
            chunk = list(handles[start : start + FEED_MAX_LOT])
            self.request("POST", "/api/orders/feed", json_body={"handles": chunk})

    # -- catalog -----------------------------------------------------------------------

    def product_ids(self) -> list[int]:
        ids: list[int] = []
        start = 1
        while True:
            reply = self.get(
                "/api/catalog_system/pvt/products/GetProductAndSkuIds",
                params={"_from": start, "_to": start + CATALOG_WINDOW - 1},
            )
            ids.extend(int(product_id) for product_id in reply.data["data"])
            total = int(reply.data["range"]["total"])
            start += CATALOG_WINDOW
            if start > total:
                return sorted(set(ids))

    def get_product(self, product_id: int) -> Reply | None:
        return self.get(f"/api/catalog/pvt/product/{product_id}", not_found_ok=True)

    def sku_ids(self) -> list[int]:
        ids: list[int] = []
        page = 1
        while True:
            reply = self.get(
                "/api/catalog_system/pvt/sku/stockkeepingunitids",
                params={"page": page, "pagesize": SKU_PAGE_SIZE},
            )
            if not reply.data:
                return sorted(set(ids))
            ids.extend(int(sku_id) for sku_id in reply.data)
            page += 1

    def get_sku(self, sku_id: int) -> Reply | None:
        return self.get(
            f"/api/catalog_system/pvt/sku/stockkeepingunitbyid/{sku_id}", not_found_ok=True
        )

    # -- Master Data -------------------------------------------------------------------

    def scroll_customers(self, updated_since: datetime | None = None) -> Iterator[list[Any]]:
        """Pages of CL documents, optionally only those updated since a moment."""
        params: dict[str, Any] = {
            "_size": SCROLL_SIZE,
            "_fields": CUSTOMER_FIELDS,
            "_sort": "id ASC",
        }
        if updated_since is not None:
            params["_where"] = f"updatedIn>{format_vtex_instant(updated_since)}"
        headers = {"Accept": "application/vnd.vtex.ds.v10+json"}
        reply = self.get("/api/dataentities/CL/scroll", params=params, headers=headers)
        token = reply.headers.get("X-VTEX-MD-TOKEN")
        while reply.data:
            yield reply.data
            reply = self.get(
                "/api/dataentities/CL/scroll", params={"_token": token}, headers=headers
            )


def _halves(lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
    mid = lo + (hi - lo) / 2
    return [(lo, mid), (mid, hi)]
