"""The CLV holdout scorecard per tenant in the warehouse: the fit as of the churn holdout's
calibration date, scored on each customer's purchases since (`clv_scorecard.py`), written to
`analytics_python.clv_scorecard` (one row per tenant and calibration date, kept as a series),
`analytics_python.clv_scorecard_deciles` and `analytics_python.clv_scorecard_customers` (the
latest per tenant).

The fit is the one `holdout_predictions` made and recorded in `analytics_python.clv_fits` in
the same refresh: the model is fitted once per holdout, and what is scored is what the churn
bands of the holdout were computed with. A tenant without that fit is not scored, and named.

Activation reads the latest `beats_baseline` per tenant before it targets a tier or audience
derived from CLV."""

from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, date, datetime

import numpy as np
import psycopg

from cdp_assets.analytics.clv import BgNbdParams, GammaGammaParams
from cdp_assets.analytics.clv_scorecard import Accuracy, Scorecard, score_holdout
from cdp_assets.analytics.prediction_refresh import (
    HOLDOUT_SUMMARY_MODEL,
    FitInputs,
    read_fit_inputs,
)
from cdp_assets.analytics.predictions import Fit

# Purchase days and spend after the calibration date (the summary's as_of) up to the holdout's
# end, per customer of the summary; merged per day as the summary merges them.
HOLDOUT_ACTUALS_SQL = f"""
SELECT summary.customer_key, count(DISTINCT purchases.order_date),
       coalesce(sum(purchases.order_total), 0)::float8
  FROM intermediate.{HOLDOUT_SUMMARY_MODEL} summary
  LEFT JOIN intermediate.int_orders__purchases purchases
    ON purchases.tenant_id = summary.tenant_id
   AND purchases.customer_key = summary.customer_key
   AND purchases.is_purchase
   AND purchases.order_date > summary.as_of
   AND purchases.order_date <= %(holdout_end)s
 WHERE summary.tenant_id = %(tenant_id)s
 GROUP BY summary.customer_key
"""

# The newest fit on the holdout's summary as of the calibration date: this refresh's.
HOLDOUT_FIT_SQL = """
SELECT model, fallback_reason, bgnbd_r, bgnbd_alpha, bgnbd_a, bgnbd_b, gg_p, gg_q, gg_gamma
  FROM analytics_python.clv_fits
 WHERE tenant_id = %s AND as_of = %s AND summary_model = %s
 ORDER BY fitted_at DESC
 LIMIT 1
"""

_ACCURACY_COLUMNS = ("mae", "bias", "rank_correlation", "top_decile_share")


def holdout_fit(conn: psycopg.Connection, inputs: FitInputs) -> Fit | None:
    """The fit `holdout_predictions` recorded for the tenant as of the calibration date (the
    models' parameters, or none where it fell back to the heuristic, which is not scored);
    None when it has recorded none."""
    row = conn.execute(
        HOLDOUT_FIT_SQL, (inputs.tenant_id, inputs.as_of, HOLDOUT_SUMMARY_MODEL)
    ).fetchone()
    if row is None:
        return None
    model, fallback_reason, *bgnbd, p, q, gamma = row
    if fallback_reason is not None or None in (*bgnbd, p, q, gamma):
        return Fit(model, fallback_reason=fallback_reason)
    return Fit(model, BgNbdParams(*bgnbd), GammaGammaParams(p, q, gamma))


def holdout_actuals(
    conn: psycopg.Connection, inputs: FitInputs, holdout_end: date
) -> tuple[np.ndarray, np.ndarray]:
    """Each customer's purchase days and spend in the holdout, in the order of `inputs.keys`."""
    rows = conn.execute(
        HOLDOUT_ACTUALS_SQL, {"tenant_id": inputs.tenant_id, "holdout_end": holdout_end}
    ).fetchall()
    by_key = {key: (days, spend) for key, days, spend in rows}
    bought = np.array([by_key[key][0] for key in inputs.keys], dtype=np.float64)
    spent = np.array([by_key[key][1] for key in inputs.keys], dtype=np.float64)
    return bought, spent


def score_tenants(
    reader: psycopg.Connection,
    writer: psycopg.Connection,
    tenant_ids: Sequence[str],
    holdout_end: date,
) -> tuple[list[tuple[str, date, Scorecard]], list[str]]:
    """Score each tenant with customers as of its calibration date on the holdout's fit and
    record its scorecard (replacing one of the same date), committed tenant by tenant; and
    the tenants left unscored for want of that fit."""
    scored, unfitted = [], []
    for inputs in read_fit_inputs(reader, HOLDOUT_SUMMARY_MODEL, tenant_ids):
        if inputs.as_of is None:
            continue
        fitted = holdout_fit(writer, inputs)
        if fitted is None:
            unfitted.append(inputs.tenant_id)
            continue
        bought, spent = holdout_actuals(writer, inputs, holdout_end)
        days = (holdout_end - inputs.as_of).days
        card = score_holdout(
            fitted, inputs.x, inputs.t_x, inputs.T, inputs.m_x, bought, spent, days
        )
        _record(writer, inputs, card, bought, spent)
        writer.commit()
        scored.append((inputs.tenant_id, inputs.as_of, card))
    return scored, unfitted


def _accuracy_values(accuracy: Accuracy | None) -> list:
    if accuracy is None:
        return [None] * (1 + len(_ACCURACY_COLUMNS))
    return [
        accuracy.predicted_total,
        accuracy.mean_absolute_error,
        accuracy.bias,
        accuracy.rank_correlation,
        accuracy.top_decile_share,
    ]


def _record(
    conn: psycopg.Connection,
    inputs: FitInputs,
    card: Scorecard,
    bought: np.ndarray,
    spent: np.ndarray,
) -> None:
    tenant_id, calibration_date = inputs.tenant_id, inputs.as_of
    columns = ["tenant_id", "calibration_date", "holdout_days", "customers", "model"]
    columns += ["fallback_reason", "beats_baseline", "computed_at"]
    values = [tenant_id, calibration_date, card.holdout_days, card.customers, card.model]
    values += [card.fallback_reason, card.beats_baseline, datetime.now(UTC)]
    for quantity in ("purchases", "spend"):
        model = getattr(card, f"model_{quantity}")
        naive = getattr(card, f"baseline_{quantity}")
        columns += [f"actual_{quantity}", f"predicted_{quantity}", f"baseline_{quantity}"]
        values += [naive.actual_total, model and model.predicted_total, naive.predicted_total]
        columns += [f"{quantity}_{c}" for c in _ACCURACY_COLUMNS]
        values += _accuracy_values(model)[1:]
        columns += [f"baseline_{quantity}_{c}" for c in _ACCURACY_COLUMNS]
        values += _accuracy_values(naive)[1:]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
    conn.execute(
        f"INSERT INTO analytics_python.clv_scorecard ({', '.join(columns)})"
        f" VALUES ({', '.join(['%s'] * len(columns))})"
        f" ON CONFLICT (tenant_id, calibration_date) DO UPDATE SET {updates}",
        values,
    )
    conn.execute(
        "DELETE FROM analytics_python.clv_scorecard_deciles"
        " WHERE tenant_id = %s AND calibration_date = %s",
        (tenant_id, calibration_date),
    )
    with conn.cursor().copy(
        "COPY analytics_python.clv_scorecard_deciles (tenant_id, calibration_date, decile,"
        " customers, predicted_purchases, actual_purchases, baseline_purchases, predicted_spend,"
        " actual_spend, baseline_spend) FROM STDIN"
    ) as copy:
        for decile in card.deciles:
            copy.write_row((tenant_id, calibration_date, *asdict(decile).values()))
    _replace_customers(conn, inputs, card, bought, spent)


def _replace_customers(
    conn: psycopg.Connection,
    inputs: FitInputs,
    card: Scorecard,
    bought: np.ndarray,
    spent: np.ndarray,
) -> None:
    conn.execute(
        "DELETE FROM analytics_python.clv_scorecard_customers WHERE tenant_id = %s",
        (inputs.tenant_id,),
    )
    missing = [None] * len(inputs.keys)
    columns = zip(
        inputs.keys,
        bought.astype(np.int64).tolist(),
        card.predicted_purchases.tolist() if card.predicted_purchases is not None else missing,
        card.baseline_per_customer[0].tolist(),
        np.round(spent, 2).tolist(),
        card.predicted_spend.tolist() if card.predicted_spend is not None else missing,
        card.baseline_per_customer[1].tolist(),
        strict=True,
    )
    with conn.cursor().copy(
        "COPY analytics_python.clv_scorecard_customers (tenant_id, calibration_date, customer_key,"
        " actual_purchases, predicted_purchases, baseline_purchases, actual_spend,"
        " predicted_spend, baseline_spend) FROM STDIN"
    ) as copy:
        for row in columns:
            copy.write_row((inputs.tenant_id, inputs.as_of, *row))
