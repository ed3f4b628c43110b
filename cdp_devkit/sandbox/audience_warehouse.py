"""A synthetic warehouse holding exactly the relations activation reads, for tests and the
activation benchmark.

`marts.customers` has the mart's identifier columns and `audiences.audience_test` is a table
of (tenant, customer) pairs keyed as dbt keys every audience table (unique on both), so a
caller changes an audience's membership as a refresh of the audiences would. Each change is
followed by the ANALYZE dbt's build runs after a change that large (macro analyze_if_stale):
on statistics that say a tenant has no rows, the planner joins the two in a nested loop
over the whole tenant for each member, minutes for an audience of tens of thousands.
The dbt-built relations themselves are exercised end to end by the pipeline tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from cdp_assets.lib.database import database_url, with_database
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.tenants.registry import Tenant, add_tenant

AUDIENCE = "audience_test"

SCHEMA = f"""
CREATE SCHEMA marts;
CREATE SCHEMA audiences;
CREATE TABLE marts.customers (
    tenant_id text, customer_key text, email text, phone_e164 text,
    first_name text, last_name text, country text,
    email_sha256 text, phone_sha256 text, document text, is_newsletter_opt_in boolean,
    PRIMARY KEY (tenant_id, customer_key)
);
CREATE TABLE audiences.{AUDIENCE} (
    tenant_id text, customer_key text, PRIMARY KEY (tenant_id, customer_key)
);
"""

# Customer i of a tenant: mixed-case e-mail, a national mobile number, accented names; every
# tenth has neither e-mail nor phone (unmatchable). The hashes are the mart's: the normalized
# e-mail and the E.164 phone. Newsletter: i % 3 = 0 opted in, 1 opted out, 2 never said.
CUSTOMERS = """
INSERT INTO marts.customers
SELECT tenant_id, customer_key, email, phone, 'José', 'Conceição', 'BR',
       encode(sha256(convert_to(lower(btrim(email)), 'UTF8')), 'hex'),
       encode(sha256(convert_to('+55' || regexp_replace(phone, '[^0-9]', '', 'g'), 'UTF8')),
              'hex'),
       NULL, CASE i %% 3 WHEN 0 THEN true WHEN 1 THEN false END
FROM (
    SELECT i, %(tenant)s AS tenant_id, %(tenant)s || '-' || i AS customer_key,
           CASE WHEN i %% 10 <> 9 THEN ' Cliente.' || i || '@Exemplo.COM.br ' END AS email,
           CASE WHEN i %% 10 <> 9
                THEN '(11) 9' || (6000 + i %% 4000) || '-' || lpad((i %% 10000)::text, 4, '0')
           END AS phone
    FROM generate_series(%(first)s::int, %(last)s::int) AS i
) AS customers
ON CONFLICT DO NOTHING
"""


@contextmanager
def activation_warehouse() -> Iterator[str]:
    """A throwaway migrated database with the synthetic marts; its URL."""
    server = database_url()
    name = f"cdp_act_{uuid.uuid4().hex[:10]}"
    url = with_database(server, name)
    migrated_url(url)
    with psycopg.connect(url) as conn:
        conn.execute(SCHEMA)
    try:
        yield url
    finally:
        with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def add_tenant_with_customers(conn: psycopg.Connection, tenant_id: str, customers: int) -> None:
    add_tenant(conn, Tenant(tenant_id, tenant_id.replace("_", "-"), "UNUSED_KEY", "UNUSED_TOKEN"))
    conn.execute(CUSTOMERS, {"tenant": tenant_id, "first": 0, "last": customers - 1})
    conn.execute("ANALYZE marts.customers")
    conn.commit()


def set_members(conn: psycopg.Connection, tenant_id: str, numbers: range | list[int]) -> None:
    """Make the tenant's audience exactly these customer numbers, in one transaction."""
    conn.execute(f"DELETE FROM audiences.{AUDIENCE} WHERE tenant_id = %s", (tenant_id,))
    conn.execute(
        f"INSERT INTO audiences.{AUDIENCE} SELECT %s, %s || '-' || i FROM unnest(%s::int[]) i",
        (tenant_id, tenant_id, list(numbers)),
    )
    conn.execute(f"ANALYZE audiences.{AUDIENCE}")
    conn.commit()
