"""Activation test helpers over the synthetic audience warehouse."""

from __future__ import annotations

import psycopg

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.sandbox.audience_warehouse import (
    AUDIENCE,
    activation_warehouse,
    add_tenant_with_customers,
    set_members,
)

__all__ = ["AUDIENCE", "activation_warehouse", "add_tenant_with_customers", "set_members"]


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
