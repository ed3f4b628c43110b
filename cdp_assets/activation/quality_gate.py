"""The CLV quality gate: a destination audience whose params set `requires_clv_quality` (a
CLV tier written to the store, an audience of high predicted value) is sent only for tenants
whose latest CLV holdout scorecard beats the naive baseline.

`analytics_python.clv_scorecard` holds one row per tenant and calibration date; only the
latest date counts. A tenant without a scorecard (no weekly holdout scored yet) does not
pass: a merchant should not target customers by a model nobody has checked on their store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

CLV_GATE_PARAM = "requires_clv_quality"


def requires_clv_quality(params: Any) -> bool:
    """Whether the audience's params ask for the gate; params of another shape (a rule written
    by hand in the table) ask for nothing here, and are refused where they are read."""
    return isinstance(params, dict) and params.get(CLV_GATE_PARAM) is True


def clv_gate_refusals(conn: psycopg.Connection, tenant_ids: Iterable[str]) -> dict[str, str]:
    """tenant -> why its CLV may not be acted on, for the tenants given that fail the gate."""
    wanted = sorted(set(tenant_ids))
    if not wanted:
        return {}
    latest = dict(
        (tenant_id, (calibration_date, beats_baseline))
        for tenant_id, calibration_date, beats_baseline in conn.execute(
            """
            SELECT DISTINCT ON (tenant_id) tenant_id, calibration_date, beats_baseline
            FROM analytics_python.clv_scorecard WHERE tenant_id = ANY(%s)
            ORDER BY tenant_id, calibration_date DESC, computed_at DESC
            """,
            (wanted,),
        )
    )
    refusals = {}
    for tenant_id in wanted:
        if tenant_id not in latest:
            refusals[tenant_id] = f"no CLV holdout scorecard for tenant {tenant_id} yet"
            continue
        calibration_date, beats_baseline = latest[tenant_id]
        if beats_baseline is not True:
            refusals[tenant_id] = (
                f"CLV does not beat the naive baseline on the holdout calibrated"
                f" {calibration_date}: values derived from it are not sent"
            )
    return refusals
