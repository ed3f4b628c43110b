"""The platform's one code location: every domain's definitions plus shared resources."""

from collections.abc import Callable

import dagster as dg

from cdp_assets.activation.definitions import defs as activation_defs
from cdp_assets.analytics.definitions import defs as analytics_defs
from cdp_assets.framework.executor import executor_from_env
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.definitions import defs as ops_defs
from cdp_assets.ops.freshness import FRESHNESS
from cdp_assets.ops.status import watched_assets
from cdp_assets.privacy.definitions import defs as privacy_defs
from cdp_assets.tenants.definitions import defs as tenants_defs
from cdp_assets.vtex.definitions import defs as vtex_defs

DATA_ENGINEERING = "team:data-engineering"
ANALYTICS = "team:analytics"
MARKETING_OPS = "team:marketing-ops"
# Who answers for the assets of each group: shown on every asset in the UI.
OWNERS_BY_GROUP: dict[str, list[str]] = {
    "tenants": [DATA_ENGINEERING],
    "vtex": [DATA_ENGINEERING],
    "staging": [ANALYTICS],
    "intermediate": [ANALYTICS],
    "marts": [ANALYTICS],
    "audiences": [ANALYTICS],
    "activation": [MARKETING_OPS],
    "operations": [DATA_ENGINEERING],
    "privacy": [DATA_ENGINEERING],
}


def owners_and_freshness(domains: dg.Definitions) -> Callable[[dg.AssetSpec], dg.AssetSpec]:
    """An asset's owners (OWNERS_BY_GROUP) and freshness policy, from the one table
    `cdp status` judges by (ops/freshness.py)."""
    policies = {
        key: dg.FreshnessPolicy.time_window(fail_window=FRESHNESS[name])
        for name, keys in watched_assets(domains).items()
        for key in keys
    }

    def apply(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.group_name not in OWNERS_BY_GROUP:
            raise LookupError(f"asset group {spec.group_name!r} has no owners in OWNERS_BY_GROUP")
        return spec.replace_attributes(
            owners=OWNERS_BY_GROUP[spec.group_name],
            freshness_policy=policies.get(spec.key, spec.freshness_policy),
        )

    return apply


def build_definitions() -> dg.Definitions:
    domains = dg.Definitions.merge(
        tenants_defs(),
        vtex_defs(),
        analytics_defs(),
        activation_defs(),
        ops_defs(),
        privacy_defs(),
    )
    # Each asset links to the code that computes it (dbt models to their SQL as well).
    assets: list[dg.AssetsDefinition | dg.AssetSpec] = []
    for asset in dg.with_source_code_references(list(domains.assets or [])):
        # Owners and freshness go on specs: a source asset would have none to take them.
        if not isinstance(asset, dg.AssetsDefinition | dg.AssetSpec):
            raise TypeError(f"{asset!r}: define assets with specs or asset definitions")
        assets.append(asset)
    mapped = dg.map_asset_specs(owners_and_freshness(domains), assets)
    return dg.Definitions(
        assets=mapped,
        asset_checks=domains.asset_checks,
        jobs=domains.jobs,
        schedules=domains.schedules,
        sensors=domains.sensors,
        resources={**(domains.resources or {}), "warehouse": WarehouseResource()},
        # Dagster's default executor forking from a forkserver, or Celery (CDP_EXECUTOR=celery).
        executor=executor_from_env(),
    )


defs = build_definitions()
