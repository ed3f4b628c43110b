"""Concurrency: runs of one tenant queue behind each other, and when they do overlap (a range
of months launched as one run carries no tenant tag; a coordinator without the limits) the
upsert still lands every record exactly once. Different tenants run side by side without
touching each other's rows, even when they share every key.

Each run is a `run_worker` process, as the run launcher starts them; their runs are read back
from the test database, which is their Dagster storage too.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
import yaml

# The queued run coordinator's own test of a run against the runs in progress.
from dagster._utils.tags import TagConcurrencyLimitsCounter
from run_worker import Worker
from support import TABLES, THIS_MONTH, months_ago, register
from truth import compare, landed_rows, load_truth, truth_counts

from cdp_assets.partitions import tenants
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

STORE = StoreSpec(
    account="concurrency",
    seed=51,
    customers=300,
    orders=500,
    products=20,
    history_start=months_ago(6),
    history_end=THIS_MONTH,
)
FIRST_MONTH = STORE.history_start.isoformat()
# The store's last month, its busiest: the shape of a twice-daily run (one tenant, one month).
LAST_MONTH = months_ago(1).isoformat()
RUN_CONFIGS = {
    "local": files("cdp_assets.lib") / "dagster.yaml",
    "production": Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml",
}
TENANT_ONLY = ("products", "skus", "customers")  # their runs carry dagster/partition alone

Runs = dict[str, dg.RunRecord]  # one worker's runs, by entity


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([STORE]) as server:
        yield server


def together(instance: dg.DagsterInstance, gate: Path, *workers: tuple[str, ...]) -> list[Runs]:
    """Start the workers' runs at the same moment and wait for them; their runs. `gate`: an
    empty folder."""
    started = [Worker(*args, gate=gate) for args in workers]
    Worker.wait_ready(gate, started)
    Worker.open(gate)
    return [finished(instance, worker) for worker in started]


def finished(instance: dg.DagsterInstance, worker: Worker) -> Runs:
    return {e: instance.get_run_record_by_id(run_id) for e, run_id in worker.runs().items()}


def overlap(*workers: Runs) -> float:
    """Seconds during which every one of the workers had a run in progress."""
    spans = [
        (min(r.start_time for r in runs.values()), max(r.end_time for r in runs.values()))
        for runs in workers
    ]
    return min(end for _, end in spans) - max(begin for begin, _ in spans)


def landed(instance: dg.DagsterInstance, record: dg.RunRecord, figure: str) -> int:
    """A row count of the run: each partition of a range (a month) records its own."""
    events = instance.all_logs(
        record.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    )
    return sum(event.asset_materialization.metadata[figure].value for event in events)


def retried(instance: dg.DagsterInstance, records: list[dg.RunRecord]) -> int:
    """Step retries: a deadlock or serialization failure in an upsert would show here."""
    return sum(
        len(instance.all_logs(r.dagster_run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY))
        for r in records
    )


def succeeded(records: list[dg.RunRecord]) -> bool:
    return all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)


def inserted(instance: dg.DagsterInstance, records: list[dg.RunRecord]) -> int:
    return sum(landed(instance, record, "rows_inserted") for record in records)


def updated(instance: dg.DagsterInstance, records: list[dg.RunRecord]) -> int:
    return sum(landed(instance, record, "rows_updated") for record in records)


def add_tenant(conn, instance: dg.DagsterInstance, tenant_id: str) -> None:
    """Register the tenant and its partition up front: workers started together would both
    try to add the partition."""
    register(conn, tenant_id, STORE.account, history_start=STORE.history_start)
    instance.add_dynamic_partitions(tenants.name, [tenant_id])


def run_limits() -> dict[str, list[dict[str, Any]]]:
    """Each dagster.yaml's tag concurrency limits, as the run coordinator reads them."""
    return {
        name: yaml.safe_load(path.read_text())["concurrency"]["runs"]["tag_concurrency_limits"]
        for name, path in RUN_CONFIGS.items()
    }


def queued_behind(
    limits: list[dict[str, Any]], running: dg.DagsterRun, queued: dg.DagsterRun
) -> bool:
    """Whether the coordinator keeps `queued` waiting while `running` is in progress."""
    return TagConcurrencyLimitsCounter(limits, [running]).is_blocked(queued)


def in_month(conn, month: str) -> int:
    (count,) = conn.execute(
        "SELECT count(*) FROM truth WHERE entity = 'orders' AND created >= %s"
        " AND created < %s::date + interval '1 month'",
        (month, month),
    ).fetchone()
    return count


def test_two_runs_of_one_tenant_queue_behind_each_other_and_land_everything_once(
    conn, instance, sandbox, reliability_report, tmp_path
):
    tenant_id = "conc_same"
    add_tenant(conn, instance, tenant_id)
    load_truth(conn, sandbox, STORE.account)
    truth = truth_counts(conn)
    month_orders = in_month(conn, LAST_MONTH)
    port = str(sandbox.port)

    # At the same moment: the tenant's last month twice (the twice-daily schedule's shape),
    # and all of it twice (a range of months, catalog, customers).
    month, ingest = ("month", tenant_id, port, LAST_MONTH), ("ingest", tenant_id, port, FIRST_MONTH)
    *month_runs, sync_a, sync_b = together(instance, tmp_path, month, month, ingest, ingest)
    months = [runs["orders"] for runs in month_runs]
    syncs = [sync_a, sync_b]
    month_overlap, sync_overlap = overlap(*month_runs), overlap(*syncs)
    comparison = compare(conn, sandbox, tenant_id, STORE.account)
    by_entity = {entity: [runs[entity] for runs in syncs] for entity in TABLES}
    records = months + [record for pair in by_entity.values() for record in pair]
    # Every record inserted by exactly one of the runs, and never rewritten by the other.
    landed_once = {
        "orders": inserted(instance, months + by_entity["orders"]) == truth["orders"],
        **{e: inserted(instance, by_entity[e]) == truth[e] for e in TENANT_ONLY},
    }
    rewritten, retries = updated(instance, records), retried(instance, records)
    reliability_report.record(
        "concurrency: two runs of one tenant at once",
        faults=f"2 runs of {tenant_id} {LAST_MONTH[:7]} ({month_overlap:.1f} s together),"
        f" 2 full syncs ({sync_overlap:.1f} s together)",
        checked=comparison.checked,
        lost=comparison.lost,
        duplicates=comparison.duplicates + rewritten,
        passed=succeeded(records) and comparison.exact and all(landed_once.values()),
    )
    assert month_overlap > 0 and sync_overlap > 0  # they really ran at the same time
    assert succeeded(records) and retries == 0
    assert inserted(instance, months) == month_orders
    assert landed_once == dict.fromkeys(landed_once, True)
    assert rewritten == 0
    assert comparison.exact, comparison

    # What the run queue does with such pairs: the second waits for the first.
    for name, limits in run_limits().items():
        first, second = (record.dagster_run for record in months)
        assert queued_behind(limits, first, second), name
        for entity in TENANT_ONLY:
            first, second = (record.dagster_run for record in by_entity[entity])
            assert queued_behind(limits, first, second), (name, entity)


def test_different_tenants_run_in_parallel_without_touching_each_other(
    conn, instance, sandbox, reliability_report, tmp_path
):
    # Two tenants on one VTEX account: every order, SKU and customer id is shared.
    tenant_ids = ("conc_left", "conc_right")
    for tenant_id in tenant_ids:
        add_tenant(conn, instance, tenant_id)
    load_truth(conn, sandbox, STORE.account)
    truth = truth_counts(conn)
    port = str(sandbox.port)
    syncs = together(instance, tmp_path, *[("ingest", t, port, FIRST_MONTH) for t in tenant_ids])
    together_seconds = overlap(*syncs)
    left, right = (compare(conn, sandbox, t, STORE.account) for t in tenant_ids)
    total = left + right
    each_complete = [
        {entity: inserted(instance, [runs[entity]]) for entity in TABLES} == truth for runs in syncs
    ]
    records = [record for runs in syncs for record in runs.values()]
    reliability_report.record(
        "concurrency: two tenants sharing every key, in parallel",
        faults=f"full syncs of {' and '.join(tenant_ids)} ({together_seconds:.1f} s together)",
        checked=total.checked,
        lost=total.lost,
        duplicates=total.duplicates,
        passed=succeeded(records) and total.exact and all(each_complete),
    )
    assert together_seconds > 0
    assert succeeded(records) and retried(instance, records) == 0
    assert all(each_complete)  # each tenant got its own copy of every record
    assert total.exact, total
    for name, limits in run_limits().items():
        for entity in TABLES:
            left, right = (runs[entity].dagster_run for runs in syncs)
            assert not queued_behind(limits, left, right), (name, entity)


@pytest.mark.long
@pytest.mark.parametrize("seed", range(1, 6))
def test_runs_of_one_tenant_overlapping_a_change_converge_to_the_newest(
    conn, warehouse_url, instance, sandbox, reliability_report, tmp_path, seed
):
    tenant_id = f"conc_changing_{seed}"
    add_tenant(conn, instance, tenant_id)
    port = str(sandbox.port)
    # Two runs start together; once they are landing, orders change and a third run, which
    # re-reads every month, starts: what the first two read before the change must not win
    # over what it reads after, whichever lands last.
    first, late = tmp_path / "first", tmp_path / "late"
    first.mkdir()
    late.mkdir()
    pair = [Worker("ingest", tenant_id, port, FIRST_MONTH, gate=first) for _ in range(2)]
    refresh = Worker("refresh", tenant_id, port, FIRST_MONTH, gate=late)
    Worker.wait_ready(late, [refresh])
    Worker.wait_ready(first, pair)
    Worker.open(first)
    with psycopg.connect(warehouse_url, autocommit=True) as poll:
        while landed_rows(poll, tenant_id) == 0:
            time.sleep(0.01)
    at = datetime.now(UTC) - timedelta(hours=1)
    sandbox.mutate(STORE.account, seed=100 + seed, changed=40, new=10, at=at)
    Worker.open(late)
    workers = [finished(instance, worker) for worker in (*pair, refresh)]
    comparison = compare(conn, sandbox, tenant_id, STORE.account)
    records = [record for runs in workers for record in runs.values()]
    reliability_report.record(
        f"concurrency: runs of one tenant overlapping a change of orders (seed {seed})",
        faults=f"3 full syncs ({overlap(*workers):.1f} s together), 40 orders changed and 10"
        " created after two had started",
        checked=comparison.checked,
        lost=comparison.lost,
        duplicates=comparison.duplicates,
        passed=succeeded(records) and comparison.exact,
    )
    assert succeeded(records) and retried(instance, records) == 0
    assert comparison.exact, comparison
