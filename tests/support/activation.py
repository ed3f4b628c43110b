"""Activation test helpers over the synthetic audience warehouse."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import dagster as dg
import psycopg

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.google.resources import GoogleResource
from cdp_assets.activation.identifiers import sha256_hex
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_devkit.sandbox.audience_warehouse import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    set_members,
)

if TYPE_CHECKING:
    # Only annotated here: its import (grpc and Google's clients) would slow every process
    # that imports this module, the reliability workers among them.
    from cdp_devkit.sandbox.google.sandbox import GoogleSandbox

__all__ = ["AUDIENCE", "activation_warehouse", "add_tenant_with_customers", "set_members"]

# The Google Ads account the Google destinations push to, and the environment variable their
# developer token is read from.
GOOGLE_CUSTOMER = "1234567890"
GOOGLE_TOKEN_REF = "GOOGLE_ADS_TEST_DEVELOPER_TOKEN"


def register_destination(
    conn: psycopg.Connection, destination: Destination, audience: str = AUDIENCE
) -> None:
    add_destination(conn, destination)
    add_audience(conn, destination.destination_id, audience)
    conn.commit()


def runs(conn: psycopg.Connection, destination_id: str) -> list[dict]:
    cursor = conn.execute(
        "SELECT * FROM cdp.activation_runs WHERE destination_id = %s ORDER BY activation_run_id",
        (destination_id,),
    )
    names = [c.name for c in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def push(
    asset: dg.AssetsDefinition, instance, tenant_id: str, resources: dict, config: dict
) -> dg.ExecuteInProcessResult:
    """Materialize an activation asset for one tenant as the UI would, failures kept."""
    instance.add_dynamic_partitions(tenants.name, [tenant_id])
    return dg.materialize(
        [asset],
        partition_key=tenant_id,
        instance=instance,
        resources=resources,
        run_config={"ops": {asset.key.path[-1]: {"config": config}}},
        raise_on_error=False,
    )


def outcome(result: dg.ExecuteInProcessResult) -> dict:
    """The single destination audience row of the run's metadata table (also on failure)."""
    events = result.get_asset_materialization_events()
    if events:
        table = events[0].materialization.metadata["audiences"].value
    else:
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        table = failure.step_failure_data.user_failure_data.metadata["audiences"].value
    (record,) = table.records
    return record.data


def add_google_destination(
    url: str,
    tenant_id: str,
    platform: str,
    members: range | list[int],
    customers: int = 400,
    **settings,
) -> Destination:
    """A tenant of `customers` synthetic customers whose audience is `members`, pushed to
    Google through `platform` (``google_data_manager`` or ``google_ads``) with consent given."""
    destination = Destination(
        f"{tenant_id}_google",
        tenant_id,
        platform,
        GOOGLE_CUSTOMER,
        credential_refs={"developer_token": GOOGLE_TOKEN_REF} if platform == "google_ads" else {},
        ad_user_data_consent="GRANTED",
        ad_personalization_consent="GRANTED",
        **settings,
    )
    with psycopg.connect(url) as conn:
        add_tenant_with_customers(conn, tenant_id, customers)
        set_members(conn, tenant_id, members)
        register_destination(conn, destination)
    return destination


def push_to_google(
    instance, url: str, sandbox: GoogleSandbox, tenant_id: str, **config
) -> dg.ExecuteInProcessResult:
    """The tenant's Google push against the sandbox, retrying without waiting."""
    resources = {
        "warehouse": WarehouseResource(url=url),
        "google": GoogleResource(sandbox_address=sandbox.address, retry_base_seconds=0.01),
    }
    return push(google_customer_match, instance, tenant_id, resources, config)


def google_user_list(url: str, destination_id: str) -> str:
    """The name Google gave the destination's list."""
    with psycopg.connect(url) as conn:
        (name,) = conn.execute(
            "SELECT platform_audience_id FROM cdp.destination_audiences WHERE destination_id = %s",
            (destination_id,),
        ).fetchone()
    return name


def google_member_keys(numbers: Iterable[int]) -> set[str]:
    """The Google sandbox's keys of these customers: their hashed e-mail (Google's gmail rules
    do not apply); every tenth customer has none and is left out."""
    return {"email:" + sha256_hex(f"cliente.{i}@exemplo.com.br") for i in numbers if i % 10 != 9}
