"""The chain from an order event to the audiences: the tenants whose orders the feed's drains
landed, and the refreshes of their analytics and audiences that `feed_changes_sensor`
(sensors.py) requests (their push follows from the audience-change sensor,
activation/sensors.py). Bursts coalesce: a tenant's queued refresh absorbs new landings, a
running one is followed by one more."""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import dagster as dg

from cdp_assets.tenants.runs import block_request, tenant_blocks
from cdp_assets.vtex.assets import TENANTS_LANDED, vtex_orders_feed

# Feed materializations read per query; a tick reads them all.
EVENTS_PER_PAGE = 1000


@dataclass
class FeedChanges:
    """The sensor's cursor: the last feed materialization read, and the tenants whose
    landed orders no refresh has read yet."""

    after_storage_id: int | None = None
    pending: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, cursor: str | None) -> "FeedChanges":
        if not cursor:
            return cls()
        state = json.loads(cursor)
        return cls(state["after_storage_id"], set(state["pending"]))

    def serialize(self) -> str:
        return json.dumps(
            {"after_storage_id": self.after_storage_id, "pending": sorted(self.pending)}
        )


def read_landings(instance: dg.DagsterInstance, changes: FeedChanges) -> None:
    """Adds to `changes.pending` the tenants whose feed drains landed rows since the cursor."""
    while True:
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=vtex_orders_feed.key, after_storage_id=changes.after_storage_id
            ),
            limit=EVENTS_PER_PAGE,
            ascending=True,
        )
        for record in result.records:
            changes.after_storage_id = record.storage_id
            materialization = record.asset_materialization
            assert materialization is not None  # the records are materializations
            landed = materialization.metadata.get(TENANTS_LANDED)
            tenant = record.partition_key
            if (
                isinstance(landed, dg.JsonMetadataValue)
                and tenant is not None
                and tenant in (landed.value or ())
            ):
                changes.pending.add(tenant)
        if not result.has_more:
            return


def due_tenants(
    pending: Iterable[str], queued: set[str], started: set[str]
) -> tuple[set[str], set[str]]:
    """(tenants to refresh now, tenants still pending). A tenant with a refresh queued is
    absorbed by it (the run reads what landed before it starts); one with a refresh running
    waits for it to end, since it may have read its orders already."""
    waiting = {tenant for tenant in pending if tenant in started}
    due = {tenant for tenant in pending if tenant not in started and tenant not in queued}
    return due, waiting


def changes_requests(
    due: set[str], tenant_rows: Sequence, partition_order: Sequence[str], run_key: str
) -> list[dg.RunRequest]:
    """One refresh per block of neighbouring due tenants (active, with a partition)."""
    concerned = [tenant for tenant in tenant_rows if tenant.tenant_id in due]
    return [block_request(block, run_key) for block in tenant_blocks(partition_order, concerned)]
