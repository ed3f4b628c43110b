"""From an order event in a store to the ad platform, hands-off: the feed sensor drains the
feed, the feed-changes sensor refreshes the tenant's analytics and audiences, the
audience-change sensor pushes; each sensor evaluated as the daemon evaluates it, each run it
requests executed as requested. Bursts of events coalesce into one refresh per tenant."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import dagster as dg
import psycopg
import pytest
from support import order_row, register, store_from_history_start, sync, vtex_for

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.jobs import activation_push
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.push_requests import pushes_only_changes
from cdp_assets.activation.sensors import audience_changes_sensor
from cdp_assets.analytics.feed_changes import changes_requests
from cdp_assets.analytics.jobs import CHANGES_JOB
from cdp_assets.analytics.sensors import feed_changes_sensor
from cdp_assets.definitions import defs
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, tenants
from cdp_assets.tenants.registry import Tenant
from cdp_assets.vtex.assets import TENANTS_LANDED, vtex_orders_feed
from cdp_assets.vtex.feed import FeedSettings, turn_feed_on
from cdp_assets.vtex.jobs import FEED_SYNC_JOB
from cdp_assets.vtex.sensors import vtex_orders_feed_sensor
from cdp_assets.vtex.sync import ORDERS
from cdp_devkit.bench.freshness import (
    Event,
    at_platform,
    job_load,
    observe_landings,
    run_spans,
)
from cdp_devkit.sandbox import MetaSandbox, SandboxProcess

STORES = {
    "chain_a": store_from_history_start("chaina", seed=71, customers=300, orders=1500, products=20),
    "chain_b": store_from_history_start("chainb", seed=72, customers=200, orders=800, products=15),
}
AUDIENCE = "audience_new_customers"
META_TOKEN_REF, META_TOKEN, META_ACCOUNT = "CHAIN_META_TOKEN", "chain-meta-token", "4242"


def tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, cursor: str | None = None):
    """One evaluation of `sensor`, as the daemon's tick makes it: (run requests, cursor)."""
    resources = {"warehouse": WarehouseResource()}
    with dg.build_sensor_context(instance, cursor=cursor, resources=resources) as context:
        result = sensor(context)
    if isinstance(result, dg.SkipReason):
        return [], cursor
    if isinstance(result, dg.SensorResult):
        return list(result.run_requests or []), result.cursor
    return list(result), cursor


def execute(instance: dg.DagsterInstance, job_name: str, request: dg.RunRequest) -> None:
    """The run a request launches, executed in this process."""
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance,
        partition_key=request.partition_key,
        tags=request.tags,
        asset_selection=request.asset_selection,
        run_config=request.run_config,
        raise_on_error=False,
    )
    assert result.success, f"{job_name} {request.tags} failed"


def covered(request: dg.RunRequest, order: list[str]) -> set[str]:
    """The tenants a request covers: its partition or its range in `order`."""
    if request.partition_key:
        return {request.partition_key}
    first, last = request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]
    return set(order[order.index(first) : order.index(last) + 1])


def requested_tenants(requests: list[dg.RunRequest], order: list[str]) -> list[set[str]]:
    """This file's tenants each request covers: the instance holds other files' tenants too."""
    return [
        covered(request, order) & set(STORES)
        for request in requests
        if covered(request, order) & set(STORES)
    ]


def members(conn: psycopg.Connection, tenant_id: str) -> set[str]:
    rows = conn.execute(
        f"SELECT customer_key FROM audiences.{AUDIENCE} WHERE tenant_id = %s", (tenant_id,)
    )
    return {key for (key,) in rows}


def reachable(conn: psycopg.Connection, tenant_id: str) -> set[str]:
    """The members Meta can match: with an e-mail or a phone."""
    rows = conn.execute(
        f"SELECT a.customer_key FROM audiences.{AUDIENCE} a JOIN marts.customers c"
        " USING (tenant_id, customer_key)"
        " WHERE a.tenant_id = %s AND (c.email IS NOT NULL OR c.phone_e164 IS NOT NULL)",
        (tenant_id,),
    )
    return {key for (key,) in rows}


def order_customers(conn: psycopg.Connection, tenant_id: str, order_ids: list[str]) -> set[str]:
    rows = conn.execute(
        "SELECT customer_key FROM intermediate.int_orders__purchases"
        " WHERE tenant_id = %s AND order_id = ANY(%s)",
        (tenant_id, order_ids),
    )
    return {key for (key,) in rows}


@pytest.fixture(scope="module")
def chain(warehouse_url, instance):
    """Two stores synced, analysed and their audiences built, the feed on for both; a Meta
    destination of chain_a's new customers, pushed once."""
    with (
        SandboxProcess(list(STORES.values())) as sandbox,
        MetaSandbox({META_TOKEN: [META_ACCOUNT]}) as meta,
        psycopg.connect(warehouse_url) as conn,
        temporary_environment(
            {
                "VTEX_BASE_URL_TEMPLATE": sandbox.base_url + "/{account}",
                "VTEX_REQUESTS_PER_SECOND": "5000",
                "META_GRAPH_URL": meta.graph_url,
                META_TOKEN_REF: META_TOKEN,
            }
        ),
    ):
        for tenant_id, spec in STORES.items():
            tenant = register(conn, tenant_id, spec.account)
            sync(instance, sandbox, tenant_id)
            turn_feed_on(conn, vtex_for(sandbox).client_for(tenant), tenant_id, FeedSettings())
            conn.commit()
        both = dg.RunRequest(tags={RANGE_START_TAG: "chain_a", RANGE_END_TAG: "chain_b"})
        execute(instance, CHANGES_JOB, both)
        add_destination(
            conn,
            Destination(
                "chain_a_meta",
                "chain_a",
                "meta",
                META_ACCOUNT,
                credential_refs={"access_token": META_TOKEN_REF},
                min_audience_size=1,
            ),
        )
        add_audience(conn, "chain_a_meta", AUDIENCE)
        conn.commit()
        execute(
            instance,
            activation_push.name,
            dg.RunRequest(partition_key="chain_a", asset_selection=[meta_custom_audiences.key]),
        )
        yield sandbox, meta, conn


def meta_members(meta: MetaSandbox) -> set[str]:
    (audience,) = meta.audiences(META_ACCOUNT)
    return {row["EXTERN_ID"] for row in meta.members(audience["id"])}


def test_an_order_event_reaches_the_audience_and_meta_through_the_chain(chain, instance):
    sandbox, meta, conn = chain
    started = datetime.now(UTC)
    order = instance.get_dynamic_partitions(tenants.name)
    before = members(conn, "chain_a")
    assert meta_members(meta) == reachable(conn, "chain_a")  # the initial push
    b_before = members(conn, "chain_b")
    placed = sandbox.mutate("chaina", seed=5, changed=0, new=40, at=datetime.now(UTC))

    drains, _ = tick(vtex_orders_feed_sensor, instance)
    # Both feeds are due (never drained): neighbours, one run.
    assert requested_tenants(drains, order) == [{"chain_a", "chain_b"}]
    (ours,) = [r for r in drains if covered(r, order) & set(STORES)]
    execute(instance, FEED_SYNC_JOB, ours)
    (landed,) = conn.execute(
        "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = 'chain_a' AND order_id = ANY(%s)",
        (placed,),
    ).fetchone()
    assert landed == len(placed)

    refreshes, _ = tick(feed_changes_sensor, instance)
    # chain_b's feed was drained too, but landed nothing: no refresh of it.
    assert requested_tenants(refreshes, order) == [{"chain_a"}]
    execute(instance, CHANGES_JOB, refreshes[0])
    joined = members(conn, "chain_a") - before
    buyers = order_customers(conn, "chain_a", placed)
    # New guests' first purchases: new customers of the audience, all of them from the orders.
    assert joined and joined <= buyers
    assert members(conn, "chain_b") == b_before

    pushes, _ = tick(audience_changes_sensor, instance)
    (push,) = [p for p in pushes if "chain_a" in covered(p, order)]
    assert push.asset_selection == [meta_custom_audiences.key]
    execute(instance, activation_push.name, push)
    assert meta_members(meta) == reachable(conn, "chain_a")
    assert joined & reachable(conn, "chain_a") <= meta_members(meta)
    assert joined & meta_members(meta)
    # Pushed: nothing left to request.
    again, _ = tick(audience_changes_sensor, instance)
    assert not any("chain_a" in covered(p, order) for p in again)
    # What the benchmark reads of it: one push of chain_a since the test started, its run's
    # start before its materialization.
    ((push_start, pushed),) = run_spans(instance, meta_custom_audiences.key, started)["chain_a"]
    assert started.timestamp() <= push_start <= pushed


def drained(instance: dg.DagsterInstance, tenant_id: str, rows_inserted: int) -> None:
    """A feed drain's materialization as its run records it (what the sensor reads)."""
    landed = [tenant_id] if rows_inserted else []
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            vtex_orders_feed.key,
            partition=tenant_id,
            metadata={"rows_inserted": rows_inserted, TENANTS_LANDED: landed},
        )
    )


def refresh_run(instance: dg.DagsterInstance, tenant_id: str, status: dg.DagsterRunStatus) -> str:
    """A refresh of the tenant in the run storage, not started yet (created, waiting for its
    launch) or started."""
    run_id = str(uuid.uuid4())
    instance.add_run(
        dg.DagsterRun(
            job_name=CHANGES_JOB,
            run_id=run_id,
            status=status,
            tags={"dagster/partition": tenant_id},
        )
    )
    return run_id


def test_a_burst_of_events_is_one_refresh_per_tenant(chain, instance):
    order = instance.get_dynamic_partitions(tenants.name)
    _, cursor = tick(feed_changes_sensor, instance)  # what earlier tests landed is read
    for _ in range(5):
        drained(instance, "chain_a", 3)
        drained(instance, "chain_b", 2)
    drained(instance, "chain_b", 0)
    requests, cursor = tick(feed_changes_sensor, instance, cursor)
    # Neighbours: one run for both tenants, one for all their drains.
    assert requested_tenants(requests, order) == [{"chain_a", "chain_b"}]
    assert tick(feed_changes_sensor, instance, cursor)[0] == []  # handled

    # A queued refresh absorbs new landings: it reads them when it starts.
    queued = refresh_run(instance, "chain_a", dg.DagsterRunStatus.NOT_STARTED)
    drained(instance, "chain_a", 1)
    requests, cursor = tick(feed_changes_sensor, instance, cursor)
    assert requests == []
    instance.delete_run(queued)

    # A running one may have read its orders already: one more once it ends, not before.
    running = refresh_run(instance, "chain_b", dg.DagsterRunStatus.STARTED)
    drained(instance, "chain_b", 4)
    drained(instance, "chain_b", 1)
    requests, cursor = tick(feed_changes_sensor, instance, cursor)
    assert requests == []
    requests, cursor = tick(feed_changes_sensor, instance, cursor)
    assert requests == []
    instance.delete_run(running)
    requests, cursor = tick(feed_changes_sensor, instance, cursor)
    assert requested_tenants(requests, order) == [{"chain_b"}]
    assert tick(feed_changes_sensor, instance, cursor)[0] == []


def test_a_push_queued_or_running_absorbs_further_audience_changes(chain, instance):
    _, _, conn = chain
    order = instance.get_dynamic_partitions(tenants.name)
    conn.execute(
        f"DELETE FROM audiences.{AUDIENCE} WHERE tenant_id = 'chain_a'"
        f" AND customer_key = (SELECT min(customer_key) FROM audiences.{AUDIENCE}"
        "  WHERE tenant_id = 'chain_a')"
    )
    conn.commit()

    def meta_pushes_of_chain_a() -> list[dg.RunRequest]:
        pushes, _ = tick(audience_changes_sensor, instance)
        return [
            p
            for p in pushes
            if p.asset_selection == [meta_custom_audiences.key] and "chain_a" in covered(p, order)
        ]

    (request,) = meta_pushes_of_chain_a()
    assert pushes_only_changes(dg.DagsterRun(job_name="push", run_config=request.run_config))

    def in_flight(
        status: dg.DagsterRunStatus, tenant_id: str, asset: dg.AssetKey, config, minutes: float
    ) -> str:
        """A push in the run storage, started `minutes` ago when it has started."""
        run_id = str(uuid.uuid4())
        instance.add_run(
            dg.DagsterRun(
                job_name=activation_push.name,
                run_id=run_id,
                status=status,
                tags={"dagster/partition": tenant_id},
                asset_selection=frozenset([asset]),
                run_config=config,
            )
        )
        if status == started:
            conn.execute(
                "UPDATE runs SET start_time = extract(epoch FROM now()) - %s WHERE run_id = %s",
                (minutes * 60, run_id),
            )
            conn.commit()
        return run_id

    queued, started = dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED
    meta, google = meta_custom_audiences.key, google_customer_match.key
    cases = [
        # A push of changes to Meta queued or running, of any tenant: the next one waits for
        # it to end, then covers everything changed meanwhile.
        (queued, "chain_b", meta, request.run_config, 0, False),
        (started, "chain_b", meta, request.run_config, 1, False),
        # Running for over 15 minutes (stuck, likely), it holds only its own tenants.
        (started, "chain_b", meta, request.run_config, 16, True),
        (started, "chain_a", meta, request.run_config, 16, False),
        # The 48-hour push (or a verdict poll) holds only its own tenants.
        (queued, "chain_a", meta, {}, 0, False),
        (started, "chain_a", meta, {}, 1, False),
        (started, "chain_b", meta, {}, 1, True),
        # A push to another destination asset holds nothing of Meta's.
        (started, "chain_a", google, {}, 1, True),
    ]
    for status, tenant_id, asset, config, minutes, requested in cases:
        run_id = in_flight(status, tenant_id, asset, config, minutes)
        found = meta_pushes_of_chain_a()
        assert bool(found) == requested, (status, tenant_id, asset, config, minutes)
        assert not any(tenant_id in covered(p, order) for p in found if asset == meta)
        instance.delete_run(run_id)
    assert meta_pushes_of_chain_a()


def test_the_benchmark_credits_each_change_to_the_first_push_after_its_refresh():
    refreshes = [(10.0, 20.0), (30.0, 40.0)]  # (run start, audiences refreshed)
    pushes = [(21.0, 25.0), (41.0, 45.0)]
    assert at_platform(refreshes, pushes, 5.0, push_pending=False) == (20.0, 25.0)
    # Landed after the first refresh started: the next one read it.
    assert at_platform(refreshes, pushes, 15.0, push_pending=False) == (40.0, 45.0)
    assert at_platform(refreshes, pushes, 35.0, push_pending=False) == (None, None)
    # No push after the last refresh: at the platform with it, unless a push is still due.
    assert at_platform(refreshes, [], 15.0, push_pending=False) == (40.0, 40.0)
    assert at_platform(refreshes, [], 15.0, push_pending=True) == (40.0, None)
    # Nothing pushed before the next refresh: the first changed nothing Meta holds.
    assert at_platform(refreshes, [(41.0, 45.0)], 5.0, push_pending=False) == (20.0, 20.0)


def landed_order(conn: psycopg.Connection, tenant: str, order_id: str, change: datetime) -> None:
    """The order as a drain lands it after a change at `change`."""
    upsert_documents(conn, ORDERS, tenant, [order_row(order_id, change, "invoiced", change)])
    conn.commit()


def test_the_benchmark_lands_an_event_when_its_change_first_landed(conn):
    # An order changed twice lands twice, and its row keeps the second landing only: the first
    # event landed with the first, seen then.
    tenant, created = "bench_landing", datetime.now(UTC)
    events = [Event(tenant, "o-1", created, False), Event(tenant, "o-2", created, True)]
    landed: dict[int, datetime] = {}
    landed_order(conn, tenant, "o-1", created - timedelta(days=3))  # before the event
    observe_landings(conn, events, landed)
    assert landed == {}
    landed_order(conn, tenant, "o-1", created + timedelta(seconds=1))
    observe_landings(conn, events, landed)
    (first,) = conn.execute(
        "SELECT synced_at FROM raw_vtex.orders WHERE tenant_id = %s AND order_id = 'o-1'",
        (tenant,),
    ).fetchone()
    conn.commit()
    assert landed == {0: first}
    landed_order(conn, tenant, "o-1", created + timedelta(minutes=20))  # the second change
    landed_order(conn, tenant, "o-2", created)
    observe_landings(conn, events, landed)
    assert landed[0] == first and landed[1] > first


def test_the_queue_is_first_come_first_served_and_a_tick_requests_the_urgent_first():
    # The queue launches higher dagster/priority first: with the tenant's priority on the
    # chain's runs, requested all day long, the first tenants' runs kept a block of the last
    # tenants queued for 18 minutes. No run carries one; a tick requests the urgent first.
    rows = [Tenant(t, t, "K", "T", priority=p) for t, p in (("a", 3), ("b", 9), ("c", 0))]
    order = ["a", "b", "x", "c"]  # x landed nothing: c is a block of its own
    requests = changes_requests({"a", "b", "c"}, rows, order, "landed-1")
    assert [r.partition_key for r in requests] == ["c", None]
    assert (requests[1].tags[RANGE_START_TAG], requests[1].tags[RANGE_END_TAG]) == ("a", "b")
    assert not any("dagster/priority" in r.tags for r in requests)


def test_the_benchmark_reports_each_jobs_runs_and_their_wait_in_the_queue():
    load = job_load(
        [("push", 0.0, 5.0), ("push", 10.0, 25.0), ("push", 20.0, None), ("refresh", 3.0, 4.5)]
    )
    assert load == {
        "push": {
            "runs": 3,  # one still queued: counted, no wait yet
            "queue_wait_p50_seconds": 5.0,
            "queue_wait_p95_seconds": 15.0,
            "queue_wait_max_seconds": 15.0,
        },
        "refresh": {
            "runs": 1,
            "queue_wait_p50_seconds": 1.5,
            "queue_wait_p95_seconds": 1.5,
            "queue_wait_max_seconds": 1.5,
        },
    }
    assert job_load([("drain", 0.0, None)])["drain"]["queue_wait_p50_seconds"] is None
