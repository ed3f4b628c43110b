"""Jobs over the analytics assets."""

import dagster as dg

from cdp_assets.analytics.assets import dbt_audiences, dbt_tenant_models, dbt_tenant_scoring
from cdp_assets.analytics.prediction_assets import customer_predictions, holdout_predictions
from cdp_assets.partitions import tenants

ANALYTICS_JOB = "analytics_tenant_refresh"
AUDIENCES_JOB = "audiences_refresh"

analytics_tenant_refresh = dg.define_asset_job(
    ANALYTICS_JOB,
    selection=dg.AssetSelection.assets(
        dbt_tenant_models, customer_predictions, holdout_predictions, dbt_tenant_scoring
    ),
    partitions_def=tenants,
    description="Tenants' dbt models, CLV fits, churn risk and its holdout (one run for many).",
)
audiences_refresh = dg.define_asset_job(
    AUDIENCES_JOB,
    selection=dg.AssetSelection.assets(dbt_audiences),
    description="Refresh every audience materialized view (all tenants).",
)
