"""Quarantine of records that cannot be landed, with the reason and the raw text.

A record is identified by its key and raw text, so seeing it again on a later run updates
its row instead of adding one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg


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
