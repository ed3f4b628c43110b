"""Jobs over the analytics assets."""

import dagster as dg

from cdp_assets.analytics.assets import (
    customer_predictions,
    dbt_audiences,
    dbt_tenant_models,
    dbt_tenant_scoring,
)
from cdp_assets.partitions import tenants

ANALYTICS_JOB = "analytics_tenant_refresh"
AUDIENCES_JOB = "audiences_refresh"

analytics_tenant_refresh = dg.define_asset_job(
    ANALYTICS_JOB,
    selection=dg.AssetSelection.assets(dbt_tenant_models, customer_predictions, dbt_tenant_scoring),
    partitions_def=tenants,
    description="One tenant's dbt models, CLV fit and churn risk.",
)
audiences_refresh = dg.define_asset_job(
    AUDIENCES_JOB,
    selection=dg.AssetSelection.assets(dbt_audiences),
    description="Refresh every audience materialized view (all tenants).",
)
