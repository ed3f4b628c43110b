"""Run requests over tenants: one run per block of neighbouring tenants (a range of
partitions).

No run carries a `dagster/priority`: the run queue is then first come, first served, and a
tick requests its runs in the tenants' priority order, so they launch in that order. With
the tenant's priority on every run, the chain's runs (feed drains, the refreshes after them,
the pushes of changed audiences), requested all day long, let the first tenants' steady
stream hold the last tenants' runs in the queue: a refresh waited 18 minutes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg

from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, TENANT_PARTITIONS
from cdp_assets.tenants.registry import Tenant, list_tenants


def with_partitions(rows: list[Tenant], partition_keys: set[str]) -> list[Tenant]:
    return [tenant for tenant in rows if tenant.tenant_id in partition_keys]


def tenants_with_partitions(
    context: dg.ScheduleEvaluationContext | dg.SensorEvaluationContext,
    warehouse: WarehouseResource,
) -> tuple[list[Tenant], Sequence[str]]:
    """Active tenants that already have a partition (the sensor adds new ones first), and the
    partitions in their order."""
    with warehouse.connect() as conn:
        rows = list_tenants(conn, active_only=True)
    order = context.instance.get_dynamic_partitions(TENANT_PARTITIONS)
    return with_partitions(rows, set(order)), order


def tenant_blocks(
    partition_order: Sequence[str], tenant_rows: list[Tenant], at_most: int | None = None
) -> list[list[Tenant]]:
    """`tenant_rows` as blocks of neighbours in the tenants' partition order: one block is one
    range of partitions, which one run covers. A tenant that is not in `tenant_rows` ends a
    block, so no run reaches it; a block of more than `at_most` tenants is cut into blocks of
    that many at most. The most urgent blocks (by their most urgent tenant's priority) come
    first."""
    by_id = {tenant.tenant_id: tenant for tenant in tenant_rows}
    blocks: list[list[Tenant]] = []
    current: list[Tenant] = []
    for tenant_id in partition_order:
        if tenant_id in by_id:
            current.append(by_id[tenant_id])
        if current and (tenant_id not in by_id or len(current) == at_most):
            blocks.append(current)
            current = []
    blocks += [current] if current else []
    return sorted(blocks, key=lambda block: min(tenant.priority for tenant in block))


def spanning_blocks(
    partition_order: Sequence[str], tenant_rows: list[Tenant], concerned: set[str]
) -> list[list[Tenant]]:
    """The blocks of `tenant_rows` (`tenant_blocks`), each cut to the span from its first to
    its last tenant in `concerned`, the others between them included; the most urgent (by
    their most urgent tenant concerned) first."""
    spans = []
    for block in tenant_blocks(partition_order, tenant_rows):
        at = [i for i, tenant in enumerate(block) if tenant.tenant_id in concerned]
        if at:
            spans.append(block[at[0] : at[-1] + 1])
    return sorted(
        spans,
        key=lambda span: min(tenant.priority for tenant in span if tenant.tenant_id in concerned),
    )


def block_request(
    block: list[Tenant],
    run_key: str,
    asset_selection: list[dg.AssetKey] | None = None,
    run_config: dict[str, Any] | None = None,
) -> dg.RunRequest:
    """One run over a block of tenants."""
    first, last = block[0].tenant_id, block[-1].tenant_id
    scope = {} if first == last else {RANGE_START_TAG: first, RANGE_END_TAG: last}
    return dg.RunRequest(
        run_key=f"{first}..{last}|{run_key}",
        partition_key=first if first == last else None,
        asset_selection=asset_selection,
        run_config=run_config or {},
        tags=scope,
    )


QUEUED = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)
STARTED = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


def runs_in_flight(instance: dg.DagsterInstance, job_name: str) -> Sequence[dg.RunRecord]:
    """The job's runs queued or started, with their start times."""
    return instance.get_run_records(
        filters=dg.RunsFilter(job_name=job_name, statuses=[*QUEUED, *STARTED])
    )


def run_tenants_of(run: dg.DagsterRun, partition_order: Sequence[str]) -> set[str]:
    """The tenant partitions a run covers: its partition, or its range in `partition_order`."""
    if "dagster/partition" in run.tags:
        return {run.tags["dagster/partition"]}
    first, last = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if first not in partition_order or last not in partition_order:
        return set()
    return set(partition_order[partition_order.index(first) : partition_order.index(last) + 1])
