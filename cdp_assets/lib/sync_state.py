"""Cursors in `cdp.sync_state`: how far each tenant's entity (and scope) is synced."""

from __future__ import annotations

from datetime import datetime

import psycopg


def get_cursor(
    conn: psycopg.Connection, tenant_id: str, entity: str, scope: str = ""
) -> datetime | None:
    row = conn.execute(
        "SELECT synced_through FROM cdp.sync_state"
        " WHERE tenant_id = %s AND entity = %s AND scope = %s",
        (tenant_id, entity, scope),
    ).fetchone()
    return row[0] if row else None


def set_cursor(
    conn: psycopg.Connection,
    tenant_id: str,
    entity: str,
    synced_through: datetime,
    run_id: str,
    scope: str = "",
) -> None:
    """Move the cursor forward; an older value (a late re-run) never moves it back."""
    conn.execute(
        """
        INSERT INTO cdp.sync_state (tenant_id, entity, scope, synced_through, last_run_id)
        VALUES (%s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id, entity, scope) DO UPDATE
           SET synced_through = greatest(cdp.sync_state.synced_through, excluded.synced_through),
               last_run_id = excluded.last_run_id, updated_at = now()
        """,
        (tenant_id, entity, scope, synced_through, run_id),
    )
