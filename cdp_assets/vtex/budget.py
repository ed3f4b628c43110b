"""A VTEX account's request budget, shared by every process and host that calls the account.

VTEX limits requests per account (6,000 a minute for Get order), whoever sends them: two runs
on one account, each pacing itself at the full rate, would together send twice the budget, and
VTEX's 429s then also slow the merchant's own Admin. So the budget is a row of
`cdp.vtex_request_budget` (migration 0014): a token bucket refilling at the callers' rate, from
which each process takes a batch of tokens per round trip (a quarter second of requests: four
statements a second per account at 80 requests/s, whatever the number of processes), and a
pause that every caller honours once VTEX answered 429.
"""

from __future__ import annotations

import threading

import psycopg

from cdp_assets.lib.database import connect

# One statement: take `take` tokens after refilling for the time elapsed since the last taker;
# the bucket goes below zero when more was taken than it held, and the taker waits until its
# share has refilled (or the pause ends, whichever is later).
_TAKE = """
INSERT INTO cdp.vtex_request_budget AS b (account, tokens, updated_at)
VALUES (%(account)s, %(capacity)s - %(take)s, clock_timestamp())
ON CONFLICT (account) DO UPDATE SET
    tokens = least(
        %(capacity)s,
        b.tokens + %(rate)s * extract(epoch FROM clock_timestamp() - b.updated_at)
    ) - %(take)s,
    updated_at = clock_timestamp()
RETURNING greatest(
    -b.tokens / %(rate)s,
    extract(epoch FROM b.paused_until - clock_timestamp()),
    0
)
"""
_PAUSE = """
INSERT INTO cdp.vtex_request_budget AS b (account, tokens, updated_at, paused_until)
VALUES (%(account)s, 0, clock_timestamp(), clock_timestamp() + make_interval(secs => %(seconds)s))
ON CONFLICT (account) DO UPDATE SET
    paused_until = greatest(b.paused_until, excluded.paused_until)
"""


class SharedBudget:
    """One account's budget at `rate` requests per second, as seen by this process."""

    def __init__(self, url: str, account: str, rate: float) -> None:
        self.url, self.account, self.rate = url, account, rate
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def take(self, tokens: float) -> float:
        """Take `tokens`: the seconds to wait before spending them (0 when they were there)."""
        (wait,) = self._execute(
            _TAKE,
            {"account": self.account, "rate": self.rate, "capacity": self.rate, "take": tokens},
        )
        return float(wait)

    def pause(self, seconds: float) -> None:
        """No caller of the account takes tokens for the next `seconds` (VTEX answered 429)."""
        self._execute(_PAUSE, {"account": self.account, "seconds": seconds})

    def _execute(self, query: str, params: dict[str, object]) -> tuple:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self.url, autocommit=True)
                cursor = self._conn.execute(query, params)
                return (cursor.fetchone() or ()) if cursor.description else ()
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None  # connect again next time: the server may have restarted
                raise
