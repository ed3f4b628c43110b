"""Meta Custom Audiences per tenant, fed by the audience materialized views."""

from cdp_assets.activation.destination_assets import ad_platform_asset
from cdp_assets.activation.identifiers import meta_row
from cdp_assets.lib.dagster_home import META_API_POOL

meta_custom_audiences = ad_platform_asset(
    "meta_custom_audiences",
    kind="meta",
    pool=META_API_POOL,
    platforms=("meta",),
    resource_key="meta",
    build_row=meta_row,
    description="The tenant's audiences in its Meta ad accounts (destinations with platform"
    " 'meta').\n\nHashed with our own normalization, sent as differences against what Meta last"
    " confirmed (`cdp.destination_members`); history in `cdp.activation_runs`.",
)
