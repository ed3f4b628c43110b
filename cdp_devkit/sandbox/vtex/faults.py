"""Fault configuration and the deterministic choice of which request gets which fault.

Every ``/api`` request in a faulted route family draws once from a ``random.Random(seed)``
stream, so a given seed and request sequence reproduces the same faults. Faults only change what
goes over the wire, never the store (see the server for how each kind is delivered).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

from cdp_devkit.sandbox.vtex.hostile import RETRY_AFTER_FORMS

ROUTE_FAMILIES: frozenset[str] = frozenset(
    {"orders", "catalog", "masterdata", "feed", "collections"}
)
SERVER_ERROR_STATUSES: tuple[int, ...] = (500, 502, 503, 504)
# Kinds in the order their probability intervals are laid out on [0, 1).
FAULT_KINDS: tuple[str, ...] = ("429", "5xx", "reset", "truncate", "slow")
# What a route's 200 answer can be broken into (``malformed_envelopes``): no body at all, the
# body wrapped in an object where VTEX answers a list (or the other way round), the scroll's
# X-VTEX-MD-TOKEN header left out.
ENVELOPE_DEFECTS: tuple[str, ...] = ("empty_body", "wrong_type", "no_token_header")
# How a delivered feed event can be broken (``feed_event_defects``).
FEED_EVENT_DEFECTS: tuple[str, ...] = (
    "no_handle",
    "null_order_id",
    "integer_order_id",
    "not_an_object",
)
# How Get order fails for the ids of ``failing_orders``: 404 (VTEX serves only orders of the
# last two years), 503 on every attempt, or a 200 whose body never parses.
ORDER_FAILURES: tuple[str, ...] = ("404", "5xx", "unparseable")
# Well-formed wrong answers of List orders (``list_answer``): an empty page reporting no orders
# at all, or ``"list": null``.
LIST_ANSWERS: tuple[str, ...] = ("empty_page", "null_list")


@dataclass(frozen=True)
class FaultConfig:
    """The JSON body of ``POST /_sandbox/faults``; ``{}`` means no faults."""

    seed: int = 0
    rate_429: float = 0.0
    retry_after: int = 1
    rate_5xx: float = 0.0
    rate_reset: float = 0.0
    rate_truncate: float = 0.0
    rate_slow: float = 0.0
    slow_seconds: float = 3.0
    duplicate_pages: bool = False
    reorder_pages: bool = False
    duplicate_feed_events: bool = False
    # A scroll token expires once it has served this many pages, as if the client had idled
    # past Master Data's 20 minutes (0: only the idle expiry).
    expire_scroll_after_pages: int = 0
    # Listings that never end: stockkeepingunitids repeats its last page past the end,
    # GetProductAndSkuIds always reports one more window, a scroll starts over at its end.
    endless_listings: bool = False
    # Route name (as in the stats) -> an ENVELOPE_DEFECTS entry, applied to its every 200.
    malformed_envelopes: dict[str, str] = field(default_factory=dict)
    # Each is delivered once, as an extra, broken delivery of an event read in the same lot.
    feed_event_defects: tuple[str, ...] = ()
    # Order id -> an ORDER_FAILURES entry: how its Get order fails, on every request.
    failing_orders: dict[str, str] = field(default_factory=dict)
    # Order and product ids whose detail carries a number jsonb cannot hold (``"discount":
    # 1e-20000``): valid JSON that Postgres refuses.
    poison_documents: tuple[str, ...] = ()
    # Order ids whose Get order stamps lastChange 9999-12-31.
    future_stamp_orders: tuple[str, ...] = ()
    # Order ids whose List orders entry comes without its orderId.
    unlisted_order_ids: tuple[str, ...] = ()
    # The next ``list_answer_calls`` List orders calls answer a LIST_ANSWERS entry.
    list_answer: str = ""
    list_answer_calls: int = 1
    # List orders reports this many more orders than its pages hold, in every window.
    list_total_excess: int = 0
    # How a 429 says when to come back: a hostile.RETRY_AFTER_FORMS entry.
    retry_after_form: str = "seconds"
    # Requests an account may make per minute (VTEX: 6,000 for Get order); past it, 429.
    requests_per_minute: int = 0
    # Route name (as in the stats) -> origin its requests are redirected to (302), where the
    # capture endpoint records what it was sent.
    redirect: dict[str, str] = field(default_factory=dict)
    # Route names answered 400 with the request's headers echoed in the body.
    echo_headers: tuple[str, ...] = ()
    # Route name -> seconds between the bytes of its answers.
    drip: dict[str, float] = field(default_factory=dict)
    routes: frozenset[str] = field(default_factory=lambda: ROUTE_FAMILIES)

    def __post_init__(self) -> None:
        rates = self.rates()
        if any(not 0.0 <= rate <= 1.0 for rate in rates) or sum(rates) > 1.0 + 1e-9:
            raise ValueError("fault rates must lie in [0, 1] and sum to at most 1")
        if self.retry_after < 0 or self.slow_seconds < 0:
            raise ValueError("retry_after and slow_seconds must be >= 0")
        unknown = set(self.routes) - ROUTE_FAMILIES
        if unknown:
            raise ValueError(f"unknown route families: {sorted(unknown)}")
        if self.expire_scroll_after_pages < 0:
            raise ValueError("expire_scroll_after_pages must be >= 0")
        if self.list_answer not in ("", *LIST_ANSWERS):
            raise ValueError(f"list_answer takes {', '.join(LIST_ANSWERS)}")
        if self.list_answer_calls < 0 or self.list_total_excess < 0:
            raise ValueError("list_answer_calls and list_total_excess must be >= 0")
        for name, values, known in (
            ("malformed_envelopes", self.malformed_envelopes.values(), ENVELOPE_DEFECTS),
            ("feed_event_defects", self.feed_event_defects, FEED_EVENT_DEFECTS),
            ("failing_orders", self.failing_orders.values(), ORDER_FAILURES),
        ):
            if not set(values) <= set(known):
                raise ValueError(f"{name} takes {', '.join(known)}")
        if self.retry_after_form not in RETRY_AFTER_FORMS:
            raise ValueError(f"retry_after_form takes {', '.join(RETRY_AFTER_FORMS)}")
        if self.requests_per_minute < 0 or any(s <= 0 for s in self.drip.values()):
            raise ValueError("requests_per_minute must be >= 0 and drip intervals > 0")

    def rates(self) -> tuple[float, ...]:
        return (self.rate_429, self.rate_5xx, self.rate_reset, self.rate_truncate, self.rate_slow)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultConfig:
        """Build from JSON, rejecting unknown keys and wrong types (a typo must not mean 'off')."""
        known = {f.name: f for f in fields(cls)}
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown fault options: {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key == "routes":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError("routes must be a list of route family names")
                kwargs[key] = frozenset(value)
            elif key in (
                "duplicate_pages",
                "reorder_pages",
                "duplicate_feed_events",
                "endless_listings",
            ):
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be a boolean")
                kwargs[key] = value
            elif key in ("malformed_envelopes", "failing_orders", "redirect"):
                if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()
                ):
                    raise ValueError(f"{key} must be an object of strings")
                kwargs[key] = value
            elif key in (
                "feed_event_defects",
                "poison_documents",
                "future_stamp_orders",
                "unlisted_order_ids",
                "echo_headers",
            ):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{key} must be a list of strings")
                kwargs[key] = tuple(value)
            elif key == "drip":
                if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                    for k, v in value.items()
                ):
                    raise ValueError(f"{key} must be an object of numbers")
                kwargs[key] = {k: float(v) for k, v in value.items()}
            elif key in ("list_answer", "retry_after_form"):
                if not isinstance(value, str):
                    raise ValueError(f"{key} must be a string")
                kwargs[key] = value
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            elif key in (
                "seed",
                "retry_after",
                "expire_scroll_after_pages",
                "list_answer_calls",
                "list_total_excess",
                "requests_per_minute",
            ):
                if value != int(value):
                    raise ValueError(f"{key} must be an integer")
                kwargs[key] = int(value)
            else:
                kwargs[key] = float(value)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["routes"] = sorted(self.routes)
        data["feed_event_defects"] = list(self.feed_event_defects)
        return data


class Fault(NamedTuple):
    kind: str  # one of FAULT_KINDS
    status: int  # HTTP status for "429" / "5xx", else 200


class FaultInjector:
    """Holds the active configuration and its random stream."""

    def __init__(self, config: FaultConfig | None = None) -> None:
        self.configure(config or FaultConfig())

    def configure(self, config: FaultConfig) -> None:
        """Replace the configuration and restart the stream from its seed."""
        self.config = config
        self._random = random.Random(config.seed)
        self._feed_event_defects = list(config.feed_event_defects)
        self._list_answers_left = config.list_answer_calls if config.list_answer else 0

    def decide(self, family: str) -> Fault | None:
        """The fault (if any) for the next request of a route family."""
        config = self.config
        rates = config.rates()
        # No draw for unaffected requests: the sequence of faulted families alone decides.
        if family not in config.routes or not any(rates):
            return None
        draw = self._random.random()
        threshold = 0.0
        for kind, rate in zip(FAULT_KINDS, rates, strict=True):
            threshold += rate
            if draw < threshold:
                if kind == "429":
                    return Fault(kind, 429)
                if kind == "5xx":
                    return Fault(kind, self._random.choice(SERVER_ERROR_STATUSES))
                return Fault(kind, 200)
        return None

    def duplicated_records(self, family: str) -> int:
        """How many records of the previous page to repeat at the head of this one (0 = none)."""
        if not self.config.duplicate_pages or family not in self.config.routes:
            return 0
        return 1 + self._random.randrange(3)

    def reordered_page(self, family: str) -> bool:
        """Whether this page is served as if the list's order had changed since the previous
        page: it starts one record early, repeating the previous page's last record, and its
        own last record is served by no page unless the next one shifts too."""
        return (
            self.config.reorder_pages
            and family in self.config.routes
            and self._random.random() < 0.5
        )

    def duplicate_feed_event(self) -> bool:
        """Whether to deliver the feed event being read a second time in the same batch."""
        config = self.config
        return (
            config.duplicate_feed_events and "feed" in config.routes and self._random.random() < 0.5
        )

    def feed_event_defect(self) -> str | None:
        """The next broken delivery to add to a feed read, until each asked for was delivered."""
        if not self._feed_event_defects or "feed" not in self.config.routes:
            return None
        return self._feed_event_defects.pop(0)

    def list_answer(self) -> str | None:
        """The wrong answer due for this List orders call, until ``list_answer_calls`` were
        given."""
        if not self._list_answers_left:
            return None
        self._list_answers_left -= 1
        return self.config.list_answer
