"""Google Customer Match per tenant, through the Data Manager API or the Google Ads API."""

import dagster as dg

from cdp_assets.activation.google.resources import GoogleResource
from cdp_assets.activation.identifiers import google_row
from cdp_assets.activation.run import ActivationConfig, activate_audiences
from cdp_assets.analytics.assets import dbt_audiences
from cdp_assets.lib.dagster_home import GOOGLE_API_POOL
from cdp_assets.lib.step_retries import ACTIVATION_RETRY
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants


@dg.asset(
    partitions_def=tenants,
    # One run may cover many tenants (the triggers group them): see activation/triggers.py.
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[dbt_audiences],
    group_name="activation",
    kinds={"googleads", "python"},
    pool=GOOGLE_API_POOL,
    retry_policy=ACTIVATION_RETRY,
    metadata={"dagster/table_name": "cdp.activation_runs"},
)
def google_customer_match(
    context: dg.AssetExecutionContext,
    config: ActivationConfig,
    warehouse: WarehouseResource,
    google: GoogleResource,
) -> dg.MaterializeResult:
    """The tenant's audiences as Customer Match lists (platforms 'google_data_manager' and
    'google_ads'), sent as differences against what Google last confirmed."""
    return activate_audiences(
        context,
        config,
        warehouse,
        ("google_data_manager", "google_ads"),
        google.audiences_for,
        google_row,
    )
