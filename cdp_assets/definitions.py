"""The platform's one code location: every domain's definitions plus shared resources."""

import dagster as dg

from cdp_assets.activation.definitions import defs as activation_defs
from cdp_assets.analytics.definitions import defs as analytics_defs
from cdp_assets.google.definitions import defs as google_defs
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.meta.definitions import defs as meta_defs
from cdp_assets.tenants.definitions import defs as tenants_defs
from cdp_assets.vtex.definitions import defs as vtex_defs


def build_definitions() -> dg.Definitions:
    return dg.Definitions.merge(
        tenants_defs(),
        vtex_defs(),
        analytics_defs(),
        meta_defs(),
        google_defs(),
        activation_defs(),
        dg.Definitions(resources={"warehouse": WarehouseResource()}),
    )


defs = build_definitions()
