"""The warehouse measured against the VTEX sandbox's truth, for the reliability scenarios.

The truth is the sandbox's export, loaded into a temporary table next to `raw_vtex.*` so that
every comparison is one set-based query: counts and content checksums per entity, what is
lost or extra, whether a batch is half-visible, and whether a cursor claims data that is not
there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
import psycopg
from support import TABLES

from cdp_assets.vtex.client import CUSTOMER_FIELDS
from cdp_assets.vtex.sync import BATCH_SIZE
from cdp_devkit.sandbox import SandboxProcess

ENTITIES = tuple(TABLES)
KEYS = {entity: key for entity, (key, _) in TABLES.items()}


@dataclass(frozen=True)
class Comparison:
    """The warehouse against the truth, over one or more entities of one tenant."""

    checked: int  # records in the truth
    lost: int  # truth records missing from the warehouse or stored with other content
    extra: int  # warehouse rows the truth does not have
    duplicates: int  # keys stored more than once
    mismatched: tuple[str, ...] = ()  # entities whose count or content checksum differs

    @property
    def exact(self) -> bool:
        return not (self.lost or self.extra or self.duplicates or self.mismatched)

    def __add__(self, other: Comparison) -> Comparison:
        return Comparison(
            self.checked + other.checked,
            self.lost + other.lost,
            self.extra + other.extra,
            self.duplicates + other.duplicates,
            self.mismatched + other.mismatched,
        )


def load_truth(
    conn: psycopg.Connection,
    sandbox: SandboxProcess,
    account: str,
    entities: Iterable[str] = ENTITIES,
) -> None:
    """The sandbox's current truth in the temp table `truth`, malformed orders left out (the
    stores of these scenarios have none, and rejects are checked elsewhere)."""
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS truth (entity text, key text, payload jsonb,"
        " created timestamptz, PRIMARY KEY (entity, key))"
    )
    conn.execute("TRUNCATE truth")
    with conn.cursor().copy("COPY truth (entity, key, payload) FROM STDIN") as copy:
        for entity in entities:
            # Customers as the sync asks Master Data for them: these fields only.
            fields = CUSTOMER_FIELDS if entity == "customers" else None
            for record in sandbox.export(account, entity, fields=fields):
                if not record["malformed"]:
                    copy.write_row(
                        (entity, str(record["key"]), orjson.dumps(record["doc"]).decode())
                    )
    conn.execute(
        "UPDATE truth SET created = (payload->>'creationDate')::timestamptz WHERE entity = 'orders'"
    )


# Whether truth record `t` is stored for tenant %(t)s, whatever its content.
_IS_STORED = "({})".format(
    " OR ".join(
        f"(t.entity = '{entity}' AND EXISTS (SELECT 1 FROM raw_vtex.{entity} r"
        f" WHERE r.tenant_id = %(t)s AND r.{key} = t.key))"
        for entity, key in KEYS.items()
    )
)


def truth_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Records per entity in the loaded truth."""
    return dict(conn.execute("SELECT entity, count(*) FROM truth GROUP BY 1").fetchall())


def _stored_rows(entity: str) -> str:
    return f"SELECT {KEYS[entity]} AS key, payload FROM raw_vtex.{entity} WHERE tenant_id = %(t)s"


def compare_loaded(
    conn: psycopg.Connection, tenant_id: str, entities: Iterable[str] = ENTITIES
) -> Comparison:
    """`compare` against the truth already loaded."""
    total = Comparison(0, 0, 0, 0)
    for entity in entities:
        truth = f"SELECT key, payload FROM truth WHERE entity = '{entity}'"
        stored = _stored_rows(entity)
        digest = "SELECT row(count(*), md5(string_agg(payload::text, '' ORDER BY key))) FROM ({}) s"
        row = conn.execute(
            f"""
            SELECT ({digest.format(truth)}) IS NOT DISTINCT FROM ({digest.format(stored)}),
                   (SELECT count(*) FROM ({truth}) t),
                   (SELECT count(*) FROM ({truth} EXCEPT {stored}) d),
                   (SELECT count(*) FROM ({stored} EXCEPT {truth}) d),
                   (SELECT count(*) - count(DISTINCT key) FROM ({stored}) s)
            """,
            {"t": tenant_id},
        ).fetchone()
        assert row is not None
        same, checked, lost, extra, duplicates = row
        total += Comparison(checked, lost, extra, duplicates, () if same else (entity,))
    return total


def compare(
    conn: psycopg.Connection,
    sandbox: SandboxProcess,
    tenant_id: str,
    account: str,
    entities: Iterable[str] = ENTITIES,
) -> Comparison:
    """The tenant's raw tables against the account's truth: counts, content checksums, and
    the records lost, extra or duplicated."""
    entities = tuple(entities)
    load_truth(conn, sandbox, account, entities)
    return compare_loaded(conn, tenant_id, entities)


def wrong_rows(conn: psycopg.Connection, tenant_id: str) -> int:
    """Stored rows that are not a truth record with the same content (loaded truth): what a
    crash may leave is fewer rows, never a wrong one."""
    return sum(
        conn.execute(
            f"SELECT count(*) FROM ({_stored_rows(entity)} EXCEPT"
            f" SELECT key, payload FROM truth WHERE entity = '{entity}') d",
            {"t": tenant_id},
        ).fetchone()[0]
        for entity in ENTITIES
    )


def partial_batches(conn: psycopg.Connection, tenant_id: str) -> list[str]:
    """Groups landed by one `land()` call (an order month, a whole other entity) whose visible
    rows are not whole batches: landing commits every BATCH_SIZE records, so a group is
    absent, a multiple of BATCH_SIZE, or complete (loaded truth)."""
    rows = conn.execute(
        f"""
        WITH groups AS (
            SELECT t.entity,
                   CASE WHEN t.entity = 'orders'
                        THEN to_char(t.created AT TIME ZONE 'UTC', 'YYYY-MM') END AS month,
                   count(*) AS expected,
                   count(*) FILTER (WHERE {_IS_STORED}) AS landed
            FROM truth t GROUP BY 1, 2
        )
        SELECT entity || coalesce(' ' || month, '') || ': ' || landed || ' of ' || expected
          FROM groups
         WHERE landed %% {BATCH_SIZE} <> 0 AND landed <> expected
        """,
        {"t": tenant_id},
    ).fetchall()
    return [text for (text,) in rows]


def cursor_gaps(conn: psycopg.Connection, tenant_id: str, slack: timedelta = timedelta()) -> int:
    """Truth records a cursor claims as synced that the warehouse lacks (loaded truth).

    An order month's cursor claims every order created before it, less `slack` (the overlap
    the next run re-reads); a customers or catalog cursor claims the whole entity.
    """
    row = conn.execute(
        f"""
        SELECT count(*) FROM truth t
          JOIN cdp.sync_state s
            ON s.tenant_id = %(t)s AND s.entity = t.entity
           AND s.scope = CASE WHEN t.entity = 'orders'
                              THEN to_char(date_trunc('month', t.created AT TIME ZONE 'UTC'),
                                           'YYYY-MM-DD')
                              ELSE '' END
         WHERE (t.entity <> 'orders' OR t.created < s.synced_through - %(slack)s)
           AND NOT {_IS_STORED}
        """,
        {"t": tenant_id, "slack": slack},
    ).fetchone()
    assert row is not None
    return row[0]


Cursors = dict[tuple[str, str], datetime]


def cursors(conn: psycopg.Connection, tenant_id: str) -> Cursors:
    rows = conn.execute(
        "SELECT entity, scope, synced_through FROM cdp.sync_state WHERE tenant_id = %s",
        (tenant_id,),
    )
    return {(entity, scope): at for entity, scope, at in rows}


def moved_back(before: Cursors, after: Cursors) -> list[str]:
    """Cursors that went backwards, or disappeared, between two snapshots."""
    return [
        f"{entity}/{scope}: {at} -> {after.get((entity, scope))}"
        for (entity, scope), at in before.items()
        if after.get((entity, scope)) is None or after[(entity, scope)] < at
    ]


def landed_rows(conn: psycopg.Connection, tenant_id: str) -> int:
    """Rows of the tenant across the raw tables (what a crash or restart trigger polls)."""
    row = conn.execute(
        "SELECT "
        + " + ".join(
            f"(SELECT count(*) FROM raw_vtex.{entity} WHERE tenant_id = %(t)s)"
            for entity in ENTITIES
        ),
        {"t": tenant_id},
    ).fetchone()
    assert row is not None
    return row[0]
