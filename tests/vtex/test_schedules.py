import logging
import uuid
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import dagster as dg
import psycopg
import pytest
import sqlalchemy
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._scheduler.scheduler import launch_scheduled_runs
from dagster._utils.schedules import cron_string_iterator

from cdp_assets.analytics.jobs import ANALYTICS_JOB, CHURN_HOLDOUT_JOB
from cdp_assets.analytics.schedules import audiences_every_48_hours, churn_holdout_weekly
from cdp_assets.definitions import defs
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.dagster_home import apply_pool_limits
from cdp_assets.lib.database import sqlalchemy_url, with_database
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.lib.sync_state import OrderGaps
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    TENANT_RUN_TAG,
    tenant_months,
    tenants,
)
from cdp_assets.tenants.registry import Tenant, add_tenant, list_tenants
from cdp_assets.tenants.runs import with_partitions
from cdp_assets.vtex.jobs import vtex_orders_sync
from cdp_assets.vtex.schedules import (
    ORDER_SYNC_TENANTS_PER_RUN,
    REPAIR_MONTHS_PER_TICK,
    REPAIR_TAG,
    order_sync_requests,
    recent_months,
    tenant_run_requests,
    vtex_catalog_daily,
    vtex_orders_twice_daily,
)

BUENOS_AIRES = ZoneInfo("America/Argentina/Buenos_Aires")
ORDERS_CHECKS = ("orders_landed_for_every_synced_tenant", "orders_read_and_reconciled")
HOLDOUT_ASSETS = (
    "int_customers__holdout_summary",
    "holdout_predictions",
    "churn_holdout",
    "clv_scorecard",
)


@pytest.fixture
def scheduled_tenants(conn) -> list:
    """Two active tenants (priority 5 and 1), an inactive one, and one not yet a partition;
    what the schedules see: active rows that have a partition."""
    for tenant_id, priority, active in (
        ("sched_a", 5, True),
        ("sched_b", 1, True),
        ("sched_c", 0, False),
        ("sched_d", 2, True),
    ):
        add_tenant(conn, Tenant(tenant_id, "shop", "K", "T", priority=priority, active=active))
    conn.commit()
    rows = [t for t in list_tenants(conn, active_only=True) if t.tenant_id.startswith("sched_")]
    return with_partitions(rows, {"sched_a", "sched_b", "sched_c"})


# The inactive sched_c splits sched_a from sched_b; sched_d has no partition yet.
SPLIT = ["sched_a", "sched_c", "sched_b"]


def test_orders_sync_covers_the_last_48_hours_across_a_month_end(scheduled_tenants):
    month_end = datetime(2026, 12, 1, 6, tzinfo=BUENOS_AIRES)
    requests = order_sync_requests(scheduled_tenants, SPLIT, month_end)
    # One run per block, the most urgent first (sched_b), over both months the 48 hours
    # touch; no inactive tenant and no tenant the sensor has not made a partition yet.
    ranges = [(r.partition_key_range.start, r.partition_key_range.end) for r in requests]
    assert ranges == [
        ("2026-11-01|sched_b", "2026-12-01|sched_b"),
        ("2026-11-01|sched_a", "2026-12-01|sched_a"),
    ]
    assert [r.tags[TENANT_RUN_TAG] for r in requests] == ["sched_b", "sched_a"]
    assert all(r.partition_key is None for r in requests)
    # The range holds the tenant's two months and no other tenant's partition.
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(tenants.name, SPLIT)
        assert tenant_months.get_partition_keys_in_range(
            requests[0].partition_key_range, dynamic_partitions_store=instance
        ) == ["2026-11-01|sched_b", "2026-12-01|sched_b"]
    assert not any("dagster/priority" in r.tags for r in requests)
    assert len({r.run_key for r in requests}) == 2

    mid_month = order_sync_requests(
        scheduled_tenants, SPLIT, datetime(2026, 12, 15, 18, tzinfo=BUENOS_AIRES)
    )
    assert [str(r.partition_key) for r in mid_month] == ["2026-12-01|sched_b", "2026-12-01|sched_a"]
    assert all(r.partition_key_range is None for r in mid_month)
    assert vtex_orders_twice_daily.cron_schedule == "0 6,18 * * *"
    assert vtex_orders_twice_daily.execution_timezone == "America/Argentina/Buenos_Aires"


def test_orders_sync_reads_neighbouring_tenants_in_one_run(scheduled_tenants):
    """Neighbouring tenants are one run over the rectangle of their recent months: one run's
    start instead of one per tenant. No tenant tag: the run is no single tenant's."""
    order = ["sched_c", "sched_a", "sched_b"]
    requests = order_sync_requests(
        scheduled_tenants, order, datetime(2026, 12, 1, 6, tzinfo=BUENOS_AIRES)
    )
    (block,) = requests
    assert block.partition_key is None and TENANT_RUN_TAG not in block.tags
    assert block.run_key.startswith("sched_a..sched_b|")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(tenants.name, order)
        assert sorted(
            tenant_months.get_partition_keys_in_range(
                block.partition_key_range, dynamic_partitions_store=instance
            )
        ) == [
            "2026-11-01|sched_a",
            "2026-11-01|sched_b",
            "2026-12-01|sched_a",
            "2026-12-01|sched_b",
        ]


def test_a_long_block_of_tenants_is_read_by_several_runs():
    """A block's tenants share one process: past ORDER_SYNC_TENANTS_PER_RUN neighbours, the
    block is split, the most urgent part first."""
    rows = [
        Tenant(f"blk_{i:02d}", "shop", "K", "T", priority=0 if i >= 20 else 5) for i in range(23)
    ]
    evening = datetime(2026, 12, 15, 18, tzinfo=BUENOS_AIRES)
    requests = order_sync_requests(rows, [t.tenant_id for t in rows], evening)
    spans = [(str(r.tags[RANGE_START_TAG]), str(r.tags[RANGE_END_TAG])) for r in requests]
    assert ORDER_SYNC_TENANTS_PER_RUN == 10
    assert spans == [
        ("2026-12-01|blk_20", "2026-12-01|blk_22"),
        ("2026-12-01|blk_00", "2026-12-01|blk_09"),
        ("2026-12-01|blk_10", "2026-12-01|blk_19"),
    ]


def test_orders_sync_reads_again_the_months_left_unread_or_unreconciled(scheduled_tenants):
    """An older month with orders whose detail kept failing, or whose listing VTEX's totals did
    not account for, is read again by the schedule: a tenant does not stay degraded until
    someone re-runs the month by hand."""
    gaps = {
        "sched_b": OrderGaps(
            unread={date(2026, 3, 1): 2},
            unsettled={date(2026, 5, 1): "unreconciled", date(2026, 12, 1): "failed"},
            unavailable=[date(2024, 1, 1)],
        ),
        "sched_a": OrderGaps(
            unsettled={date(2025, m, 1): "failed" for m in range(1, 13)},
        ),
    }
    moment = datetime(2026, 12, 15, 18, tzinfo=BUENOS_AIRES)
    requests = order_sync_requests(scheduled_tenants, SPLIT, moment, gaps)
    keys = [str(r.partition_key) for r in requests]
    # The recent month first (once, though it failed), then the repairs, newest first; an
    # unavailable month is not requested (VTEX does not serve it), and each tenant gets at
    # most REPAIR_MONTHS_PER_TICK of them.
    assert keys == [
        "2026-12-01|sched_b",
        "2026-12-01|sched_a",
        "2026-05-01|sched_b",
        "2026-03-01|sched_b",
        *(f"2025-{m:02d}-01|sched_a" for m in range(12, 12 - REPAIR_MONTHS_PER_TICK, -1)),
    ]
    assert len({r.run_key for r in requests}) == len(requests)
    repairs = [r for r in requests if r.tags.get(REPAIR_TAG)]
    assert len(repairs) == 2 + REPAIR_MONTHS_PER_TICK
    assert order_sync_requests(scheduled_tenants, SPLIT, moment) == order_sync_requests(
        scheduled_tenants, SPLIT, moment, {}
    )


def test_the_orders_schedule_finds_the_months_to_read_again_in_the_warehouse(
    scheduled_tenants, conn, warehouse_url
):
    conn.execute(
        "INSERT INTO raw_vtex.unreadable_orders (tenant_id, order_id, month, error)"
        " VALUES ('sched_a', 'v-1', '2026-02-01', 'GET /api/oms/pvt/orders/v-1: 500')"
    )
    conn.commit()
    evening = datetime(2026, 12, 15, 18, tzinfo=BUENOS_AIRES)
    resources = {"warehouse": WarehouseResource(url=warehouse_url)}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(tenants.name, ["sched_a", "sched_b", "sched_c"])
        with dg.build_schedule_context(instance, evening, resources=resources) as context:
            requests = vtex_orders_twice_daily(context)
    # sched_a and sched_b are neighbours: one run over their recent month, then the repair.
    block, repair = requests
    assert (block.tags[RANGE_START_TAG], block.tags[RANGE_END_TAG]) == (
        "2026-12-01|sched_a",
        "2026-12-01|sched_b",
    )
    assert str(repair.partition_key) == "2026-02-01|sched_a"


def test_catalog_sync_at_five_per_active_tenant(scheduled_tenants):
    requests = tenant_run_requests(scheduled_tenants, datetime(2026, 12, 2, 5, tzinfo=BUENOS_AIRES))
    assert [r.partition_key for r in requests] == ["sched_b", "sched_a"]
    assert vtex_catalog_daily.cron_schedule == "0 5 * * *"


def test_the_schedules_are_valid_definitions():
    # Resolving the code location validates each schedule against its job.
    defs.resolve_all_job_defs()
    assert {s.name for s in defs.schedules} >= {
        "vtex_orders_twice_daily",
        "vtex_catalog_daily",
        "audiences_every_48_hours",
        "activation_every_48_hours",
        "churn_holdout_weekly",
    }
    assert {s.name for s in defs.sensors} >= {"tenant_partitions_sensor", "audience_changes_sensor"}


def test_audiences_keep_a_48_hour_rhythm_across_month_and_year_ends():
    run_days = []
    day = date(2026, 12, 20)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(tenants.name, ["sched_a", "sched_b"])
        while day < date(2027, 3, 10):
            when = datetime(day.year, day.month, day.day, 10, tzinfo=BUENOS_AIRES)
            with dg.build_schedule_context(instance, scheduled_execution_time=when) as context:
                request = audiences_every_48_hours(context)
            if isinstance(request, dg.RunRequest):
                # One run over every tenant.
                assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == (
                    "sched_a",
                    "sched_b",
                )
                run_days.append(day)
            day += timedelta(days=1)
    gaps = {b - a for a, b in zip(run_days, run_days[1:], strict=False)}
    assert gaps == {timedelta(days=2)}
    assert len(run_days) >= 39


def test_churn_holdout_runs_weekly_over_blocks_of_neighbouring_tenants(
    scheduled_tenants, warehouse_url
):
    """One run per block of active tenants that have a partition: the inactive sched_c
    splits sched_a and sched_b from sched_d."""
    sunday = datetime(2026, 12, 6, 3, tzinfo=BUENOS_AIRES)
    resources = {"warehouse": WarehouseResource(url=warehouse_url)}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(tenants.name, ["sched_a", "sched_b", "sched_c", "sched_d"])
        with dg.build_schedule_context(instance, sunday, resources=resources) as context:
            pair, single = churn_holdout_weekly(context)
    assert (pair.tags[RANGE_START_TAG], pair.tags[RANGE_END_TAG]) == ("sched_a", "sched_b")
    assert pair.partition_key is None and "dagster/priority" not in pair.tags
    assert single.partition_key == "sched_d" and RANGE_START_TAG not in single.tags
    assert pair.run_key.endswith("|20261206") and pair.run_key != single.run_key
    assert churn_holdout_weekly.job_name == CHURN_HOLDOUT_JOB
    assert churn_holdout_weekly.cron_schedule == "0 3 * * 0"


def test_the_daily_refresh_leaves_the_churn_holdout_to_its_weekly_job():
    graph = defs.resolve_asset_graph()
    holdout = [dg.AssetKey(k) for k in HOLDOUT_ASSETS]
    daily = [dg.AssetKey(k) for k in ("customers", "customer_predictions", "churn_risk")]
    assert all(graph.get(key).automation_condition is None for key in holdout)
    assert all(graph.get(key).automation_condition is not None for key in daily)
    daily_job = defs.resolve_job_def(ANALYTICS_JOB).asset_layer.selected_asset_keys
    weekly_job = defs.resolve_job_def(CHURN_HOLDOUT_JOB).asset_layer.selected_asset_keys
    assert set(holdout) == set(weekly_job) and not set(holdout) & set(daily_job)
    assert set(daily) <= set(daily_job)


def test_dbt_runs_one_at_a_time(instance):
    apply_pool_limits(instance)
    assert instance.event_log_storage.get_concurrency_info("dbt").slot_count == 1


def test_a_tick_of_the_orders_schedule_creates_one_run_per_block_in_few_statements(
    warehouse_url, monkeypatch
):
    """The daemon's tick, as Dagster's scheduler runs it: one queued run over the block of
    tenants, its planned months and checks recorded, in few statements a run (400 tenants took
    the tick past its budget when it created a run per tenant at two dozen statements each)."""
    name = f"cdp_tick_{uuid.uuid4().hex[:8]}"
    url = migrated_url(with_database(warehouse_url, name))
    monkeypatch.setenv("DATABASE_URL", url)
    overrides = {
        "storage": storage_config(sqlalchemy_url(url)),
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "QueuedRunCoordinator",
        },
        "telemetry": {"enabled": False},
    }
    tenant_ids = [f"tick_{i}" for i in range(6)]
    statements: list[str] = []

    def executed(_conn, _cursor, statement: str, *_: object) -> None:
        statements.append(statement)

    try:
        with psycopg.connect(url) as conn:
            for tenant in tenant_ids:
                add_tenant(conn, Tenant(tenant, tenant.replace("_", ""), "K", "T"))
        with (
            dg.instance_for_test(overrides=overrides) as instance,
            create_test_daemon_workspace_context(
                InProcessWorkspaceLoadTarget(
                    InProcessCodeLocationOrigin(
                        LoadableTargetOrigin(module_name="cdp_assets.definitions"),
                        location_name="cdp",
                    )
                ),
                instance,
            ) as workspace,
        ):
            instance.add_dynamic_partitions(tenants.name, tenant_ids)
            due = next(
                cron_string_iterator(
                    datetime.now(UTC).timestamp(),
                    vtex_orders_twice_daily.cron_schedule,
                    vtex_orders_twice_daily.execution_timezone,
                )
            ).astimezone(UTC)

            def scheduler_until(end: datetime) -> None:
                logger = logging.getLogger("scheduler")
                list(launch_scheduled_runs(workspace, logger, end, iteration_times={}))

            scheduler_until(due - timedelta(minutes=1))  # the schedules' states, no tick yet
            engines = [instance.run_storage._engine, instance.event_log_storage._engine]
            for engine in engines:
                sqlalchemy.event.listen(engine, "before_cursor_execute", executed)
            try:
                scheduler_until(due + timedelta(seconds=1))
            finally:
                for engine in engines:
                    sqlalchemy.event.remove(engine, "before_cursor_execute", executed)

            runs = instance.get_runs()
            (block,) = [r for r in runs if r.job_name == vtex_orders_sync.name]
            assert block.status == dg.DagsterRunStatus.QUEUED
            # Its planned months and checks are recorded, as Dagster records them: every
            # tenant's recent months in the one run.
            planned = instance.get_records_for_run(
                block.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
            ).records
            months = recent_months(due)
            assert sorted(r.partition_key for r in planned) == sorted(
                f"{month}|{tenant}" for tenant in tenant_ids for month in months
            )
            for check in ORDERS_CHECKS:
                history = instance.event_log_storage.get_asset_check_execution_history(
                    dg.AssetCheckKey(dg.AssetKey("vtex_orders"), check), limit=50
                )
                assert block.run_id in {c.run_id for c in history}, check
            # The whole tick: the block's run, its six tenants' months planned, and the other
            # schedules' runs due (a run per tenant cost 17 statements each).
            assert len(statements) <= 30 * len(runs), (len(statements), len(runs))
    finally:
        with psycopg.connect(with_database(warehouse_url, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
