"""VTEX's request budget is the account's, whoever calls it: two runs on one account, each in a
process of its own and each pacing itself at the full rate, stay under the budget together (the
sandbox answers 429 past it, as VTEX does), because both draw from the account's budget in the
warehouse (`vtex/budget.py`). Both land everything.
"""

from __future__ import annotations

import pytest
from products_worker import RunWorker
from support import register
from truth import Comparison, compare

from cdp_devkit.sandbox import SandboxProcess, StoreSpec

STORE = StoreSpec("budgeted", seed=71, customers=20, orders=20, products=500)
RATE = 100  # requests per second each run paces itself at
# The account's budget in the sandbox: 120 requests a second, one second's worth at once. Each
# run alone fits; the two of them, each at its own pace, would not.
BUDGET_PER_MINUTE = 7200
TENANTS = ("budget_left", "budget_right")


@pytest.mark.timeout(400)
def test_two_runs_on_one_account_stay_under_its_budget_together(conn, instance, reliability_report):
    with SandboxProcess([STORE]) as sandbox:
        for tenant_id in TENANTS:
            register(conn, tenant_id, STORE.account)
        sandbox.set_faults({"requests_per_minute": BUDGET_PER_MINUTE})
        workers = [
            RunWorker(sandbox, tenant_id, WORKER_REQUESTS_PER_SECOND=str(RATE))
            for tenant_id in TENANTS
        ]
        for worker in workers:
            assert worker.finish(timeout=300) == 0
        account = sandbox.stats()["accounts"][STORE.account]
        comparison = sum(
            (compare(conn, sandbox, t, STORE.account, entities=("products",)) for t in TENANTS),
            Comparison(0, 0, 0, 0),
        )
    runs = [instance.get_run_record_by_id(worker.run(instance).run_id) for worker in workers]
    together = min(r.end_time for r in runs) - max(r.start_time for r in runs)
    refused = account["faults"].get("budget", 0)
    reliability_report.record(
        "rate budget: two runs on one VTEX account at once",
        faults=f"budget {BUDGET_PER_MINUTE}/min on the account, 2 runs at {RATE}/s each"
        f" ({account['total']} requests, {together:.1f} s together): {refused} refused",
        checked=comparison.checked,
        lost=comparison.lost,
        duplicates=comparison.duplicates,
        passed=comparison.exact and refused == 0,
    )
    assert together > 3, "the runs must overlap for the budget to be shared"
    assert refused == 0, account
    assert comparison.exact, comparison
