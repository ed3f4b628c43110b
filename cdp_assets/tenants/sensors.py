"""Keeps the `tenants` dynamic partitions equal to the valid, active rows of `cdp.tenants`."""

import dagster as dg
import psycopg

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import TENANT_PARTITIONS, tenants
from cdp_assets.tenants.registry import TenantError, list_tenants


def plan_tenant_partitions(
    conn: psycopg.Connection, existing: set[str]
) -> tuple[list[str], list[str], list[str]]:
    """(partitions to add, partitions to remove, why some active rows were left out)."""
    wanted: set[str] = set()
    refused: list[str] = []
    for tenant in list_tenants(conn, active_only=True):
        try:
            tenant.validate()
        except TenantError as error:  # a bad row must not block the others
            refused.append(str(error))
            continue
        wanted.add(tenant.tenant_id)
    return sorted(wanted - existing), sorted(existing - wanted), refused


@dg.sensor(
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 30 s, makes the `tenants` partitions those of the active rows of"
    " cdp.tenants: adds a partition for each new active tenant and removes those of"
    " deactivated or deleted ones. A row that fails validation is left out, with a warning in"
    " the tick's log.",
)
def tenant_partitions_sensor(
    context: dg.SensorEvaluationContext, warehouse: WarehouseResource
) -> dg.SensorResult | dg.SkipReason:
    existing = set(context.instance.get_dynamic_partitions(TENANT_PARTITIONS))
    with warehouse.connect() as conn:
        added, removed, refused = plan_tenant_partitions(conn, existing)
    for message in refused:
        context.log.warning(message)
    if not added and not removed:
        return dg.SkipReason(f"{len(existing)} tenant partitions, all up to date")
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if added:
        requests.append(tenants.build_add_request(added))
    if removed:
        requests.append(tenants.build_delete_request(removed))
    context.log.info(f"tenant partitions: added {added}, removed {removed}")
    return dg.SensorResult(dynamic_partitions_requests=requests)
