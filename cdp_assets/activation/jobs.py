"""The activation job: the pushes to every destination, as the triggers request them."""

import dagster as dg

from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.vtex_collections.assets import vtex_product_collections
from cdp_assets.activation.vtex_masterdata.assets import vtex_masterdata_fields
from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.partitions import tenants

activation_push = dg.define_asset_job(
    "activation_push",
    selection=[
        meta_custom_audiences,
        google_customer_match,
        vtex_product_collections,
        vtex_masterdata_fields,
    ],
    partitions_def=tenants,
    description="Every destination of the run's tenants (one, or a range): Meta, Google, VTEX"
    " collections and the fields written to VTEX Master Data.",
    tags=run_bound("activation_push"),
)
