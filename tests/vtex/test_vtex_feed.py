"""VTEX orders feed v3: configured per tenant, drained by a sensor-launched run, at least once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import orjson
import psycopg
import pytest
from click.testing import CliRunner
from support import HISTORY_START, metadata, register, vtex_for

from cdp_assets.analytics.feed_changes import FeedChanges, read_landings
from cdp_assets.cli import main
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.tenants.registry import Tenant
from cdp_assets.vtex.assets import TENANTS_LANDED, vtex_orders_feed
from cdp_assets.vtex.client import VtexClient, VtexError
from cdp_assets.vtex.feed import (
    FEED_READ_ATTEMPTS,
    FeedError,
    FeedSettings,
    FeedState,
    drain_feed,
    turn_feed_off,
    turn_feed_on,
)
from cdp_assets.vtex.sensors import (
    IDLE_POLL,
    due_feeds,
    feed_block_requests,
    vtex_orders_feed_sensor,
)
from cdp_assets.vtex.sync import Landing, sync_orders
from cdp_devkit.sandbox import SandboxProcess, StoreSpec
from cdp_devkit.sandbox.vtex.faults import FEED_EVENT_DEFECTS

ACCOUNTS = (
    "feedcli",
    "feedland",
    "feeddup",
    "feedretry",
    "feedorder",
    "feedgone",
    "senseon",
    "senseoff",
    "feedbroken",
    "feedmissing",
    "feedfail404",
    "feedfail5xx",
    "feedfailbody",
    "feedobject",
    "feedowna",
    "feedownb",
    "feedblocka",
    "feedblockb",
    "feedcurrent",
)


@pytest.fixture(scope="module")
def sandbox():
    # One store per test: VTEX keeps one feed per appKey, and a test's queue must be its own.
    specs = [
        StoreSpec(
            account=account,
            seed=seed,
            customers=60,
            orders=200,
            products=5,
            history_start=HISTORY_START,
        )
        for seed, account in enumerate(ACCOUNTS, start=40)
    ]
    with SandboxProcess(specs) as server:
        yield server


def client_for(sandbox: SandboxProcess, tenant: Tenant) -> VtexClient:
    return vtex_for(sandbox).client_for(tenant)


def enable_feed(
    conn: psycopg.Connection, sandbox: SandboxProcess, tenant: Tenant, **settings
) -> VtexClient:
    client = client_for(sandbox, tenant)
    turn_feed_on(conn, client, tenant.tenant_id, FeedSettings(**settings))
    return client


def change_orders(sandbox: SandboxProcess, account: str, changed: int, new: int) -> list[str]:
    at = datetime.now(UTC) - timedelta(minutes=5)
    return sandbox.mutate(account, seed=7, changed=changed, new=new, at=at)


def drain(instance: dg.DagsterInstance, sandbox: SandboxProcess, tenant_id: str, **vtex):
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    return dg.materialize(
        [vtex_orders_feed],
        partition_key=tenant_id,
        instance=instance,
        resources={"warehouse": WarehouseResource(), "vtex": vtex_for(sandbox, **vtex)},
        raise_on_error=False,
    )


def statuses(conn: psycopg.Connection, tenant_id: str, order_ids: list[str]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT order_id, payload->>'status' FROM raw_vtex.orders"
        " WHERE tenant_id = %s AND order_id = ANY(%s)",
        (tenant_id, order_ids),
    )
    return dict(rows.fetchall())


def truth_statuses(sandbox: SandboxProcess, account: str, order_ids: list[str]) -> dict[str, str]:
    wanted = set(order_ids)
    return {
        record["key"]: record["doc"]["status"]
        for record in sandbox.export(account, "orders")
        if record["key"] in wanted
    }


def test_cli_turns_the_feed_on_with_a_status_filter_and_off(conn, sandbox, monkeypatch):
    tenant = register(conn, "t_feed_cli", "feedcli")
    monkeypatch.setenv("VTEX_BASE_URL_TEMPLATE", sandbox.base_url + "/{account}")
    runner = CliRunner()
    assert runner.invoke(main, ["tenants", "feed", "t_feed_cli"]).exit_code == 2  # on or off?

    on = ["tenants", "feed", "t_feed_cli", "--on", "--status", "invoiced", "--status", "canceled"]
    result = runner.invoke(main, on)
    assert result.exit_code == 0, result.output
    client = client_for(sandbox, tenant)
    config = client.feed_config()
    assert config["filter"] == {"type": "FromWorkflow", "status": ["invoiced", "canceled"]}
    assert config["queue"] == {
        "visibilityTimeoutInSeconds": 240,
        "MessageRetentionPeriodInSeconds": 1_209_600,
    }
    assert config["quantity"] == 0
    row = conn.execute(
        "SELECT enabled, statuses FROM cdp.order_feeds WHERE tenant_id = 't_feed_cli'"
    ).fetchone()
    assert row == (True, ["invoiced", "canceled"])

    # New orders also pass through order-created and other statuses: the filter drops those.
    change_orders(sandbox, "feedcli", changed=6, new=4)
    events = client.read_feed() + client.read_feed()
    assert len(events) >= 6
    assert {event["state"] for event in events} <= {"invoiced", "canceled"}

    result = runner.invoke(main, ["tenants", "feed", "t_feed_cli", "--off"])
    assert result.exit_code == 0, result.output
    assert client.feed_config() is None
    conn.rollback()  # a fresh snapshot: the CLI wrote from its own connection
    (enabled,) = conn.execute(
        "SELECT enabled FROM cdp.order_feeds WHERE tenant_id = 't_feed_cli'"
    ).fetchone()
    assert enabled is False


def test_changed_orders_arrive_through_the_feed_and_land_with_their_new_status(
    conn, instance, sandbox
):
    tenant = register(conn, "t_feed_land", "feedland")
    client = enable_feed(conn, sandbox, tenant)
    everything = (datetime.combine(HISTORY_START, datetime.min.time(), UTC), datetime.now(UTC))
    sync_orders(client, conn, "t_feed_land", *everything, "baseline", Landing())
    conn.commit()
    order_ids = change_orders(sandbox, "feedland", changed=8, new=3)
    changed, new = order_ids[:8], order_ids[8:]
    before = statuses(conn, "t_feed_land", changed)
    assert len(before) == 8 and not statuses(conn, "t_feed_land", new)

    result = drain(instance, sandbox, "t_feed_land")
    assert result.success
    counts = metadata(result)
    # One event per status change; a new order also passes through order-created.
    assert counts["feed_events"] == counts["handles_committed"] == 8 + 2 * 3
    assert counts["orders_fetched"] == 11 and counts["feed_duplicate_events"] == 0
    assert (counts["rows_inserted"], counts["rows_updated"], counts["rows_rejected"]) == (3, 8, 0)
    conn.rollback()
    after = statuses(conn, "t_feed_land", order_ids)
    assert after == truth_statuses(sandbox, "feedland", order_ids)
    assert all(after[order_id] != before[order_id] for order_id in changed)
    assert client.feed_config()["quantity"] == 0

    again = metadata(drain(instance, sandbox, "t_feed_land"))
    assert again["feed_events"] == again["rows_received"] == 0


def test_orders_the_list_sync_landed_after_their_change_are_not_read_again(conn, sandbox):
    """The List sync reads new orders as they are now; their feed events announce nothing the
    landed copy lacks, so the drain commits them without a Get order, even an order-created
    event read apart from its order's later status event (a drain of one lot at a time splits
    them). Changed orders landed before their change are read."""
    tenant = register(conn, "t_feed_current", "feedcurrent")
    client = enable_feed(conn, sandbox, tenant)
    everything = (datetime.combine(HISTORY_START, datetime.min.time(), UTC), datetime.now(UTC))
    sync_orders(client, conn, "t_feed_current", *everything, "baseline", Landing())
    conn.commit()
    # 5 + 2 * 4 events: the third new order's two events fall in two lots of 10.
    order_ids = change_orders(sandbox, "feedcurrent", changed=5, new=4)
    new = order_ids[5:]
    recent = (datetime.now(UTC) - timedelta(hours=2), datetime.now(UTC))
    sync_orders(client, conn, "t_feed_current", *recent, "list", Landing())
    conn.commit()
    assert set(statuses(conn, "t_feed_current", new)) == set(new)
    gets_before = sandbox.stats()["accounts"]["feedcurrent"]["requests"].get("get_order", 0)

    drains = [drain_feed(conn, client, "t_feed_current", "test-run", max_lots=1)]
    while drains[-1].events:
        drains.append(drain_feed(conn, client, "t_feed_current", "test-run", max_lots=1))

    gets = sandbox.stats()["accounts"]["feedcurrent"]["requests"]["get_order"] - gets_before
    assert [d.events for d in drains] == [10, 3, 0]
    assert sum(d.orders for d in drains) == gets == 5
    # The third new order is current in both lots: once for each of its events.
    assert sum(d.orders_current for d in drains) == 4 + 1
    assert sum(d.handles_committed for d in drains) == 5 + 2 * 4
    assert sum(d.landing.counts.updated for d in drains) == 5
    conn.rollback()
    landed = statuses(conn, "t_feed_current", order_ids)
    assert landed == truth_statuses(sandbox, "feedcurrent", order_ids)
    assert client.feed_config()["quantity"] == 0


def test_duplicate_deliveries_fetch_each_order_once_and_are_all_committed(conn, sandbox):
    tenant = register(conn, "t_feed_dup", "feeddup")
    client = enable_feed(conn, sandbox, tenant, visibility_timeout_seconds=1)
    order_ids = change_orders(sandbox, "feeddup", changed=20, new=0)
    gets_before = sandbox.stats()["accounts"]["feeddup"]["requests"].get("get_order", 0)
    sandbox.set_faults({"seed": 3, "duplicate_feed_events": True, "routes": ["feed"]})
    try:
        result = drain_feed(conn, client, "t_feed_dup", "test-run")
    finally:
        sandbox.clear_faults()

    assert result.duplicate_events > 0
    assert result.events == 20 + result.duplicate_events == result.handles_committed
    assert result.orders == 20 and result.landing.counts.inserted == 20
    gets = sandbox.stats()["accounts"]["feeddup"]["requests"]["get_order"] - gets_before
    assert gets == 20
    (rows,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = 't_feed_dup'"
        " AND order_id = ANY(%s)",
        (order_ids,),
    ).fetchone()
    assert rows == 20
    # Every delivery was committed: nothing comes back once the visibility timeout is over.
    time.sleep(1.1)
    assert client.read_feed() == [] and client.feed_config()["quantity"] == 0


def test_events_of_a_failed_drain_stay_queued_and_land_on_the_next_run(conn, instance, sandbox):
    tenant = register(conn, "t_feed_retry", "feedretry")
    client = enable_feed(conn, sandbox, tenant, visibility_timeout_seconds=1)
    order_ids = change_orders(sandbox, "feedretry", changed=6, new=2)
    sandbox.set_faults({"rate_5xx": 1.0, "routes": ["orders"]})  # Get order fails, not the feed
    try:
        failed = drain(instance, sandbox, "t_feed_retry", max_retries=0)
    finally:
        sandbox.clear_faults()
    assert not failed.success
    error = failed.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "VtexRequestFailed" in error
    conn.rollback()
    assert statuses(conn, "t_feed_retry", order_ids) == {}
    assert client.feed_config()["quantity"] == 6 + 2 * 2  # read, but none committed

    time.sleep(1.1)  # VTEX shows uncommitted events again after the visibility timeout
    retried = drain(instance, sandbox, "t_feed_retry")
    assert retried.success
    counts = metadata(retried)
    assert counts["feed_events"] == counts["handles_committed"] == 10
    assert counts["rows_inserted"] == 8
    conn.rollback()
    assert statuses(conn, "t_feed_retry", order_ids) == truth_statuses(
        sandbox, "feedretry", order_ids
    )
    assert client.feed_config()["quantity"] == 0


def test_a_block_drain_records_each_tenants_own_counts(conn, instance, sandbox):
    """One run drains two neighbouring tenants: each tenant's partition records its own
    drain (what it landed, the events it committed), not the run's totals, and names only
    itself as landed."""
    larger, smaller = "t_feed_own_a", "t_feed_own_b"
    enable_feed(conn, sandbox, register(conn, larger, "feedowna"))
    enable_feed(conn, sandbox, register(conn, smaller, "feedownb"))
    change_orders(sandbox, "feedowna", changed=4, new=2)
    change_orders(sandbox, "feedownb", changed=1, new=1)
    instance.add_dynamic_partitions(tenants.name, [larger, smaller])  # neighbours: one range
    block = dg.materialize(
        [vtex_orders_feed],
        instance=instance,
        tags={RANGE_START_TAG: larger, RANGE_END_TAG: smaller},
        resources={"warehouse": WarehouseResource(), "vtex": vtex_for(sandbox)},
    )

    recorded = {
        event.materialization.partition: event.materialization.metadata
        for event in block.get_asset_materialization_events()
    }
    assert sorted(recorded) == [larger, smaller]
    # Never synced before: every order the feed announced is new to the warehouse.
    assert recorded[larger]["rows_inserted"].value == 4 + 2
    assert recorded[smaller]["rows_inserted"].value == 1 + 1
    committed = {t: recorded[t]["handles_committed"].value for t in recorded}
    assert committed[larger] > committed[smaller] > 0
    assert committed[larger] == recorded[larger]["feed_events"].value
    assert recorded[larger][TENANTS_LANDED].value == [larger]
    assert recorded[smaller][TENANTS_LANDED].value == [smaller]


def test_a_failed_drain_in_a_block_leaves_the_others_landed_and_recorded(conn, instance, sandbox):
    """One run drains two neighbouring tenants; Get order fails for every order of the first's
    feed. The run fails naming it alone; the second's orders land and its drain is recorded,
    so the refresh after the feed follows it; the first's events wait for the next drain."""
    failing, healthy = "t_feed_block_a", "t_feed_block_b"
    failing_client = enable_feed(
        conn, sandbox, register(conn, failing, "feedblocka"), visibility_timeout_seconds=1
    )
    enable_feed(conn, sandbox, register(conn, healthy, "feedblockb"))
    failing_orders = change_orders(sandbox, "feedblocka", changed=4, new=1)
    healthy_orders = change_orders(sandbox, "feedblockb", changed=3, new=2)
    instance.add_dynamic_partitions(tenants.name, [failing, healthy])  # neighbours: one range
    _, after_storage_id = read_landings_since(instance, None)
    sandbox.set_faults({"failing_orders": dict.fromkeys(failing_orders, "5xx")})
    try:
        block = dg.materialize(
            [vtex_orders_feed],
            instance=instance,
            tags={RANGE_START_TAG: failing, RANGE_END_TAG: healthy},
            resources={
                "warehouse": WarehouseResource(),
                "vtex": vtex_for(sandbox, max_retries=0),
            },
            raise_on_error=False,
        )
    finally:
        sandbox.clear_faults()

    assert not block.success
    error = block.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert f"drained for {failing}: VtexRequestFailed" in error and healthy not in error
    conn.rollback()
    assert statuses(conn, healthy, healthy_orders) == truth_statuses(
        sandbox, "feedblockb", healthy_orders
    )
    assert statuses(conn, failing, failing_orders) == {}
    recorded = {
        event.materialization.partition: event.materialization.metadata
        for event in block.get_asset_materialization_events()
    }
    assert list(recorded) == [healthy]
    assert recorded[healthy][TENANTS_LANDED].value == [healthy]
    assert recorded[healthy]["rows_inserted"].value == 3 + 2  # the tenant was never synced
    # What the feed-changes sensor reads: a refresh of the healthy tenant, not of the other.
    landed, _ = read_landings_since(instance, after_storage_id)
    assert landed == {healthy}
    assert failing_client.feed_config()["quantity"] == 4 + 1 * 2  # read, none committed

    time.sleep(1.1)  # VTEX shows uncommitted events again after the visibility timeout
    retried = drain(instance, sandbox, failing)
    assert retried.success and metadata(retried)["handles_committed"] == 6
    conn.rollback()
    assert statuses(conn, failing, failing_orders) == truth_statuses(
        sandbox, "feedblocka", failing_orders
    )


def read_landings_since(
    instance: dg.DagsterInstance, after_storage_id: int | None
) -> tuple[set[str], int | None]:
    """The tenants whose recorded drains landed orders after the storage id, as the
    feed-changes sensor reads them, and where the reading stopped."""
    changes = FeedChanges(after_storage_id)
    read_landings(instance, changes)
    return changes.pending, changes.after_storage_id


def test_handles_are_committed_only_once_the_rows_are_visible_to_others(
    conn, sandbox, warehouse_url
):
    tenant = register(conn, "t_feed_order", "feedorder")
    client = enable_feed(conn, sandbox, tenant)
    order_ids = change_orders(sandbox, "feedorder", changed=5, new=2)
    visible_at_commit: list[int] = []
    commit = client.commit_feed

    def checked_commit(handles: list[str]) -> None:
        # Another session sees only committed rows.
        with psycopg.connect(warehouse_url) as other:
            (count,) = other.execute(
                "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = 't_feed_order'"
                " AND order_id = ANY(%s)",
                (order_ids,),
            ).fetchone()
        visible_at_commit.append(count)
        commit(handles)

    client.commit_feed = checked_commit
    result = drain_feed(conn, client, "t_feed_order", "test-run")
    assert result.handles_committed == 5 + 2 * 2
    assert visible_at_commit == [7]


def test_a_feed_vtex_deleted_is_recreated_and_a_feed_turned_off_is_not_drained(conn, sandbox):
    tenant = register(conn, "t_feed_gone", "feedgone")
    client = enable_feed(
        conn, sandbox, tenant, statuses=("invoiced",), visibility_timeout_seconds=30
    )
    assert client.delete_feed()  # what VTEX does to a feed without events for its retention
    result = drain_feed(conn, client, "t_feed_gone", "test-run")
    assert result.recreated and result.events == 0
    config = client.feed_config()
    assert config["filter"]["status"] == ["invoiced"]
    assert config["queue"]["visibilityTimeoutInSeconds"] == 30

    assert turn_feed_off(conn, client, "t_feed_gone")
    with pytest.raises(FeedError, match="is off"):
        drain_feed(conn, client, "t_feed_gone", "test-run")


def test_malformed_events_are_quarantined_and_committed_and_the_rest_lands(conn, sandbox):
    tenant = register(conn, "t_feed_broken", "feedbroken")
    client = enable_feed(conn, sandbox, tenant, visibility_timeout_seconds=1)
    order_ids = change_orders(sandbox, "feedbroken", changed=6, new=0)
    sandbox.set_faults({"feed_event_defects": list(FEED_EVENT_DEFECTS)})
    try:
        result = drain_feed(conn, client, "t_feed_broken", "test-run")
    finally:
        sandbox.clear_faults()

    assert result.malformed_events == len(FEED_EVENT_DEFECTS) == 4
    assert result.events == 6 + 4 and result.handles_committed == 6 + 2  # two had no handle
    quarantined = conn.execute(
        "SELECT reason, raw_text FROM raw_vtex.rejects"
        " WHERE tenant_id = 't_feed_broken' AND entity = 'orders_feed' ORDER BY reason"
    ).fetchall()
    assert [reason.split(" (")[0] for reason, _ in quarantined] == [
        "feed event has no handle",
        "feed event has no usable orderId",
        "feed event has no usable orderId",
        "feed event is not a JSON object",
    ]
    assert all(orjson.loads(raw) is not None for _, raw in quarantined)  # the text as delivered
    assert statuses(conn, "t_feed_broken", order_ids) == truth_statuses(
        sandbox, "feedbroken", order_ids
    )
    time.sleep(1.1)  # nothing comes back once the visibility timeout is over
    assert client.read_feed() == [] and client.feed_config()["quantity"] == 0


def reread_rows(conn: psycopg.Connection, tenant_id: str) -> dict[str, tuple[int, str]]:
    rows = conn.execute(
        "SELECT order_id, attempts, last_error FROM raw_vtex.orders_to_reread WHERE tenant_id = %s",
        (tenant_id,),
    )
    return {order_id: (attempts, error) for order_id, attempts, error in rows}


@pytest.mark.timeout(120)
def test_an_order_that_cannot_be_read_is_retried_then_reread_by_id_until_it_lands(conn, sandbox):
    """Its events come back until the last attempt, then the drains re-read it by id: the
    change lands once VTEX serves the order again, though the List sync re-reads only recent
    orders."""
    tenant = register(conn, "t_feed_missing", "feedmissing")
    client = enable_feed(conn, sandbox, tenant, visibility_timeout_seconds=1)
    everything = (datetime.combine(HISTORY_START, datetime.min.time(), UTC), datetime.now(UTC))
    sync_orders(client, conn, "t_feed_missing", *everything, "baseline", Landing())
    conn.commit()
    order_ids = change_orders(sandbox, "feedmissing", changed=5, new=0)
    missing, others = order_ids[0], order_ids[1:]
    truth = truth_statuses(sandbox, "feedmissing", order_ids)
    sandbox.set_faults({"failing_orders": {missing: "404"}})
    try:
        first = drain_feed(conn, client, "t_feed_missing", "test-run")
        assert client.feed_config()["quantity"] == 1  # its event waits to be delivered again
        assert first.orders_unreadable == 1 and first.handles_committed == 4
        drains = 1
        while client.feed_config()["quantity"] and drains < FEED_READ_ATTEMPTS:
            time.sleep(1.1)
            drain_feed(conn, client, "t_feed_missing", "test-run")
            drains += 1
        assert client.feed_config()["quantity"] == 0  # committed after the last attempt
        attempts, error = reread_rows(conn, "t_feed_missing")[missing]
        assert attempts >= FEED_READ_ATTEMPTS and "404" in error
        assert statuses(conn, "t_feed_missing", [missing])[missing] != truth[missing]
    finally:
        sandbox.clear_faults()

    later = drain_feed(conn, client, "t_feed_missing", "test-run")
    assert later.orders_reread == 1 and later.landing.counts.updated == 1
    assert statuses(conn, "t_feed_missing", order_ids) == truth
    assert reread_rows(conn, "t_feed_missing") == {}
    assert statuses(conn, "t_feed_missing", others) == truth_statuses(
        sandbox, "feedmissing", others
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("failure", ["404", "5xx", "unparseable"])
def test_an_order_that_cannot_be_read_holds_back_only_its_own_events(conn, sandbox, failure):
    account = {"404": "feedfail404", "5xx": "feedfail5xx", "unparseable": "feedfailbody"}[failure]
    tenant_id = f"t_{account}"
    tenant = register(conn, tenant_id, account)
    client = enable_feed(conn, sandbox, tenant, visibility_timeout_seconds=60)
    client.max_retries = 1
    order_ids = change_orders(sandbox, account, changed=6, new=0)
    failing = order_ids[2]
    readable = [order_id for order_id in order_ids if order_id != failing]
    sandbox.set_faults({"failing_orders": {failing: failure}})
    try:
        result = drain_feed(conn, client, tenant_id, "test-run")
    finally:
        sandbox.clear_faults()
    assert client.feed_config()["quantity"] == 1  # hidden for the visibility timeout
    assert statuses(conn, tenant_id, readable) == truth_statuses(sandbox, account, readable)
    assert failing not in statuses(conn, tenant_id, [failing])
    assert result.orders_unreadable == 1 and result.handles_committed == 5
    assert list(reread_rows(conn, tenant_id)) == [failing]


def test_a_feed_read_that_is_not_a_list_is_a_clear_error(conn, sandbox):
    tenant = register(conn, "t_feed_object", "feedobject")
    client = enable_feed(conn, sandbox, tenant)
    change_orders(sandbox, "feedobject", changed=3, new=0)
    sandbox.set_faults({"malformed_envelopes": {"read_feed": "wrong_type"}})
    try:
        with pytest.raises(VtexError) as raised:
            drain_feed(conn, client, "t_feed_object", "test-run")
    finally:
        sandbox.clear_faults()
    assert str(raised.value) == (
        "tenant 't_feed_object': VTEX account 'feedobject': GET /api/orders/feed answered"
        " a JSON object, not a JSON list"
    )


def feed(tenant_id: str, priority: int, drained_ago: timedelta | None, events: int | None):
    now = datetime(2026, 6, 1, 12, tzinfo=UTC)
    tenant = Tenant(tenant_id, tenant_id.replace("_", ""), "K", "T", priority=priority)
    return FeedState(tenant, None if drained_ago is None else now - drained_ago, events)


def test_drains_skip_tenants_in_flight_idle_or_without_a_partition():
    now = datetime(2026, 6, 1, 12, tzinfo=UTC)
    feeds = [
        feed("busy", 1, timedelta(minutes=1), 40),
        feed("never_drained", 2, None, None),
        feed("idle_recently", 3, IDLE_POLL - timedelta(seconds=1), 0),
        feed("idle_long_ago", 4, IDLE_POLL, 0),
        feed("running", 5, timedelta(minutes=1), 10),
        feed("no_partition", 6, None, None),
    ]
    keys = {f.tenant.tenant_id for f in feeds} - {"no_partition"}
    due = due_feeds(feeds, keys, {"running"}, now)
    assert [tenant.tenant_id for tenant in due] == ["busy", "never_drained", "idle_long_ago"]
    # Neighbours in the partition order share a run, first come, first served in the queue.
    order = [f.tenant.tenant_id for f in feeds if f.tenant.tenant_id in keys]
    requests = feed_block_requests(feeds, order, {"running"}, now)
    assert [r.run_key for r in requests] == [
        "busy..never_drained|20260601120000",
        "idle_long_ago..idle_long_ago|20260601120000",
    ]
    assert not any("dagster/priority" in r.tags for r in requests)


def test_ticks_of_one_minute_request_runs_of_their_own():
    # The sensor ticks every 30 seconds: a key per minute would make Dagster drop the second
    # tick's drains as already requested.
    feeds = [feed("first", 1, None, None), feed("second", 2, None, None)]
    order = ["first", "second"]
    tick = datetime(2026, 6, 1, 12, tzinfo=UTC)
    keys = [
        {r.run_key for r in feed_block_requests(feeds, order, set(), tick + offset)}
        for offset in (timedelta(0), timedelta(seconds=30))
    ]
    assert keys == [{"first..second|20260601120000"}, {"first..second|20260601120030"}]


def test_sensor_requests_drains_only_for_tenants_with_the_feed_on(conn, sandbox):
    on = register(conn, "t_sense_on", "senseon")
    off = register(conn, "t_sense_off", "senseoff")
    register(conn, "t_sense_none", "senseon")
    client = enable_feed(conn, sandbox, on)
    turn_feed_off(conn, enable_feed(conn, sandbox, off), "t_sense_off")
    change_orders(sandbox, "senseon", changed=2, new=0)
    ours = {"t_sense_on", "t_sense_off", "t_sense_none"}

    def tick() -> set[str]:
        # A throwaway instance: the context disposes the instance it is given.
        scratch = dg.DagsterInstance.ephemeral()
        scratch.add_dynamic_partitions(tenants.name, sorted(ours))
        resources = {"warehouse": WarehouseResource()}
        with dg.build_sensor_context(instance=scratch, resources=resources) as context:
            result = vtex_orders_feed_sensor(context)
        if isinstance(result, dg.SkipReason):
            return set()
        assert all(r.job_name in (None, "vtex_orders_feed_sync") for r in result)
        return {r.partition_key for r in result} & ours

    assert tick() == {"t_sense_on"}
    assert drain_feed(conn, client, "t_sense_on", "test-run").events == 2
    assert tick() == {"t_sense_on"}  # the last drain found events: there may be more
    assert drain_feed(conn, client, "t_sense_on", "test-run").events == 0
    assert tick() == set()  # idle: polled again after IDLE_POLL
