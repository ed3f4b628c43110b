"""Helpers shared by the tests that ingest from the sandbox."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import orjson
import psycopg
from dagster._daemon.types import DaemonHeartbeat

from cdp_assets.analytics.dbt_files import (
    DBT_EXECUTABLE,
    DBT_PROJECT_DIR,
    PRODUCTION_STATE,
    RUN_VARS_ENV,
    dbt_connection_env,
    keep_parse,
)
from cdp_assets.framework.dbt_cli import seed_parse
from cdp_assets.framework.dbt_fork import ForkedDbt
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import month_start, order_months, tenant_month_range_tags, tenants
from cdp_assets.tenants.registry import Tenant, add_tenant, vtex_orders_available_from
from cdp_assets.vtex.assets import vtex_customers, vtex_orders, vtex_products, vtex_skus
from cdp_assets.vtex.import_orders import import_orders
from cdp_assets.vtex.resources import VtexResource
from cdp_devkit.sandbox import SandboxProcess, StoreSpec, credentials_for


def order_row(
    order_id: str, last_change: datetime, status: str, created: datetime
) -> tuple[str, datetime, datetime, str, str]:
    """An order as the VTEX steps hand it to `upsert_documents`: id, last change, creation,
    summary and document."""
    document = {"orderId": order_id, "status": status, "lastChange": last_change.isoformat()}
    summary = {"status": status}
    return (
        order_id,
        last_change,
        created,
        orjson.dumps(summary).decode(),
        orjson.dumps(document).decode(),
    )


def months_ago(back: int) -> date:
    """The first day of the month `back` months before this one (UTC)."""
    return month_start(datetime.now(UTC), back).date()


# Where stores of whole months end.
THIS_MONTH = month_start(datetime.now(UTC))
# Where the test stores' order histories start: the first day of a month that lies whole
# within the two years VTEX serves orders for, whatever the day (that window begins two days
# after the date two years back, so up to the 2nd of the month 23 months back).
HISTORY_START = months_ago(22)


def store_from_history_start(
    account: str, *, seed: int, customers: int, orders: int, products: int, **spec: Any
) -> StoreSpec:
    """A synthetic store whose orders start at HISTORY_START; `spec` sets any other field of
    its StoreSpec."""
    return StoreSpec(
        account, seed, customers, orders, products, history_start=HISTORY_START, **spec
    )


TABLES = {
    "orders": ("order_id", vtex_orders),
    "products": ("product_id", vtex_products),
    "skus": ("sku_id", vtex_skus),
    "customers": ("customer_id", vtex_customers),
}


def register(
    conn: psycopg.Connection, tenant_id: str, account: str, history_start: date = HISTORY_START
) -> Tenant:
    key_ref, token_ref = f"TEST_{tenant_id.upper()}_KEY", f"TEST_{tenant_id.upper()}_TOKEN"
    os.environ[key_ref], os.environ[token_ref] = credentials_for(account)
    tenant = Tenant(tenant_id, account, key_ref, token_ref, history_start=history_start)
    add_tenant(conn, tenant)
    conn.commit()
    return tenant


def vtex_for(sandbox: SandboxProcess, **overrides) -> VtexResource:
    settings = {
        "base_url_template": sandbox.base_url + "/{account}",
        "requests_per_second": 5000,  # VTEX's limit does not apply on loopback
        "backoff_base_seconds": 0.05,
        "backoff_cap_seconds": 0.5,
        **overrides,
    }
    return VtexResource(**settings)


def sync(
    instance: dg.DagsterInstance,
    sandbox: SandboxProcess,
    tenant_id: str,
    *,
    vtex: VtexResource | None = None,
    entities=tuple(TABLES),
    months: tuple[str, str] | None = None,
    full_refresh: bool = False,
    raise_on_error: bool = True,
) -> dict[str, dg.ExecuteInProcessResult]:
    """Materialize the tenant's VTEX assets as the UI would: one run per partition set."""
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    resources = {"warehouse": WarehouseResource(), "vtex": vtex or vtex_for(sandbox)}
    results = {}
    for entity in entities:
        asset = TABLES[entity][1]
        if entity == "orders":
            first, last = months or (
                order_months.get_first_partition_key(),
                order_months.get_last_partition_key(),
            )
            run = {
                "tags": tenant_month_range_tags(tenant_id, first, last),
                "run_config": {"ops": {"vtex_orders": {"config": {"full_refresh": full_refresh}}}},
            }
        elif entity == "customers":
            run = {
                "partition_key": tenant_id,
                "run_config": {
                    "ops": {"vtex_customers": {"config": {"full_refresh": full_refresh}}}
                },
            }
        else:
            run = {"partition_key": tenant_id}
        results[entity] = dg.materialize(
            [asset], resources=resources, instance=instance, raise_on_error=raise_on_error, **run
        )
    return results


def import_unavailable_orders(
    conn: psycopg.Connection, sandbox: SandboxProcess, tenant_id: str, account: str, folder: Path
) -> None:
    """The account's orders older than VTEX serves, imported from a file of Get order
    documents, as an operator imports a store's history."""
    available_from = vtex_orders_available_from(datetime.now(UTC))
    path = folder / f"{tenant_id}-older-orders.ndjson"
    with path.open("wb") as file:
        for record in sandbox.export(account, "orders"):
            document = record["doc"]
            created = isinstance(document, dict) and document.get("creationDate")
            if created and datetime.fromisoformat(created) < available_from:
                file.write(orjson.dumps(document) + b"\n")
    import_orders(conn, tenant_id, path, "import-older-orders")


def evaluate_check(
    instance: dg.DagsterInstance,
    check: dg.AssetChecksDefinition,
    tenant_id: str,
    month: str | None = None,
) -> dg.AssetCheckEvaluation:
    """A VTEX asset check alone, for one tenant's partition (with `month`: one tenant x month
    partition), as a run launched for it runs it."""
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    (check_key,) = check.check_keys
    asset = next(a for _, a in TABLES.values() if a.key == check_key.asset_key)
    job = dg.define_asset_job(
        "check_alone",
        selection=dg.AssetSelection.checks(check),
        partitions_def=asset.partitions_def,
    )
    definitions = dg.Definitions(
        assets=[asset],
        asset_checks=[check],
        jobs=[job],
        resources={"warehouse": WarehouseResource(), "vtex": VtexResource()},
    )
    # The partition as a run launched for it carries it (execute_in_process's partition_key
    # looks for a partitioned asset in the selection, and there is none).
    tags = {"dagster/partition": tenant_id}
    if month is not None:
        key = dg.MultiPartitionKey({"tenant": tenant_id, "month": month})
        tags = {
            "dagster/partition": str(key),
            "dagster/partition/tenant": tenant_id,
            "dagster/partition/month": month,
        }
    result = definitions.resolve_job_def(job.name).execute_in_process(instance=instance, tags=tags)
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def metadata(result: dg.ExecuteInProcessResult) -> dict[str, float]:
    (event,) = result.get_asset_materialization_events()[:1]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def run_dbt(warehouse_url: str, *args: str, succeeds: bool = True) -> str:
    """Run dbt on the project against the test database's production schemas (target prod),
    as an operator would; its output. It must exit 0, or with `succeeds=False` must fail.

    dbt's own command line runs in a child forked from this process, as the platform's steps
    run it (framework/dbt_fork.py), from the project's kept parse of this database: a test
    pays neither a new interpreter's import of dbt nor a whole parse."""
    env = {**os.environ, **dbt_connection_env(warehouse_url), "DO_NOT_TRACK": "1"}
    command = [
        DBT_EXECUTABLE,
        *args,
        "--target",
        "prod",
        "--profiles-dir",
        str(DBT_PROJECT_DIR),
        "--project-dir",
        str(DBT_PROJECT_DIR),
    ]
    # A parse made with `--vars` would make the platform's next run on this database parse
    # the whole project again; one in a folder of the caller's is not the project's to keep.
    keeps = not {"--vars", "--target-path"} & set(args)
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder)
        env["DBT_TARGET_PATH"] = env["DBT_LOG_PATH"] = str(target)
        if keeps:
            seed_parse(PRODUCTION_STATE, target, env)
        dbt = ForkedDbt(command, env, DBT_PROJECT_DIR)
        try:
            with dbt.stdout:
                output = dbt.stdout.read().decode("utf-8", "replace")
        except BaseException:
            # Interrupted (a timeout, Ctrl-C): dbt stops as a `dbt` process would.
            dbt.send_signal(signal.SIGINT)
            dbt.wait()
            raise
        succeeded = dbt.wait() == 0
        if keeps and succeeded:
            keep_parse(target, env)
    assert succeeded == succeeds, output[-3000:]
    return output


def dbt_build(warehouse_url: str, tenant_id: str, select: str, as_of: str) -> None:
    """`dbt build` of one tenant's models as of a date, as the platform's runs build: the vars
    in the environment (a change of `--vars` would make dbt parse the whole project again),
    without the unit tests (which `test_dbt_unit_tests_pass` runs)."""
    vars_env = {RUN_VARS_ENV: json.dumps({"tenant_id": tenant_id, "as_of": as_of})}
    with temporary_environment(vars_env):
        run_dbt(warehouse_url, "build", "--select", select, "--exclude-resource-type", "unit_test")


HOLDOUT_RATES_SQL = """
SELECT risk.churn_band, count(*),
       avg((EXISTS (SELECT 1 FROM intermediate.int_orders__purchases p
                     WHERE p.tenant_id = risk.tenant_id AND p.customer_key = risk.customer_key
                       AND p.is_purchase AND p.order_date > %(calibration_end)s))::int)
  FROM marts.churn_risk risk WHERE risk.tenant_id = %(tenant)s GROUP BY 1
"""
RISK_BANDS = ("low", "medium", "high", "lost")


def holdout_repurchase_rates(
    conn: psycopg.Connection, tenant_id: str, calibration_end: str
) -> dict[str, tuple[int, float]]:
    """Per churn band (computed as of `calibration_end`): customers, and the share of them
    who bought again after it."""
    rows = conn.execute(
        HOLDOUT_RATES_SQL, {"calibration_end": calibration_end, "tenant": tenant_id}
    )
    return {band: (n, float(rate)) for band, n, rate in rows}


def assert_bands_rank_repurchase(rates: dict[str, tuple[int, float]]) -> None:
    observed = [rates[band][1] for band in RISK_BANDS if band in rates]
    assert len(observed) >= 3, rates
    assert observed == sorted(observed, reverse=True), rates


def daemon_alive(instance: dg.DagsterInstance) -> None:
    """A heartbeat now from every daemon the instance needs, as a running dagster-daemon
    writes them every 30 s (the health tests start the real one where it matters)."""
    for daemon in instance.get_required_daemon_types():
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), daemon, None, None))
