"""Database faults: the warehouse's Postgres restarts in the middle of an ingestion run.

A throwaway embedded server is started for this module (the shared test server is never
touched) and holds the warehouse; Dagster's own storage stays on the shared server, so what is
tested is how the VTEX steps take the warehouse going away: they retry on
`psycopg.OperationalError` (`retry_transient`), and when the outage outlasts the retries the run
fails with a clear error and the next run converges. Landing commits per batch, so a batch is
never half visible.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import dagster as dg
import psycopg
import pytest
from support import THIS_MONTH, months_ago, register, sync, vtex_for
from support.throwaway_postgres import Postgres, throwaway_postgres
from truth import (
    compare,
    cursor_gaps,
    landed_rows,
    load_truth,
    partial_batches,
    truth_counts,
    wrong_rows,
)

from cdp_assets.partitions import order_months
from cdp_assets.vtex.sync import BATCH_SIZE
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

# Seven months of orders, and customers in three landing batches (2,000 + 2,000 + 500).
STORE = StoreSpec(
    account="dbfaults",
    seed=41,
    customers=4500,
    orders=600,
    products=15,
    history_start=months_ago(7),
    history_end=THIS_MONTH,
)
MONTHS = (STORE.history_start.isoformat(), order_months.get_last_partition_key())
SEEDS, SEEDS_LONG = [1], range(2, 8)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with throwaway_postgres("cdp_database_faults") as server:
        yield server


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess([STORE]) as server:
        yield server


class Restart(threading.Thread):
    """Restarts the server once `threshold` rows of the tenant have landed, keeping it down for
    `downtime` seconds, then looks at what the interrupted run left visible."""

    def __init__(
        self,
        postgres: Postgres,
        sandbox: SandboxProcess,
        tenant_id: str,
        threshold: int,
        downtime: float,
    ) -> None:
        super().__init__(name=f"restart-{tenant_id}")
        self.postgres, self.sandbox, self.tenant_id = postgres, sandbox, tenant_id
        self.threshold, self.downtime = threshold, downtime
        self.run_over = threading.Event()
        self.landed: int | None = None  # rows visible when the server went down
        self.partial: list[str] = []
        self.wrong = self.gaps = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.postgres.url, autocommit=True) as poll:
                while (landed := landed_rows(poll, self.tenant_id)) < self.threshold:
                    if self.run_over.wait(0.005):
                        return
            self.landed = landed
            self.postgres.stop()
            time.sleep(self.downtime)
            self.postgres.start()
            with psycopg.connect(self.postgres.url) as conn:
                load_truth(conn, self.sandbox, STORE.account)
                self.partial = partial_batches(conn, self.tenant_id)
                self.wrong = wrong_rows(conn, self.tenant_id)
                self.gaps = cursor_gaps(conn, self.tenant_id)
        except BaseException as error:  # re-raised in the test's thread by `finish`
            self.error = error

    def finish(self) -> None:
        self.run_over.set()
        self.join()
        if self.error is not None:
            raise self.error


def step_retries(result: dg.ExecuteInProcessResult) -> list[str]:
    """The errors the run's steps were retried for."""
    return [
        event.event_specific_data.error.to_string()
        for event in result.all_events
        if event.event_type_value == "STEP_UP_FOR_RETRY"
    ]


def store_counts(postgres: Postgres, sandbox: SandboxProcess) -> dict[str, int]:
    with psycopg.connect(postgres.url) as conn:
        load_truth(conn, sandbox, STORE.account)
        return truth_counts(conn)


def restart_mid_run(postgres, sandbox, instance, reliability_report, monkeypatch, seed: int):
    tenant_id = f"db_restart_{seed}"
    monkeypatch.setenv("DATABASE_URL", postgres.url)  # the assets' WarehouseResource()
    with psycopg.connect(postgres.url) as conn:
        register(conn, tenant_id, STORE.account, history_start=STORE.history_start)
    # Down while the orders step lands its months; back before its first retry.
    orders = store_counts(postgres, sandbox)["orders"]
    threshold = random.Random(seed).randint(orders // 5, orders * 3 // 4)
    restart = Restart(postgres, sandbox, tenant_id, threshold, downtime=0.5)
    restart.start()
    try:
        vtex = vtex_for(sandbox, step_retry_base_seconds=1.0)
        results = sync(instance, sandbox, tenant_id, vtex=vtex, months=MONTHS)
    finally:
        restart.finish()
    retries = step_retries(results["orders"])
    with psycopg.connect(postgres.url) as conn:
        comparison = compare(conn, sandbox, tenant_id, STORE.account)
        gaps = cursor_gaps(conn, tenant_id)
    reliability_report.record(
        f"database: Postgres restarted mid-run (seed {seed})",
        faults=f"fast shutdown with {restart.landed} rows landed, down 0.5 s;"
        f" {len(retries)} step retries",
        checked=comparison.checked,
        lost=comparison.lost + gaps + restart.gaps,
        duplicates=comparison.duplicates,
        passed=comparison.exact and not (restart.partial or restart.wrong),
    )
    assert restart.landed is not None  # the restart happened during the run
    assert restart.partial == [] and restart.wrong == 0 and restart.gaps == 0
    assert retries and all("psycopg" in error for error in retries), retries
    assert comparison.exact, comparison
    assert gaps == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restart_mid_run_is_retried_and_the_run_converges(
    postgres, sandbox, instance, reliability_report, monkeypatch, seed
):
    restart_mid_run(postgres, sandbox, instance, reliability_report, monkeypatch, seed)


@pytest.mark.long
@pytest.mark.parametrize("seed", SEEDS_LONG)
def test_restarts_mid_run_long(postgres, sandbox, instance, reliability_report, monkeypatch, seed):
    restart_mid_run(postgres, sandbox, instance, reliability_report, monkeypatch, seed)


def test_an_outage_longer_than_the_retries_fails_clearly_and_the_next_run_converges(
    postgres, sandbox, instance, reliability_report, monkeypatch
):
    tenant_id = "db_outage"
    monkeypatch.setenv("DATABASE_URL", postgres.url)
    with psycopg.connect(postgres.url) as conn:
        register(conn, tenant_id, STORE.account, history_start=STORE.history_start)
    counts = store_counts(postgres, sandbox)
    # Down once the first customers batch is visible, for longer than the step's retries
    # last; each Master Data page takes a second, so the next batch is still to come.
    first_batch = sum(counts.values()) - counts["customers"] + BATCH_SIZE
    restart = Restart(postgres, sandbox, tenant_id, first_batch, downtime=5.0)
    restart.start()
    sandbox.set_faults({"rate_slow": 1.0, "slow_seconds": 1.0, "routes": ["masterdata"]})
    try:
        vtex = vtex_for(sandbox, step_retry_base_seconds=0.1)
        failed = sync(instance, sandbox, tenant_id, vtex=vtex, months=MONTHS, raise_on_error=False)
    finally:
        sandbox.clear_faults()
        restart.finish()
    customers = failed["customers"]
    error = customers.get_step_failure_events()[0].event_specific_data.error.to_string()
    retries = step_retries(customers)

    rerun = sync(instance, sandbox, tenant_id, entities=("customers",))
    with psycopg.connect(postgres.url) as conn:
        comparison = compare(conn, sandbox, tenant_id, STORE.account)
    reliability_report.record(
        "database: Postgres down longer than the step retries",
        faults=f"fast shutdown with {restart.landed} rows landed, down 5 s; run failed after"
        f" {len(retries)} step retries",
        checked=comparison.checked,
        lost=comparison.lost + restart.gaps,
        duplicates=comparison.duplicates,
        passed=rerun["customers"].success
        and comparison.exact
        and not (restart.partial or restart.wrong),
    )
    assert all(failed[entity].success for entity in ("orders", "products", "skus"))
    assert not customers.success and len(retries) == 3
    # The operator sees what went wrong: the database connection, not a generic failure.
    assert "OperationalError" in error and "connection" in error, error
    # What the failed run left: whole batches only, and no cursor ahead of them.
    assert restart.landed == first_batch
    assert restart.partial == [] and restart.wrong == 0 and restart.gaps == 0
    assert rerun["customers"].success
    assert comparison.exact, comparison
