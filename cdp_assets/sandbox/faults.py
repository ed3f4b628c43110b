"""Fault configuration and the deterministic choice of which request gets which fault.

Every ``/api`` request in a faulted route family draws once from a ``random.Random(seed)``
stream, so a given seed and request sequence reproduces the same faults. Faults only change what
goes over the wire, never the store (see the server for how each kind is delivered).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

ROUTE_FAMILIES: frozenset[str] = frozenset(
    {"orders", "catalog", "masterdata", "feed", "collections"}
)
SERVER_ERROR_STATUSES: tuple[int, ...] = (500, 502, 503, 504)
# Kinds in the order their probability intervals are laid out on [0, 1).
FAULT_KINDS: tuple[str, ...] = ("429", "5xx", "reset", "truncate", "slow")


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
            elif key in ("duplicate_pages", "reorder_pages", "duplicate_feed_events"):
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be a boolean")
                kwargs[key] = value
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            elif key in ("seed", "retry_after"):
                if value != int(value):
                    raise ValueError(f"{key} must be an integer")
                kwargs[key] = int(value)
            else:
                kwargs[key] = float(value)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["routes"] = sorted(self.routes)
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
