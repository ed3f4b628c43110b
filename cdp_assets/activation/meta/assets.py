"""Meta Custom Audiences per tenant, fed by the audience materialized views."""

import dagster as dg

from cdp_assets.activation.identifiers import meta_row
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.activation.run import ActivationConfig, activate_audiences
from cdp_assets.analytics.assets import dbt_audiences
from cdp_assets.lib.dagster_home import META_API_POOL
from cdp_assets.lib.step_retries import ACTIVATION_RETRY
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants


@dg.asset(
    partitions_def=tenants,
    # One run may cover many tenants (the triggers group them): see activation/triggers.py.
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[dbt_audiences],
    group_name="activation",
    kinds={"meta", "python"},
    pool=META_API_POOL,
    retry_policy=ACTIVATION_RETRY,
    metadata={"dagster/table_name": "cdp.activation_runs"},
)
def meta_custom_audiences(
    context: dg.AssetExecutionContext,
    config: ActivationConfig,
    warehouse: WarehouseResource,
    meta: MetaResource,
) -> dg.MaterializeResult:
    """The tenant's audiences in its Meta ad accounts (destinations with platform 'meta').

    Hashed with our own normalization, sent as differences against what Meta last
    confirmed (`cdp.destination_members`); history in `cdp.activation_runs`.
    """
    return activate_audiences(context, config, warehouse, ("meta",), meta.audiences_for, meta_row)
