"""Backfills of `vtex_orders`, one tenant at a time.

Dagster builds a backfill's runs from key ranges of its selection, and ranges a two-dimensional
selection along whichever dimension has fewer distinct keys in it
(`DefaultPartitionsSubset.get_partition_key_ranges`, Dagster 1.13.27): a selection of more
tenants than months becomes runs of one month across neighbouring tenants. Such a run is not
one VTEX account's, so no per-tenant limit can queue it. A backfill of a single tenant ranges
along that tenant's months, so a backfill of orders is stored as one backfill per tenant
(`per_tenant_backfills`, called by the instance's run storage as the backfill is added, from the
UI or from code): each run is then a range of up to 24 contiguous months of one tenant (the
asset's backfill policy), the fewest runs that keep to one tenant each, and carries the
tenant's run tag, on which dagster.yaml's per-tenant limit keys.
"""

from __future__ import annotations

from collections import defaultdict

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.partitions.subset import DefaultPartitionsSubset
from dagster._core.execution.backfill import PartitionBackfill
from dagster._core.utils import make_new_backfill_id

from cdp_assets.partitions import TENANT_RUN_TAG, tenant_months

VTEX_ORDERS = dg.AssetKey("vtex_orders")
# On each slice of a backfill stored per tenant: the backfill the UI (or the caller) launched.
SLICE_OF_TAG = "cdp/backfill_slice_of"


def _orders_keys_by_tenant(backfill: PartitionBackfill) -> dict[str, set[str]] | None:
    """The selected `vtex_orders` partitions by tenant, when the backfill selects them alone
    and as a list of keys; None for any other backfill (other assets, every partition)."""
    data = backfill.asset_backfill_data
    if data is None or data.target_subset.asset_keys != {VTEX_ORDERS}:
        return None
    selected = data.target_subset.partitions_subsets_by_asset_key.get(VTEX_ORDERS)
    if not isinstance(selected, DefaultPartitionsSubset):
        return None
    by_tenant: dict[str, set[str]] = defaultdict(set)
    for key in selected.get_partition_keys():
        tenant = tenant_months.get_partition_key_from_str(key).keys_by_dimension["tenant"]
        by_tenant[tenant].add(key)
    return by_tenant


def per_tenant_backfills(backfill: PartitionBackfill) -> list[PartitionBackfill]:
    """`backfill` as one backfill per tenant, each tagged with its tenant, when it is a
    backfill of `vtex_orders` partitions; otherwise `[backfill]` unchanged. The first tenant's
    keeps the backfill's id, which the UI follows; the others name it in SLICE_OF_TAG."""
    by_tenant = _orders_keys_by_tenant(backfill)
    if not by_tenant:
        return [backfill]
    data = backfill.asset_backfill_data
    assert data is not None
    slices = []
    for index, tenant in enumerate(sorted(by_tenant)):
        # Dagster's NamedTuple sets `__hash__ = None`, which mypy takes for a third field.
        target = AssetGraphSubset(  # type: ignore[call-arg]
            partitions_subsets_by_asset_key={
                VTEX_ORDERS: DefaultPartitionsSubset(frozenset(by_tenant[tenant]))
            }
        )
        tags = {**backfill.tags, TENANT_RUN_TAG: tenant}
        if index:
            tags[SLICE_OF_TAG] = backfill.backfill_id
        slices.append(
            backfill._replace(
                backfill_id=make_new_backfill_id() if index else backfill.backfill_id,
                tags=tags,
                asset_backfill_data=data._replace(target_subset=target),
                asset_selection=[VTEX_ORDERS],
            )
        )
    return slices
