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

import os
import threading
from typing import Any, cast

import psycopg
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

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


# Sessions of one process on one budget database, at most.
SESSIONS_PER_DATABASE = 4
# How long a statement waits for one of them before failing.
SESSION_WAIT_SECONDS = 30


def application_name() -> str:
    """How this process's budget session shows in pg_stat_activity."""
    return f"cdp vtex budget (pid {os.getpid()})"


class _BudgetSessions:
    """This process's sessions on each budget database, shared by every account's budget: a
    budget takes a batch of tokens at most four times a second, so a few sessions serve all
    the accounts of a process, where one each held a session per account for the process's
    life (a drain over 41 tenants held 41, and the runs of a busy fleet ran out of
    connections). Up to SESSIONS_PER_DATABASE statements run at once, so one slow statement
    (a connect timing out, a busy row) does not hold back every account."""

    def __init__(self) -> None:
        self._pools: dict[str, QueuePool] = {}
        self._lock = threading.Lock()
        self._inherited: list[QueuePool] = []
        os.register_at_fork(after_in_child=self._forget_parents)

    def _forget_parents(self) -> None:
        # A forked child must neither use the parent's sessions nor close them (closing sends
        # the server a goodbye on the parent's socket): they are kept, unused.
        self._inherited += self._pools.values()
        self._pools = {}
        self._lock = threading.Lock()

    def _pool(self, url: str) -> QueuePool:
        with self._lock:
            if url not in self._pools:

                def session() -> Any:  # psycopg's connection, unknown to SQLAlchemy's typing
                    return connect(url, autocommit=True, application_name=application_name())

                self._pools[url] = QueuePool(
                    session,
                    pool_size=SESSIONS_PER_DATABASE,
                    max_overflow=0,
                    timeout=SESSION_WAIT_SECONDS,
                    reset_on_return=None,  # autocommit: no transaction to end
                )
            return self._pools[url]

    def execute(self, url: str, query: str, params: dict[str, object]) -> tuple:
        try:
            session = self._pool(url).connect()
        except PoolTimeout as error:
            # As a lost connection: the VTEX steps retry on those.
            raise psycopg.OperationalError(
                f"no session on the VTEX budget's database was free within {SESSION_WAIT_SECONDS} s"
            ) from error
        try:
            cursor = cast(psycopg.Connection, session.dbapi_connection).execute(query, params)
            return (cursor.fetchone() or ()) if cursor.description else ()
        except psycopg.OperationalError:
            # Not kept: the next statement connects again (the server may have restarted).
            session.invalidate()
            raise
        finally:
            session.close()


_SESSIONS = _BudgetSessions()


class SharedBudget:
    """One account's budget at `rate` requests per second, as seen by this process."""

    def __init__(self, url: str, account: str, rate: float) -> None:
        self.url, self.account, self.rate = url, account, rate

    def take(self, tokens: float) -> float:
        """Take `tokens`: the seconds to wait before spending them (0 when they were there)."""
        (wait,) = _SESSIONS.execute(
            self.url,
            _TAKE,
            {"account": self.account, "rate": self.rate, "capacity": self.rate, "take": tokens},
        )
        return float(wait)

    def pause(self, seconds: float) -> None:
        """No caller of the account takes tokens for the next `seconds` (VTEX answered 429)."""
        _SESSIONS.execute(self.url, _PAUSE, {"account": self.account, "seconds": seconds})
