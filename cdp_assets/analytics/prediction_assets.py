"""The Python step between the dbt models: BG/NBD + Gamma-Gamma fits per tenant (scipy,
which dbt cannot run on Postgres), today's and the churn holdout's."""

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from operator import itemgetter

import dagster as dg
import numpy as np
import psycopg
from dagster_dbt import get_asset_key_for_model
from numpy.typing import NDArray

from cdp_assets.analytics.assets import (
    HOLDOUT_SUMMARY_MODEL,
    dbt_holdout_summary,
    dbt_tenant_models,
    run_tenants,
)
from cdp_assets.analytics.automation import ANALYTICS_AUTOMATION
from cdp_assets.analytics.predictions import HORIZON_MONTHS, Predictions, predict
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants

SUMMARY_MODEL = "int_customers__purchase_summary"


def summary_sql(model: str) -> str:
    """Some tenants' fit inputs from a purchase summary model (macro purchase_summary), tenant
    after tenant and in a fixed order within each: floating-point sums depend on it, and the
    same data must give the same fit. One query for every tenant of a run: one per tenant
    scanned the whole summary each time (41 tenants: 1.1 s of the server's time)."""
    return f"""
SELECT tenant_id, customer_key, frequency_x, recency_t_x_days, age_t_days,
       mean_repeat_spend::float8, (revenue / nullif(purchase_days, 0))::float8, as_of
  FROM intermediate.{model}
 WHERE tenant_id = ANY(%s)
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


def read_fit_inputs(
    conn: psycopg.Connection, model: str, tenant_ids: Sequence[str]
) -> Iterator[FitInputs]:
    """Each of `tenant_ids` in turn (in code point order), streamed from one query: one
    tenant's rows in memory at a time. A tenant without rows comes with none."""
    with conn.cursor(name=f"fit_inputs_{model}", binary=True) as cursor:
        cursor.itersize = 10_000
        cursor.execute(summary_sql(model), (list(tenant_ids),))
        groups = itertools.groupby(cursor, key=itemgetter(0))
        group = next(groups, None)
        for tenant_id in sorted(tenant_ids):
            rows: list[tuple] = []
            if group is not None and group[0] == tenant_id:
                rows = list(group[1])
                group = next(groups, None)
            yield _fit_inputs(tenant_id, rows)


def _fit_inputs(tenant_id: str, rows: list[tuple]) -> FitInputs:
    _, keys, *numbers, as_of = zip(*rows, strict=True) if rows else ((),) * 8
    # NULL (None, then NaN) counts as 0.
    x, t_x, T, m_x, spend = (np.nan_to_num(np.array(c, dtype=float)) for c in numbers)
    return FitInputs(tenant_id, as_of[0] if rows else None, list(keys), x, t_x, T, m_x, spend)


def _predictions_asset(
    name: str,
    summary: tuple[dg.AssetsDefinition, str],
    automation_condition: dg.AutomationCondition | None,
    record_fits: bool,
    description: str,
) -> dg.AssetsDefinition:
    """A tenant-partitioned asset fitting every tenant of its run on the model `summary`
    (the dbt assets building it, its name) and replacing the tenant's rows of
    `analytics_python.<name>`."""
    summary_assets, summary_model = summary
    table = f"analytics_python.{name}"

    @dg.asset(
        name=name,
        description=description,
        partitions_def=tenants,
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=[get_asset_key_for_model([summary_assets], summary_model)],
        group_name="marts",
        kinds={"python", "scipy", "postgres"},
        automation_condition=automation_condition,
        metadata={"dagster/table_name": table},
    )
    def fit(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        with warehouse.connect() as reader, warehouse.connect() as writer:
            fitted = fit_and_replace(
                reader, writer, summary_model, table, run_tenants(context), record_fits
            )
        if len(fitted) == 1:
            _, customers, result = fitted[0]
            return dg.MaterializeResult(metadata=_metadata(result, customers))
        # A run over several tenants records this on each of them: a table, not numbers.
        return dg.MaterializeResult(
            metadata={
                "tenants_in_run": len(fitted),
                "tenants": dg.MetadataValue.md(_fits_table(fitted)),
            }
        )

    return fit


customer_predictions = _predictions_asset(
    "customer_predictions",
    (dbt_tenant_models, SUMMARY_MODEL),
    ANALYTICS_AUTOMATION,
    record_fits=True,
    description="""P(alive), expected purchases and CLV over 1, 3 and 5 years per customer.

    BG/NBD and Gamma-Gamma fitted per tenant of the run by maximum likelihood
    (`analytics/clv.py`); a tenant whose data cannot support the fit gets the documented
    heuristic, and the `model` column says which one each row came from.""",
)
holdout_predictions = _predictions_asset(
    "holdout_predictions",
    (dbt_holdout_summary, HOLDOUT_SUMMARY_MODEL),
    # Run by the weekly churn holdout schedule.
    None,
    record_fits=False,
    description="""The same fit as customer_predictions, as of the churn holdout's calibration
    date (var churn_holdout_days before as_of): the P(alive) marts.churn_holdout bands with,
    so the holdout tests the churn rules as they run today. Weekly.""",
)


def fit_and_replace(
    reader: psycopg.Connection,
    writer: psycopg.Connection,
    summary_model: str,
    table: str,
    tenant_ids: Sequence[str],
    record_fits: bool,
) -> list[tuple[str, int, Predictions]]:
    """Fit each tenant of `tenant_ids` on `summary_model` (read on `reader`) and replace its
    rows of `table` (on `writer`); returns (tenant, customers, predictions) in tenant order.
    Committed tenant by tenant: a failure later in a long run keeps the tenants done."""
    fitted: list[tuple[str, int, Predictions]] = []
    for inputs in read_fit_inputs(reader, summary_model, tenant_ids):
        result = predict(inputs.x, inputs.t_x, inputs.T, inputs.m_x, inputs.spend_per_day)
        _replace_predictions(writer, table, inputs, result, record_fits)
        writer.commit()
        fitted.append((inputs.tenant_id, len(inputs.keys), result))
    return fitted


def _replace_predictions(
    conn: psycopg.Connection,
    table: str,
    inputs: FitInputs,
    result: Predictions,
    record_fits: bool,
) -> None:
    conn.execute(f"DELETE FROM {table} WHERE tenant_id = %s", (inputs.tenant_id,))
    if inputs.keys:
        _copy_predictions(conn, table, inputs, result)
        if record_fits:
            repeaters = int((inputs.x > 0).sum())
            _record_fit(conn, inputs.tenant_id, inputs.as_of, len(inputs.keys), repeaters, result)


def _fits_table(fitted: list[tuple[str, int, Predictions]]) -> str:
    lines = [
        "| tenant | customers | model | mean P(alive) | CLV 1y | CLV 3y | CLV 5y |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for tenant_id, customers, result in fitted:
        mean_alive = float(result.p_alive.mean()) if customers else 0.0
        totals = " | ".join(f"{float(result.clv[m].sum()):,.2f}" for m in HORIZON_MONTHS)
        lines.append(
            f"| {tenant_id} | {customers} | {result.model} | {mean_alive:.3f} | {totals} |"
        )
    return "\n".join(lines)


def _copy_predictions(
    conn: psycopg.Connection, table: str, inputs: FitInputs, result: Predictions
) -> None:
    columns_sql = (
        "tenant_id, customer_key, as_of, frequency_x, recency_t_x_days, age_t_days,"
        " mean_repeat_spend, p_alive, p_no_purchase_90d, expected_purchases_1y,"
        " expected_purchases_3y, expected_purchases_5y, clv_1y, clv_3y, clv_5y, model"
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
        strict=True,
    )
    tenant_id, as_of, model = inputs.tenant_id, inputs.as_of, result.model
    with conn.cursor().copy(f"COPY {table} ({columns_sql}) FROM STDIN") as copy:
        for key, x_i, t_x_i, T_i, *estimates, spend, clv_1y, clv_3y, clv_5y in columns:
            copy.write_row(
                (tenant_id, key, as_of, x_i, t_x_i, T_i, spend, *estimates)
                + (clv_1y, clv_3y, clv_5y, model)
            )


def _record_fit(
    conn, tenant_id, as_of, customers: int, repeaters: int, result: Predictions
) -> None:
    bg = result.bgnbd.params if result.bgnbd else None
    gg = result.gamma_gamma.params if result.gamma_gamma else None
    conn.execute(
        """
        INSERT INTO analytics_python.clv_fits (tenant_id, as_of, model, fallback_reason,
            customers, repeaters, bgnbd_r, bgnbd_alpha, bgnbd_a, bgnbd_b, bgnbd_log_likelihood,
            gg_p, gg_q, gg_gamma, gg_log_likelihood)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            tenant_id,
            as_of,
            result.model,
            result.fallback_reason,
            customers,
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
        ),
    )


def _metadata(result: Predictions, customers: int) -> dict:
    clv_1y = result.clv[12]
    metadata: dict = {
        "dagster/row_count": customers,
        "model": result.model,
        "fell_back": result.fallback_reason is not None,
        "mean_p_alive": float(result.p_alive.mean()) if customers else 0.0,
        **{f"clv_{m // 12}y_total": float(result.clv[m].sum()) for m in HORIZON_MONTHS},
    }
    if result.fallback_reason:
        metadata["fallback_reason"] = result.fallback_reason
    if result.bgnbd and result.gamma_gamma:
        bg, gg = result.bgnbd.params, result.gamma_gamma.params
        metadata.update(
            bgnbd_r=bg.r,
            bgnbd_alpha=bg.alpha,
            bgnbd_a=bg.a,
            bgnbd_b=bg.b,
            gg_p=gg.p,
            gg_q=gg.q,
            gg_gamma=gg.gamma,
            **result.fit_details,
        )
    if customers:
        quantiles = np.quantile(clv_1y, [0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
        table = "| quantile | CLV 1y |\n|---|---|\n" + "\n".join(
            f"| p{int(q * 100)} | {v:,.2f} |"
            for q, v in zip((0.1, 0.25, 0.5, 0.75, 0.9, 0.99), quantiles, strict=True)
        )
        metadata["clv_1y_distribution"] = dg.MetadataValue.md(table)
    return metadata
