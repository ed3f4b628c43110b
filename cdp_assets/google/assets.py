"""Google Customer Match per tenant, through the Data Manager API or the Google Ads API."""

import dagster as dg

from cdp_assets.activation.audiences import audience_members, audience_signature, require_audience
from cdp_assets.activation.destinations import DestinationAudience
from cdp_assets.activation.identifiers import google_row
from cdp_assets.activation.run import ActivationConfig, activate
from cdp_assets.analytics.assets import dbt_audiences
from cdp_assets.google.resources import GoogleResource
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import get_tenant


@dg.asset(
    partitions_def=tenants,
    deps=[dbt_audiences],
    group_name="activation",
    kinds={"googleads", "python"},
    pool="google_api",
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
    url = warehouse.url_migrated()
    with warehouse.connect() as conn:
        tenant = get_tenant(conn, context.partition_key)

        def members(target: DestinationAudience):
            require_audience(conn, target.audience)
            return lambda: audience_members(url, target, tenant.default_country, google_row)

        return activate(
            context,
            conn,
            ("google_data_manager", "google_ads"),
            config,
            google.audiences_for,
            members,
            lambda target: audience_signature(conn, tenant.tenant_id, target.audience),
        )
