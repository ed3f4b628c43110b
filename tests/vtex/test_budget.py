"""The VTEX request budgets of a process share one database session: a run draining the feeds
of 41 tenants held a session per account for its whole life, and a busy fleet's runs together
ran out of the server's connections."""

from __future__ import annotations

import threading

import psycopg

from cdp_assets.vtex.budget import SharedBudget, application_name

ACCOUNTS = [f"session{n}" for n in range(6)]


def budget_sessions(conn: psycopg.Connection) -> int:
    """This process's budget sessions on the database."""
    (count,) = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %s",
        (application_name(),),
    ).fetchone()
    return count


def test_the_budgets_of_many_accounts_share_one_session(warehouse_url, conn):
    conn.autocommit = True
    budgets = [SharedBudget(warehouse_url, account, rate=1000) for account in ACCOUNTS]
    threads = [threading.Thread(target=budget.take, args=(1,)) for budget in budgets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    budgets[0].pause(0)
    assert budget_sessions(conn) == 1
    (taken,) = conn.execute(
        "SELECT count(*) FROM cdp.vtex_request_budget WHERE account = ANY(%s)", (ACCOUNTS,)
    ).fetchone()
    assert taken == len(ACCOUNTS)
