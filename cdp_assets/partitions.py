"""Partitions shared by every tenant-scoped asset, and the time zone the schedules keep."""

from datetime import UTC, datetime

import dagster as dg

from cdp_assets.tenants.registry import SLUG

# The stores' (and their operators') clock: schedules tick on it.
TIMEZONE = "America/Argentina/Buenos_Aires"
# The name the instance stores the tenant partitions under.
TENANT_PARTITIONS = "tenants"
tenants = dg.DynamicPartitionsDefinition(name=TENANT_PARTITIONS)

# VTEX order dates are UTC, so month windows are UTC too; the current month is a
# partition (end_offset=1) so the twice-daily sync has somewhere to land.
order_months = dg.MonthlyPartitionsDefinition(start_date="2020-01-01", end_offset=1)

tenant_months = dg.MultiPartitionsDefinition({"tenant": tenants, "month": order_months})


def month_start(moment: datetime, back: int = 0) -> datetime:
    """The first instant (UTC) of the month `back` months before `moment`'s."""
    index = moment.year * 12 + moment.month - 1 - back
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


# Dagster's run tags for one run over a range of partitions (what a UI backfill sends).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# The tenant of a run over a range of one tenant's months, for the per-tenant run limit of
# dagster.yaml. Not `dagster/partition/tenant`, which a run of one partition carries: on a
# range run Dagster would read that tag as the run's (one-dimensional) partition key.
TENANT_RUN_TAG = "cdp/tenant"


def tenant_month_key(tenant_id: str, month: str) -> dg.MultiPartitionKey:
    """The `tenant_months` partition of one tenant's month."""
    return dg.MultiPartitionKey({"tenant": tenant_id, "month": month})


def tenant_month_range_tags(tenant_id: str, first_month: str, last_month: str) -> dict[str, str]:
    """Tags for one run over months `first_month`..`last_month` of one tenant's orders."""
    return {
        RANGE_START_TAG: tenant_month_key(tenant_id, first_month),
        RANGE_END_TAG: tenant_month_key(tenant_id, last_month),
        TENANT_RUN_TAG: tenant_id,
    }


def tenant_of_partition_key(key: str) -> str | None:
    """The tenant of a `tenants` key (`acme`) or a `tenant_months` key (`2025-01-01|acme`);
    None for keys of other partitionings (a month alone is not a tenant slug)."""
    if key.count("|") == 1:
        key = tenant_months.get_partition_key_from_str(key).keys_by_dimension["tenant"]
    return key if SLUG.fullmatch(key) else None
