import dagster as dg

from cdp_assets.ops.sensors import sync_errors_sensor


def defs() -> dg.Definitions:
    return dg.Definitions(sensors=[sync_errors_sensor])
