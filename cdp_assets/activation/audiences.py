"""Reading audience members out of the warehouse, hashed row by row on the way out.

Members come from the audience materialized views (`audiences.<audience>`) joined to the
`customers` mart for the identifiers. Those to hash are streamed in chunks on a reading
connection of their own, so memory stays bounded whatever the audience size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import psycopg
from psycopg import sql

from cdp_assets.activation.destinations import DestinationAudience
from cdp_assets.activation.identifiers import Contact
from cdp_assets.activation.sync import MemberSource
from cdp_assets.analytics.dbt_files import MANIFEST_PATH, manifest_audiences

RowBuilder = Callable[[Contact, str], list[str]]


# How the comment of every audience table dbt builds begins (macro record_audience_sql).
DBT_BUILT = "dbt_sql_md5:"


def audience_views(conn: psycopg.Connection) -> set[str]:
    """The audience materialized views activation reads: those that exist, but for one dbt
    built for a model the platform's definitions do not have (a branch's built with
    `--target prod`, an audience since dropped), which nothing maintains any more. Their
    manifest as loaded: a project file changed since (the exposures an audiences refresh
    writes) is for the next load, not a parse in every activation step."""
    rows = conn.execute(
        """
        SELECT c.relname, coalesce(obj_description(c.oid, 'pg_class'), '')
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'audiences' AND c.relkind IN ('r', 'm')
        """
    ).fetchall()
    declared = set(manifest_audiences(MANIFEST_PATH))
    return {name for name, comment in rows if name in declared or not comment.startswith(DBT_BUILT)}


def require_audience(views: set[str], audience: str) -> None:
    """`views`: what `audience_views` read (once per run step, not once per audience)."""
    if audience not in views:
        raise LookupError(
            f"no audience materialized view audiences.{audience} of the dbt project: build the"
            " audiences with dbt, or fix or turn off the audience"
            f" (cdp destinations audience DESTINATION {audience} --off)"
        )


# Part of every source fingerprint: bump it when a normalization rule changes, so every
# member is hashed again under the new rule.
NORMALIZATION_VERSION = "2"  # 2: names re-composed (NFC) after dropping symbols


# Members a destination may receive under its consent policy (destinations.CONSENT_POLICIES),
# from the customer's latest Master Data newsletter choice (NULL: no CL document).
CONSENTED = {
    "none": sql.SQL("true"),
    "newsletter_opt_in": sql.SQL("c.is_newsletter_opt_in IS TRUE"),
    "not_opted_out": sql.SQL("c.is_newsletter_opt_in IS DISTINCT FROM false"),
}


def audience_members(
    conn: psycopg.Connection,
    target: DestinationAudience,
    default_country: str,
    build_row: RowBuilder,
) -> MemberSource:
    """One tenant's audience, keyed by customer_key, without the people suppressed in the
    tenant (cdp.privacy_suppressions, matched on the hashes of the customer's normalized
    e-mail, phone and document) and those the destination's consent policy leaves out: a
    member who becomes either is removed by the next sync. A member whose inputs are unchanged
    since the destination confirmed it keeps its confirmed row, in the database; the others
    are read, normalized and hashed.

    `conn` is the caller's connection for reading members (not the one writing the sync
    state): each audience reads in a transaction of its own on it, ended even when the
    reader stops early, so one connection serves every audience of a run step."""
    suppressed = sql.SQL(
        """EXISTS (SELECT FROM cdp.privacy_suppressions s
                   WHERE s.tenant_id = a.tenant_id
                     AND s.identifier_sha256 IN (c.email_sha256, c.phone_sha256,
                         encode(sha256(convert_to(c.document, 'UTF8')), 'hex')))"""
    )
    members = sql.SQL(
        """
        WITH members AS (
            SELECT a.customer_key, c.email, c.phone_e164, c.first_name, c.last_name, c.country,
                   md5(row(%(version)s::text, %(default_country)s::text, c.email, c.phone_e164,
                           c.first_name, c.last_name, c.country)::text) AS source_fingerprint
            FROM audiences.{audience} a
            JOIN marts.customers c USING (tenant_id, customer_key)
            WHERE a.tenant_id = %(tenant_id)s AND {consented} AND NOT {suppressed}
        )
        """
    ).format(
        audience=sql.Identifier(target.audience),
        consented=CONSENTED[target.destination.consent_policy],
        suppressed=suppressed,
    )
    # Each member left out counted once, a suppression first. Without a consent policy and
    # without a suppression in the tenant, the scan is skipped (a one-time filter).
    excluded = sql.SQL(
        """
        SELECT count(*) FILTER (WHERE suppressed),
               count(*) FILTER (WHERE NOT suppressed AND NOT consented)
        FROM (SELECT {suppressed} AS suppressed, {consented} AS consented
              FROM audiences.{audience} a
              JOIN marts.customers c USING (tenant_id, customer_key)
              WHERE a.tenant_id = %(tenant_id)s
                AND ({policy_applies} OR EXISTS (SELECT FROM cdp.privacy_suppressions
                                                 WHERE tenant_id = %(tenant_id)s))) member
        """
    ).format(
        suppressed=suppressed,
        consented=CONSENTED[target.destination.consent_policy],
        audience=sql.Identifier(target.audience),
        policy_applies=sql.Literal(target.destination.consent_policy != "none"),
    )
    confirmed_match = sql.SQL(
        """
        confirmed.destination_id = %(destination_id)s
        AND confirmed.audience = %(audience)s
        AND confirmed.member_key = members.customer_key
        AND confirmed.source_fingerprint = members.source_fingerprint
        """
    )
    confirmed = members + sql.SQL(
        "SELECT members.customer_key, confirmed.fingerprint, members.source_fingerprint,"
        " confirmed.identifiers FROM members JOIN cdp.destination_members confirmed ON {}"
    ).format(confirmed_match)
    fresh = members + sql.SQL(
        "SELECT members.* FROM members"
        " WHERE NOT EXISTS (SELECT FROM cdp.destination_members confirmed WHERE {})"
    ).format(confirmed_match)
    params = {
        "version": NORMALIZATION_VERSION,
        "default_country": default_country,
        "tenant_id": target.destination.tenant_id,
        "destination_id": target.destination.destination_id,
        "audience": target.audience,
    }

    def fresh_members() -> Iterator[tuple[str, str, list[str]]]:
        # Streamed in chunks: bounded memory in one statement, planned for the whole result
        # (a cursor is planned for its first 10 %: a quadratic nested loop when the view's
        # statistics are stale).
        with conn.transaction(), conn.cursor() as cursor:
            for *contact, source_fingerprint in cursor.stream(fresh, params, size=10_000):
                yield contact[0], source_fingerprint, build_row(Contact(*contact), default_country)

    return MemberSource(fresh_members, confirmed, params, excluded)


def audience_signatures(
    conn: psycopg.Connection, audience: str, tenant_ids: Iterable[str]
) -> dict[str, str]:
    """tenant -> member count and a digest of the member keys, which changes exactly when
    the tenant's membership does; one query for all the tenants given."""
    wanted = sorted(set(tenant_ids))
    rows = conn.execute(
        sql.SQL(
            "SELECT tenant_id, count(*) || ':' || md5(string_agg(customer_key, ','"
            " ORDER BY customer_key)) FROM audiences.{audience} WHERE tenant_id = ANY(%s)"
            " GROUP BY tenant_id"
        ).format(audience=sql.Identifier(audience)),
        (wanted,),
    ).fetchall()
    found: dict[str, str] = dict(rows)
    # No member: what count and digest give for none.
    return {tenant_id: found.get(tenant_id, "0:") for tenant_id in wanted}
