"""Google Customer Match per tenant, through the Data Manager API or the Google Ads API."""

from cdp_assets.activation.destination_assets import ad_platform_asset
from cdp_assets.activation.identifiers import google_row
from cdp_assets.lib.dagster_home import GOOGLE_API_POOL

google_customer_match = ad_platform_asset(
    "google_customer_match",
    kind="googleads",
    pool=GOOGLE_API_POOL,
    platforms=("google_data_manager", "google_ads"),
    resource_key="google",
    build_row=google_row,
    description="The tenant's audiences as Customer Match lists (platforms 'google_data_manager'"
    " and 'google_ads'), sent as differences against what Google last confirmed.",
)
