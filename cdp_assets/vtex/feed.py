"""Drain a tenant's VTEX orders feed (v3) into `raw_vtex.orders`, at least once.

An event only says that an order changed: the order is re-read with Get order and landed by
the List sync's upsert and quarantine, so duplicated, out-of-order and replayed events all
converge to the same rows. Handles go back to VTEX only after the rows are committed in
Postgres; a crash in between makes VTEX show the events again after the visibility timeout,
and landing them again changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_assets.vtex.client import (
    FEED_MAX_LOT,
    FEED_RETENTION_SECONDS,
    FEED_VISIBILITY_SECONDS,
    VtexClient,
)
from cdp_assets.vtex.records import order_row
from cdp_assets.vtex.sync import ORDERS, Landing, _detail, land

# 1,000 events per run; a longer backlog continues on the sensor's next tick.
MAX_LOTS_PER_RUN = 100
# Events landed and committed together: 100 orders take seconds, far less than the
# visibility timeout, so handles are committed before VTEX shows their events again.
LOTS_PER_ROUND = 10


class FeedError(RuntimeError):
    """A drain that cannot start, with a message for the operator."""


@dataclass(frozen=True)
class FeedSettings:
    """How the feed is configured on VTEX; `statuses` None delivers every status change."""

    statuses: tuple[str, ...] | None = None
    visibility_timeout_seconds: int = FEED_VISIBILITY_SECONDS
    retention_seconds: int = FEED_RETENTION_SECONDS

    def apply(self, client: VtexClient) -> None:
        client.configure_feed(
            self.statuses,
            visibility_timeout_seconds=self.visibility_timeout_seconds,
            retention_seconds=self.retention_seconds,
        )


@dataclass(frozen=True)
class FeedState:
    """An active tenant whose feed is on, and what its last drain found."""

    tenant: Tenant
    last_drained_at: datetime | None
    last_events: int | None


@dataclass
class FeedDrain:
    """What one drain did, for materialization metadata."""

    landing: Landing = field(default_factory=Landing)
    lots: int = 0
    events: int = 0
    duplicate_events: int = 0  # deliveries of an event already delivered in the same round
    orders: int = 0  # Get order calls: distinct orders per round
    handles_committed: int = 0
    recreated: bool = False
    queued_at_start: int = 0
    oldest_event_age_seconds: float = 0.0

    @property
    def landed(self) -> int:
        counts = self.landing.counts
        return counts.inserted + counts.updated + counts.unchanged

    def metadata(self) -> dict[str, float | int | bool]:
        return {
            **self.landing.metadata(),
            "feed_lots": self.lots,
            "feed_events": self.events,
            "feed_duplicate_events": self.duplicate_events,
            "orders_fetched": self.orders,
            "handles_committed": self.handles_committed,
            "feed_recreated": self.recreated,
            "feed_queued_at_start": self.queued_at_start,
            "feed_oldest_event_age_seconds": self.oldest_event_age_seconds,
        }


def feed_settings(conn: psycopg.Connection, tenant_id: str) -> FeedSettings | None:
    """The tenant's feed settings when its feed is on, else None."""
    row = conn.execute(
        "SELECT statuses, visibility_timeout_seconds, retention_seconds FROM cdp.order_feeds"
        " WHERE tenant_id = %s AND enabled",
        (tenant_id,),
    ).fetchone()
    if row is None:
        return None
    statuses, visibility, retention = row
    return FeedSettings(None if statuses is None else tuple(statuses), visibility, retention)


def turn_feed_on(
    conn: psycopg.Connection, client: VtexClient, tenant_id: str, settings: FeedSettings
) -> None:
    """Configure the feed on VTEX, then record it as on (VTEX first: a feed recorded as on
    but missing on VTEX would only be recreated by the next drain)."""
    settings.apply(client)
    conn.execute(
        """
        INSERT INTO cdp.order_feeds
            (tenant_id, enabled, statuses, visibility_timeout_seconds, retention_seconds)
        VALUES (%s, true, %s, %s, %s)
        ON CONFLICT (tenant_id) DO UPDATE SET
            enabled = true, statuses = excluded.statuses,
            visibility_timeout_seconds = excluded.visibility_timeout_seconds,
            retention_seconds = excluded.retention_seconds, updated_at = now()
        """,
        (
            tenant_id,
            None if settings.statuses is None else list(settings.statuses),
            settings.visibility_timeout_seconds,
            settings.retention_seconds,
        ),
    )
    conn.commit()


def turn_feed_off(conn: psycopg.Connection, client: VtexClient, tenant_id: str) -> bool:
    """Stop draining, then delete the feed on VTEX so no queue of ours keeps filling; returns
    whether VTEX had one."""
    conn.execute(
        "UPDATE cdp.order_feeds SET enabled = false, updated_at = now() WHERE tenant_id = %s",
        (tenant_id,),
    )
    conn.commit()
    return client.delete_feed()


def enabled_feeds(conn: psycopg.Connection) -> list[FeedState]:
    """Active tenants whose feed is on, in priority order."""
    rows = conn.execute(
        "SELECT tenant_id, last_drained_at, last_events FROM cdp.order_feeds WHERE enabled"
    ).fetchall()
    state = {tenant_id: (drained, events) for tenant_id, drained, events in rows}
    return [
        FeedState(tenant, *state[tenant.tenant_id])
        for tenant in list_tenants(conn, active_only=True)
        if tenant.tenant_id in state
    ]


def drain_feed(
    conn: psycopg.Connection,
    client: VtexClient,
    tenant_id: str,
    run_id: str,
    *,
    max_lots: int = MAX_LOTS_PER_RUN,
) -> FeedDrain:
    """Read the feed until it is empty (or `max_lots` reads), landing the changed orders and
    committing their handles round by round. Commits `conn`."""
    settings = feed_settings(conn, tenant_id)
    if settings is None:
        raise FeedError(
            f"the orders feed of tenant {tenant_id!r} is off;"
            f" turn it on with `cdp tenants feed {tenant_id} --on`"
        )
    drain = FeedDrain()
    status = client.feed_config()
    if status is None:
        # VTEX deletes a feed that saw no event for a whole retention period. Changes made
        # meanwhile never reach the feed; the twice-daily List sync picks them up.
        settings.apply(client)
        drain.recreated = True
    else:
        drain.queued_at_start = int(status.get("quantity") or 0)
        drain.oldest_event_age_seconds = float(
            status.get("approximateAgeOfOldestMessageInSeconds") or 0
        )
    exhausted = False
    while not exhausted and drain.lots < max_lots:
        events, exhausted = _read_round(client, min(LOTS_PER_ROUND, max_lots - drain.lots), drain)
        if events:
            _land_round(conn, client, tenant_id, run_id, events, drain)
    conn.execute(
        "UPDATE cdp.order_feeds SET last_drained_at = now(), last_events = %s WHERE tenant_id = %s",
        (drain.events, tenant_id),
    )
    conn.commit()
    drain.landing.count_requests(client)
    return drain


def _read_round(
    client: VtexClient, lots: int, drain: FeedDrain
) -> tuple[list[dict[str, Any]], bool]:
    """Up to `lots` reads; True as well when the feed has nothing new for now: an empty read,
    or one that only repeats this round's events (their visibility timeout ran out). Repeats
    are kept: their handles are the newest, which a queue may require for the commit."""
    events: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(lots):
        lot = client.read_feed(FEED_MAX_LOT)
        drain.lots += 1
        events.extend(lot)
        fresh = {event["eventId"] for event in lot} - seen
        if not fresh:
            return events, True
        seen |= fresh
    return events, False


def _land_round(
    conn: psycopg.Connection,
    client: VtexClient,
    tenant_id: str,
    run_id: str,
    events: Sequence[dict[str, Any]],
    drain: FeedDrain,
) -> None:
    order_ids = sorted({event["orderId"] for event in events})
    details = client.map_concurrent(
        lambda order_id: _detail(client.get_order, order_id, lambda r: order_row(r.data, r.raw)),
        order_ids,
    )
    land(conn, ORDERS, tenant_id, details, run_id, drain.landing)
    # land() commits each batch only when no transaction is open; any earlier query on
    # `conn` opened one and turned those batches into savepoints. The handles must not reach
    # VTEX before the rows are durable, so commit explicitly.
    conn.commit()
    handles = [event["handle"] for event in events]
    client.commit_feed(handles)
    drain.events += len(events)
    drain.duplicate_events += len(events) - len({event["eventId"] for event in events})
    drain.orders += len(order_ids)
    drain.handles_committed += len(handles)
