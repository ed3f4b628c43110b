"""Quarantine of records that cannot be landed, with the reason and the raw text; and the
orders that could not be read, to be read again.

A record is identified by its key and raw text, so seeing it again on a later run updates
its row instead of adding one. An unread order is identified by its id."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import date, datetime

import psycopg

from cdp_assets.lib.redaction import redact


@dataclass(frozen=True)
class Reject:
    natural_key: str | None
    reason: str
    raw_text: str


def record_rejects(
    conn: psycopg.Connection, tenant_id: str, entity: str, rejects: Sequence[Reject], run_id: str
) -> None:
    if not rejects:
        return
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO raw_vtex.rejects (tenant_id, entity, natural_key, reason, raw_text,
                                          raw_md5, run_id)
            VALUES (%s, %s, %s, %s, %s, md5(coalesce(%s, '') || chr(10) || %s), %s)
            ON CONFLICT (tenant_id, entity, raw_md5) DO UPDATE
               SET last_seen_at = now(), times_seen = raw_vtex.rejects.times_seen + 1,
                   run_id = excluded.run_id, reason = excluded.reason
            """,
            [
                (
                    tenant_id,
                    entity,
                    key,
                    r.reason,
                    _text(r.raw_text),
                    key,
                    _text(r.raw_text),
                    run_id,
                )
                for r in rejects
                # A key can hold a NUL too (`"orderId": "1\u0000"`, refused for that reason).
                for key in [None if r.natural_key is None else _text(r.natural_key)]
            ],
        )


def _text(raw: str) -> str:
    # Postgres text cannot hold NUL; keep everything else as received.
    return raw.replace("\x00", "\\u0000")


@dataclass(frozen=True)
class Unreadable:
    """An order VTEX listed whose Get order kept failing after the client's retries."""

    order_id: str
    month: date  # the order month whose runs read it again
    status: str | None  # as List orders reported it
    error: str


def unread_orders(
    conn: psycopg.Connection, tenant_id: str, start: datetime, end: datetime
) -> list[Unreadable]:
    """The tenant's unread orders of the months from `start`'s to the one before `end`'s
    first instant."""
    rows = conn.execute(
        """
        SELECT order_id, month, status, error FROM raw_vtex.unreadable_orders
         WHERE tenant_id = %s
           AND month >= date_trunc('month', %s::timestamptz AT TIME ZONE 'UTC')
           AND month < %s::timestamptz AT TIME ZONE 'UTC'
         ORDER BY order_id
        """,
        (tenant_id, start, end),
    )
    return [Unreadable(*row) for row in rows]


def settle_unread(
    conn: psycopg.Connection,
    tenant_id: str,
    read: Collection[str],
    unread: Sequence[Unreadable],
    run_id: str,
) -> None:
    """In the caller's transaction: forget the unread orders now `read` (landed or
    quarantined), record those still `unread` (an order unread again counts one attempt
    more)."""
    conn.execute(
        "DELETE FROM raw_vtex.unreadable_orders WHERE tenant_id = %s AND order_id = ANY(%s)",
        (tenant_id, list(read)),
    )
    if not unread:
        return
    conn.execute(
        """
        INSERT INTO raw_vtex.unreadable_orders
               (tenant_id, order_id, month, status, error, run_id)
        SELECT %s, u.order_id, u.month, u.status, u.error, %s
          FROM unnest(%s::text[], %s::date[], %s::text[], %s::text[])
               AS u (order_id, month, status, error)
        ON CONFLICT (tenant_id, order_id) DO UPDATE
           SET month = excluded.month,
               status = coalesce(excluded.status, raw_vtex.unreadable_orders.status),
               error = excluded.error, run_id = excluded.run_id, last_seen_at = now(),
               attempts = raw_vtex.unreadable_orders.attempts + 1
        """,
        (
            tenant_id,
            run_id,
            [u.order_id for u in unread],
            [u.month for u in unread],
            [u.status for u in unread],
            [redact(u.error) for u in unread],
        ),
    )
