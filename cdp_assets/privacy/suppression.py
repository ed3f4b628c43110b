"""The per-tenant suppression list (`cdp.privacy_suppressions`): SHA-256 of a person's
normalized identifiers. The purchase summary (dbt macro purchase_summary) leaves their
customers out of every mart and audience, and activation leaves them out of what it sends
(activation/audiences.py), whatever the store sends again."""

from __future__ import annotations

import psycopg

from cdp_assets.privacy.audit import complete_request, complete_step, open_request, start_step
from cdp_assets.privacy.identifiers import hashed
from cdp_assets.tenants.registry import get_tenant


def add_suppressions(
    conn: psycopg.Connection, tenant_id: str, request_id: int, hashes: dict[str, str]
) -> int:
    """hash -> kind on the tenant's list (kept under the first request that put it there);
    returns how many were new. Not committed."""
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO cdp.privacy_suppressions"
            " (tenant_id, identifier_kind, identifier_sha256, request_id)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(tenant_id, kind, digest, request_id) for digest, kind in sorted(hashes.items())],
        )
        return cursor.rowcount


def suppress(conn: psycopg.Connection, tenant_id: str, kind: str, value: str) -> int:
    """Suppress a person in a tenant by one identifier, recorded; the request's id."""
    digest = hashed(kind, value, get_tenant(conn, tenant_id).default_country)
    request_id = open_request(conn, tenant_id, "suppress", kind)
    conn.commit()
    start_step(conn, request_id, "suppress", 1)
    added = add_suppressions(conn, tenant_id, request_id, {digest: kind})
    complete_step(conn, request_id, "suppress", {"identifiers_added": added})
    complete_request(conn, request_id)
    return request_id


def unsuppress(conn: psycopg.Connection, tenant_id: str, kind: str, value: str) -> int:
    """Lift a suppression, recorded; the request's id. The person comes back into audiences
    at the tenant's next analytics refresh."""
    digest = hashed(kind, value, get_tenant(conn, tenant_id).default_country)
    request_id = open_request(conn, tenant_id, "unsuppress", kind)
    conn.commit()
    start_step(conn, request_id, "unsuppress", 1)
    removed = conn.execute(
        "DELETE FROM cdp.privacy_suppressions WHERE tenant_id = %s AND identifier_sha256 = %s",
        (tenant_id, digest),
    ).rowcount
    complete_step(conn, request_id, "unsuppress", {"identifiers_removed": removed})
    complete_request(conn, request_id)
    return request_id
