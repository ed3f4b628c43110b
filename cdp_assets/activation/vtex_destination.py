"""What the VTEX destinations (collections, Master Data fields) have in common as assets."""

import functools

import dagster as dg

from cdp_assets.analytics.assets import dbt_audiences, dbt_tenant_models
from cdp_assets.lib.dagster_home import VTEX_API_POOL
from cdp_assets.lib.step_retries import ACTIVATION_RETRY
from cdp_assets.partitions import tenants

# What the store is written from, as the ad platforms' pushes: the audiences and marts of the
# tenants of the run (one run may cover many tenants, the triggers group them: see
# activation/triggers.py), within the account's share of the VTEX API.
vtex_destination_asset = functools.partial(
    dg.asset,
    partitions_def=tenants,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[dbt_audiences, dbt_tenant_models],
    group_name="activation",
    kinds={"vtex", "python"},
    pool=VTEX_API_POOL,
    retry_policy=ACTIVATION_RETRY,
    metadata={"dagster/table_name": "cdp.activation_runs"},
)
