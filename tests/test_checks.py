"""The VTEX asset checks, run by Dagster for a tenant's partition as a sync's run runs them."""

from datetime import UTC, datetime

import dagster as dg
import psycopg
from support import register

from cdp_assets.lib.sync_state import set_cursor
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_assets.vtex.assets import vtex_customers
from cdp_assets.vtex.checks import raw_rows_checks
from cdp_assets.vtex.resources import VtexResource

CUSTOMERS_CHECK = next(c for c in raw_rows_checks if "customers" in str(c.check_keys))


def evaluate(instance: dg.DagsterInstance, tenant_id: str) -> dg.AssetCheckEvaluation:
    """The customers check alone, for one tenant's partition."""
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    job = dg.define_asset_job(
        "customers_check",
        selection=dg.AssetSelection.checks(CUSTOMERS_CHECK),
        partitions_def=tenants,
    )
    definitions = dg.Definitions(
        assets=[vtex_customers],
        asset_checks=[CUSTOMERS_CHECK],
        jobs=[job],
        resources={"warehouse": WarehouseResource(), "vtex": VtexResource()},
    )
    result = definitions.resolve_job_def(job.name).execute_in_process(
        # The partition as a run launched for it carries it (execute_in_process's
        # partition_key looks for a partitioned asset in the selection, and there is none).
        instance=instance,
        tags={"dagster/partition": tenant_id},
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation


def _synced(conn: psycopg.Connection, tenant_id: str) -> None:
    set_cursor(conn, tenant_id, "customers", datetime.now(UTC), "run-1")
    conn.commit()


def test_a_synced_tenant_without_rows_fails_its_own_check_only(conn, instance):
    register(conn, "chk_empty", "chkempty")
    register(conn, "chk_full", "chkfull")
    assert evaluate(instance, "chk_empty").passed  # not synced yet
    _synced(conn, "chk_empty")
    _synced(conn, "chk_full")
    conn.execute(
        "INSERT INTO raw_vtex.customers (tenant_id, customer_id, change_stamp, payload)"
        " VALUES ('chk_full', 'c1', now(), '{}')"
    )
    conn.commit()

    failing = evaluate(instance, "chk_empty")
    assert not failing.passed and failing.partition == "chk_empty"
    assert failing.metadata["tenants_without_rows"].value == "chk_empty"
    # The other tenant's check judges that tenant alone: green beside the empty one.
    other = evaluate(instance, "chk_full")
    assert other.passed and other.partition == "chk_full"
    assert other.metadata["tenants_checked"].value == "chk_full"

    conn.execute(
        "INSERT INTO raw_vtex.customers (tenant_id, customer_id, change_stamp, payload)"
        " VALUES ('chk_empty', 'c1', now(), '{}')"
    )
    conn.commit()
    assert evaluate(instance, "chk_empty").passed
