"""Master Data's scroll, the catalog's id listings and the orders feed against a hostile VTEX:
no page skipped when a scroll token request fails, no listing that runs without end, no feed
event that blocks the others or loses an order's change, and every run ends within a bound.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support import THIS_MONTH, months_ago, register, sync, vtex_for
from truth import compare, cursor_gaps

from cdp_assets.partitions import order_months
from cdp_assets.vtex.client import ListingTooLong
from cdp_assets.vtex.feed import FEED_READ_ATTEMPTS, FeedSettings, drain_feed, turn_feed_on
from cdp_assets.vtex.sync import PRODUCTS, SKUS, sync_catalog, sync_customers
from cdp_devkit.sandbox import SandboxProcess, StoreSpec
from cdp_devkit.sandbox.vtex.faults import FEED_EVENT_DEFECTS


def store(account: str, seed: int, customers: int, orders: int, products: int) -> StoreSpec:
    return StoreSpec(
        account,
        seed,
        customers,
        orders,
        products,
        history_start=months_ago(2),
        history_end=THIS_MONTH,
    )


SCROLLS = store("mdscroll", 51, customers=3500, orders=40, products=5)  # 4 scroll pages and more
ENDLESS = store("endless", 52, customers=2500, orders=40, products=300)
FEED = store("feedhostile", 53, customers=60, orders=150, products=5)
MONTHS = (FEED.history_start.isoformat(), order_months.get_last_partition_key())
CLIENT = {"timeout_seconds": 1.0, "max_retries": 10, "backoff_cap_seconds": 0.1}
PAGE_BUDGET = 40


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([SCROLLS, ENDLESS, FEED]) as server:
        yield server


def injected(sandbox: SandboxProcess, account: str) -> Counter[str]:
    return Counter(sandbox.stats()["accounts"][account]["faults"])


SCROLL_FAULTS = {
    "resets": ({"seed": 1, "rate_reset": 0.3}, "reset x{resets} on the scroll and its searches"),
    "expired tokens": (
        {"seed": 3, "expire_scroll_after_pages": 2, "rate_truncate": 0.1},
        "every token expired after 2 pages, truncate x{truncates}",
    ),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scenario", list(SCROLL_FAULTS))
def test_a_customers_sync_through_a_failing_scroll_skips_no_page(
    conn, instance, sandbox, reliability_report, scenario
):
    """A reset or truncated answer to a token request has moved Master Data's cursor on, and
    a token expires: the scroll starts again where the pages read end, and the customers
    cursor moves only once everything landed."""
    tenant_id = "md_scroll_" + scenario.replace(" ", "_")
    register(conn, tenant_id, SCROLLS.account, history_start=SCROLLS.history_start)
    before = injected(sandbox, SCROLLS.account)
    config, described = SCROLL_FAULTS[scenario]
    sandbox.set_faults({**config, "routes": ["masterdata"]})
    try:
        results = sync(
            instance, sandbox, tenant_id, vtex=vtex_for(sandbox, **CLIENT), entities=("customers",)
        )
    finally:
        sandbox.clear_faults()
    faults = injected(sandbox, SCROLLS.account) - before
    comparison = compare(conn, sandbox, tenant_id, SCROLLS.account, ("customers",))
    gaps = cursor_gaps(conn, tenant_id)
    succeeded = results["customers"].success
    reliability_report.record(
        f"api faults: {scenario} on the Master Data scroll",
        faults=described.format(resets=faults["reset"], truncates=faults["truncate"]),
        checked=comparison.checked,
        lost=comparison.lost + gaps,
        duplicates=comparison.duplicates,
        passed=succeeded and comparison.exact,
    )
    assert succeeded and (faults["reset"] or faults["truncate"])
    assert comparison.exact, comparison
    assert gaps == 0


@pytest.mark.timeout(120)
def test_listings_that_never_end_fail_on_their_page_budget(conn, sandbox, reliability_report):
    """stockkeepingunitids, GetProductAndSkuIds and the scroll never reach their end: each sync
    fails within its page budget, naming tenant, endpoint and pages, and lands nothing."""
    tenant_id = "endless_listings"
    tenant = register(conn, tenant_id, ENDLESS.account, history_start=ENDLESS.history_start)
    client = vtex_for(sandbox, **CLIENT).client_for(tenant)
    client.max_listing_pages = PAGE_BUDGET
    syncs = {
        "stockkeepingunitids": lambda: sync_catalog(client, conn, tenant_id, "endless", SKUS),
        "GetProductAndSkuIds": lambda: sync_catalog(client, conn, tenant_id, "endless", PRODUCTS),
        "dataentities/CL/scroll": lambda: sync_customers(client, conn, tenant_id, "endless", None),
    }
    sandbox.set_faults({"endless_listings": True})
    bounded: list[str] = []
    started = time.monotonic()
    try:
        for endpoint, run in syncs.items():
            with pytest.raises(ListingTooLong) as raised:
                run()
            message = str(raised.value)
            if f"tenant {tenant_id!r}" in message and endpoint in message:
                bounded.append(endpoint)
    finally:
        sandbox.clear_faults()
    seconds = time.monotonic() - started
    (landed,) = conn.execute(
        "SELECT (SELECT count(*) FROM raw_vtex.skus WHERE tenant_id = %(t)s)"
        " + (SELECT count(*) FROM raw_vtex.products WHERE tenant_id = %(t)s)",
        {"t": tenant_id},
    ).fetchone()
    reliability_report.record(
        "api faults: SKU ids, product windows and a scroll that never end",
        faults=f"3 endless listings, a budget of {PAGE_BUDGET} pages each ({seconds:.1f} s)",
        checked=len(syncs),
        lost=len(syncs) - len(bounded),
        duplicates=0,
        passed=bounded == list(syncs) and landed == 0,
    )
    assert bounded == list(syncs)
    assert landed == 0  # the id listing fails before any detail is fetched
    assert seconds < 60


def reread_rows(conn: psycopg.Connection, tenant_id: str) -> int:
    (count,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.orders_to_reread WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    return count


@pytest.mark.timeout(180)
def test_malformed_and_unreadable_feed_events_lose_no_change(
    conn, instance, sandbox, reliability_report
):
    """Broken deliveries are quarantined and committed; an order whose Get answers 404 and
    one whose Get keeps failing hold back only their own events, then are read again by id;
    once VTEX serves them, the warehouse equals the store, and the feed is empty."""
    tenant_id = "feed_hostile"
    tenant = register(conn, tenant_id, FEED.account, history_start=FEED.history_start)
    sync(instance, sandbox, tenant_id, entities=("orders",), months=MONTHS)
    client = vtex_for(sandbox, **{**CLIENT, "max_retries": 2}).client_for(tenant)
    turn_feed_on(conn, client, tenant_id, FeedSettings(visibility_timeout_seconds=1))
    at = datetime.now(UTC) - timedelta(minutes=10)
    changed = sandbox.mutate(FEED.account, seed=4, changed=30, new=0, at=at)
    missing, failing = changed[0], changed[1]
    faults = {
        "feed_event_defects": list(FEED_EVENT_DEFECTS),
        "failing_orders": {missing: "404", failing: "5xx"},
    }
    sandbox.set_faults(faults)
    drains = []
    try:
        # As the sensor would: a drain a little after the visibility timeout, until the
        # orders that cannot be read are left to the re-reads by id.
        for _ in range(FEED_READ_ATTEMPTS + 2):
            drains.append(drain_feed(conn, client, tenant_id, "reliability"))
            if client.feed_config()["quantity"] == 0:
                break
            time.sleep(1.1)
        committed_while_unreadable = client.feed_config()["quantity"] == 0
        waiting = reread_rows(conn, tenant_id)
    finally:
        sandbox.clear_faults()
    # VTEX serves both orders again, and one of them changes once more.
    sandbox.mutate(FEED.account, seed=5, changed=10, new=0, at=at + timedelta(minutes=5))
    for _ in range(3):
        drains.append(drain_feed(conn, client, tenant_id, "reliability"))
        if client.feed_config()["quantity"] == 0 and reread_rows(conn, tenant_id) == 0:
            break
        time.sleep(1.1)

    comparison = compare(conn, sandbox, tenant_id, FEED.account, ("orders",))
    (quarantined,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.rejects WHERE tenant_id = %s AND entity = 'orders_feed'",
        (tenant_id,),
    ).fetchone()
    empty = client.feed_config()["quantity"] == 0 and reread_rows(conn, tenant_id) == 0
    reliability_report.record(
        "api faults: malformed feed events, orders whose Get fails",
        faults=f"{len(FEED_EVENT_DEFECTS)} broken deliveries, a 404 and a failing Get order"
        f" for {len(drains)} drains",
        checked=comparison.checked,
        lost=comparison.lost,
        duplicates=comparison.duplicates,
        passed=comparison.exact and empty and quarantined == len(FEED_EVENT_DEFECTS),
    )
    assert sum(d.malformed_events for d in drains) == quarantined == len(FEED_EVENT_DEFECTS)
    assert committed_while_unreadable and waiting == 2
    assert comparison.exact, comparison
    assert empty
