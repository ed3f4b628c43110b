"""The VTEX request budgets of a process share a few database sessions: a run draining the feeds
of 41 tenants held a session per account for its whole life, and a busy fleet's runs together
ran out of the server's connections."""

from __future__ import annotations

import threading

import psycopg

from cdp_assets.vtex.budget import SESSIONS_PER_DATABASE, SharedBudget, application_name

ACCOUNTS = [f"session{n}" for n in range(3 * SESSIONS_PER_DATABASE)]


def budget_sessions(conn: psycopg.Connection) -> int:
    """This process's budget sessions on the database."""
    (count,) = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %s",
        (application_name(),),
    ).fetchone()
    return count


def test_the_budgets_of_many_accounts_share_a_few_sessions(warehouse_url, conn):
    conn.autocommit = True
    budgets = [SharedBudget(warehouse_url, account, rate=1000) for account in ACCOUNTS]
    threads = [threading.Thread(target=budget.take, args=(1,)) for budget in budgets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    budgets[0].pause(0)
    assert 1 <= budget_sessions(conn) <= SESSIONS_PER_DATABASE
    (taken,) = conn.execute(
        "SELECT count(*) FROM cdp.vtex_request_budget WHERE account = ANY(%s)", (ACCOUNTS,)
    ).fetchone()
    assert taken == len(ACCOUNTS)


def test_an_account_waiting_on_its_budget_holds_back_no_other(warehouse_url, conn):
    first, second = (SharedBudget(warehouse_url, account, rate=1000) for account in ACCOUNTS[:2])
    first.take(1)
    second.take(1)
    with psycopg.connect(warehouse_url) as holder:
        # Another process busy on the first account's row: its next take waits for it.
        holder.execute(
            "SELECT 1 FROM cdp.vtex_request_budget WHERE account = %s FOR UPDATE", (ACCOUNTS[0],)
        )
        waiting = threading.Thread(target=first.take, args=(1,))
        waiting.start()
        other = threading.Thread(target=second.take, args=(1,))
        other.start()
        other.join(timeout=20)
        assert not other.is_alive(), "a take on another account waited for the busy row"
        assert waiting.is_alive()
        holder.commit()
    waiting.join(timeout=20)
    assert not waiting.is_alive()
