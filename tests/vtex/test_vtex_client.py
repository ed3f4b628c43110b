import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from cdp_assets.tenants.registry import Credentials, Tenant, TenantError
from cdp_assets.vtex.client import (
    ListingTooLong,
    MalformedEnvelope,
    RateLimiter,
    VtexClient,
    VtexError,
    VtexRequestFailed,
    format_vtex_instant,
    naming_tenant,
    retry_after_seconds,
)
from cdp_devkit.sandbox import SandboxProcess, StoreSpec, credentials_for

# Four pages of 1,000 CL documents and a little more; a catalog of several id pages.
SCROLLS = StoreSpec("scrolls", seed=31, customers=3500, orders=50, products=10)
LISTINGS = StoreSpec("listings", seed=32, customers=2500, orders=50, products=600)
MANY_SCROLLS = StoreSpec("manyscrolls", seed=33, customers=3500, orders=50, products=10)


def test_retry_after_in_seconds_or_as_a_date():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after_seconds(later) <= 30


def test_list_window_instants_are_utc_with_milliseconds():
    moment = datetime(2024, 1, 2, 0, 0, 0, 123456, tzinfo=UTC)
    assert format_vtex_instant(moment) == "2024-01-02T00:00:00.123Z"


def test_rate_limiter_holds_the_rate():
    limiter = RateLimiter(rate=50, burst=1)
    started = time.monotonic()
    for _ in range(26):
        limiter.acquire()
    # 25 tokens beyond the first at 50/s cannot take less than half a second.
    assert time.monotonic() - started >= 0.45


def test_proxy_and_ca_settings_come_from_the_environment_once(monkeypatch):
    """The session reads proxies and the CA bundle when it is made and never looks at the
    environment (or ~/.netrc) again per request."""
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "bypassed.example")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/agency.pem")
    credentials = Credentials("key", "token")
    proxied = VtexClient("acme", "https://acme.vtexcommercestable.com.br", credentials)._session()
    assert proxied.proxies["https"] == "http://proxy.internal:3128"
    assert proxied.verify == "/etc/ssl/certs/agency.pem" and proxied.trust_env is False
    bypassed = VtexClient("acme", "https://bypassed.example", credentials)._session()
    assert "https" not in bypassed.proxies
    for name in ("HTTPS_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    assert proxied.proxies["https"] == "http://proxy.internal:3128"  # read once, kept
    plain = VtexClient("acme", "https://plain.example", credentials)._session()
    assert plain.proxies == {} and plain.verify is True


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess([SCROLLS, LISTINGS, MANY_SCROLLS]) as server:
        yield server


@pytest.fixture
def faults(sandbox: SandboxProcess) -> Iterator[SandboxProcess]:
    yield sandbox
    sandbox.clear_faults()


def client_for(sandbox: SandboxProcess, account: str, **overrides) -> VtexClient:
    settings = {
        "requests_per_second": 5000,
        "timeout_seconds": 2,
        "backoff_base_seconds": 0.01,
        "backoff_cap_seconds": 0.05,
        **overrides,
    }
    return VtexClient(
        account, sandbox.account_url(account), Credentials(*credentials_for(account)), **settings
    )


def customers(sandbox: SandboxProcess, account: str) -> dict[str, datetime]:
    """The account's CL documents: id -> updatedIn."""
    return {
        record["key"]: datetime.fromisoformat(record["doc"]["updatedIn"])
        for record in sandbox.export(account, "customers")
    }


@pytest.mark.timeout(120)
def test_a_scroll_through_resets_and_expired_tokens_skips_no_page(faults):
    """A token request that failed may have moved Master Data's cursor on: asking again with
    the token would get the next page. Every document is read all the same."""
    client = client_for(faults, "scrolls", max_retries=10)
    truth = customers(faults, "scrolls")
    since = sorted(truth.values())[len(truth) // 3]
    before = faults.stats()["accounts"]["scrolls"]["faults"]
    faults.set_faults({"seed": 4, "rate_reset": 0.3, "routes": ["masterdata"]})
    read = [doc["id"] for page in client.scroll_customers() for doc in page]
    faults.set_faults(
        {"seed": 6, "rate_truncate": 0.3, "expire_scroll_after_pages": 1, "routes": ["masterdata"]}
    )
    changed = [doc["id"] for page in client.scroll_customers(since) for doc in page]
    injected = faults.stats()["accounts"]["scrolls"]["faults"]
    assert injected.get("reset", 0) > before.get("reset", 0)
    assert injected.get("truncate", 0) > before.get("truncate", 0)
    assert set(read) == set(truth)
    assert {key for key, updated in truth.items() if updated > since} <= set(changed)
    assert all(truth[key] > since - timedelta(milliseconds=2) for key in changed)


@pytest.mark.timeout(120)
def test_lost_scroll_answers_leave_no_scroll_open_on_vtex(faults):
    """Master Data keeps at most 10 scrolls of an account open, an abandoned one for 20 idle
    minutes: more answers are lost than that, and every scroll still reads every document."""
    client = client_for(faults, "manyscrolls", max_retries=10)
    truth = set(customers(faults, "manyscrolls"))
    faults.set_faults({"seed": 8, "rate_reset": 0.2, "routes": ["masterdata"]})
    for _ in range(6):
        assert {doc["id"] for page in client.scroll_customers() for doc in page} == truth
    assert faults.stats()["accounts"]["manyscrolls"]["faults"]["reset"] > 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("listing", "path"),
    [
        (VtexClient.sku_ids, "stockkeepingunitids"),
        (VtexClient.product_ids, "GetProductAndSkuIds"),
        (lambda client: [page for page in client.scroll_customers()], "dataentities/CL/scroll"),
    ],
    ids=["sku ids", "product windows", "scroll"],
)
def test_a_listing_that_never_ends_fails_on_its_page_budget(faults, listing, path):
    client = client_for(faults, "listings")
    client.max_listing_pages = 12
    faults.set_faults({"endless_listings": True})
    started = time.monotonic()
    with pytest.raises(ListingTooLong) as raised:
        listing(client)
    message = str(raised.value)
    assert "'listings'" in message and path in message and "after 12 pages" in message
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
def test_a_long_listing_logs_its_progress(faults, caplog):
    client = client_for(faults, "listings", timeout_seconds=5)
    client.progress_every_seconds = 0.2
    faults.set_faults({"rate_slow": 1.0, "slow_seconds": 0.25, "routes": ["catalog"]})
    with caplog.at_level(logging.INFO, logger="dagster.builtin.vtex"):
        ids = client.product_ids()
    lines = [r.getMessage() for r in caplog.records if "GetProductAndSkuIds" in r.getMessage()]
    assert len(ids) == 600 and len(lines) >= 2
    assert "'listings'" in lines[-1] and "pages" in lines[-1] and "records" in lines[-1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("route", "defect", "call", "problem"),
    [
        ("scroll_documents", "empty_body", "scroll", "an empty body, not a JSON list"),
        ("scroll_documents", "wrong_type", "scroll", "a JSON object, not a JSON list"),
        ("scroll_documents", "no_token_header", "scroll", "without the X-VTEX-MD-TOKEN"),
        ("sku_ids", "wrong_type", "skus", "a JSON object, not a JSON list"),
        ("product_and_sku_ids", "empty_body", "products", "an empty body without a `data`"),
        ("product_and_sku_ids", "wrong_type", "products", "a JSON list without a `data`"),
    ],
)
def test_a_malformed_envelope_is_a_clear_error(faults, route, defect, call, problem):
    client = client_for(faults, "listings")
    faults.set_faults({"malformed_envelopes": {route: defect}})
    calls = {
        "scroll": lambda: next(client.scroll_customers()),
        "skus": client.sku_ids,
        "products": client.product_ids,
    }
    with pytest.raises(MalformedEnvelope) as raised:
        calls[call]()
    message = str(raised.value)
    assert "account 'listings'" in message and "GET /api/" in message and problem in message


def test_an_order_id_is_encoded_in_the_path(sandbox):
    """An id holding `?` or `#` names that order (none here), not the one before them."""
    client = client_for(sandbox, "listings")
    real = min(client.list_orders(datetime(2020, 1, 1, tzinfo=UTC), datetime.now(UTC)).orders)
    assert client.get_order(real).data["orderId"] == real
    for odd in (f"{real}?x=1", f"{real}#top", f"{real} "):
        assert client.get_order(odd) is None, odd


def test_errors_of_a_tenant_name_it():
    with (
        pytest.raises(VtexError, match="^tenant 'acme_ar': VTEX account"),
        naming_tenant("acme_ar"),
    ):
        raise MalformedEnvelope("VTEX account 'acme': GET /api/orders/feed answered ...")


def an_order_id(sandbox: SandboxProcess) -> str:
    client = client_for(sandbox, "listings")
    return min(client.list_orders(datetime(2020, 1, 1, tzinfo=UTC), datetime.now(UTC)).orders)


def test_retry_after_is_read_as_rfc_9110_writes_it():
    """delta-seconds, or an HTTP date in each form the RFC asks recipients to read: the
    preferred one, RFC 850's, asctime's (no zone: UTC), and RFC 5322's zones (-0000: UTC)."""
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert retry_after_seconds("120", now) == 120
    for date in (
        "Thu, 01 Jan 2026 12:00:30 GMT",
        "Thursday, 01-Jan-26 12:00:30 GMT",
        "Thu Jan  1 12:00:30 2026",
        "Thu, 01 Jan 2026 12:00:30 -0000",
        "Thu, 01 Jan 2026 09:00:30 -0300",
    ):
        assert retry_after_seconds(date, now) == 30, date
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0  # already past
    for unreadable in ("1.5", "-3", "inf", "nan", "soon", "", None):
        assert retry_after_seconds(unreadable, now) is None, unreadable


@pytest.mark.timeout(60)
def test_credentials_never_follow_a_redirect_to_another_origin(faults):
    """A 302 to another host is not followed (requests would carry the app key and token
    along) and fails naming the host; a redirect within the origin is followed."""
    order_id = an_order_id(faults)
    key, token = credentials_for("listings")
    client = client_for(faults, "listings")
    # The sandbox's own capture endpoint, reached under another host name: another origin.
    elsewhere = faults.base_url.replace("127.0.0.1", "localhost")
    faults.set_faults({"redirect": {"get_order": elsewhere}})
    with pytest.raises(VtexError, match=r"redirect to another origin \(localhost\)") as refused:
        client.get_order(order_id)
    assert order_id not in str(refused.value).split("answered")[-1]  # not the target's path
    captured = faults.captured()
    assert not [r for r in captured if token in str(r) or key in str(r)], captured
    faults.set_faults({"redirect": {"get_order": faults.base_url}})
    assert client.get_order(order_id).data["list"] == []  # what the capture endpoint answers
    assert len(faults.captured()) == len(captured) + 1


@pytest.mark.timeout(60)
def test_an_error_body_echoing_the_headers_is_quoted_masked(faults):
    faults.set_faults({"echo_headers": ["get_order"]})
    key, token = credentials_for("listings")
    with pytest.raises(VtexError, match="HTTP 400") as raised:
        client_for(faults, "listings").get_order(an_order_id(faults))
    assert "x-vtex-api-apptoken" in str(raised.value)  # the echo is quoted
    assert token not in str(raised.value) and key not in str(raised.value)


@pytest.mark.timeout(60)
def test_an_answer_dripped_byte_by_byte_fails_within_the_deadline(faults):
    """Each byte comes well within the per-read timeout; the request's deadline ends it."""
    order_id = an_order_id(faults)
    faults.set_faults({"drip": {"get_order": 0.2}})
    client = client_for(faults, "listings", timeout_seconds=1, deadline_seconds=1.5, max_retries=1)
    started = time.monotonic()
    with pytest.raises(VtexRequestFailed, match="no complete answer within 1.5 s"):
        client.get_order(order_id)
    assert time.monotonic() - started < 2 * 1.5 + 1


@pytest.mark.timeout(60)
def test_a_429_without_retry_after_rests_the_account_for_the_backoff(faults):
    """VTEX recommends a minute; here a second, configured."""
    order_id = an_order_id(faults)
    faults.set_faults({"rate_429": 1.0, "retry_after_form": "none"})
    client = client_for(faults, "listings", throttle_backoff_seconds=1.0, max_retries=1)
    started = time.monotonic()
    with pytest.raises(VtexRequestFailed, match="HTTP 429"):
        client.get_order(order_id)
    assert 1.0 <= time.monotonic() - started < 2.5


@pytest.mark.timeout(60)
def test_a_retry_after_given_as_an_http_date_is_honoured(faults):
    order_id = an_order_id(faults)
    faults.set_faults({"rate_429": 1.0, "retry_after_form": "date", "retry_after": 2})
    client = client_for(faults, "listings", max_retries=1)
    started = time.monotonic()
    with pytest.raises(VtexRequestFailed, match="HTTP 429"):
        client.get_order(order_id)
    # The date has whole seconds: 2 s from now, less the fraction of the current second.
    assert 1.0 <= time.monotonic() - started < 3.5


@pytest.mark.parametrize(
    "value", ["token-ending-in-a-newline\n", " token-after-a-space", "tok\x1b[31mx"]
)
def test_a_credential_with_whitespace_or_control_characters_is_refused(monkeypatch, value):
    """Named by its variable, never quoted: requests would refuse it in a header with an error
    quoting it."""
    monkeypatch.setenv("VTEX_ODD_KEY", "vtexappkey-odd-KEY")
    monkeypatch.setenv("VTEX_ODD_TOKEN", value)
    tenant = Tenant("odd_tenant", "odd", "VTEX_ODD_KEY", "VTEX_ODD_TOKEN")
    with pytest.raises(TenantError, match="VTEX_ODD_TOKEN") as raised:
        tenant.credentials()
    assert value.strip() not in str(raised.value)


@pytest.mark.timeout(60)
def test_a_list_whose_totals_lie_is_read_in_bounded_requests_and_reported(faults, caplog):
    """Totals VTEX's pages never hold: small windows are not split (they cannot have shifted),
    and windows past 3,000 are split only down to MIN_LIST_WINDOW. What is missing is
    recorded, and a long listing reports its progress."""
    end = datetime.now(UTC)
    start = end - timedelta(days=600)
    truth = {
        record["key"]
        for record in faults.export("listings", "orders")
        if start <= datetime.fromisoformat(record["doc"]["creationDate"]) <= end
    }
    for excess in (5, 5000):
        faults.set_faults({"list_total_excess": excess})
        client = client_for(faults, "listings")
        client.progress_every_seconds = 0  # a line per page
        with caplog.at_level(logging.INFO):
            listing = client.list_orders(start, end)
        assert set(listing.orders) == truth and truth
        assert listing.shortfalls and listing.unaccounted >= excess
        assert client.stats.requests < 100
    assert "windows" in caplog.text and "more than 30 pages serve" in caplog.text
