"""Orders feed v3 for one account (VTEX keeps one feed per appKey; the sandbox has one per account).

Queue semantics follow VTEX's docs: events read from the feed become invisible for
``visibilityTimeoutInSeconds`` and come back unless their handle is committed; events older than
``MessageRetentionPeriodInSeconds`` are dropped, committed or not; delivery is at least once.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdp_devkit.sandbox.vtex.generator import StatusChange, format_ticks

DEFAULT_VISIBILITY_SECONDS = 240
MIN_RETENTION_SECONDS = 345_600
MAX_RETENTION_SECONDS = 1_209_600
MAX_LOT = 10


@dataclass
class _Event:
    event_id: str
    order_id: str
    state: str
    last_state: str
    last_change: str
    current_change: str
    enqueued_at: float
    handles: list[str] = field(default_factory=list)


def _int_setting(queue: dict[str, Any], key: str, default: int) -> int:
    value = queue.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"queue.{key} must be an integer")
    return value


class OrderFeed:
    """Configuration and queue of one account's feed."""

    def __init__(self, account: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._account = account
        self._clock = clock
        self._config: dict[str, Any] | None = None
        self._statuses: frozenset[str] | None = None  # None: every status change is delivered
        self._events: dict[str, _Event] = {}  # insertion order is enqueue order
        self._visible: deque[str] = deque()
        self._hidden: list[tuple[float, int, str]] = []  # heap of (visible again at, seq, id)
        self._handles: dict[str, str] = {}
        self._counter = itertools.count()

    @property
    def configured(self) -> bool:
        return self._config is not None

    def configure(self, body: Any) -> None:
        """Create or update the feed from a ``POST /api/orders/feed/config`` body."""
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        config: dict[str, Any] = {}
        statuses: frozenset[str] | None = None
        feed_filter = body.get("filter")
        if feed_filter is not None:
            if not isinstance(feed_filter, dict):
                raise ValueError("filter must be an object")
            if feed_filter.get("type") == "FromOrders":
                raise ValueError(
                    "FromOrders (JSONata) filters are not implemented by the "
                    "sandbox; use FromWorkflow"
                )
            if feed_filter.get("type") != "FromWorkflow":
                raise ValueError("filter.type must be FromWorkflow")
            status = feed_filter.get("status", [])
            if not isinstance(status, list) or not all(isinstance(s, str) for s in status):
                raise ValueError("filter.status must be a list of strings")
            # Like VTEX, unknown status names are accepted and simply never match.
            statuses = frozenset(status)
            config["filter"] = {"type": "FromWorkflow", "status": list(status)}
        queue = body.get("queue") or {}
        if not isinstance(queue, dict):
            raise ValueError("queue must be an object")
        visibility = _int_setting(queue, "visibilityTimeoutInSeconds", DEFAULT_VISIBILITY_SECONDS)
        retention = _int_setting(queue, "MessageRetentionPeriodInSeconds", MIN_RETENTION_SECONDS)
        if visibility < 0:
            raise ValueError("queue.visibilityTimeoutInSeconds must be >= 0")
        if not MIN_RETENTION_SECONDS <= retention <= MAX_RETENTION_SECONDS:
            raise ValueError(
                f"queue.MessageRetentionPeriodInSeconds must be within "
                f"[{MIN_RETENTION_SECONDS}, {MAX_RETENTION_SECONDS}]"
            )
        config["queue"] = {
            "visibilityTimeoutInSeconds": visibility,
            "MessageRetentionPeriodInSeconds": retention,
        }
        self._config = config
        self._statuses = statuses

    def delete(self) -> None:
        """Remove the configuration and every queued event."""
        self._config = None
        self._statuses = None
        self._events.clear()
        self._visible.clear()
        self._hidden.clear()
        self._handles.clear()

    def config_document(self) -> dict[str, Any]:
        """Body of ``GET /api/orders/feed/config``; only valid when configured."""
        assert self._config is not None
        now = self._clock()
        self._expire(now)
        oldest = next(iter(self._events.values()), None)
        return {
            **self._config,
            "quantity": len(self._events),
            "approximateAgeOfOldestMessageInSeconds": round(now - oldest.enqueued_at, 3)
            if oldest
            else 0.0,
        }

    def publish(self, change: StatusChange) -> None:
        """Queue a status change if a feed exists and its filter lets the new status through."""
        if self._config is None or (
            self._statuses is not None and change.state not in self._statuses
        ):
            return
        number = next(self._counter)
        event_id = hashlib.md5(f"{self._account}:event:{number}".encode()).hexdigest().upper()
        self._events[event_id] = _Event(
            event_id=event_id,
            order_id=change.order_id,
            state=change.state,
            last_state=change.last_state,
            last_change=format_ticks(change.last_change, zulu=True),
            current_change=format_ticks(change.current_change, zulu=True),
            enqueued_at=self._clock(),
        )
        self._visible.append(event_id)

    def receive(
        self,
        maxlot: int,
        duplicate: Callable[[], bool],
        defect: Callable[[], str | None] = lambda: None,
    ) -> list[Any]:
        """Up to ``maxlot`` visible events, hidden for the visibility timeout afterwards.

        Fault injection: ``duplicate()`` is asked after each event whether to deliver it twice,
        ``defect()`` whether to add a broken delivery of it (see ``_broken``).
        """
        assert self._config is not None
        now = self._clock()
        self._expire(now)
        while self._hidden and self._hidden[0][0] <= now:
            _, _, event_id = heapq.heappop(self._hidden)
            if event_id in self._events:
                self._visible.append(event_id)
        hidden_until = now + self._config["queue"]["visibilityTimeoutInSeconds"]
        batch: list[dict[str, Any]] = []
        while self._visible and len(batch) < maxlot:
            event = self._events.get(self._visible.popleft())
            if event is None:  # committed or expired while visible
                continue
            heapq.heappush(self._hidden, (hidden_until, next(self._counter), event.event_id))
            batch.append(self._deliver(event))
            if len(batch) < maxlot and duplicate():
                batch.append(self._deliver(event))
            if len(batch) < maxlot and (kind := defect()):
                batch.append(_broken(self._deliver(event), kind))
        return batch

    def commit(self, handles: list[str]) -> None:
        """Delete the events behind these handles; unknown or stale handles are ignored."""
        for handle in handles:
            event_id = self._handles.pop(handle, None)
            event = self._events.pop(event_id, None) if event_id else None
            if event is not None:
                for other in event.handles:
                    self._handles.pop(other, None)

    def _deliver(self, event: _Event) -> dict[str, Any]:
        # A fresh receipt handle per delivery, as with SQS, which backs VTEX's feed.
        digest = hashlib.sha256(
            f"{self._account}:{event.event_id}:{next(self._counter)}".encode()
        ).digest()
        handle = base64.b64encode(b"AQEB" + digest * 3).decode()
        event.handles.append(handle)
        self._handles[handle] = event.event_id
        return {
            "eventId": event.event_id,
            "handle": handle,
            "domain": "Marketplace",
            "state": event.state,
            "lastState": event.last_state,
            "orderId": event.order_id,
            "lastChange": event.last_change,
            "currentChange": event.current_change,
        }

    def _expire(self, now: float) -> None:
        assert self._config is not None
        horizon = now - self._config["queue"]["MessageRetentionPeriodInSeconds"]
        while self._events:
            event = next(iter(self._events.values()))
            if event.enqueued_at >= horizon:
                break
            del self._events[event.event_id]
            for handle in event.handles:
                self._handles.pop(handle, None)


def _broken(delivery: dict[str, Any], kind: str) -> Any:
    """A delivery broken as ``kind`` (faults.FEED_EVENT_DEFECTS). VTEX documents at-least-once
    delivery without uniqueness (https://developers.vtex.com/docs/guides/orders-feed): a
    broken one is an extra delivery of an event the same lot also delivers intact, so the
    store's truth stays reachable."""
    if kind == "not_an_object":
        return f"{delivery['eventId']}:{delivery['orderId']}"
    broken = dict(delivery)
    if kind == "no_handle":
        del broken["handle"]
    elif kind == "null_order_id":
        broken["orderId"] = None
    else:  # integer_order_id
        broken["orderId"] = int("".join(c for c in delivery["orderId"] if c.isdigit()))
    return broken
