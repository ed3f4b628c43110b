"""Jobs over the analytics assets."""

import dagster as dg

from cdp_assets.analytics.assets import (
    dbt_audiences,
    dbt_churn_holdout,
    dbt_holdout_summary,
    dbt_tenant_models,
    dbt_tenant_scoring,
)
from cdp_assets.analytics.prediction_assets import customer_predictions, holdout_predictions
from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.partitions import tenants

ANALYTICS_JOB = "analytics_tenant_refresh"
AUDIENCES_JOB = "audiences_refresh"
CHURN_HOLDOUT_JOB = "churn_holdout_refresh"

analytics_tenant_refresh = dg.define_asset_job(
    ANALYTICS_JOB,
    selection=dg.AssetSelection.assets(dbt_tenant_models, customer_predictions, dbt_tenant_scoring),
    partitions_def=tenants,
    description="Tenants' dbt models, CLV fits and churn risk (one run for many).",
    tags=run_bound(ANALYTICS_JOB),
)
churn_holdout_refresh = dg.define_asset_job(
    CHURN_HOLDOUT_JOB,
    selection=dg.AssetSelection.assets(dbt_holdout_summary, holdout_predictions, dbt_churn_holdout),
    partitions_def=tenants,
    description="Tenants' churn holdout: the bands as of 180 days ago against who bought again"
    " since (one run for many).",
    tags=run_bound(CHURN_HOLDOUT_JOB),
)
audiences_refresh = dg.define_asset_job(
    AUDIENCES_JOB,
    selection=dg.AssetSelection.assets(dbt_audiences),
    description="Refresh every audience materialized view (all tenants).",
    tags=run_bound(AUDIENCES_JOB),
)
