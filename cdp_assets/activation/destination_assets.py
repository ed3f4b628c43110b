"""What the destinations' assets have in common: partitioned by tenant, one run covering the
tenants the triggers group (activation/push_requests.py), the platform's calls within its API's
pool, retried as activations are, their history in cdp.activation_runs."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from cdp_assets.activation.audiences import RowBuilder
from cdp_assets.activation.destinations import Destination
from cdp_assets.activation.run import ActivationConfig, activate_audiences
from cdp_assets.activation.sync import Platform
from cdp_assets.analytics.assets import dbt_audiences, dbt_tenant_models
from cdp_assets.lib.dagster_home import VTEX_API_POOL
from cdp_assets.lib.step_retries import ACTIVATION_RETRY
from cdp_assets.partitions import tenants


def destination_asset(
    kind: str, pool: str, deps: Sequence[dg.AssetsDefinition], **asset_args: Any
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """The decorator of the asset pushing `deps` to the destinations of kind `kind`, their
    calls within `pool`; `asset_args` are dg.asset's."""
    return dg.asset(
        partitions_def=tenants,
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=deps,
        group_name="activation",
        kinds={kind, "python"},
        pool=pool,
        retry_policy=ACTIVATION_RETRY,
        metadata={"dagster/table_name": "cdp.activation_runs"},
        **asset_args,
    )


# The store is written from the tenants' audiences and marts, within the account's share of the
# VTEX API.
vtex_destination_asset = functools.partial(
    destination_asset, "vtex", VTEX_API_POOL, [dbt_audiences, dbt_tenant_models]
)


def ad_platform_asset(
    name: str,
    *,
    kind: str,
    pool: str,
    platforms: tuple[str, ...],
    resource_key: str,
    build_row: RowBuilder,
    description: str,
) -> dg.AssetsDefinition:
    """The asset pushing the tenants' audiences to their destinations of `platforms`, each
    reached through `audiences_for` of the resource `resource_key`, a member sent as the row
    `build_row` makes of it."""

    @destination_asset(
        kind,
        pool,
        [dbt_audiences],
        name=name,
        description=description,
        # The platform's resource is known by its key only here: resources given as typed
        # parameters would need one parameter name per platform.
        required_resource_keys={"warehouse", resource_key},
    )
    def push(context: dg.AssetExecutionContext, config: ActivationConfig) -> dg.MaterializeResult:
        platform_for: Callable[[Destination], Platform] = getattr(
            context.resources, resource_key
        ).audiences_for
        return activate_audiences(
            context, config, context.resources.warehouse, platforms, platform_for, build_row
        )

    return push
