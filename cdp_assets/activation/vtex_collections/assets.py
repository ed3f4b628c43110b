"""Product collections written back to the tenant's VTEX store, as a destination."""

import dagster as dg
import psycopg

from cdp_assets.activation.destination_assets import vtex_destination_asset
from cdp_assets.activation.destinations import Destination, DestinationAudience
from cdp_assets.activation.run import ActivationConfig, DestinationAdapter, activate
from cdp_assets.activation.sync import MemberSource
from cdp_assets.activation.vtex_collections.client import VtexCollections
from cdp_assets.activation.vtex_collections.rules import collection_skus
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.registry import get_tenant
from cdp_assets.vtex.resources import VtexResource


@vtex_destination_asset()
def vtex_product_collections(
    context: dg.AssetExecutionContext,
    config: ActivationConfig,
    warehouse: WarehouseResource,
    vtex: VtexResource,
) -> dg.MaterializeResult:
    """Product collections written back to the tenant's VTEX store (destinations with platform
    'vtex_collections'; one rule per collection, see `rules.py`), SKUs added and removed by
    difference, one paced call each."""
    return activate(context, warehouse.connect, config, CollectionsAdapter(warehouse, vtex))


class CollectionsAdapter(DestinationAdapter):
    """VTEX collections: each rule's SKUs. One destination at a time: two destinations of one
    store writing at once would make the concurrent collection writes VTEX deadlocks on
    (activation/vtex_collections/client.py)."""

    platforms = ("vtex_collections",)
    workers = 1

    def __init__(self, warehouse: WarehouseResource, vtex: VtexResource) -> None:
        self.warehouse, self.vtex = warehouse, vtex

    def platform(self, destination: Destination) -> VtexCollections:
        with self.warehouse.connect() as conn:
            tenant = get_tenant(conn, destination.tenant_id)
        return VtexCollections(self.vtex.client_for(tenant), self.vtex.collection_write_rate())

    def members(self, reader: psycopg.Connection, target: DestinationAudience) -> MemberSource:
        skus = collection_skus(reader, target.destination.tenant_id, target.params)
        return MemberSource(lambda: iter(skus))
