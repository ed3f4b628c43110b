"""Segments, CLV tiers and churn bands written to the store's Master Data, as a destination."""

import dagster as dg
import psycopg

from cdp_assets.activation.destination_assets import vtex_destination_asset
from cdp_assets.activation.destinations import Destination, DestinationAudience
from cdp_assets.activation.run import ActivationConfig, DestinationAdapter, activate
from cdp_assets.activation.sync import MemberSource
from cdp_assets.activation.vtex_masterdata.writeback import (
    VtexMasterDataFields,
    WritebackFields,
    customer_fields,
    destination_fields,
)
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.registry import get_tenant
from cdp_assets.vtex.resources import VtexResource


@vtex_destination_asset()
def vtex_masterdata_fields(
    context: dg.AssetExecutionContext,
    config: ActivationConfig,
    warehouse: WarehouseResource,
    vtex: VtexResource,
) -> dg.MaterializeResult:
    """Segments, CLV tiers and churn bands written to the tenant's Master Data CL documents
    (destinations with platform 'vtex_masterdata', see `writeback.py`): only the documents whose
    values changed, within the account's shared request budget."""
    return activate(context, warehouse.connect, config, MasterDataAdapter(warehouse, vtex))


class MasterDataAdapter(DestinationAdapter):
    """Master Data CL fields: each customer's values. Destinations are written several at a
    time: those of different stores call different accounts, and those of one store take
    their requests from the account's budget, shared by every caller (vtex/budget.py)."""

    platforms = ("vtex_masterdata",)

    def __init__(self, warehouse: WarehouseResource, vtex: VtexResource) -> None:
        self.warehouse, self.vtex = warehouse, vtex

    def platform(self, destination: Destination) -> VtexMasterDataFields:
        with self.warehouse.connect() as conn:
            tenant = get_tenant(conn, destination.tenant_id)
            fields = destination_fields(conn, destination.destination_id)
        return VtexMasterDataFields(self.vtex.client_for(tenant), fields)

    def members(self, reader: psycopg.Connection, target: DestinationAudience) -> MemberSource:
        return customer_fields(reader, target, WritebackFields.from_params(target.params))
