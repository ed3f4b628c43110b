"""Drain a tenant's VTEX orders feed (v3) into `raw_vtex.orders`, at least once.

An event only says that an order changed: the order is re-read with Get order and landed by
the List sync's upsert and quarantine, so duplicated, out-of-order and replayed events all
converge to the same rows. An order landed with a change stamp (`lastChange`) later than the
event's `currentChange`, or equal to it and in the event's status, already holds that change
(the List sync, which reads every recent order, read it after the change) and is not read
again.

Handles go back to VTEX only after the rows are committed in
Postgres; a crash in between makes VTEX show the events again after the visibility timeout,
and landing them again changes nothing.

Event by event: a malformed event is quarantined (`raw_vtex.rejects`, entity `orders_feed`)
and committed, and the rest of its round proceeds. An event whose order cannot be read now
(404, a body that never parses, requests that keep failing) stays uncommitted, so VTEX
delivers it again, and its order is noted in `raw_vtex.orders_to_reread`; after
FEED_READ_ATTEMPTS failures its events are committed, and every drain re-reads the order by id
until it lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import psycopg

from cdp_assets.lib.rejects import Reject, record_rejects
from cdp_assets.lib.upsert import Row
from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_assets.vtex.client import (
    FEED_MAX_LOT,
    FEED_RETENTION_SECONDS,
    FEED_VISIBILITY_SECONDS,
    VtexAuthError,
    VtexClient,
    VtexError,
    VtexRequestFailed,
    naming_tenant,
)
from cdp_assets.vtex.records import MAX_KEY, InvalidRecord, order_row, parse_timestamp, reject
from cdp_assets.vtex.sync import ORDERS, Landing, land

# 1,000 events per run; a longer backlog continues on the sensor's next tick.
MAX_LOTS_PER_RUN = 100
# Events landed and committed together: 100 orders take seconds, far less than the
# visibility timeout, so handles are committed before VTEX shows their events again.
LOTS_PER_ROUND = 10
# Failed reads of an order (deliveries of its events, re-reads by id) before its events are
# committed and the order is left to the re-reads by id of the following drains.
FEED_READ_ATTEMPTS = 5
REREADS_PER_RUN = 100  # orders re-read by id per drain, the longest waiting first
FEED_REJECTS = "orders_feed"  # the entity of malformed feed events in raw_vtex.rejects


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
    orders_current: int = 0  # orders whose landed copy already held the events' change
    handles_committed: int = 0
    malformed_events: int = 0  # quarantined, and committed when they had a handle
    orders_unreadable: int = 0  # reads of an order that failed (404, unparseable, failing)
    orders_reread: int = 0  # orders re-read by id because the feed could not read them
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
            "orders_already_current": self.orders_current,
            "handles_committed": self.handles_committed,
            "feed_malformed_events": self.malformed_events,
            "orders_unreadable": self.orders_unreadable,
            "orders_reread": self.orders_reread,
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
    with naming_tenant(tenant_id):
        status = client.feed_config()
        if status is None:
            # VTEX deletes a feed that saw no event for a whole retention period. Changes made
            # meanwhile never reach the feed; the twice-daily List sync picks them up.
            settings.apply(client)
            drain.recreated = True
        elif not isinstance(status, dict):
            raise FeedError(
                f"tenant {tenant_id!r}: GET /api/orders/feed/config answered"
                f" {type(status).__name__}, not the feed's settings"
            )
        else:
            drain.queued_at_start = int(status.get("quantity") or 0)
            drain.oldest_event_age_seconds = float(
                status.get("approximateAgeOfOldestMessageInSeconds") or 0
            )
        _reread_orders(conn, client, tenant_id, run_id, drain)
        exhausted = False
        while not exhausted and drain.lots < max_lots:
            lots = min(LOTS_PER_ROUND, max_lots - drain.lots)
            deliveries, exhausted = _read_round(client, lots, drain)
            if deliveries:
                _land_round(conn, client, tenant_id, run_id, deliveries, drain)
    conn.execute(
        "UPDATE cdp.order_feeds SET last_drained_at = now(), last_events = %s WHERE tenant_id = %s",
        (drain.events, tenant_id),
    )
    conn.commit()
    drain.landing.count_requests(client)
    return drain


@dataclass(frozen=True)
class _Event:
    key: str  # the eventId, or the handle of an event without one
    handle: str
    order_id: str
    # The status the order moved to, and when: None when the event does not say (the order is
    # then read whatever was landed).
    state: str | None
    changed_at: datetime | None


@dataclass(frozen=True)
class _Malformed:
    reject: Reject
    handle: str | None  # committed when there is one, so the event stops coming back


@dataclass(frozen=True)
class _Unreadable:
    order_id: str
    reason: str
    failing: bool  # the requests kept failing (VTEX unreachable), not a 404 or a bad body


def _event(delivery: Any) -> _Event | _Malformed:
    """A delivered event, or why it cannot be used (with its raw text, for the quarantine)."""
    fields = delivery if isinstance(delivery, dict) else {}
    handle, order_id = fields.get("handle"), fields.get("orderId")
    handle = handle if isinstance(handle, str) and handle else None
    if not isinstance(delivery, dict):
        problem = "is not a JSON object"
    elif handle is None:
        problem = "has no handle"
    elif not isinstance(order_id, str) or not 0 < len(order_id) <= MAX_KEY or "\x00" in order_id:
        problem = f"has no usable orderId (got {str(order_id)[:40]!r})"
    else:
        event_id = fields.get("eventId")
        state = fields.get("state")
        return _Event(
            event_id if isinstance(event_id, str) else handle,
            handle,
            order_id,
            state if isinstance(state, str) and state else None,
            _instant(fields.get("currentChange")),
        )
    key = order_id if isinstance(order_id, str) else None
    raw = orjson.dumps(delivery).decode()
    return _Malformed(Reject(key, f"feed event {problem}", raw), handle)


def _instant(value: Any) -> datetime | None:
    try:
        return parse_timestamp(value, "currentChange")
    except InvalidRecord:
        return None


def _already_landed(conn: psycopg.Connection, tenant_id: str, events: Sequence[_Event]) -> set[str]:
    """The orders whose landed copy already holds the newest change these events announce:
    stamped after it, or at it and in its status. An order with an event that does not say
    its status or time is read."""
    newest: dict[str, tuple[datetime, str]] = {}
    unknown: set[str] = set()
    for event in events:
        if event.state is None or event.changed_at is None:
            unknown.add(event.order_id)
        elif event.order_id not in newest or event.changed_at > newest[event.order_id][0]:
            newest[event.order_id] = (event.changed_at, event.state)
    candidates = {o: change for o, change in newest.items() if o not in unknown}
    if not candidates:
        return set()
    rows = conn.execute(
        """
        SELECT o.order_id
          FROM unnest(%s::text[], %s::text[], %s::timestamptz[]) AS e (order_id, state, changed_at)
          JOIN raw_vtex.orders o ON o.tenant_id = %s AND o.order_id = e.order_id
         WHERE o.change_stamp > e.changed_at
            OR (o.change_stamp = e.changed_at
                AND coalesce(o.summary->>'status', o.payload->>'status') = e.state)
        """,
        (
            list(candidates),
            [state for _, state in candidates.values()],
            [changed_at for changed_at, _ in candidates.values()],
            tenant_id,
        ),
    )
    return {order_id for (order_id,) in rows}


def _read_round(
    client: VtexClient, lots: int, drain: FeedDrain
) -> tuple[list[_Event | _Malformed], bool]:
    """Up to `lots` reads; True as well when the feed has nothing new for now: an empty read,
    or one that only repeats this round's events (their visibility timeout ran out). Repeats
    are kept: their handles are the newest, which a queue may require for the commit."""
    deliveries: list[_Event | _Malformed] = []
    seen: set[str] = set()
    for _ in range(lots):
        lot = [_event(delivery) for delivery in client.read_feed(FEED_MAX_LOT)]
        drain.lots += 1
        deliveries.extend(lot)
        fresh = {d.key if isinstance(d, _Event) else d.reject.raw_text for d in lot} - seen
        if not fresh:
            return deliveries, True
        seen |= fresh
    return deliveries, False


def _read_order(client: VtexClient, order_id: str) -> Row | Reject | _Unreadable:
    """The order as it lands (a row, or a reject for a document that is malformed), or why it
    cannot be read now."""
    try:
        reply = client.get_order(order_id)
    except VtexAuthError:
        raise
    except VtexError as error:
        return _Unreadable(order_id, str(error), isinstance(error, VtexRequestFailed))
    if reply is None:
        return _Unreadable(order_id, "Get order answered 404", False)
    try:
        return order_row(reply.data, reply.raw)
    except InvalidRecord as error:
        return reject(error, reply.raw)


def _read_orders(
    conn: psycopg.Connection,
    client: VtexClient,
    tenant_id: str,
    run_id: str,
    order_ids: Sequence[str],
    drain: FeedDrain,
) -> tuple[list[_Unreadable], set[str]]:
    """Read and land these orders, note those that could not be read and forget those that
    could; the orders that failed, and those of them that reached FEED_READ_ATTEMPTS.
    Commits `conn`: land() commits only when no transaction is open, and any earlier query
    opened one; the handles must not reach VTEX before the rows are durable."""
    outcomes = dict(
        zip(
            order_ids,
            client.map_concurrent(lambda o: _read_order(client, o), order_ids),
            strict=True,
        )
    )
    read = {o: outcome for o, outcome in outcomes.items() if not isinstance(outcome, _Unreadable)}
    unreadable = [outcome for outcome in outcomes.values() if isinstance(outcome, _Unreadable)]
    land(conn, ORDERS, tenant_id, read.values(), run_id, drain.landing)
    conn.execute(
        "DELETE FROM raw_vtex.orders_to_reread WHERE tenant_id = %s AND order_id = ANY(%s)",
        (tenant_id, list(read)),
    )
    attempts = conn.execute(
        """
        INSERT INTO raw_vtex.orders_to_reread AS r (tenant_id, order_id, attempts, last_error)
        SELECT %s, u.order_id, 1, left(u.error, 500)
          FROM unnest(%s::text[], %s::text[]) AS u (order_id, error)
        ON CONFLICT (tenant_id, order_id) DO UPDATE
           SET attempts = r.attempts + 1, last_error = excluded.last_error,
               last_failed_at = now()
        RETURNING order_id, attempts
        """,
        (tenant_id, [u.order_id for u in unreadable], [u.reason for u in unreadable]),
    ).fetchall()
    conn.commit()
    drain.orders_unreadable += len(unreadable)
    return unreadable, {order_id for order_id, count in attempts if count >= FEED_READ_ATTEMPTS}


def _reread_orders(
    conn: psycopg.Connection, client: VtexClient, tenant_id: str, run_id: str, drain: FeedDrain
) -> None:
    """Re-read by id the orders the feed could not read, so that no change waits for a List
    sync that only re-reads recent orders."""
    order_ids = [
        order_id
        for (order_id,) in conn.execute(
            "SELECT order_id FROM raw_vtex.orders_to_reread WHERE tenant_id = %s"
            " ORDER BY last_failed_at LIMIT %s",
            (tenant_id, REREADS_PER_RUN),
        )
    ]
    if order_ids:
        _read_orders(conn, client, tenant_id, run_id, order_ids, drain)
        drain.orders_reread += len(order_ids)


def _land_round(
    conn: psycopg.Connection,
    client: VtexClient,
    tenant_id: str,
    run_id: str,
    deliveries: Sequence[_Event | _Malformed],
    drain: FeedDrain,
) -> None:
    events = [d for d in deliveries if isinstance(d, _Event)]
    malformed = [d for d in deliveries if isinstance(d, _Malformed)]
    record_rejects(conn, tenant_id, FEED_REJECTS, [m.reject for m in malformed], run_id)
    current = _already_landed(conn, tenant_id, events)
    order_ids = sorted({event.order_id for event in events} - current)
    unreadable, given_up = _read_orders(conn, client, tenant_id, run_id, order_ids, drain)
    # Events of an order not read yet come back after the visibility timeout, until the last
    # attempt; from then on the re-reads by id stand in for them.
    waiting = {u.order_id for u in unreadable} - given_up
    handles = [e.handle for e in events if e.order_id not in waiting]
    handles += [m.handle for m in malformed if m.handle is not None]
    client.commit_feed(handles)
    drain.events += len(deliveries)
    drain.duplicate_events += len(events) - len({event.key for event in events})
    drain.malformed_events += len(malformed)
    drain.orders += len(order_ids)
    drain.orders_current += len(current)
    drain.handles_committed += len(handles)
    if unreadable and len(unreadable) == len(order_ids) and all(u.failing for u in unreadable):
        # Not one order: VTEX itself. The run fails loudly; the events come back.
        raise VtexRequestFailed(
            f"Get order failed for all {len(order_ids)} orders of the feed's round"
            f" (first: {unreadable[0].reason})"
        )
