"""Activation: the destinations' assets (Meta, Google, VTEX collections and Master Data
fields) and the triggers that push them."""

import dagster as dg

from cdp_assets.activation.google.definitions import defs as google_defs
from cdp_assets.activation.jobs import activation_push
from cdp_assets.activation.meta.definitions import defs as meta_defs
from cdp_assets.activation.schedules import activation_every_48_hours
from cdp_assets.activation.sensors import audience_changes_sensor, pending_verdicts_sensor
from cdp_assets.activation.vtex_collections.assets import vtex_product_collections
from cdp_assets.activation.vtex_masterdata.assets import vtex_masterdata_fields


def defs() -> dg.Definitions:
    return dg.Definitions.merge(
        meta_defs(),
        google_defs(),
        dg.Definitions(
            assets=[vtex_product_collections, vtex_masterdata_fields],
            jobs=[activation_push],
            schedules=[activation_every_48_hours],
            sensors=[audience_changes_sensor, pending_verdicts_sensor],
        ),
    )
