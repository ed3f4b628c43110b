"""The CLV predictions in the warehouse: each tenant's purchase summary read as the fits take
it, BG/NBD + Gamma-Gamma fitted (scipy, which dbt cannot run on Postgres) or scored with a
stored fit, and the predictions written; today's and the churn holdout's.

Today's fit is stored (analytics_python.clv_fits) and reused: a tenant is fitted again on its
schedule (REFIT_AFTER_DAYS), when it has no fit or when its customers grew or shrank by
REFIT_CUSTOMER_CHANGE; every other refresh scores with the stored parameters only the
customers whose purchase summary rows it has not scored yet. A fit's parameters describe the
tenant's population, which a day's orders barely move; fitting them is most of the step's time.

Predictions also depend on the as-of day (T and the recency grow every day). Unchanged
customers stay right because the purchase summary rewrites every row of a tenant on the first
refresh of a day (macro changed_customers_scope): that refresh scores every customer with the
stored fit, as of the new day, and the day's later refreshes score the customers they changed.
Scoring is a few vectorised passes over the customers, without the optimiser's hundreds; SQL
cannot score (the expected purchases need a hypergeometric function Postgres lacks).
"""

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from operator import itemgetter

import numpy as np
import psycopg
from numpy.typing import NDArray

from cdp_assets.analytics.clv import BgNbdParams, GammaGammaParams
from cdp_assets.analytics.predictions import HORIZON_MONTHS, MODEL, Fit, Predictions, predict, score

# The purchase summaries the fits read: today's, and the churn holdout's as of its
# calibration date.
SUMMARY_MODEL = "int_customers__purchase_summary"
HOLDOUT_SUMMARY_MODEL = "int_customers__holdout_summary"
PREDICTIONS_TABLE = "analytics_python.customer_predictions"
# A stored fit serves a week of refreshes: the parameters describe how the tenant's customers
# buy and drop out, which changes over weeks, not with one day's orders.
REFIT_AFTER_DAYS = 7
# A population this much larger or smaller than the fit saw (a history imported, customers
# merged or erased) is fitted again at once.
REFIT_CUSTOMER_CHANGE = 0.25


def summary_sql(model: str, scored_in: str | None = None) -> str:
    """Some tenants' fit inputs from a purchase summary model (macro purchase_summary), tenant
    after tenant and in a fixed order within each: floating-point sums depend on it, and the
    same data must give the same fit. One query for every tenant of a run: one per tenant
    would scan the whole summary each time.

    `scored_in`: only the rows that table holds no prediction of, from the same build of the
    row (its built_at): the customers that changed since they were scored. Compared key and
    build by key and build, not against a high-water mark, so a build that committed late is
    never skipped."""
    unscored = (
        ""
        if scored_in is None
        else f"""
   AND NOT EXISTS (SELECT FROM {scored_in} AS scored
                    WHERE scored.tenant_id = summary.tenant_id
                      AND scored.customer_key = summary.customer_key
                      AND scored.summary_built_at = summary.built_at)"""
    )
    return f"""
SELECT tenant_id, customer_key, frequency_x, recency_t_x_days, age_t_days,
       mean_repeat_spend::float8, (revenue / nullif(purchase_days, 0))::float8, as_of, built_at
  FROM intermediate.{model} AS summary
 WHERE tenant_id = ANY(%s){unscored}
 ORDER BY tenant_id COLLATE "C", customer_key COLLATE "C"
"""


@dataclass
class FitInputs:
    """One tenant's customers as the models take them (days; spend in currency units)."""

    tenant_id: str
    as_of: date | None  # None: the tenant has no customers
    keys: list[str]
    x: NDArray[np.float64]
    t_x: NDArray[np.float64]
    T: NDArray[np.float64]
    m_x: NDArray[np.float64]
    spend_per_day: NDArray[np.float64]
    built_at: list[datetime]  # each summary row's build, recorded with its prediction


def read_fit_inputs(
    conn: psycopg.Connection,
    model: str,
    tenant_ids: Sequence[str],
    scored_in: str | None = None,
) -> Iterator[FitInputs]:
    """Each of `tenant_ids` in turn (in code point order), streamed from one query: one
    tenant's rows in memory at a time. A tenant without rows comes with none. `scored_in`:
    only the rows it has not scored (summary_sql)."""
    with conn.cursor(name=f"fit_inputs_{model}", binary=True) as cursor:
        cursor.itersize = 10_000
        cursor.execute(summary_sql(model, scored_in), (list(tenant_ids),))
        groups = itertools.groupby(cursor, key=itemgetter(0))
        group = next(groups, None)
        for tenant_id in sorted(tenant_ids):
            rows: list[tuple] = []
            if group is not None and group[0] == tenant_id:
                rows = list(group[1])
                group = next(groups, None)
            yield _fit_inputs(tenant_id, rows)


def _fit_inputs(tenant_id: str, rows: list[tuple]) -> FitInputs:
    _, keys, *numbers, as_of, built_at = zip(*rows, strict=True) if rows else ((),) * 9
    # NULL (None, then NaN) counts as 0.
    x, t_x, T, m_x, spend = (np.nan_to_num(np.array(c, dtype=float)) for c in numbers)
    return FitInputs(
        tenant_id, as_of[0] if rows else None, list(keys), x, t_x, T, m_x, spend, list(built_at)
    )


@dataclass
class Refreshed:
    """One tenant's predictions step: its customers, those it scored, their predictions, and
    why it fitted the models (None: it scored with the stored fit)."""

    tenant_id: str
    customers: int
    scored: int
    result: Predictions
    fitted: str | None
    fit_as_of: date | None


def fit_and_replace(
    reader: psycopg.Connection,
    writer: psycopg.Connection,
    summary_model: str,
    table: str,
    tenant_ids: Sequence[str],
    record_fits: bool,
) -> list[Refreshed]:
    """Fit each tenant of `tenant_ids` on `summary_model` (read on `reader`) and replace its
    rows of `table` (on `writer`); returns what was done, in tenant order. Committed tenant
    by tenant: a failure later in a long run keeps the tenants done."""
    return [
        _fit_tenant(writer, summary_model, table, inputs, record_fits, "fitted on every run")
        for inputs in read_fit_inputs(reader, summary_model, tenant_ids)
    ]


def _fit_tenant(
    writer: psycopg.Connection,
    summary_model: str,
    table: str,
    inputs: FitInputs,
    record_fits: bool,
    reason: str,
) -> Refreshed:
    result = predict(inputs.x, inputs.t_x, inputs.T, inputs.m_x, inputs.spend_per_day)
    _write_predictions(writer, table, inputs, result, whole=True)
    if inputs.keys and record_fits:
        repeaters = int((inputs.x > 0).sum())
        _record_fit(writer, summary_model, inputs, repeaters, result)
    writer.commit()
    customers = len(inputs.keys)
    return Refreshed(inputs.tenant_id, customers, customers, result, reason, inputs.as_of)


@dataclass(frozen=True)
class StoredFit:
    as_of: date
    customers: int
    fit: Fit


@dataclass(frozen=True)
class TenantState:
    """A tenant's latest stored fit (None: none usable) and its summary now."""

    stored: StoredFit | None
    customers: int
    as_of: date | None


# The tenants' latest fits on today's summary (the holdout's are made on another) and their
# customers now; the count reads the summary's key index, not its rows.
TENANT_STATES_SQL = f"""
SELECT tenants.tenant_id, fit.as_of, fit.customers, fit.model, fit.fallback_reason,
       fit.bgnbd_r, fit.bgnbd_alpha, fit.bgnbd_a, fit.bgnbd_b, fit.gg_p, fit.gg_q, fit.gg_gamma,
       fit.heuristic_gap_days,
       (SELECT count(*) FROM intermediate.{SUMMARY_MODEL} AS summary
         WHERE summary.tenant_id = tenants.tenant_id),
       (SELECT as_of FROM intermediate.{SUMMARY_MODEL} AS summary
         WHERE summary.tenant_id = tenants.tenant_id LIMIT 1)
  FROM unnest(%s::text[]) AS tenants (tenant_id)
  LEFT JOIN LATERAL (
      SELECT * FROM analytics_python.clv_fits AS fits
       WHERE fits.tenant_id = tenants.tenant_id AND fits.summary_model = %s
       ORDER BY fits.fitted_at DESC LIMIT 1
  ) AS fit ON true
"""


def tenant_states(conn: psycopg.Connection, tenant_ids: Sequence[str]) -> dict[str, TenantState]:
    rows = conn.execute(TENANT_STATES_SQL, (list(tenant_ids), SUMMARY_MODEL)).fetchall()
    states = {}
    for tenant_id, fit_as_of, fit_customers, model, reason, *params, gap, count, as_of in rows:
        stored = None
        if fit_as_of is not None:
            fit = _stored_fit(model, reason, params, gap)
            stored = StoredFit(fit_as_of, fit_customers, fit) if fit is not None else None
        states[tenant_id] = TenantState(stored, count, as_of)
    return states


def _stored_fit(
    model: str, reason: str | None, params: list[float | None], gap: float | None
) -> Fit | None:
    """The fit a clv_fits row records, or None when it lacks what scoring needs."""
    if model == MODEL:
        known = [value for value in params if value is not None]
        if len(known) < len(params):
            return None
        r, alpha, a, b, p, q, gamma = known
        return Fit(model, BgNbdParams(r, alpha, a, b), GammaGammaParams(p, q, gamma))
    return None if gap is None else Fit(model, heuristic_gap_days=gap, fallback_reason=reason)


def refit_reason(state: TenantState, refit_after_days: int) -> str | None:
    """Why the tenant's models are fitted again in this run, or None: scored with its fit."""
    stored = state.stored
    if stored is None:
        return "no stored fit"
    if state.as_of is not None:
        age = (state.as_of - stored.as_of).days
        if not 0 <= age < refit_after_days:
            return f"the stored fit is as of {stored.as_of}, {age} days from the summary's"
    change = abs(state.customers - stored.customers)
    if change > REFIT_CUSTOMER_CHANGE * stored.customers:
        return f"{state.customers} customers, {stored.customers} at the stored fit"
    return None


def refresh_predictions(
    reader: psycopg.Connection,
    writer: psycopg.Connection,
    tenant_ids: Sequence[str],
    refit_after_days: int = REFIT_AFTER_DAYS,
    refit: bool = False,
) -> list[Refreshed]:
    """Today's predictions of each tenant of `tenant_ids`: fitted again and every customer
    replaced where `refit_reason` says so (or `refit`), otherwise its changed customers
    scored with its stored fit and written over their old rows. Returns what was done, in
    tenant order; committed tenant by tenant."""
    # The counts and the rows in one snapshot: a summary build committing in between must not
    # make the rows read look like every customer of the tenant.
    reader.rollback()
    reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    states = tenant_states(reader, tenant_ids)
    reasons = {
        tenant_id: "asked for by the run" if refit else refit_reason(state, refit_after_days)
        for tenant_id, state in states.items()
    }
    # A tenant without customers goes the fit's way: its rows are deleted, nothing is fitted.
    to_fit = [t for t in sorted(tenant_ids) if reasons[t] or not states[t].customers]
    to_score = [t for t in sorted(tenant_ids) if t not in to_fit]
    done = [
        _fit_tenant(
            writer,
            SUMMARY_MODEL,
            PREDICTIONS_TABLE,
            inputs,
            True,
            reasons[inputs.tenant_id] or "no customers",
        )
        for inputs in read_fit_inputs(reader, SUMMARY_MODEL, to_fit)
    ]
    for inputs in read_fit_inputs(reader, SUMMARY_MODEL, to_score, scored_in=PREDICTIONS_TABLE):
        state = states[inputs.tenant_id]
        assert state.stored is not None  # refit_reason sent the others to the fit
        result = score(
            state.stored.fit, inputs.x, inputs.t_x, inputs.T, inputs.m_x, inputs.spend_per_day
        )
        whole = len(inputs.keys) == state.customers
        _write_predictions(writer, PREDICTIONS_TABLE, inputs, result, whole)
        writer.commit()
        done.append(
            Refreshed(
                inputs.tenant_id,
                state.customers,
                len(inputs.keys),
                result,
                None,
                state.stored.as_of,
            )
        )
    return sorted(done, key=lambda refreshed: refreshed.tenant_id)


def _write_predictions(
    conn: psycopg.Connection, table: str, inputs: FitInputs, result: Predictions, whole: bool
) -> None:
    """The rows of `inputs` written over the tenant's old ones: `whole`, every row of the
    tenant replaced; otherwise those of the same customers, and those of customers no longer
    in the summary (merged into another, every purchase canceled, erased) deleted."""
    if whole:
        conn.execute(f"DELETE FROM {table} WHERE tenant_id = %s", (inputs.tenant_id,))
    else:
        conn.execute(
            f"""
            DELETE FROM {table} AS scored
             WHERE scored.tenant_id = %(tenant_id)s
               AND (scored.customer_key = ANY(%(keys)s)
                    OR NOT EXISTS (SELECT FROM intermediate.{SUMMARY_MODEL} AS summary
                                    WHERE summary.tenant_id = scored.tenant_id
                                      AND summary.customer_key = scored.customer_key))
            """,
            {"tenant_id": inputs.tenant_id, "keys": inputs.keys},
        )
    if inputs.keys:
        _copy_predictions(conn, table, inputs, result)


def _copy_predictions(
    conn: psycopg.Connection, table: str, inputs: FitInputs, result: Predictions
) -> None:
    columns_sql = (
        "tenant_id, customer_key, as_of, frequency_x, recency_t_x_days, age_t_days,"
        " mean_repeat_spend, p_alive, p_no_purchase_90d, expected_purchases_1y,"
        " expected_purchases_3y, expected_purchases_5y, clv_1y, clv_3y, clv_5y, model,"
        " summary_built_at"
    )
    purchases, value = result.expected_purchases, result.clv
    # Whole columns to Python values at once (tolist runs in C), not numpy indexing per
    # value; money rounded to cents the same way, for the numeric(18, 2) columns.
    whole_days = [a.astype(np.int64).tolist() for a in (inputs.x, inputs.t_x, inputs.T)]
    fractions = [result.p_alive, result.p_no_purchase_90d, *(purchases[m] for m in HORIZON_MONTHS)]
    money = [inputs.m_x, *(value[m] for m in HORIZON_MONTHS)]
    columns = zip(
        inputs.keys,
        *whole_days,
        *(a.tolist() for a in fractions),
        *(np.round(a, 2).tolist() for a in money),
        inputs.built_at,
        strict=True,
    )
    tenant_id, as_of, model = inputs.tenant_id, inputs.as_of, result.model
    with conn.cursor().copy(f"COPY {table} ({columns_sql}) FROM STDIN") as copy:
        for key, x_i, t_x_i, T_i, *estimates, spend, clv_1y, clv_3y, clv_5y, built_at in columns:
            copy.write_row(
                (tenant_id, key, as_of, x_i, t_x_i, T_i, spend, *estimates)
                + (clv_1y, clv_3y, clv_5y, model, built_at)
            )


def _record_fit(
    conn: psycopg.Connection,
    summary_model: str,
    inputs: FitInputs,
    repeaters: int,
    result: Predictions,
) -> None:
    fit = result.fit
    bg, gg = fit.bgnbd, fit.gamma_gamma
    conn.execute(
        """
        INSERT INTO analytics_python.clv_fits (tenant_id, as_of, model, fallback_reason,
            customers, repeaters, bgnbd_r, bgnbd_alpha, bgnbd_a, bgnbd_b, bgnbd_log_likelihood,
            gg_p, gg_q, gg_gamma, gg_log_likelihood, heuristic_gap_days, summary_model)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            inputs.tenant_id,
            inputs.as_of,
            fit.model,
            fit.fallback_reason,
            len(inputs.keys),
            repeaters,
            bg and bg.r,
            bg and bg.alpha,
            bg and bg.a,
            bg and bg.b,
            result.bgnbd.log_likelihood if result.bgnbd else None,
            gg and gg.p,
            gg and gg.q,
            gg and gg.gamma,
            result.gamma_gamma.log_likelihood if result.gamma_gamma else None,
            fit.heuristic_gap_days,
            summary_model,
        ),
    )
