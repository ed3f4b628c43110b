"""The platform's one code location: every domain's definitions plus shared resources."""

import dagster as dg

from cdp_assets.activation.definitions import defs as activation_defs
from cdp_assets.analytics.definitions import defs as analytics_defs
from cdp_assets.google.definitions import defs as google_defs
from cdp_assets.lib.executor import executor_from_env
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.definitions import defs as meta_defs
from cdp_assets.ops.definitions import defs as ops_defs
from cdp_assets.ops.freshness import FRESHNESS
from cdp_assets.ops.status import watched_assets
from cdp_assets.tenants.definitions import defs as tenants_defs
from cdp_assets.vtex.definitions import defs as vtex_defs


def with_freshness(definitions: dg.Definitions) -> dg.Definitions:
    """Freshness policies from the one table `cdp status` judges by (ops/freshness.py)."""
    for name, keys in watched_assets(definitions).items():
        policy = dg.FreshnessPolicy.time_window(fail_window=FRESHNESS[name])
        definitions = definitions.map_resolved_asset_specs(
            func=lambda spec, policy=policy: spec.replace_attributes(freshness_policy=policy),
            selection=dg.AssetSelection.assets(*keys),
        )
    return definitions


def build_definitions() -> dg.Definitions:
    return with_freshness(
        dg.Definitions.merge(
            tenants_defs(),
            vtex_defs(),
            analytics_defs(),
            meta_defs(),
            google_defs(),
            activation_defs(),
            ops_defs(),
            # Dagster's default executor forking from a forkserver, or Celery (CDP_EXECUTOR=celery).
            dg.Definitions(
                resources={"warehouse": WarehouseResource()}, executor=executor_from_env()
            ),
        )
    )


defs = build_definitions()
