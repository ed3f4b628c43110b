"""The record of privacy requests (`cdp.privacy_requests`) and of each step they took, with
its completion time: the proof a request was honoured, and where an interrupted one resumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cdp_assets.lib.redaction import redact


@dataclass(frozen=True)
class Step:
    step: str
    detail: dict[str, Any]
    started_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True)
class PrivacyRequest:
    request_id: int
    tenant_id: str
    kind: str
    given: str
    targets: dict[str, list[str]]
    status: str
    last_error: str | None
    requested_at: datetime
    completed_at: datetime | None
    steps: list[Step]


def open_request(
    conn: psycopg.Connection,
    tenant_id: str,
    kind: str,
    given: str,
    targets: dict[str, list[str]] | None = None,
) -> int:
    """A new request, running; not committed (the caller's transaction holds its first step)."""
    row = conn.execute(
        "INSERT INTO cdp.privacy_requests (tenant_id, kind, given, targets, status)"
        " VALUES (%s, %s, %s, %s, 'running') RETURNING request_id",
        (tenant_id, kind, given, Jsonb(targets or {})),
    ).fetchone()
    assert row is not None
    return row[0]


def step_done(conn: psycopg.Connection, request_id: int, step: str) -> bool:
    row = conn.execute(
        "SELECT completed_at IS NOT NULL FROM cdp.privacy_request_steps"
        " WHERE request_id = %s AND step = %s",
        (request_id, step),
    ).fetchone()
    return bool(row and row[0])


def start_step(conn: psycopg.Connection, request_id: int, step: str, position: int) -> None:
    """Committed, so the record shows a step that began and never ended."""
    conn.execute(
        "INSERT INTO cdp.privacy_request_steps (request_id, step, position) VALUES (%s, %s, %s)"
        " ON CONFLICT (request_id, step) DO NOTHING",
        (request_id, step, position),
    )
    conn.commit()


def complete_step(
    conn: psycopg.Connection, request_id: int, step: str, detail: dict[str, Any]
) -> None:
    """Not committed: it commits with the step's own work, so both happen or neither."""
    conn.execute(
        "UPDATE cdp.privacy_request_steps SET completed_at = now(), detail = %s"
        " WHERE request_id = %s AND step = %s",
        (Jsonb(detail), request_id, step),
    )


def step_detail(conn: psycopg.Connection, request_id: int, step: str) -> dict[str, Any]:
    """What the step recorded so far: its counts once completed, its progress before."""
    row = conn.execute(
        "SELECT detail FROM cdp.privacy_request_steps WHERE request_id = %s AND step = %s",
        (request_id, step),
    ).fetchone()
    return row[0] if row else {}


def record_progress(
    conn: psycopg.Connection, request_id: int, step: str, detail: dict[str, Any]
) -> None:
    """The counts of a step that stops before it completes, for its next attempt to add to.
    Not committed."""
    conn.execute(
        "UPDATE cdp.privacy_request_steps SET detail = %s WHERE request_id = %s AND step = %s",
        (Jsonb(detail), request_id, step),
    )


def record_error(conn: psycopg.Connection, request_id: int, error: Exception) -> None:
    conn.rollback()
    conn.execute(
        "UPDATE cdp.privacy_requests SET last_error = %s WHERE request_id = %s",
        (redact(f"{type(error).__name__}: {error}")[:1000], request_id),
    )
    conn.commit()


def complete_request(conn: psycopg.Connection, request_id: int) -> None:
    conn.execute(
        "UPDATE cdp.privacy_requests SET status = 'completed', completed_at = now(),"
        " last_error = NULL WHERE request_id = %s",
        (request_id,),
    )
    conn.commit()


def get_request(conn: psycopg.Connection, request_id: int) -> PrivacyRequest | None:
    with conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(
            "SELECT request_id, tenant_id, kind, given, targets, status, last_error,"
            " requested_at, completed_at FROM cdp.privacy_requests WHERE request_id = %s",
            (request_id,),
        ).fetchone()
    if row is None:
        return None
    steps = [
        Step(*step)
        for step in conn.execute(
            "SELECT step, detail, started_at, completed_at FROM cdp.privacy_request_steps"
            " WHERE request_id = %s ORDER BY position",
            (request_id,),
        )
    ]
    return PrivacyRequest(**row, steps=steps)
