"""Set-based landing of raw documents: COPY into a temporary table, then one upsert.

A row replaces the stored one only when its change stamp is not older and its payload
differs, so re-runs, duplicated pages and out-of-order deliveries converge to one state.
A batch Postgres refuses because of some rows' content is landed again in halves, each in a
savepoint, until every refused row is alone: the rest lands, the refused rows are returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql


@dataclass(frozen=True)
class RawTable:
    schema: str
    name: str
    key_column: str
    extra_columns: tuple[str, ...] = ()  # typed columns besides the key, stamp and payload

    @property
    def columns(self) -> tuple[str, ...]:
        return ("tenant_id", self.key_column, "change_stamp", *self.extra_columns, "payload")

    @property
    def qualified(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


@dataclass
class UpsertCounts:
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0

    def add(self, other: UpsertCounts) -> None:
        self.inserted += other.inserted
        self.updated += other.updated
        self.unchanged += other.unchanged


# (key, change_stamp, *extra column values, payload as JSON text)
Row = tuple[str, datetime, *tuple[Any, ...], str]

# What a row's own content makes Postgres refuse (a number jsonb cannot hold, text it cannot
# store, a constraint, a key too large for its index); anything else fails the batch.
ROW_ERRORS = (
    psycopg.errors.DataError,
    psycopg.errors.IntegrityError,
    psycopg.errors.ProgramLimitExceeded,
)


@dataclass(frozen=True)
class Refused:
    """A row Postgres refused, with its reason."""

    row: Row
    reason: str


def upsert_documents(
    conn: psycopg.Connection,
    table: RawTable,
    tenant_id: str,
    rows: Sequence[Row],
    *,
    replace: bool = False,
) -> UpsertCounts:
    """Land `rows` for one tenant in the caller's transaction; returns what changed.

    `replace` (a full refresh) lets a row replace the stored one whatever their stamps: what
    VTEX answers now is the truth, even against a stored stamp from the future."""
    if not rows:
        return UpsertCounts()
    cols = table.columns
    col_list = sql.SQL(", ").join(map(sql.Identifier, cols))
    key = sql.Identifier(table.key_column)
    updatable = [c for c in cols if c not in ("tenant_id", table.key_column)]
    conn.execute(
        sql.SQL(
            # With the target's compression: COPY compresses each large document into this
            # table, with LZ4 where the raw tables use it (migration 0008), not pglz.
            "CREATE TEMP TABLE IF NOT EXISTS {incoming}"
            " (LIKE {target} INCLUDING DEFAULTS INCLUDING COMPRESSION)"
        ).format(incoming=sql.Identifier(f"incoming_{table.name}"), target=table.qualified)
    )
    incoming = sql.Identifier(f"incoming_{table.name}")
    with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(incoming, col_list)) as copy:
        for row in rows:
            copy.write_row((tenant_id, *row))
    # DISTINCT ON: one incoming row per key (the newest), since a batch may repeat a key.
    # synced_at is this statement's start, after the documents were read: the caller's
    # transaction (now()) may have begun before a read that saw a later change.
    query = sql.SQL(
        """
        WITH incoming AS (
            SELECT DISTINCT ON ({key}) {cols} FROM {incoming}
            ORDER BY {key}, change_stamp DESC
        ), upserted AS (
            INSERT INTO {target} AS t ({cols}, synced_at)
            SELECT {cols}, statement_timestamp() FROM incoming
            ON CONFLICT (tenant_id, {key}) DO UPDATE
               SET {assignments}, synced_at = statement_timestamp()
             WHERE (excluded.change_stamp >= t.change_stamp OR {replace})
               AND excluded.payload IS DISTINCT FROM t.payload
            RETURNING (xmax = 0) AS inserted
        )
        SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted)
          FROM upserted
        """
    ).format(
        key=key,
        cols=col_list,
        incoming=incoming,
        target=table.qualified,
        replace=sql.Literal(replace),
        assignments=sql.SQL(", ").join(
            sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c)) for c in updatable
        ),
    )
    counts = conn.execute(query).fetchone()
    assert counts is not None  # an aggregate answers one row
    inserted, updated = counts
    conn.execute(sql.SQL("TRUNCATE {}").format(incoming))
    # A key repeated within the batch counts as unchanged: it was received, nothing moved.
    return UpsertCounts(
        inserted=inserted, updated=updated, unchanged=len(rows) - inserted - updated
    )


def upsert_isolating(
    conn: psycopg.Connection,
    table: RawTable,
    tenant_id: str,
    rows: Sequence[Row],
    *,
    replace: bool = False,
) -> tuple[UpsertCounts, list[Refused]]:
    """`upsert_documents` of the rows Postgres accepts, in the caller's transaction: parts it
    refuses are halved, each attempt in a savepoint, until each refused row is alone. For a
    batch whose single upsert failed with a ROW_ERRORS error: k refused rows of n cost about
    2k log2(n) attempts."""
    counts = UpsertCounts()
    refused: list[Refused] = []
    parts = [rows]
    while parts:
        part = parts.pop()
        conn.execute("SAVEPOINT isolating")
        try:
            counts.add(upsert_documents(conn, table, tenant_id, part, replace=replace))
        except ROW_ERRORS as error:
            conn.execute("ROLLBACK TO SAVEPOINT isolating")
            if len(part) == 1:
                diag = error.diag
                reason = f"the warehouse refused it: {diag.message_primary} ({diag.sqlstate})"
                refused.append(Refused(part[0], reason))
            else:
                middle = len(part) // 2
                parts += [part[middle:], part[:middle]]
        conn.execute("RELEASE SAVEPOINT isolating")
    return counts, refused
