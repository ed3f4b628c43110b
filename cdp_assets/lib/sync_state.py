"""Cursors in `cdp.sync_state`: how far each tenant's entity (and scope) is synced; and in
`cdp.order_months`, how completely each order month is (VTEX's count against what landed),
with the orders left unread: what `cdp status` and the orders' check judge."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

import psycopg


def get_cursor(
    conn: psycopg.Connection, tenant_id: str, entity: str, scope: str = ""
) -> datetime | None:
    row = conn.execute(
        "SELECT synced_through FROM cdp.sync_state"
        " WHERE tenant_id = %s AND entity = %s AND scope = %s",
        (tenant_id, entity, scope),
    ).fetchone()
    return row[0] if row else None


def set_cursor(
    conn: psycopg.Connection,
    tenant_id: str,
    entity: str,
    synced_through: datetime,
    run_id: str,
    scope: str = "",
) -> None:
    """Move the cursor forward; an older value (a late re-run) never moves it back."""
    conn.execute(
        """
        INSERT INTO cdp.sync_state (tenant_id, entity, scope, synced_through, last_run_id)
        VALUES (%s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id, entity, scope) DO UPDATE
           SET synced_through = greatest(cdp.sync_state.synced_through, excluded.synced_through),
               last_run_id = excluded.last_run_id, updated_at = now()
        """,
        (tenant_id, entity, scope, synced_through, run_id),
    )


# The states of an order month (cdp.order_months, migration 0012).
RECONCILED = "reconciled"
UNRECONCILED = "unreconciled"
FAILED = "failed"
UNAVAILABLE = "unavailable"
IMPORTED = "imported"


@dataclass(frozen=True)
class OrderMonth:
    """How a sync (or an import) left one order month of a tenant."""

    state: str
    vtex_reported: int | None = None  # paging.total over the month's list windows
    accounted: int | None = None  # landed + quarantined + unread
    available_from: datetime | None = None  # VTEX's two years begin inside the month
    detail: str | None = None


def record_order_month(
    conn: psycopg.Connection, tenant_id: str, month: date, record: OrderMonth, run_id: str
) -> None:
    """In the caller's transaction. A month whose orders were imported stays `imported` while
    VTEX still does not serve it."""
    conn.execute(
        """
        INSERT INTO cdp.order_months AS m (tenant_id, month, state, vtex_reported, accounted,
                                          available_from, detail, run_id)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (tenant_id, month) DO UPDATE
           SET state = excluded.state, vtex_reported = excluded.vtex_reported,
               accounted = excluded.accounted, available_from = excluded.available_from,
               detail = excluded.detail, run_id = excluded.run_id, updated_at = now()
         WHERE NOT (m.state = 'imported' AND excluded.state = 'unavailable')
        """,
        (
            tenant_id,
            month,
            record.state,
            record.vtex_reported,
            record.accounted,
            record.available_from,
            record.detail,
            run_id,
        ),
    )


def record_imported_months(
    conn: psycopg.Connection, tenant_id: str, months: Collection[date], run_id: str
) -> None:
    """In the caller's transaction: `months`, which VTEX does not serve, hold imported orders."""
    conn.execute(
        """
        INSERT INTO cdp.order_months AS m (tenant_id, month, state, run_id)
        SELECT %s, month, 'imported', %s FROM unnest(%s::date[]) AS month
        ON CONFLICT (tenant_id, month) DO UPDATE
           SET state = 'imported', run_id = excluded.run_id, updated_at = now()
         WHERE m.state = 'unavailable'
        """,
        (tenant_id, run_id, sorted(months)),
    )


@dataclass
class OrderGaps:
    """What of a tenant's orders is not in the warehouse, by month."""

    unread: dict[date, int] = field(default_factory=dict)  # orders whose detail kept failing
    unsettled: dict[date, str] = field(default_factory=dict)  # unreconciled or failed months
    unavailable: list[date] = field(default_factory=list)  # older than VTEX serves, not imported

    @property
    def degraded(self) -> bool:
        """Orders VTEX serves are missing: unread orders, or months not reconciled."""
        return bool(self.unread or self.unsettled)

    def describe(self) -> str:
        parts = [
            f"{count} order{'s' if count != 1 else ''} unread in {month:%Y-%m}"
            for month, count in sorted(self.unread.items())
        ]
        parts += [f"{month:%Y-%m} {state}" for month, state in sorted(self.unsettled.items())]
        return "; ".join(parts)

    def describe_unavailable(self) -> str:
        months = sorted(self.unavailable)
        if not months:
            return ""
        span = f"{months[0]:%Y-%m}" + (f" to {months[-1]:%Y-%m}" if len(months) > 1 else "")
        return (
            f"{len(months)} order month{'s' if len(months) != 1 else ''} ({span}) unavailable"
            " from VTEX, which serves two years: import them with cdp tenants import-orders"
        )


def order_gaps(
    conn: psycopg.Connection, tenant_ids: Sequence[str], months: Sequence[date] | None = None
) -> dict[str, OrderGaps]:
    """Each tenant's gaps (every tenant of `tenant_ids` has an entry), in `months` only when
    given."""
    rows = conn.execute(
        """
        SELECT 'unread', tenant_id, month, count(*)::int FROM raw_vtex.unreadable_orders
         WHERE tenant_id = ANY(%(tenants)s)
           AND (%(months)s::date[] IS NULL OR month = ANY(%(months)s))
         GROUP BY tenant_id, month
        UNION ALL
        SELECT state, tenant_id, month, 0 FROM cdp.order_months
         WHERE tenant_id = ANY(%(tenants)s) AND state IN ('unreconciled', 'failed', 'unavailable')
           AND (%(months)s::date[] IS NULL OR month = ANY(%(months)s))
        """,
        {"tenants": list(tenant_ids), "months": None if months is None else list(months)},
    )
    gaps = {tenant_id: OrderGaps() for tenant_id in tenant_ids}
    for kind, tenant_id, month, count in rows:
        found = gaps[tenant_id]
        if kind == "unread":
            found.unread[month] = count
        elif kind == UNAVAILABLE:
            found.unavailable.append(month)
        else:
            found.unsettled[month] = kind
    return gaps
