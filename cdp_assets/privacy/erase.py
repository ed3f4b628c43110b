"""Erasure of a person from one tenant: the warehouse, what is derived from it, and every
destination they were sent to.

A request first finds the person: the identity records resolution linked to the identifier
given (`intermediate.int_identity__*`), and the raw documents holding any of their
identifiers that no build has resolved yet. What it found is stored with the request as ids
that are no personal data (order ids, Master Data ids, record ids, customer keys), and their
identifiers' hashes go on the tenant's suppression list in the same transaction. The steps
that follow each commit with their record in `cdp.privacy_request_steps`, and each can run
again: a request cut short (a killed process, a platform down) resumes where it stopped with
`cdp privacy resume` or the same erase again.

- mask_raw: in one transaction, the person's orders lose every personal field (contact,
  names, document, addresses, and any text holding their identifiers), keeping amounts,
  items and dates; their Master Data documents and the quarantined records holding their
  identifiers are deleted. The orders' landing time moves, so the next analytics refresh
  parses them again, as orders of no one.
- derived: their rows leave every table built from the raw ones (staging, identity, marts,
  predictions, an analyst's own schemas too), and the materialized views (audiences) are
  refreshed.
- destinations: each member the person was sent as is removed from the platform with its
  remove call, from the rows the platform confirmed (hashed, as sent). A platform that
  processes requests later (Data Manager, a Google Ads job) keeps the request open until
  the audience's syncs have read its verdicts; the hourly `privacy_requests` schedule then
  completes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import phonenumbers
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from cdp_assets.activation.destinations import Destination, get_destination
from cdp_assets.activation.identifiers import normalize_email, normalize_phone, sha256_hex
from cdp_assets.activation.sync import (
    AsynchronousPlatform,
    AudienceGone,
    Platform,
    hold_pending_removals,
)
from cdp_assets.privacy.audit import (
    complete_request,
    complete_step,
    open_request,
    record_error,
    record_progress,
    start_step,
    step_detail,
    step_done,
)
from cdp_assets.privacy.identifiers import normalize_document, normalized
from cdp_assets.privacy.suppression import add_suppressions
from cdp_assets.tenants.registry import get_tenant

PlatformFor = Callable[[Destination], Platform]
STEPS = ("suppress", "mask_raw", "derived", "destinations")
# Any constant: the first key of the advisory lock a process holds on a request it works on.
_REQUEST_LOCK = 727_045
# Fields of an order (any level) that are about the buyer or where the order goes.
PERSONAL_FIELDS = frozenset(
    {
        "email",
        "firstName",
        "lastName",
        "document",
        "phone",
        "corporateName",
        "tradeName",
        "corporateDocument",
        "stateInscription",
        "corporatePhone",
        "userProfileId",
        "receiverName",
        "street",
        "number",
        "complement",
        "neighborhood",
        "postalCode",
        "reference",
        "geoCoordinates",
    }
)
# A value shorter than this is no identifier to look for inside other text.
SHORTEST_IDENTIFIER = 6


class RequestBusy(RuntimeError):
    """Another process is working on the request."""


class AwaitingPlatforms(RuntimeError):
    """Removals were sent and the platforms have yet to say they applied them: the request
    stays open until they have."""


@dataclass
class Person:
    """What an erase touches, by ids that are no personal data, and the hashes it suppresses."""

    customer_keys: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)
    order_ids: list[str] = field(default_factory=list)
    customer_ids: list[str] = field(default_factory=list)
    hashes: dict[str, str] = field(default_factory=dict)  # sha256 -> kind

    def targets(self) -> dict[str, list[str]]:
        found = asdict(self)
        del found["hashes"]
        return found

    def counts(self) -> dict[str, int]:
        return {name: len(values) for name, values in asdict(self).items()}


def _exists(conn: psycopg.Connection, relation: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (relation,)).fetchone()
    return bool(row and row[0])


def _resolved_records(
    conn: psycopg.Connection, tenant_id: str, keys: list[str], identifiers: dict[str, set[str]]
) -> list[tuple[str, str, str | None, str | None, str | None, str | None]]:
    """(customer_key, record_id, user_profile_id, email, phone, document) of every record of
    the customers in `keys` or holding one of `identifiers` on any of their records."""
    if not _exists(conn, "intermediate.int_identity__customer_keys"):
        return []
    return conn.execute(
        """
        SELECT customer_key, record_id, user_profile_id, email_normalized, phone_e164,
               document_normalized
        FROM intermediate.int_identity__customer_keys
        WHERE tenant_id = %(tenant_id)s AND customer_key IN (
            SELECT customer_key FROM intermediate.int_identity__customer_keys
            WHERE tenant_id = %(tenant_id)s
              AND (customer_key = ANY(%(keys)s) OR email_normalized = ANY(%(emails)s)
                   OR phone_e164 = ANY(%(phones)s) OR document_normalized = ANY(%(documents)s)))
        ORDER BY record_id
        """,
        {
            "tenant_id": tenant_id,
            "keys": keys,
            "emails": sorted(identifiers["email"]),
            "phones": sorted(identifiers["phone"]),
            "documents": sorted(identifiers["document"]),
        },
    ).fetchall()


def _phone_digits(e164: str, default_country: str) -> list[str]:
    """How a raw phone's digits may look: international, or national in the tenant's country."""
    digits = e164.lstrip("+")
    code = str(phonenumbers.country_code_for_region(default_country.upper()))
    return [digits, digits[len(code) :]] if digits.startswith(code) else [digits]


_RAW_MATCHES = """
WITH wanted AS (SELECT %(emails)s::text[] AS emails, %(documents)s::text[] AS documents,
                       %(phones)s::text[] AS phones, %(profiles)s::text[] AS profiles)
SELECT 'order', o.order_id, p ->> 'userProfileId', p ->> 'email', p ->> 'phone', p ->> 'document'
FROM raw_vtex.orders o, wanted,
     LATERAL (SELECT coalesce(o.summary, o.payload) -> 'clientProfileData' AS p) profile
WHERE o.tenant_id = %(tenant_id)s AND (
    o.order_id = ANY(%(order_ids)s) OR p ->> 'userProfileId' = ANY(wanted.profiles)
    OR lower(btrim(p ->> 'email')) = ANY(wanted.emails)
    OR regexp_replace(p ->> 'document', '[^0-9]', '', 'g') = ANY(wanted.documents)
    OR regexp_replace(p ->> 'phone', '[^0-9]', '', 'g') = ANY(wanted.phones))
UNION ALL
SELECT 'cl', c.customer_id, c.payload ->> 'userId', c.payload ->> 'email', c.payload ->> 'phone',
       c.payload ->> 'document'
FROM raw_vtex.customers c, wanted
WHERE c.tenant_id = %(tenant_id)s AND (
    c.customer_id = ANY(%(customer_ids)s) OR c.payload ->> 'userId' = ANY(wanted.profiles)
    OR lower(btrim(c.payload ->> 'email')) = ANY(wanted.emails)
    OR regexp_replace(c.payload ->> 'document', '[^0-9]', '', 'g') = ANY(wanted.documents)
    OR regexp_replace(c.payload ->> 'phone', '[^0-9]', '', 'g') = ANY(wanted.phones))
"""


def find_person(conn: psycopg.Connection, tenant_id: str, kind: str, value: str) -> Person:
    """Everything of the tenant that is the person named by `kind` (email, phone, document,
    customer_key) and `value`: the customers identity resolution gave the identifier to, every
    customer and raw document holding an identifier of theirs (whatever resolution made of
    it: the suppression list keeps every such customer out of the marts anyway), and so on
    until no new identifier turns up."""
    country = get_tenant(conn, tenant_id).default_country
    person = Person(customer_keys=[value] if kind == "customer_key" else [])
    identifiers: dict[str, set[str]] = {"email": set(), "phone": set(), "document": set()}
    if kind != "customer_key":
        identifiers[kind].add(normalized(kind, value, country))
    profiles: set[str] = set()
    seen: dict[str, set[str]] | None = None
    while seen != identifiers:
        seen = {name: set(values) for name, values in identifiers.items()}
        for key, record_id, profile, *found in _resolved_records(
            conn, tenant_id, person.customer_keys, identifiers
        ):
            person.customer_keys.append(key)
            person.record_ids.append(record_id)
            profiles |= {profile} if profile else set()
            for name, identifier in zip(("email", "phone", "document"), found, strict=True):
                identifiers[name] |= {identifier} if identifier else set()
        rows = conn.execute(
            _RAW_MATCHES,
            {
                "tenant_id": tenant_id,
                "emails": sorted(identifiers["email"]),
                "documents": sorted(identifiers["document"]),
                "phones": sorted(
                    d for p in identifiers["phone"] for d in _phone_digits(p, country)
                ),
                "profiles": sorted(profiles),
                "order_ids": [
                    r.removeprefix("order:") for r in person.record_ids if r.startswith("order:")
                ],
                "customer_ids": [
                    r.removeprefix("cl:") for r in person.record_ids if r.startswith("cl:")
                ],
            },
        ).fetchall()
        for source, source_id, profile, email, phone, document in rows:
            if source == "order":
                person.order_ids.append(source_id)
                person.record_ids.append(f"profile:{profile}" if profile else f"order:{source_id}")
            else:
                person.customer_ids.append(source_id)
                person.record_ids.append(f"cl:{source_id}")
            profiles |= {profile} if profile else set()
            for name, identifier in (
                ("email", normalize_email(email)),
                ("phone", normalize_phone(phone, country)),
                ("document", normalize_document(document)),
            ):
                identifiers[name] |= {identifier} if identifier else set()
    person.customer_keys = sorted(set(person.customer_keys))
    person.record_ids = sorted(set(person.record_ids))
    person.order_ids = sorted(set(person.order_ids))
    person.customer_ids = sorted(set(person.customer_ids))
    person.hashes = {sha256_hex(v): name for name, values in identifiers.items() for v in values}
    return person


def start_erase(conn: psycopg.Connection, tenant_id: str, kind: str, value: str) -> int:
    """Record an erase request with what it found, its hashes suppressed (one transaction);
    an erase of the same person still open is returned instead of a new one."""
    person = find_person(conn, tenant_id, kind, value)
    open_one = conn.execute(
        """
        SELECT r.request_id FROM cdp.privacy_requests r
        JOIN cdp.privacy_suppressions s USING (request_id)
        WHERE r.tenant_id = %s AND r.kind = 'erase' AND r.status = 'running'
          AND s.identifier_sha256 = ANY(%s)
        ORDER BY r.request_id LIMIT 1
        """,
        (tenant_id, list(person.hashes)),
    ).fetchone()
    if open_one is not None:
        conn.rollback()
        return open_one[0]
    request_id = open_request(conn, tenant_id, "erase", kind, person.targets())
    conn.execute(
        "INSERT INTO cdp.privacy_request_steps (request_id, step, position) VALUES (%s, %s, 0)",
        (request_id, STEPS[0]),
    )
    added = add_suppressions(conn, tenant_id, request_id, person.hashes)
    complete_step(conn, request_id, STEPS[0], {**person.counts(), "identifiers_added": added})
    conn.commit()
    return request_id


def masked(value: Any, identifiers: frozenset[str]) -> Any:
    """A JSON value without personal fields, nor any text holding one of `identifiers`
    (lower-case); numbers, booleans and other text stay as they are."""
    if isinstance(value, dict):
        return {
            key: None if key in PERSONAL_FIELDS else masked(item, identifiers)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [masked(item, identifiers) for item in value]
    if isinstance(value, str) and any(found in value.lower() for found in identifiers):
        return None
    return value


def _clear_values(rows: Iterable[tuple[Any, ...]]) -> frozenset[str]:
    """The identifiers as the documents hold them and normalized, lower-case, to look for."""
    values: set[str] = set()
    for row in rows:
        for text in row:
            if not text:
                continue
            digits = re.sub(r"[^0-9]", "", text)
            values |= {text.strip().lower(), digits} if "@" not in text else {text.strip().lower()}
    return frozenset(v for v in values if len(v) >= SHORTEST_IDENTIFIER)


def _like_any(values: Iterable[str]) -> list[str]:
    return ["%" + re.sub(r"([\\%_])", r"\\\1", v) + "%" for v in sorted(values)]


def mask_raw(conn: psycopg.Connection, tenant_id: str, targets: dict[str, list[str]]) -> dict:
    """The person's raw documents masked or deleted; not committed (the step commits it whole,
    so an interruption leaves all or nothing, and the identifiers to look for are read from
    the documents themselves)."""
    order_ids, customer_ids = targets["order_ids"], targets["customer_ids"]
    profile = "coalesce(summary, payload) -> 'clientProfileData'"
    found = conn.execute(
        f"""
        SELECT {profile} ->> 'email', {profile} ->> 'phone', {profile} ->> 'document'
        FROM raw_vtex.orders WHERE tenant_id = %(tenant_id)s AND order_id = ANY(%(orders)s)
        UNION ALL
        SELECT payload ->> 'email', payload ->> 'phone', payload ->> 'document'
        FROM raw_vtex.customers WHERE tenant_id = %(tenant_id)s AND customer_id = ANY(%(cls)s)
        """,
        {"tenant_id": tenant_id, "orders": order_ids, "cls": customer_ids},
    ).fetchall()
    identifiers = _clear_values(found)
    orders = conn.execute(
        "SELECT order_id, payload, summary FROM raw_vtex.orders"
        " WHERE tenant_id = %s AND order_id = ANY(%s) FOR UPDATE",
        (tenant_id, order_ids),
    ).fetchall()
    with conn.cursor() as cursor:
        cursor.executemany(
            "UPDATE raw_vtex.orders SET payload = %s, summary = %s,"
            " synced_at = statement_timestamp() WHERE tenant_id = %s AND order_id = %s",
            [
                (
                    Jsonb(masked(payload, identifiers)),
                    Jsonb(masked(summary, identifiers)) if summary is not None else None,
                    tenant_id,
                    order_id,
                )
                for order_id, payload, summary in orders
            ],
        )
    documents = conn.execute(
        "DELETE FROM raw_vtex.customers WHERE tenant_id = %s AND customer_id = ANY(%s)",
        (tenant_id, customer_ids),
    ).rowcount
    rejects = conn.execute(
        "DELETE FROM raw_vtex.rejects WHERE tenant_id = %s"
        " AND (natural_key = ANY(%s) OR lower(raw_text) LIKE ANY(%s))",
        (tenant_id, order_ids + customer_ids, _like_any(identifiers)),
    ).rowcount
    return {"orders_masked": len(orders), "documents_deleted": documents, "rejects": rejects}


_KEY_COLUMNS = {
    "customer_key": "customer_keys",
    "record_id": "record_ids",
    "order_id": "order_ids",
    "customer_id": "customer_ids",
}
_DERIVED_TABLES = """
SELECT n.nspname, c.relname, array_agg(a.attname::text)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('cdp', 'raw_vtex', 'public', 'information_schema')
  AND n.nspname !~ '^pg_'
GROUP BY n.nspname, c.relname
HAVING 'tenant_id' = ANY(array_agg(a.attname::text))
ORDER BY 1, 2
"""


def clean_derived(conn: psycopg.Connection, tenant_id: str, targets: dict[str, list[str]]) -> dict:
    """The person's rows out of every table built from the raw ones, and the materialized
    views refreshed; committed."""
    deleted = 0
    for schema, table, columns in conn.execute(_DERIVED_TABLES).fetchall():
        keys = [
            sql.SQL("{} = ANY({})").format(sql.Identifier(c), sql.Placeholder(_KEY_COLUMNS[c]))
            for c in columns
            if c in _KEY_COLUMNS
        ]
        if keys:
            deleted += conn.execute(
                sql.SQL("DELETE FROM {}.{} WHERE tenant_id = %(tenant_id)s AND ({})").format(
                    sql.Identifier(schema), sql.Identifier(table), sql.SQL(" OR ").join(keys)
                ),
                {**targets, "tenant_id": tenant_id},
            ).rowcount
    conn.commit()
    views = conn.execute(
        """
        SELECT n.nspname, c.relname, EXISTS (SELECT FROM pg_index i
                                             WHERE i.indrelid = c.oid AND i.indisunique)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind = 'm' AND c.relispopulated ORDER BY 1, 2
        """
    ).fetchall()
    for schema, view, unique in views:
        # Concurrently where a unique index allows it: activation reads audiences meanwhile.
        conn.execute(
            sql.SQL("REFRESH MATERIALIZED VIEW {} {}.{}").format(
                sql.SQL("CONCURRENTLY" if unique else ""),
                sql.Identifier(schema),
                sql.Identifier(view),
            )
        )
        conn.commit()
    return {"derived_rows_deleted": deleted, "views_refreshed": len(views)}


def remove_from_destinations(
    conn: psycopg.Connection,
    request_id: int,
    tenant_id: str,
    customer_keys: list[str],
    platform_for: PlatformFor,
) -> dict:
    """Each member the person was sent as, removed on its platform from the row it confirmed.
    A row leaves the sync state once its platform took the removal (committed); a removal
    the platform has yet to process is held as a sync holds its own, and the step completes
    once the audience's syncs have read every verdict (raises `AwaitingPlatforms` until then:
    a failed removal puts the rows back, and the resume sends it again)."""
    rows = conn.execute(
        """
        SELECT m.destination_id, m.audience, a.platform_audience_id,
               array_agg(m.member_key ORDER BY m.member_key),
               array_agg(m.identifiers ORDER BY m.member_key)
        FROM cdp.destination_members m
        JOIN cdp.destination_audiences a USING (destination_id, audience)
        JOIN cdp.destinations d USING (destination_id)
        WHERE d.tenant_id = %s AND d.platform <> 'vtex_collections'
          AND m.member_key = ANY(%s)
        GROUP BY 1, 2, 3 ORDER BY 1, 2
        """,
        (tenant_id, customer_keys),
    ).fetchall()
    platforms: dict[str, Platform] = {}
    removed = 0
    for destination_id, audience, platform_id, member_keys, identifiers in rows:
        if destination_id not in platforms:
            platforms[destination_id] = platform_for(get_destination(conn, destination_id))
        platform = platforms[destination_id]
        try:
            if platform_id is not None:
                busy = platform.busy(platform_id)
                if busy is not None:
                    raise RuntimeError(f"{destination_id}/{audience} is busy: {busy}")
                result = platform.remove(platform_id, identifiers)
                if result.rejected:
                    raise RuntimeError(
                        f"{destination_id}/{audience} refused {len(result.rejected)} removals:"
                        f" {sorted(set(result.rejected.values()))[:3]}"
                    )
                if isinstance(platform, AsynchronousPlatform):
                    platform.submit(platform_id)
                    hold_pending_removals(
                        conn, destination_id, audience, member_keys, result.pending
                    )
        except AudienceGone:
            pass  # the platform deleted the audience, and its members with it
        conn.execute(
            "DELETE FROM cdp.destination_members"
            " WHERE destination_id = %s AND audience = %s AND member_key = ANY(%s)",
            (destination_id, audience, member_keys),
        )
        conn.commit()
        removed += len(member_keys)
    # Counted over every attempt: an attempt after removals awaited their verdicts finds
    # nothing left to send.
    before = step_detail(conn, request_id, "destinations")
    counts = {
        "members_removed": before.get("members_removed", 0) + removed,
        "destination_audiences": before.get("destination_audiences", 0) + len(rows),
    }
    awaiting = _removals_awaiting_verdicts(conn, tenant_id, customer_keys)
    if awaiting:
        record_progress(conn, request_id, "destinations", counts)
        conn.commit()
        raise AwaitingPlatforms(
            f"{awaiting} removal requests await their platform's verdict; the audiences' syncs"
            " read it, and the hourly privacy schedule then completes the request"
        )
    return counts


def _removals_awaiting_verdicts(
    conn: psycopg.Connection, tenant_id: str, customer_keys: list[str]
) -> int:
    row = conn.execute(
        """
        SELECT count(*) FROM cdp.destination_requests r
        JOIN cdp.destinations d USING (destination_id)
        WHERE d.tenant_id = %s AND r.status = 'pending' AND r.operation = 'remove'
          AND EXISTS (SELECT FROM jsonb_array_elements(r.members) m WHERE m ->> 0 = ANY(%s))
        """,
        (tenant_id, customer_keys),
    ).fetchone()
    conn.commit()
    assert row is not None
    return row[0]


def run_erase(conn: psycopg.Connection, request_id: int, platform_for: PlatformFor) -> None:
    """Carry an erase request through its remaining steps; raises what stopped it, after
    recording it on the request (which stays open, to resume)."""
    row = conn.execute(
        "SELECT tenant_id, targets, status FROM cdp.privacy_requests"
        " WHERE request_id = %s AND kind = 'erase'",
        (request_id,),
    ).fetchone()
    if row is None:
        raise LookupError(f"no erase request {request_id}")
    tenant_id, targets, status = row
    if status == "completed":
        return
    lock = conn.execute(
        "SELECT pg_try_advisory_lock(%s, %s)", (_REQUEST_LOCK, request_id)
    ).fetchone()
    conn.commit()
    assert lock is not None
    if not lock[0]:
        raise RequestBusy(f"request {request_id} is being carried out by another process")
    steps: dict[str, Callable[[], dict]] = {
        "mask_raw": lambda: mask_raw(conn, tenant_id, targets),
        "derived": lambda: clean_derived(conn, tenant_id, targets),
        "destinations": lambda: remove_from_destinations(
            conn, request_id, tenant_id, targets["customer_keys"], platform_for
        ),
    }
    try:
        for position, step in enumerate(STEPS[1:], start=1):
            if step_done(conn, request_id, step):
                continue
            start_step(conn, request_id, step, position)
            detail = steps[step]()
            complete_step(conn, request_id, step, detail)
            conn.commit()
        complete_request(conn, request_id)
    except Exception as error:
        record_error(conn, request_id, error)
        raise
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_REQUEST_LOCK, request_id))
        conn.commit()


def open_erasures(conn: psycopg.Connection) -> list[int]:
    return [
        request_id
        for (request_id,) in conn.execute(
            "SELECT request_id FROM cdp.privacy_requests"
            " WHERE kind = 'erase' AND status = 'running' ORDER BY request_id"
        )
    ]


def default_platform(destination: Destination) -> Platform:
    """The destination's platform client, as the activation assets build it (their resources'
    defaults: the endpoints, or the sandboxes named in the environment)."""
    if destination.platform == "meta":
        from cdp_assets.activation.meta.resources import MetaResource

        return MetaResource().audiences_for(destination)
    from cdp_assets.activation.google.resources import GoogleResource

    return GoogleResource().audiences_for(destination)
