"""VTEX REST client on `requests`: pooled sessions, deadlines, retries and a rate limit.

Every request ends within its deadline and follows no redirect off the account's origin
(`lib/outbound.py`). 5xx, 408, connection resets, timeouts and bodies that do not parse are
retried with exponential backoff and full jitter. A 429 rests every caller of the account for
what `Retry-After` says, or VTEX's recommended minute without it; the account's request
budget is shared by every process calling it (`vtex/budget.py`). 401/403 are never retried:
they fail the tenant at once with a message naming no secret; other errors quote the body
with the credentials masked.
"""

from __future__ import annotations

import copy
import email.utils
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import orjson
import requests
from dagster import get_dagster_logger

from cdp_assets.lib import settings
from cdp_assets.lib.outbound import (
    BoundedSession,
    DeadlineExceeded,
    Deadlines,
    OutboundError,
    RequestAborted,
)
from cdp_assets.lib.redaction import redact
from cdp_assets.tenants.registry import Credentials
from cdp_assets.vtex.budget import SharedBudget
from cdp_assets.vtex.records import InvalidRecord, parse_timestamp

LIST_PAGE_SIZE = 100
LIST_MAX_PAGES = 30  # VTEX serves at most 30 pages x 100 orders per list query
CATALOG_WINDOW = 250
SKU_PAGE_SIZE = 1000
SCROLL_SIZE = 1000
# The narrowest list window. One VTEX still reports more than 3,000 orders for cannot be read
# whole: a total no store reaches (3,000 orders a minute), so the totals are not believed any
# more, and every window left is read as it is (its shortfall recorded), not split further.
MIN_LIST_WINDOW = timedelta(minutes=1)
ORDERS_PATH = "/api/oms/pvt/orders"
FEED_MAX_LOT = 10  # events per feed read; VTEX serves at most 10
FEED_VISIBILITY_SECONDS = 240  # VTEX's documented example
# The longest VTEX allows: a platform outage shorter than this loses no feed event.
FEED_RETENTION_SECONDS = 1_209_600
# A listing (SKU ids, product windows, a scroll) still going after this many pages fails: 20
# million SKUs or CL documents at 1,000 a page. One that never ends would run for hours.
MAX_LISTING_PAGES = 20_000
PROGRESS_EVERY_SECONDS = 30.0  # a progress line at least this often during a long listing
SCROLL_PATH = "/api/dataentities/CL/scroll"
SEARCH_PATH = "/api/dataentities/CL/search"
SEARCH_PAGE_SIZE = 100  # Master Data's search serves 100 documents a request...
SEARCH_REACH = 10_000  # ...and 10,000 a query
SKU_IDS_PATH = "/api/catalog_system/pvt/sku/stockkeepingunitids"
PRODUCT_IDS_PATH = "/api/catalog_system/pvt/products/GetProductAndSkuIds"
FEED_PATH = "/api/orders/feed"
# Documents are asked for from the last `updatedIn` read less this (and up to the next one
# plus this): documents of the same millisecond are read twice, never skipped.
SCROLL_OVERLAP = timedelta(milliseconds=1)
# Answers to a scroll token lost in a row: the pages they may have skipped must stay within
# what one search reaches.
MAX_LOST_SCROLL_ANSWERS = SEARCH_REACH // SCROLL_SIZE - 1
# What downstream models use; `_all` is discouraged by VTEX for bulk reads.
CUSTOMER_FIELDS = (
    "id,userId,email,firstName,lastName,document,documentType,phone,isCorporate,"
    "isNewsletterOptIn,localeDefault,createdIn,updatedIn"
)

T = TypeVar("T")
R = TypeVar("R")
_LOG = get_dagster_logger("vtex")


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


class MalformedEnvelope(VtexError):
    """A 200 whose body or headers do not have the shape the endpoint documents."""


class ListingTooLong(VtexError):
    """A paged listing went past `max_listing_pages`: a listing that does not end."""


@contextmanager
def naming_tenant(tenant_id: str) -> Iterator[None]:
    """VTEX errors name the account and the endpoint; a tenant's run names the tenant too."""
    try:
        yield
    except VtexError as error:
        error.args = (f"tenant {tenant_id!r}: {error}",)
        raise


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
    """Paces the requests of one account from every thread of this process: a token bucket of
    its own, or, given the account's `SharedBudget`, batches of tokens taken from the budget
    every process and host calling the account shares (a round trip per quarter second of
    requests, not per request). A 429 pauses every caller of the account (`pause`)."""

    _by_account: dict[str, RateLimiter] = {}
    _registry_lock = threading.Lock()

    def __init__(
        self, rate: float, burst: float | None = None, budget: SharedBudget | None = None
    ) -> None:
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate)
        self.budget = budget
        self.batch = max(1.0, rate / 4)
        self.tokens = 0.0 if budget is not None else self.capacity
        self.updated = time.monotonic()
        self.ready_at = 0.0  # no token is handed out before this (a pause, a budget's debt)
        self.lock = threading.Lock()

    @classmethod
    def for_account(cls, account: str, rate: float, budget_url: str | None = None) -> RateLimiter:
        """This process's limiter of `account`; shared with every process through the
        database at `budget_url` when given."""
        with cls._registry_lock:
            limiter = cls._by_account.get(account)
            shared = limiter is not None and (limiter.budget and limiter.budget.url) == budget_url
            if limiter is None or limiter.rate != rate or not shared:
                budget = SharedBudget(budget_url, account, rate) if budget_url else None
                limiter = cls._by_account[account] = cls(rate, budget=budget)
            return limiter

    def acquire(self, stop: threading.Event | None = None) -> None:
        """Wait for a token; returns without one as soon as `stop` is set."""
        while True:
            with self.lock:
                now = time.monotonic()
                wait = self.ready_at - now
                if wait <= 0:
                    if self.budget is None:
                        elapsed, self.updated = now - self.updated, now
                        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
                    elif self.tokens < 1:
                        self.ready_at = now + self.budget.take(self.batch)
                        self.tokens += self.batch
                    if self.tokens >= 1 and self.ready_at <= now:
                        self.tokens -= 1
                        return
                    wait = max(self.ready_at - now, (1 - self.tokens) / self.rate)
            if stop is None:
                time.sleep(wait)
            elif stop.wait(wait):
                return

    def pause(self, seconds: float) -> None:
        """No request of the account for `seconds`, from this process nor (shared) any other."""
        with self.lock:
            self.ready_at = max(self.ready_at, time.monotonic() + seconds)
            if self.budget is not None:
                self.budget.pause(seconds)


@dataclass(frozen=True)
class Reply:
    data: Any
    raw: bytes
    headers: requests.structures.CaseInsensitiveDict


class _Listing:
    """One paged listing: its page budget, and a progress line at least every
    `progress_every_seconds` (checked as each page arrives)."""

    def __init__(self, client: VtexClient, path: str) -> None:
        self.client = client
        self.path = path
        self.pages = 0
        self.records = 0
        self.windows = 0  # list windows read whole (orders)
        self.started = self.reported = time.monotonic()

    def page(self, records: int) -> None:
        """Count a page of `records` before it is used; past the budget, fail."""
        client = self.client
        if self.pages >= client.max_listing_pages:
            raise ListingTooLong(
                f"VTEX account {client.account!r}: GET {self.path} had not ended after"
                f" {self.pages} pages ({self.records} records), the most a run reads"
                " (max_listing_pages): the listing does not end"
            )
        self.pages += 1
        self.records += records
        now = time.monotonic()
        if now - self.reported >= client.progress_every_seconds:
            self.reported = now
            windows = f", {self.windows} windows" if self.windows else ""
            _LOG.info(
                f"VTEX account {client.account!r}: GET {self.path}: {self.pages} pages{windows},"
                f" {self.records} records in {now - self.started:.0f} s"
            )


def _shape(reply: Reply | None) -> str:
    """What a response body was, for an error message."""
    if reply is None or not reply.raw:
        return "an empty body"
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return f"a JSON {names.get(type(reply.data), 'number')}"


def _integer_id(value: Any) -> int | None:
    """A catalog id as VTEX lists it (an integer, or its digits as text); None otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _last_updated(page: list[Any]) -> datetime | None:
    """The `updatedIn` of the last document of a page sorted by it (skipping unreadable ones)."""
    return _first_updated(page[::-1])


def _first_updated(page: list[Any]) -> datetime | None:
    """The `updatedIn` of the first document of a page sorted by it (skipping unreadable ones)."""
    for document in page:
        if isinstance(document, dict):
            try:
                return parse_timestamp(document.get("updatedIn"), "updatedIn")
            except InvalidRecord:
                continue
    return None


def format_vtex_instant(moment: datetime) -> str:
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait by a `Retry-After` header (RFC 9110 section 10.2.3): delay-seconds, or
    an HTTP date in any of the forms the RFC asks recipients to read (a date without a zone, or
    with RFC 5322's `-0000`, is UTC); None when absent or unreadable."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _excerpt(content: bytes) -> str:
    """The start of an error body, credentials masked first: an error page may echo the
    request's headers, app key and token included."""
    return redact(content[:65_536].decode("utf-8", "replace"))[:300]


class VtexClient:
    """Calls one VTEX account. Thread-safe: each thread gets its own pooled session."""

    # Bounds and reporting of the paged listings (SKU ids, product windows, the CL scroll).
    max_listing_pages: int = MAX_LISTING_PAGES
    progress_every_seconds: float = PROGRESS_EVERY_SECONDS

    def __init__(
        self,
        account: str,
        base_url: str,
        credentials: Credentials,
        *,
        requests_per_second: float = 80.0,
        max_workers: int = 8,
        timeout_seconds: float = 30.0,
        deadline_seconds: float = 180.0,
        max_retries: int = 6,
        backoff_base_seconds: float = 1.0,
        backoff_cap_seconds: float = 60.0,
        throttle_backoff_seconds: float = 60.0,
        max_retry_after_seconds: float = 300.0,
        budget_url: str | None = None,
    ) -> None:
        """`timeout_seconds` bounds each read, `deadline_seconds` each request as a whole (the
        largest page included). After a 429 the account rests for what `Retry-After` says (at
        most `max_retry_after_seconds`), or without it for `throttle_backoff_seconds`, VTEX's
        recommended minute. `budget_url`: the database holding the account's request budget
        shared with every other process (else this process paces itself alone)."""
        self.account = account
        self.base_url = base_url.rstrip("/")
        self._headers = {
            "X-VTEX-API-AppKey": credentials.app_key,
            "X-VTEX-API-AppToken": credentials.app_token,
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        self.max_workers = max_workers
        self.deadlines = Deadlines(min(10.0, timeout_seconds), timeout_seconds, deadline_seconds)
        self.max_retries = max_retries
        self.backoff_base = backoff_base_seconds
        self.backoff_cap = backoff_cap_seconds
        self.throttle_backoff = throttle_backoff_seconds
        self.max_retry_after = max_retry_after_seconds
        self.limiter = RateLimiter.for_account(account, requests_per_second, budget_url)
        self.stats = RequestStats()
        self._local = threading.local()
        self._sessions: list[BoundedSession] = []
        self._sessions_lock = threading.Lock()
        self._stopping = threading.Event()

    def __repr__(self) -> str:
        return f"VtexClient(account={self.account!r}, base_url={self.base_url!r})"

    # -- transport ---------------------------------------------------------------------

    def _session(self) -> BoundedSession:
        session = getattr(self._local, "session", None)
        if session is None:
            # Bounded per request as a whole, and never following a redirect off the
            # account's origin: the app key and token would go along (lib/outbound.py).
            session = BoundedSession(self.deadlines, pool_maxsize=self.max_workers)
            session.headers.update(self._headers)
            # The environment (proxies, CA bundle) is read once, here: with trust_env on,
            # requests looks for ~/.netrc and re-reads the proxy variables on every call,
            # a fifth of the client's CPU in a profile of a full-history order sync.
            proxies = requests.utils.get_environ_proxies(self.base_url)
            session.proxies.update({k: v for k, v in proxies.items() if k != "no"})
            session.verify = (
                settings.value("REQUESTS_CA_BUNDLE") or settings.value("CURL_CA_BUNDLE") or True
            )
            session.trust_env = False
            self._local.session = session
            with self._sessions_lock:
                self._sessions.append(session)
        return session

    def stop(self) -> None:
        """End the requests in flight and refuse new ones: the step using the client is
        ending (cancelled, or failed elsewhere), and its threads must not outlive it."""
        self._stopping.set()
        with self._sessions_lock:
            for session in self._sessions:
                session.abort()

    def _backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))

    def _throttled(self, retry_after: str | None) -> float:
        """How long the account rests after a 429, jittered so that callers spread out."""
        waited = retry_after_seconds(retry_after)
        if waited is None:
            return self.throttle_backoff * random.uniform(1.0, 1.25)
        return min(self.max_retry_after, waited) + random.uniform(0, self.backoff_base)

    def _stopped(self, method: str, path: str) -> VtexError:
        return VtexError(f"{method} {path} on account {self.account!r}: stopped, the step ended")

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
                self._stopping.wait(delay)
            self.limiter.acquire(self._stopping)
            if self._stopping.is_set():
                raise self._stopped(method, path)
            self.stats.count(requests=1)
            malformed = None
            try:
                response = self._session().request(
                    method, url, params=params, data=body, headers=headers
                )
                content = response.content
            except (
                requests.ConnectionError,
                requests.Timeout,  # per read, or the request's deadline
                requests.exceptions.ChunkedEncodingError,  # connection dropped mid-body
            ) as error:
                deadline = isinstance(error, DeadlineExceeded)  # its text says what and how long
                failure = str(error) if deadline else type(error).__name__
                delay = self._backoff(attempt)
                continue
            except RequestAborted:
                raise self._stopped(method, path) from None
            except (requests.RequestException, OutboundError) as error:
                # A redirect off the origin, a header requests refuses: never worth a retry.
                raise VtexError(
                    redact(f"{method} {path} on account {self.account!r}: {error}")
                ) from None
            status = response.status_code
            if status in (401, 403):
                raise VtexAuthError(
                    f"VTEX account {self.account!r} refused the credentials (HTTP {status}) on"
                    f" {method} {path}: check the app key and token the tenant references"
                )
            if status == 429:
                # Every caller of the account rests, in every process: throttling also slows
                # the merchant's own Admin, which shares the account's budget.
                self.stats.count(throttled=1)
                self.limiter.pause(self._throttled(response.headers.get("Retry-After")))
                failure, delay = "HTTP 429", 0.0
                continue
            if status == 408 or status >= 500:
                failure = f"HTTP {status}"
                delay = self._backoff(attempt)
                continue
            if status == 404 and not_found_ok:
                return None
            if 300 <= status < 400:
                raise VtexError(f"{method} {path} answered HTTP {status}, a redirect not followed")
            if status >= 400:
                raise VtexError(f"{method} {path} answered HTTP {status}: {_excerpt(content)!r}")
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
            try:
                pending: list[Future[R]] = []
                for item in items:
                    pending.append(pool.submit(fn, item))
                    if len(pending) >= 2 * self.max_workers:
                        yield pending.pop(0).result()
                for future in pending:
                    yield future.result()
            except BaseException:
                # Cancelled (the step was interrupted), abandoned or failed: the calls in
                # flight end now rather than at their deadlines, and no queued one starts.
                self.stop()
                pool.shutdown(wait=True, cancel_futures=True)
                raise

    # -- orders ------------------------------------------------------------------------

    def _list_page(self, window: _ListWindow, page: int) -> tuple[int, list[Any]]:
        """VTEX's `paging.total` and the `list` of one page of a window."""
        span = f"creationDate:[{format_vtex_instant(window.start)} TO"
        span += f" {format_vtex_instant(window.end)}]"
        reply = self.get(
            ORDERS_PATH,
            params={
                "f_creationDate": span,
                "orderBy": "creationDate,asc",
                "page": page,
                "per_page": LIST_PAGE_SIZE,
            },
        )
        where = f"(List orders, {window}, page {page})"
        body = reply.data if reply is not None else None
        if not isinstance(body, dict):
            raise self._malformed(ORDERS_PATH, f"{where} answered {_shape(reply)}, not an object")
        entries = body.get("list")
        if not isinstance(entries, list):
            kind = "null" if entries is None else type(entries).__name__
            raise self._malformed(ORDERS_PATH, f"{where} answered a page whose list is {kind}")
        paging = body.get("paging")
        total = _integer_id(paging.get("total")) if isinstance(paging, dict) else None
        if total is None:
            raise self._malformed(ORDERS_PATH, f"{where} answered a page without paging.total")
        return total, entries

    def list_orders(self, start: datetime, end: datetime) -> OrderListing:
        """Every order VTEX lists as created in [start, end], with what it reported per window.

        VTEX serves at most 30 pages x 100 orders per query: a window is split in halves while
        VTEX reports more, and while it spans more than one page and its pages hold fewer
        distinct orders than reported (pages shifted between requests). A one-page window
        cannot have shifted: its total is wrong, and splitting it would never end. A window
        of MIN_LIST_WINDOW still reporting more than 30 pages makes every total suspect: the
        windows left are read as they are. What a window falls short of is recorded
        (`shortfalls`). Entries without an orderId are kept apart for quarantine. A progress
        line comes at least every `progress_every_seconds`.
        """
        listing = OrderListing()
        progress = _Listing(self, ORDERS_PATH)
        windows = [_ListWindow(start, end)]
        believe_totals = True
        while windows:
            window = windows.pop()
            total, entries = self._list_page(window, 1)
            progress.page(len(entries))
            splittable = believe_totals and window.end - window.start > MIN_LIST_WINDOW
            if total > LIST_PAGE_SIZE * LIST_MAX_PAGES:
                if splittable:
                    windows += window.halves()
                    continue
                if believe_totals:
                    believe_totals = False
                    _LOG.warning(
                        f"VTEX account {self.account!r}: List orders reports {total} orders in"
                        f" {window}, more than 30 pages serve, at the narrowest window"
                        f" ({MIN_LIST_WINDOW}): every window left is read as it is"
                    )
            window.add(entries, 1)
            for page in range(2, min(-(-total // LIST_PAGE_SIZE), LIST_MAX_PAGES) + 1):
                if not entries:  # an empty page: the pages after it are empty too
                    break
                _, entries = self._list_page(window, page)
                progress.page(len(entries))
                window.add(entries, page)
            if window.found < total and total > LIST_PAGE_SIZE and splittable:
                windows += window.halves()
                continue
            listing.add(window, total)
            progress.windows += 1
        return listing

    def get_order(self, order_id: str) -> Reply | None:
        """The order's detail; None when VTEX answers 404. An empty body is not an order:
        it fails like a request that keeps failing, and the order is read again later."""
        # Encoded whole: an id holding `/`, `?` or `#` must name that order, not another.
        path = f"{ORDERS_PATH}/{quote(order_id, safe='')}"
        reply = self.get(path, not_found_ok=True)
        if reply is not None and not reply.raw:
            raise self._malformed(path, "(Get order) answered an empty body")
        return reply

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

    def read_feed(self, maxlot: int = FEED_MAX_LOT) -> list[Any]:
        """Up to `maxlot` events as delivered (the drain checks each); VTEX hides them for the
        visibility timeout, then shows them again unless their handles were committed."""
        return self._json_list(self.get(FEED_PATH, params={"maxlot": maxlot}), FEED_PATH)

    def commit_feed(self, handles: Sequence[str]) -> None:
        """Delete delivered events by handle.

        VTEX documents no maximum per call; chunks of one lot are what a read hands out.
        """
        for start in range(0, len(handles), FEED_MAX_LOT):
            chunk = list(handles[start : start + FEED_MAX_LOT])
            self.request("POST", "/api/orders/feed", json_body={"handles": chunk})

    # -- listings ----------------------------------------------------------------------

    def _malformed(self, path: str, problem: str) -> MalformedEnvelope:
        return MalformedEnvelope(f"VTEX account {self.account!r}: GET {path} {problem}")

    def _json_list(self, reply: Reply | None, path: str) -> list[Any]:
        if reply is None or not isinstance(reply.data, list):
            raise self._malformed(path, f"answered {_shape(reply)}, not a JSON list")
        return reply.data

    def _integer_ids(self, values: Iterable[Any], path: str) -> list[int]:
        ids = []
        for value in values:
            number = _integer_id(value)
            if number is None:
                raise self._malformed(path, f"listed {str(value)[:40]!r}, which is not an id")
            ids.append(number)
        return ids

    def _single_attempt(self) -> VtexClient:
        """This client (its sessions, rate limit and counts) making each request once."""
        once = copy.copy(self)
        once.max_retries = 0
        return once

    # -- catalog -----------------------------------------------------------------------

    def product_ids(self) -> list[int]:
        listing = _Listing(self, PRODUCT_IDS_PATH)
        ids: set[int] = set()
        start = 1
        while True:
            reply = self.get(
                PRODUCT_IDS_PATH, params={"_from": start, "_to": start + CATALOG_WINDOW - 1}
            )
            body = reply.data if reply is not None else None
            window = body.get("data") if isinstance(body, dict) else None
            span = body.get("range") if isinstance(body, dict) else None
            total = _integer_id(span.get("total")) if isinstance(span, dict) else None
            if not isinstance(window, dict) or total is None:
                raise self._malformed(
                    PRODUCT_IDS_PATH,
                    f"answered {_shape(reply)} without a `data` object and a `range.total`",
                )
            listing.page(len(window))
            ids.update(self._integer_ids(window, PRODUCT_IDS_PATH))
            start += CATALOG_WINDOW
            if start > total:
                return sorted(ids)

    def get_product(self, product_id: int) -> Reply | None:
        return self.get(f"/api/catalog/pvt/product/{product_id}", not_found_ok=True)

    def sku_ids(self) -> list[int]:
        listing = _Listing(self, SKU_IDS_PATH)
        ids: set[int] = set()
        page = 1
        while True:
            reply = self.get(SKU_IDS_PATH, params={"page": page, "pagesize": SKU_PAGE_SIZE})
            batch = self._json_list(reply, SKU_IDS_PATH)
            if not batch:
                return sorted(ids)
            listing.page(len(batch))
            ids.update(self._integer_ids(batch, SKU_IDS_PATH))
            page += 1

    def get_sku(self, sku_id: int) -> Reply | None:
        return self.get(
            f"/api/catalog_system/pvt/sku/stockkeepingunitbyid/{sku_id}", not_found_ok=True
        )

    # -- Master Data -------------------------------------------------------------------

    def scroll_customers(self, updated_since: datetime | None = None) -> Iterator[list[Any]]:
        """Pages of CL documents in `updatedIn` order, optionally only those updated since a
        moment.

        Master Data's scroll token is a forward cursor on its side: every request made with it
        moves it on, whether or not its answer arrived, and it expires after 20 idle minutes.
        So when an answer is lost (reset, timeout, truncated or malformed body, 429, 5xx), the
        next answer to the token is taken, and the documents between the last page read and
        that answer, which the lost one may have held, are read by search; when Master Data
        refuses the token (expired), a new scroll starts after the last page read. A failure
        costs documents read twice, never a page skipped, and leaves no scroll open on VTEX
        (10 per account at most).
        """
        listing = _Listing(self, SCROLL_PATH)
        position = updated_since
        page, token = self._open_scroll(position)
        while page:
            listing.page(len(page))
            yield page
            last = _last_updated(page)
            if last is not None and (position is None or last > position):
                position = last
            if token is None:
                return
            page, token, lost = self._next_scroll_page(token, position)
            if lost:
                for missed in self._search_customers(position, _first_updated(page)):
                    listing.page(len(missed))
                    yield missed

    def _open_scroll(self, updated_after: datetime | None) -> tuple[list[Any], str | None]:
        """The first page of a scroll sorted by `updatedIn`, and its token: None when the page
        holds every document of the query (`REST-Content-Total`), so that the end is known
        without a token request that could fail."""
        params: dict[str, Any] = {
            "_size": SCROLL_SIZE,
            "_fields": CUSTOMER_FIELDS,
            "_sort": "updatedIn ASC",
        }
        if updated_after is not None:
            params["_where"] = f"updatedIn>{format_vtex_instant(updated_after - SCROLL_OVERLAP)}"
        reply = self.get(SCROLL_PATH, params=params, headers=_SCROLL)
        page = self._json_list(reply, SCROLL_PATH)
        assert reply is not None  # a list was answered
        total = reply.headers.get("REST-Content-Total", "")
        if total.isdigit() and len(page) >= int(total):
            return page, None
        token = reply.headers.get("X-VTEX-MD-TOKEN")
        if page and not token:
            raise self._malformed(
                SCROLL_PATH, "answered without the X-VTEX-MD-TOKEN header the next page needs"
            )
        return page, token

    def _next_scroll_page(
        self, token: str, position: datetime | None
    ) -> tuple[list[Any], str | None, bool]:
        """The scroll's next page and the token to go on with (a new scroll's when Master Data
        refused this one); True as well when answers were lost before it, each request having
        moved the cursor on: the documents between `position` and the page are unread."""
        once = self._single_attempt()
        lost = 0
        while True:
            try:
                reply = once.get(SCROLL_PATH, params={"_token": token}, headers=_SCROLL)
                return self._json_list(reply, SCROLL_PATH), token, lost > 0
            except VtexAuthError:
                raise
            except (VtexRequestFailed, MalformedBody, MalformedEnvelope) as error:
                lost += 1
                if lost > min(self.max_retries, MAX_LOST_SCROLL_ANSWERS):
                    raise VtexRequestFailed(
                        f"VTEX account {self.account!r}: GET {SCROLL_PATH} lost {lost} answers"
                        f" in a row (last: {error})"
                    ) from error
                time.sleep(self._backoff(lost))
            except VtexError:  # refused, as an expired token is
                page, fresh = self._open_scroll(position)
                return page, fresh, False

    def _search_customers(
        self, after: datetime | None, until: datetime | None
    ) -> Iterator[list[Any]]:
        """Pages of the CL documents updated after `after` and up to `until` (None: no bound),
        by search: it keeps no cursor, so its requests are retried like any other."""
        bounds = []
        if after is not None:
            bounds.append(f"updatedIn>{format_vtex_instant(after - SCROLL_OVERLAP)}")
        if until is not None:
            bounds.append(f"updatedIn<{format_vtex_instant(until + SCROLL_OVERLAP)}")
        params = {"_fields": CUSTOMER_FIELDS, "_sort": "updatedIn ASC"}
        if bounds:
            params["_where"] = " AND ".join(bounds)
        for start in range(0, SEARCH_REACH, SEARCH_PAGE_SIZE):
            headers = {**_SCROLL, "REST-Range": f"resources={start}-{start + SEARCH_PAGE_SIZE}"}
            reply = self.get(SEARCH_PATH, params=params, headers=headers)
            page = self._json_list(reply, SEARCH_PATH)
            if page:
                yield page
            if len(page) < SEARCH_PAGE_SIZE:
                return
        raise VtexRequestFailed(
            f"VTEX account {self.account!r}: GET {SEARCH_PATH} holds more than the"
            f" {SEARCH_REACH} documents a search reaches between {after} and {until}"
        )


_SCROLL = {"Accept": "application/vnd.vtex.ds.v10+json"}


@dataclass(frozen=True)
class ListedOrder:
    order_id: str
    created: datetime | None  # the list's creationDate, when readable
    status: str | None


@dataclass(frozen=True)
class UnlistedEntry:
    """A list entry without an orderId: what it was and where, kept for quarantine."""

    problem: str
    raw: str


@dataclass(frozen=True)
class Shortfall:
    """A window VTEX reported more orders for than its pages held."""

    window: str
    reported: int
    found: int


class _ListWindow:
    """One creation window of List orders, as its pages are read."""

    def __init__(self, start: datetime, end: datetime) -> None:
        self.start, self.end = start, end
        self.orders: dict[str, ListedOrder] = {}
        self.unlisted: dict[str, UnlistedEntry] = {}

    def __str__(self) -> str:
        return f"window {format_vtex_instant(self.start)} to {format_vtex_instant(self.end)}"

    @property
    def found(self) -> int:
        """Distinct entries read, those without an orderId included."""
        return len(self.orders) + len(self.unlisted)

    def halves(self) -> list[_ListWindow]:
        middle = self.start + (self.end - self.start) / 2
        return [_ListWindow(self.start, middle), _ListWindow(middle, self.end)]

    def add(self, entries: list[Any], page: int) -> None:
        for entry in entries:
            order_id = entry.get("orderId") if isinstance(entry, dict) else None
            if not isinstance(order_id, str) or not order_id:
                raw = orjson.dumps(entry).decode()
                problem = f"List orders entry without an orderId ({self}, page {page})"
                self.unlisted[raw] = UnlistedEntry(problem, raw)
                continue
            status = entry.get("status")
            self.orders[order_id] = ListedOrder(
                order_id,
                _instant(entry.get("creationDate")),
                status if isinstance(status, str) else None,
            )


@dataclass
class OrderListing:
    """What List orders answered over a span of time."""

    orders: dict[str, ListedOrder] = field(default_factory=dict)
    unlisted: list[UnlistedEntry] = field(default_factory=list)
    reported: int = 0  # paging.total, summed over the windows read whole
    shortfalls: list[Shortfall] = field(default_factory=list)

    def add(self, window: _ListWindow, total: int) -> None:
        self.orders.update(window.orders)
        self.unlisted += window.unlisted.values()
        self.reported += total
        if window.found < total:
            self.shortfalls.append(Shortfall(str(window), total, window.found))

    @property
    def unaccounted(self) -> int:
        """Orders VTEX reported that no page held."""
        return sum(s.reported - s.found for s in self.shortfalls)

    @property
    def newest(self) -> datetime | None:
        """The latest creation instant listed."""
        return max((o.created for o in self.orders.values() if o.created), default=None)


def _instant(value: Any) -> datetime | None:
    try:
        return parse_timestamp(value, "creationDate")
    except InvalidRecord:
        return None
