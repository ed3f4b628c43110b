import dagster as dg

from cdp_assets.tenants.sensors import tenant_partitions_sensor


def defs() -> dg.Definitions:
    return dg.Definitions(sensors=[tenant_partitions_sensor])
