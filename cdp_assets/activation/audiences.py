"""Reading audience members out of the warehouse, hashed row by row on the way out.

Members come from the audience materialized views (`audiences.<audience>`) joined to the
`customers` mart for the identifiers, streamed with a server-side cursor on a connection of
their own so memory stays bounded whatever the audience size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql

from cdp_assets.activation.identifiers import Contact

RowBuilder = Callable[[Contact, str], list[str]]


def audience_views(conn: psycopg.Connection) -> set[str]:
    """Audience materialized views that exist (built by dbt)."""
    rows = conn.execute("SELECT matviewname FROM pg_matviews WHERE schemaname = 'audiences'")
    return {name for (name,) in rows}


def require_audience(conn: psycopg.Connection, audience: str) -> None:
    if audience not in audience_views(conn):
        raise LookupError(
            f"no audience materialized view audiences.{audience}; build the audiences with dbt"
            " (or fix the audience name in cdp.destination_audiences)"
        )


def audience_members(
    url: str, tenant_id: str, audience: str, default_country: str, build_row: RowBuilder
) -> Iterator[tuple[str, list[str]]]:
    """(customer_key, hashed row) for every member of one tenant's audience."""
    query = sql.SQL(
        """
        SELECT a.customer_key, c.email, c.phone_e164, c.first_name, c.last_name, c.country
        FROM audiences.{audience} a
        JOIN marts.customers c USING (tenant_id, customer_key)
        WHERE a.tenant_id = %s
        """
    ).format(audience=sql.Identifier(audience))
    with psycopg.connect(url) as conn, conn.cursor(name="audience_members") as cursor:
        cursor.itersize = 10_000
        cursor.execute(query, (tenant_id,))
        for row in cursor:
            yield row[0], build_row(Contact(*row), default_country)


def audience_signature(conn: psycopg.Connection, tenant_id: str, audience: str) -> str:
    """Member count and a digest of the member keys: changes exactly when membership does."""
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) || ':' || coalesce(md5(string_agg(customer_key, ','"
            " ORDER BY customer_key)), '') FROM audiences.{audience} WHERE tenant_id = %s"
        ).format(audience=sql.Identifier(audience)),
        (tenant_id,),
    ).fetchone()
    assert row is not None
    return row[0]
