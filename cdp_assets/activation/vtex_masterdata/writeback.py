"""Customer fields written back to the tenant's VTEX Master Data CL documents, as an
activation platform: each customer's segment, CLV tier and churn band in fields of the
merchant's choosing, which the store's promotions and clusters can target.

A member is one CL document: its id (not personal data: a random GUID that identifies
nothing outside the store that issued it) and the values to write, in the order of the
destination's fields. Customers are read from the identity records, so only documents the
store already has are written; the sync's diff sends only the documents whose values
changed, each as one partial update (`PATCH /api/dataentities/CL/documents/{id}`) through
the tenant's VTEX client, whose every request is taken from the account's request budget
shared with ingestion (`vtex/budget.py`). A customer who leaves (erased, suppressed, no
longer a customer) has the fields emptied.

A document deleted in the store since ingestion read it is not written: the Master Data v1
spec gives that PATCH no answer for a missing id, and `PUT` on the same path creates, so a
PATCH may create the document anew, with nothing but our fields. Each batch first asks
search which of its documents still exist (one request per SEARCH_IDS documents, a few
percent of the writes); the others are rejected with the reason, counted as rejects, and the
rest of the batch lands.

The fields must exist on the CL entity: Master Data v1 has no route to create them, so
`missing_fields` reads the entity's structure and the operator creates any missing one in
the Admin (`cdp destinations check`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from cdp_assets.activation.destinations import DestinationAudience, DestinationError
from cdp_assets.activation.sync import BatchResult, MemberSource, Row
from cdp_assets.vtex.client import (
    SEARCH_PATH,
    VtexAuthError,
    VtexClient,
    VtexError,
    VtexRequestFailed,
)

ENTITY = "CL"
STRUCTURE_PATH = f"/api/dataentities/{ENTITY}"
DOCUMENT_PATH = f"/api/dataentities/{ENTITY}/documents/{{document_id}}"
# The destination's one "audience": the customers mart, whose customers are written.
AUDIENCE = "customers"

# What a destination may write, by name: one SQL value per customer over `customers` (c),
# `rfm_segments` (r), `churn_risk` (k) and the tenant's CLV ranking (v). Missing values are ''.
VALUES = {
    "segment": "r.segment",
    "churn_band": "k.churn_band",
    # Top 20 % of the tenant's predicted 1-year CLV (as audience_high_clv), the next 30 %,
    # the rest; no tier for a customer the model has not scored.
    "clv_tier": (
        "CASE WHEN v.top_share IS NULL THEN NULL WHEN v.top_share <= 0.2 THEN 'high'"
        " WHEN v.top_share <= 0.5 THEN 'medium' ELSE 'low' END"
    ),
}
DEFAULT_FIELDS = {"cdpSegment": "segment", "cdpClvTier": "clv_tier", "cdpChurnBand": "churn_band"}
DEFAULT_UPDATED_AT_FIELD = "cdpUpdatedAt"
FIELD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,49}")
# Values derived from the CLV model: a destination writing one should be gated on its quality.
CLV_VALUES = frozenset({"clv_tier"})
# Documents whose existence one search asks for: `id=... OR ...` over 50 GUIDs keeps the query
# string near 2.5 KB, well inside what HTTP front ends accept, and within a search page (100).
SEARCH_IDS = 50
DELETED = (
    "the CL document no longer exists in the store (deleted since ingestion): not written, as"
    " writing would create it anew"
)


@dataclass(frozen=True)
class WritebackFields:
    """CL field -> value written to it, in order, and the field stamped with the moment of
    each write ('' for none)."""

    fields: tuple[tuple[str, str], ...]
    updated_at_field: str

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> WritebackFields:
        """From a destination audience's params: {"fields": {"cdpSegment": "segment", ...},
        "updated_at_field": "cdpUpdatedAt"}; the defaults where absent."""
        fields = params.get("fields", DEFAULT_FIELDS)
        updated_at = params.get("updated_at_field", DEFAULT_UPDATED_AT_FIELD)
        problems = []
        if not isinstance(fields, dict) or not fields:
            problems.append('"fields" must map CL field names to values')
            fields = {}
        for name, value in fields.items():
            if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
                problems.append(f"{str(name)[:60]!r} is not a Master Data field name")
            if value not in VALUES:
                problems.append(f"{str(value)[:60]!r} is not one of {', '.join(sorted(VALUES))}")
        if not isinstance(updated_at, str) or (updated_at and not FIELD_NAME.fullmatch(updated_at)):
            problems.append('"updated_at_field" must be a Master Data field name, or ""')
        if problems:
            raise DestinationError("Master Data write-back: " + "; ".join(problems))
        return cls(tuple(fields.items()), updated_at)

    def names(self) -> list[str]:
        return [name for name, _ in self.fields] + (
            [self.updated_at_field] if self.updated_at_field else []
        )


def destination_fields(conn: psycopg.Connection, destination_id: str) -> WritebackFields:
    """The fields a destination writes: its `customers` audience's params."""
    row = conn.execute(
        "SELECT params FROM cdp.destination_audiences WHERE destination_id = %s AND audience = %s",
        (destination_id, AUDIENCE),
    ).fetchone()
    if row is None:
        raise DestinationError(
            f"destination {destination_id!r} writes no fields: add them with `cdp destinations"
            f" audience {destination_id} {AUDIENCE} --params '{{\"fields\": {{...}}}}'`"
        )
    return WritebackFields.from_params(row[0])


def customer_fields(
    conn: psycopg.Connection, target: DestinationAudience, fields: WritebackFields
) -> MemberSource:
    """The tenant's CL documents with the values to write, keyed by document id, without the
    people suppressed in the tenant. A document whose values are unchanged since the
    destination confirmed them keeps its confirmed row, in the database."""
    values = sql.SQL(", ").join(
        sql.SQL("coalesce(({})::text, '')").format(sql.SQL(VALUES[value]))
        for _, value in fields.fields
    )
    # The documents are computed on their own, by the tenant: joined to the confirmed rows
    # by their ids (cut from the records' ids, which the planner cannot estimate), the
    # planner expected a handful and looked each document's values up one by one, the
    # tenant's CLV ranking computed again for each, quadratic in the tenant's customers.
    members = sql.SQL(
        """
        WITH clv AS (
            SELECT p.customer_key,
                   cume_dist() OVER (ORDER BY p.clv_1y DESC) AS top_share
            FROM analytics_python.customer_predictions p
            WHERE p.tenant_id = %(tenant_id)s AND p.clv_1y > 0
        ), documents AS MATERIALIZED (
            SELECT substr(i.record_id, 4) AS document_id, ARRAY[{values}] AS field_values
            FROM intermediate.int_identity__customer_keys i
            JOIN marts.customers c USING (tenant_id, customer_key)
            LEFT JOIN marts.rfm_segments r USING (tenant_id, customer_key)
            LEFT JOIN marts.churn_risk k USING (tenant_id, customer_key)
            LEFT JOIN clv v USING (customer_key)
            WHERE i.tenant_id = %(tenant_id)s AND i.record_id LIKE 'cl:%%'
              AND NOT EXISTS (SELECT FROM cdp.privacy_suppressions s
                              WHERE s.tenant_id = c.tenant_id
                                AND s.identifier_sha256 IN (c.email_sha256, c.phone_sha256,
                                    encode(sha256(convert_to(c.document, 'UTF8')), 'hex')))
        ), members AS (
            SELECT document_id, field_values,
                   md5(array_to_string(field_values, chr(31))) AS source_fingerprint
            FROM documents
        )
        """
    ).format(values=values)
    confirmed_match = sql.SQL(
        "confirmed.destination_id = %(destination_id)s AND confirmed.audience = %(audience)s"
        " AND confirmed.member_key = members.document_id"
        " AND confirmed.source_fingerprint = members.source_fingerprint"
    )
    confirmed = members + sql.SQL(
        "SELECT members.document_id, confirmed.fingerprint, members.source_fingerprint,"
        " confirmed.identifiers FROM members JOIN cdp.destination_members confirmed ON {}"
    ).format(confirmed_match)
    fresh = members + sql.SQL(
        "SELECT document_id, field_values, source_fingerprint FROM members"
        " WHERE NOT EXISTS (SELECT FROM cdp.destination_members confirmed WHERE {})"
    ).format(confirmed_match)
    params = {
        "tenant_id": target.destination.tenant_id,
        "destination_id": target.destination.destination_id,
        "audience": target.audience,
    }

    def fresh_members() -> Iterator[tuple[str, str, Row]]:
        with conn.transaction(), conn.cursor() as cursor:
            for document_id, field_values, source_fingerprint in cursor.stream(
                fresh, params, size=10_000
            ):
                yield document_id, source_fingerprint, [document_id, *field_values]

    return MemberSource(fresh_members, confirmed, params)


def missing_fields(client: VtexClient, names: Iterable[str]) -> list[str]:
    """The names that are not fields of the CL entity (or are internal, not writable)."""
    reply = client.get(STRUCTURE_PATH)
    structure = reply.data if reply is not None else None
    if not isinstance(structure, dict) or not isinstance(structure.get("fields"), list):
        raise VtexError(f"GET {STRUCTURE_PATH} did not answer the entity's structure")
    writable = {
        field.get("name")
        for field in structure["fields"]
        if isinstance(field, dict) and not field.get("isInternal")
    }
    return [name for name in names if name not in writable]


def how_to_create(names: Iterable[str]) -> str:
    """What the merchant does to create missing CL fields (Master Data v1 has no API for it)."""
    return (
        "create them in the VTEX Admin: Store Settings > Master Data (Dynamic Storage) > Data"
        " Structure > CL (Client) > Fields, one each: "
        + ", ".join(
            f"{name} ({'Date and Time' if name.endswith('UpdatedAt') else 'Varchar 50'},"
            " nullable, searchable, filter)"
            for name in names
        )
        + "; then save and 'Reload schema' on the CL entity"
    )


class VtexMasterDataFields:
    """Writes the destination's fields to CL documents, one partial update each, several at
    once on the client's threads; every request is paced by the account's shared budget."""

    batch_size = 200  # documents between two state commits

    def __init__(self, client: VtexClient, fields: WritebackFields) -> None:
        self.client = client
        self.fields = fields
        self._checked = False

    def overwrites_members(self) -> bool:
        return True

    def matchable(self, row: Row) -> bool:
        return bool(row[0])

    def ensure_audience(self, target: DestinationAudience) -> str:
        self._require_fields()
        return ENTITY

    def _require_fields(self) -> None:
        """Once per run: a missing field would have every document refused."""
        if self._checked:
            return
        missing = missing_fields(self.client, self.fields.names())
        if missing:
            raise DestinationError(
                f"the CL entity has no field {', '.join(missing)}: " + how_to_create(missing)
            )
        self._checked = True

    def _existing(self, document_ids: list[str]) -> set[str]:
        """Which of the documents the store still has, by search, SEARCH_IDS a request."""

        def search(chunk: list[str]) -> set[str]:
            reply = self.client.get(
                SEARCH_PATH,
                params={"_where": " OR ".join(f"id={d}" for d in chunk), "_fields": "id"},
                headers={"REST-Range": f"resources=0-{len(chunk)}"},
            )
            found = reply.data if reply is not None else None
            if not isinstance(found, list):
                raise VtexError(f"GET {SEARCH_PATH} did not answer a list of documents")
            return {d["id"] for d in found if isinstance(d, dict) and isinstance(d.get("id"), str)}

        chunks = [document_ids[i : i + SEARCH_IDS] for i in range(0, len(document_ids), SEARCH_IDS)]
        return set().union(*self.client.map_concurrent(search, chunks))

    def _write(self, rows: list[Row], clear: bool) -> BatchResult:
        self._require_fields()
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        existing = self._existing([row[0] for row in rows])

        def patch(row: Row) -> str | None:
            document_id, *values = row
            if document_id not in existing:
                return DELETED
            body: dict[str, Any] = {
                name: None if clear or value == "" else value
                for (name, _), value in zip(self.fields.fields, values, strict=True)
            }
            if self.fields.updated_at_field:
                body[self.fields.updated_at_field] = None if clear else stamp
            try:
                self.client.request(
                    "PATCH", DOCUMENT_PATH.format(document_id=document_id), json_body=body
                )
            except (VtexRequestFailed, VtexAuthError):
                raise
            except VtexError as error:  # this document refused, with VTEX's answer
                return str(error)[:200]
            return None

        rejected = {
            index: reason
            for index, reason in enumerate(self.client.map_concurrent(patch, rows))
            if reason is not None
        }
        searches = -(-len(rows) // SEARCH_IDS)
        patches = sum(row[0] in existing for row in rows)
        return BatchResult(rejected=rejected, requests=searches + patches)

    def add(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._write(rows, clear=False)

    def remove(self, platform_id: str, rows: list[Row]) -> BatchResult:
        return self._write(rows, clear=True)

    def replace(self, platform_id: str, batches: Iterable[list[Row]]) -> BatchResult:
        """Write every document's values again (the repair after fields were edited by hand);
        rejected rows by their position among every row sent, as the sync numbers them."""
        rejected: dict[int, str] = {}
        requests = offset = 0
        for batch in batches:
            result = self._write(batch, clear=False)
            rejected.update({offset + i: reason for i, reason in result.rejected.items()})
            requests += result.requests
            offset += len(batch)
        return BatchResult(rejected=rejected, requests=requests)

    def busy(self, platform_id: str) -> str | None:
        return None

    def match_info(self, platform_id: str) -> dict[str, Any]:
        return {}
