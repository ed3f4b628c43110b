"""API faults during ingestion: whatever VTEX does on the wire, the warehouse converges to the
sandbox's truth, with no duplicate keys and no cursor claiming data that is not there."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from support import THIS_MONTH, metadata, months_ago, register, sync, vtex_for
from truth import compare, cursor_gaps, cursors, load_truth, moved_back

from cdp_assets.partitions import month_start, order_months
from cdp_assets.vtex import resources
from cdp_assets.vtex.assets import OVERLAP
from cdp_assets.vtex.client import OrderListing, VtexClient
from cdp_assets.vtex.feed import FeedSettings, drain_feed, turn_feed_on
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

# Two dense months, the two before this one: order-list windows span several pages (100
# orders each), so duplicated and reordered pages happen; 1,200 customers make the Master Data
# scroll two pages long.
FAULTS_START = months_ago(2)
FAULTS = StoreSpec(
    account="apifaults",
    seed=21,
    customers=1200,
    orders=300,
    products=20,
    history_start=FAULTS_START,
    history_end=THIS_MONTH,
)
# Only the months the stores have: every month partition of a run costs Dagster events.
MONTHS = (FAULTS_START.isoformat(), order_months.get_last_partition_key())
# One month in the past: a list call sees the whole store, so orders changed right after it
# are all orders whose detail call comes later. The store ends at the month's last day.
CHANGE_MONTH = months_ago(18).isoformat()
CHANGE = StoreSpec(
    account="apichange",
    seed=22,
    customers=100,
    orders=300,
    products=10,
    history_start=months_ago(18),
    history_end=month_start(THIS_MONTH, 17) - timedelta(days=1),
)
FEED = StoreSpec(
    account="apifeed",
    seed=23,
    customers=80,
    orders=150,
    products=10,
    history_start=FAULTS_START,
    history_end=THIS_MONTH,
)

# Patient retries and short waits: faults are frequent here, time is not what is measured. A
# 429 rests the whole account (VTEX asks for a minute without Retry-After): a tenth of a second.
CLIENT = {
    "timeout_seconds": 0.4,
    "max_retries": 15,
    "backoff_cap_seconds": 0.15,
    "step_retry_base_seconds": 0.1,
    "throttle_backoff_seconds": 0.1,
    "max_retry_after_seconds": 0.1,
}
PROFILES: dict[str, dict[str, Any]] = {
    "429 storm": {"rate_429": 0.3, "retry_after": 1},
    "429s without Retry-After": {"rate_429": 0.2, "retry_after_form": "none"},
    "429s with Retry-After as an HTTP date": {
        "rate_429": 0.2,
        "retry_after": 1,
        "retry_after_form": "date",
    },
    "5xx bursts": {"rate_5xx": 0.4},
    "resets and read timeouts": {"rate_reset": 0.15, "rate_slow": 0.03, "slow_seconds": 1.0},
    "truncated JSON bodies": {"rate_truncate": 0.3},
    "duplicated and reordered pages": {"duplicate_pages": True, "reorder_pages": True},
}
# Every fault at once, for the long randomized runs.
MIXED = {
    "rate_429": 0.1,
    "retry_after": 1,
    "rate_5xx": 0.1,
    "rate_reset": 0.05,
    "rate_truncate": 0.05,
    "rate_slow": 0.02,
    "slow_seconds": 1.0,
    "duplicate_pages": True,
    "reorder_pages": True,
}
# The sandbox's fault counter each option feeds.
COUNTED = {
    "rate_429": "429",
    "rate_5xx": "5xx",
    "rate_reset": "reset",
    "rate_truncate": "truncate",
    "rate_slow": "slow",
    "reorder_pages": "reorder_pages",
}


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([FAULTS, CHANGE, FEED]) as server:
        yield server


def injected(sandbox: SandboxProcess, account: str) -> Counter[str]:
    """Faults the sandbox has delivered to an account so far, by kind."""
    return Counter(sandbox.stats()["accounts"][account]["faults"])


def describe(faults: Counter[str], config: dict[str, Any]) -> str:
    parts = [f"{kind} x{count}" for kind, count in sorted(faults.items())]
    if config.get("rate_429"):
        form = config.get("retry_after_form", "seconds")
        parts.append(
            {"none": "no Retry-After", "date": "Retry-After as an HTTP date"}.get(
                form, f"Retry-After {config.get('retry_after', 1)} s"
            )
        )
    if config.get("duplicate_pages"):
        parts.append("duplicated pages")
    return ", ".join(parts)


def rejects(conn: psycopg.Connection, tenant_id: str) -> int:
    (count,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.rejects WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    return count


def sync_through_faults(
    conn, instance, sandbox, reliability_report, tenant_id: str, scenario: str, config: dict
) -> None:
    """A full sync of a new tenant while the sandbox injects `config`, then the checks."""
    register(conn, tenant_id, FAULTS.account, history_start=FAULTS_START)
    before = injected(sandbox, FAULTS.account)
    sandbox.set_faults(config)
    try:
        vtex = vtex_for(sandbox, **CLIENT)
        results = sync(instance, sandbox, tenant_id, vtex=vtex, months=MONTHS)
    finally:
        sandbox.clear_faults()
    faults = injected(sandbox, FAULTS.account) - before
    comparison = compare(conn, sandbox, tenant_id, FAULTS.account)
    gaps = cursor_gaps(conn, tenant_id)
    quarantined = rejects(conn, tenant_id)
    succeeded = all(result.success for result in results.values())
    reliability_report.record(
        f"api faults: {scenario}",
        faults=describe(faults, config),
        checked=comparison.checked,
        lost=comparison.lost + gaps,
        duplicates=comparison.duplicates,
        passed=succeeded and comparison.exact and quarantined == 0,
    )
    assert succeeded
    assert comparison.exact, comparison
    assert gaps == 0
    # A body still truncated after every retry would have been quarantined instead of landed.
    assert quarantined == 0
    expected = {kind for option, kind in COUNTED.items() if config.get(option)}
    assert expected <= set(faults), faults  # every fault asked for was really delivered
    if config.get("rate_429"):
        assert metadata(results["orders"])["api_429_responses"] > 0


@pytest.mark.parametrize("scenario", list(PROFILES))
def test_sync_converges_through_api_faults(conn, instance, sandbox, reliability_report, scenario):
    tenant_id = "api_" + re.sub(r"\W+", "_", scenario.lower())
    config = {"seed": 7, **PROFILES[scenario]}
    sync_through_faults(conn, instance, sandbox, reliability_report, tenant_id, scenario, config)


@pytest.mark.long
@pytest.mark.parametrize("seed", range(1, 9))
def test_sync_converges_through_every_fault_at_once(
    conn, instance, sandbox, reliability_report, seed
):
    config = {"seed": seed, **MIXED}
    scenario = f"every fault at once (seed {seed})"
    sync_through_faults(
        conn, instance, sandbox, reliability_report, f"api_mixed_{seed}", scenario, config
    )


def test_an_order_changed_between_list_and_detail_lands_in_its_newest_state(
    conn, instance, sandbox, reliability_report, monkeypatch
):
    tenant_id = "api_list_detail"
    register(conn, tenant_id, CHANGE.account, history_start=CHANGE.history_start)
    mutated: list[str] = []

    class ChangesAfterListing(VtexClient):
        """Changes orders in the store right after the first list call: their detail calls
        then answer a newer version than the one listed, and new orders appear inside a
        window already listed (as VTEX's lagging list index does)."""

        def list_orders(self, start: datetime, end: datetime) -> OrderListing:
            listed = super().list_orders(start, end)
            if not mutated:
                at = CHANGE.history_end - timedelta(hours=12)
                mutated.extend(sandbox.mutate(CHANGE.account, seed=3, changed=25, new=6, at=at))
            return listed

    monkeypatch.setattr(resources, "VtexClient", ChangesAfterListing)
    month = (CHANGE_MONTH, CHANGE_MONTH)
    sync(instance, sandbox, tenant_id, entities=("orders",), months=month)
    changed, new = mutated[:25], mutated[25:]
    load_truth(conn, sandbox, CHANGE.account, ("orders",))
    stale = conn.execute(
        "SELECT count(*) FROM truth t WHERE t.key = ANY(%s) AND NOT EXISTS (SELECT 1 FROM"
        " raw_vtex.orders o WHERE o.tenant_id = %s AND o.order_id = t.key"
        " AND o.payload = t.payload)",
        (changed, tenant_id),
    ).fetchone()[0]
    # New orders were created after the list call, inside the window it listed: missing now,
    # but within the overlap the next run re-reads, never behind it.
    gaps, gaps_past_overlap = cursor_gaps(conn, tenant_id), cursor_gaps(conn, tenant_id, OVERLAP)
    first_cursors = cursors(conn, tenant_id)

    second = sync(instance, sandbox, tenant_id, entities=("orders",), months=month)
    comparison = compare(conn, sandbox, tenant_id, CHANGE.account, ("orders",))
    back = moved_back(first_cursors, cursors(conn, tenant_id))
    reliability_report.record(
        "api faults: orders changed between list and detail",
        faults=f"{len(changed)} orders changed and {len(new)} created after the list call",
        checked=comparison.checked,
        lost=comparison.lost + stale + gaps_past_overlap,
        duplicates=comparison.duplicates,
        passed=comparison.exact and not back and gaps == len(new),
    )
    assert stale == 0  # every changed order landed as its detail call answered: the newest
    assert (gaps, gaps_past_overlap) == (len(new), 0)
    assert metadata(second["orders"])["rows_inserted"] == len(new)
    assert comparison.exact, comparison
    assert not back


def test_redelivered_and_out_of_order_feed_events_converge(
    conn, instance, sandbox, reliability_report
):
    tenant_id = "api_feed"
    tenant = register(conn, tenant_id, FEED.account, history_start=FEED.history_start)
    sync(instance, sandbox, tenant_id, entities=("orders",), months=MONTHS)
    client = vtex_for(sandbox, **CLIENT).client_for(tenant)
    turn_feed_on(conn, client, tenant_id, FeedSettings(visibility_timeout_seconds=1))
    at = datetime.now(UTC) - timedelta(minutes=10)
    sandbox.mutate(FEED.account, seed=1, changed=40, new=5, at=at)
    # A drain that read the whole queue and died before committing: VTEX shows those events
    # again once their visibility timeout is over, after the newer events of the same orders
    # that the second change (of every order that can still change) queues meanwhile.
    delivered: list[dict] = []
    while lot := client.read_feed():
        delivered.extend(lot)
    sandbox.mutate(FEED.account, seed=2, changed=FEED.orders, new=0, at=at + timedelta(minutes=5))

    read = client.read_feed

    def recorded_read(maxlot: int) -> list[dict]:
        lot = read(maxlot)
        delivered.extend(lot)
        return lot

    client.read_feed = recorded_read
    config = {"seed": 5, "duplicate_feed_events": True, "rate_5xx": 0.2, "rate_reset": 0.1}
    sandbox.set_faults({**config, "routes": ["feed", "orders"]})
    drains = []
    try:
        # Resets hide the events of a lost read for the visibility timeout: drain until the
        # queue is empty, as the sensor's next runs would.
        for _ in range(10):
            drains.append(drain_feed(conn, client, tenant_id, "reliability"))
            if client.feed_config()["quantity"] == 0:
                break
            time.sleep(1.1)
    finally:
        sandbox.clear_faults()

    seen: set[str] = set()
    latest: dict[str, str] = {}
    redelivered = out_of_order = 0
    for event in delivered:
        redelivered += event["eventId"] in seen
        seen.add(event["eventId"])
        order = event["orderId"]
        out_of_order += latest.get(order, "") > event["currentChange"]
        latest[order] = max(latest.get(order, ""), event["currentChange"])
    comparison = compare(conn, sandbox, tenant_id, FEED.account, ("orders",))
    empty = client.feed_config()["quantity"] == 0
    reliability_report.record(
        "api faults: redelivered and out-of-order feed events",
        faults=f"{len(delivered)} deliveries: {redelivered} redelivered, {out_of_order} older"
        " than an event already delivered for the order; 5xx and resets on the feed",
        checked=comparison.checked,
        lost=comparison.lost,
        duplicates=comparison.duplicates,
        passed=comparison.exact and empty,
    )
    assert redelivered > 0 and out_of_order > 0  # the scenario really happened
    assert comparison.exact, comparison
    assert empty  # every event, the abandoned ones included, was committed in the end
