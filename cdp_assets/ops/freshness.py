"""How old each tenant-partitioned asset may get: the one place `cdp status` and the assets'
freshness policies read it from.

Keys are asset key names; the `dbt_*` keys name `@dbt_assets` definitions and stand for
every model they build (the staging, intermediate and mart views and tables of one tenant
are rebuilt together, so they share one expectation).
"""

from datetime import timedelta

# Orders sync every 12 hours (06:00 and 18:00), plus an hour for the run itself: a missed
# sync shows soon after the next one was due.
ORDERS = timedelta(hours=13)
# Daily work (catalog, customers, the tenant's dbt models and CLV fit): a day plus slack.
DAILY = timedelta(hours=26)
# Activation runs every 48 hours (sooner on audience changes): two days plus slack.
ACTIVATION = timedelta(hours=50)
# The churn holdout runs weekly: a week plus slack.
WEEKLY = timedelta(days=8)

FRESHNESS: dict[str, timedelta] = {
    "vtex_orders": ORDERS,
    "vtex_products": DAILY,
    "vtex_skus": DAILY,
    "vtex_customers": DAILY,
    "dbt_tenant_models": DAILY,
    "customer_predictions": DAILY,
    "dbt_tenant_scoring": DAILY,
    "dbt_holdout_summary": WEEKLY,
    "holdout_predictions": WEEKLY,
    "dbt_churn_holdout": WEEKLY,
    "clv_scorecard": WEEKLY,
    # Refreshed after each change of the tenant's marts, and every 48 hours in any case.
    "dbt_audiences": ACTIVATION,
    "meta_custom_audiences": ACTIVATION,
    "google_customer_match": ACTIVATION,
    "vtex_product_collections": ACTIVATION,
    "vtex_masterdata_fields": ACTIVATION,
}

# Platform-wide assets (not partitioned): `cdp status --check` and the health endpoint judge
# them too. The operations metrics run every 15 minutes: two missed evaluations, and the
# schedule (or the daemon) has stalled.
OPERATIONS = timedelta(minutes=45)
PLATFORM_FRESHNESS: dict[str, timedelta] = {"operations_metrics": OPERATIONS}
