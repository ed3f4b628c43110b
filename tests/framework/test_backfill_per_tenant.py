"""A backfill of `vtex_orders` launched as the UI launches it (its GraphQL mutation, in
process) and turned into runs by Dagster's backfill daemon iteration: whatever the shape of the
selection, every run covers months of one tenant, carries that tenant's run tag, and there are
no more runs than one per 24 contiguous selected months of a tenant."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_graphql.test.utils import execute_dagster_graphql
from support import months_ago

from cdp_assets.framework.backfills import SLICE_OF_TAG
from cdp_assets.framework.dagster_storage import storage_config
from cdp_assets.lib.database import sqlalchemy_url
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, TENANT_RUN_TAG, tenants

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_PARTITION_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
  }
}
"""
MAX_MONTHS_PER_RUN = 24  # vtex_orders' backfill policy


@pytest.fixture(scope="module")
def queued_instance(warehouse_url: str) -> Iterator[dg.DagsterInstance]:
    """The platform's storage with Dagster's run queue: submitted runs wait there (no daemon
    dequeues them here), as they do while the queue's limits hold them."""
    overrides = {
        "storage": storage_config(sqlalchemy_url(warehouse_url)),
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "QueuedRunCoordinator",
        },
        "telemetry": {"enabled": False},
    }
    with dg.instance_for_test(overrides=overrides) as instance:
        yield instance


@pytest.fixture(scope="module")
def workspace(queued_instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="cdp_assets.definitions", working_directory=str(ROOT)),
        location_name="cdp",
    )
    target = InProcessWorkspaceLoadTarget(origin)
    with create_test_daemon_workspace_context(target, queued_instance) as context:
        yield context


def _dimensions(key: str) -> dict[str, str]:
    month, tenant = key.split("|")  # Dagster sorts the dimensions by name
    return {"month": month, "tenant": tenant}


def _key(tenant: str, month: str) -> str:
    return str(dg.MultiPartitionKey({"tenant": tenant, "month": month}))


def _months(first_back: int, count: int) -> list[str]:
    """`count` consecutive month keys, the oldest `first_back` months ago."""
    return [months_ago(first_back - i).isoformat() for i in range(count)]


def _launch(workspace: WorkspaceProcessContext, asset: str, keys: list[str]) -> list:
    """Launch a backfill as the UI does; the backfills it was stored as."""
    params = {
        "tags": [{"key": "dagster/from_ui", "value": "true"}],
        "assetSelection": [{"path": [asset]}],
        "partitionNames": keys,
        "fromFailure": False,
    }
    launched = execute_dagster_graphql(
        workspace.create_request_context(), LAUNCH_PARTITION_BACKFILL, {"backfillParams": params}
    )
    result = launched.data["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    backfill_id = result["backfillId"]
    backfills = [
        b
        for b in workspace.instance.get_backfills()
        if b.backfill_id == backfill_id or b.tags.get(SLICE_OF_TAG) == backfill_id
    ]
    assert backfill_id in {b.backfill_id for b in backfills}
    return backfills


@contextmanager
def _launched_and_iterated(
    workspace: WorkspaceProcessContext, keys: list[str]
) -> Iterator[list[dg.DagsterRun]]:
    """Launch an orders backfill as the UI does, run the backfill daemon's iteration, and
    give the runs of the backfills it was stored as; then cancel those and delete the runs
    (queued: a daemon of a later test on this database would start them)."""
    backfills = _launch(workspace, "vtex_orders", keys)
    instance = workspace.instance
    try:
        list(execute_backfill_iteration(workspace, logging.getLogger("backfill")))
        yield [
            run
            for b in backfills
            for run in instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: b.backfill_id}))
        ]
    finally:
        _discard(instance, backfills)


def _discard(instance: dg.DagsterInstance, backfills: list) -> None:
    for backfill in backfills:
        stored = instance.get_backfill(backfill.backfill_id)
        instance.update_backfill(stored.with_status(BulkActionStatus.CANCELED))
        for run in instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill.backfill_id})):
            instance.delete_run(run.run_id)


def _ranges(runs: list[dg.DagsterRun]) -> list[tuple[dict[str, str], dict[str, str]]]:
    return [
        (_dimensions(run.tags[RANGE_START_TAG]), _dimensions(run.tags[RANGE_END_TAG]))
        for run in runs
    ]


def _minimal_runs(months_by_tenant: dict[str, list[str]]) -> int:
    """One run per 24 months of each stretch of a tenant's consecutive selected months."""
    every_month = _months(40, 41)
    count = 0
    for months in months_by_tenant.values():
        positions = sorted(every_month.index(m) for m in months)
        stretches = [1]
        for previous, current in zip(positions, positions[1:], strict=False):
            if current == previous + 1:
                stretches[-1] += 1
            else:
                stretches.append(1)
        count += sum(-(-length // MAX_MONTHS_PER_RUN) for length in stretches)
    return count


def test_a_backfill_of_more_tenants_than_months_runs_each_tenant_on_its_own(
    workspace: WorkspaceProcessContext,
) -> None:
    instance = workspace.instance
    wide = [f"bf_wide_{i:02d}" for i in range(30)]
    long_tenant, gap_tenant = "bf_long", "bf_gap"
    months_by_tenant = {tenant: _months(5, 3) for tenant in wide}
    months_by_tenant[long_tenant] = _months(30, 26)  # more than one run's worth
    three = _months(12, 4)
    months_by_tenant[gap_tenant] = [three[0], three[1], three[3]]  # a loaded month between
    instance.add_dynamic_partitions(tenants.name, sorted(months_by_tenant))
    try:
        selected = {_key(t, m) for t, months in months_by_tenant.items() for m in months}
        # More distinct tenants than distinct months in the selection: what Dagster ranges
        # along the month dimension.
        distinct_months = {m for months in months_by_tenant.values() for m in months}
        assert len(months_by_tenant) > len(distinct_months)

        with _launched_and_iterated(workspace, sorted(selected)) as runs:
            ranges = _ranges(runs)
        across_tenants = [(a, b) for a, b in ranges if a["tenant"] != b["tenant"]]
        assert not across_tenants, f"{len(across_tenants)} of {len(runs)} runs span tenants"
        span = _months(40, 41)
        covered: list[str] = []
        for run, (first, last) in zip(runs, ranges, strict=True):
            tenant = first["tenant"]
            assert run.tags.get(TENANT_RUN_TAG) == tenant, run.tags
            assert "dagster/partition/tenant" not in run.tags  # Dagster would misread the range
            months = span[span.index(first["month"]) : span.index(last["month"]) + 1]
            assert len(months) <= MAX_MONTHS_PER_RUN
            covered += [_key(tenant, m) for m in months]
        assert sorted(covered) == sorted(selected)  # each selected month once, nothing else
        assert len(runs) == _minimal_runs(months_by_tenant)
    finally:
        for tenant in months_by_tenant:
            instance.delete_dynamic_partition(tenants.name, tenant)


def test_a_backfill_of_other_assets_is_stored_as_launched(workspace: WorkspaceProcessContext):
    instance = workspace.instance
    shops = ["bf_cat_a", "bf_cat_b"]
    instance.add_dynamic_partitions(tenants.name, shops)
    try:
        backfills = _launch(workspace, "vtex_products", shops)
        _discard(instance, backfills)
        (backfill,) = backfills
        assert TENANT_RUN_TAG not in backfill.tags
        target = backfill.asset_backfill_data.target_subset
        selected = sorted((p.asset_key, p.partition_key) for p in target.iterate_asset_partitions())
        assert selected == [(dg.AssetKey("vtex_products"), shop) for shop in shops]
    finally:
        for shop in shops:
            instance.delete_dynamic_partition(tenants.name, shop)
