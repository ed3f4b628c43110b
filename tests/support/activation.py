"""Activation test helpers over the synthetic audience warehouse."""

from __future__ import annotations

import dagster as dg
import psycopg

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.partitions import tenants
from cdp_devkit.sandbox.audience_warehouse import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    set_members,
)

__all__ = ["AUDIENCE", "activation_warehouse", "add_tenant_with_customers", "set_members"]


def register_destination(
    conn: psycopg.Connection, destination: Destination, audience: str = AUDIENCE
) -> None:
    add_destination(conn, destination)
    add_audience(conn, destination.destination_id, audience)
    conn.commit()


def runs(conn: psycopg.Connection, destination_id: str) -> list[dict]:
    cursor = conn.execute(
        "SELECT * FROM cdp.activation_runs WHERE destination_id = %s ORDER BY activation_run_id",
        (destination_id,),
    )
    names = [c.name for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def push(
    asset: dg.AssetsDefinition, instance, tenant_id: str, resources: dict, config: dict
) -> dg.ExecuteInProcessResult:
    """Materialize an activation asset for one tenant as the UI would, failures kept."""
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    return dg.materialize(
        [asset],
        partition_key=tenant_id,
        instance=instance,
        resources=resources,
        run_config={"ops": {asset.key.path[-1]: {"config": config}}},
        raise_on_error=False,
    )


def outcome(result: dg.ExecuteInProcessResult) -> dict:
    """The single destination audience row of the run's metadata table (also on failure)."""
    events = result.get_asset_materialization_events()
    if events:
        table = events[0].materialization.metadata["audiences"].value
    else:
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        table = failure.step_failure_data.user_failure_data.metadata["audiences"].value
    (record,) = table.records
    return record.data
