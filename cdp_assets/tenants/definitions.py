import dagster as dg

from cdp_assets.tenants.sensors import tenant_partitions_sensor

# The tenants table, which dbt's staging reads (source `cdp.tenants`): written by `cdp tenants`,
# not computed by Dagster.
tenants_table = dg.AssetSpec(
    key=["cdp", "tenants"],
    group_name="tenants",
    description="One row per tenant (store): slug, VTEX account, credential references (names of"
    " environment variables), priority, history start and default country. Managed with"
    " `cdp tenants`; the tenant_partitions_sensor makes its active rows partitions.",
    kinds={"postgres"},
    metadata={"dagster/table_name": "cdp.tenants"},
)


def defs() -> dg.Definitions:
    return dg.Definitions(assets=[tenants_table], sensors=[tenant_partitions_sensor])
