"""Analytics as assets: dbt models per tenant, the CLV fit between them, audiences for all."""

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg
import numpy as np
import psycopg
from dagster_dbt import DbtCliResource, dbt_assets, get_asset_key_for_model

from cdp_assets.analytics.automation import ANALYTICS_AUTOMATION
from cdp_assets.analytics.dbt_project import (
    dbt_connection_env,
    dbt_project,
    ensure_manifest,
    translator,
)
from cdp_assets.analytics.predictions import HORIZON_MONTHS, Predictions, predict
from cdp_assets.lib.warehouse import WarehouseResource, migrated_url
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import SLUG

MANIFEST = ensure_manifest()
# Models by folder; their tests come by (cautious) indirect selection, so a test declared
# in a folder's YAML runs only with the asset that builds all of the models it reads.
TENANT_MODELS = " ".join(
    f"path:models/{layer},resource_type:model" for layer in ("staging", "intermediate", "marts")
)
SCORING_MODELS = "churn_risk"  # reads the predictions, so it runs after them
# churn_risk and its tests (a test of it also reads customers: keep it out of the first step)
SCORING_AND_TESTS = f"{SCORING_MODELS}+"
AUDIENCE_MODELS = "path:models/audiences,resource_type:model"


def dbt_vars(tenant_ids: Sequence[str] | None) -> str:
    """`--vars` for some tenants (or all), as of today in UTC."""
    values: dict = {"as_of": datetime.now(UTC).date().isoformat()}
    if tenant_ids is not None:
        for tenant_id in tenant_ids:
            # The macros refuse such an id too, but dbt would first choke on its YAML (JSON
            # escapes of characters beyond the BMP are not YAML) with a baffling error.
            if not SLUG.fullmatch(tenant_id):
                raise ValueError(f"tenant id {tenant_id[:80]!r} is not a slug")
        values["tenant_id"] = list(tenant_ids)
    return json.dumps(values)


def run_tenants(context: dg.AssetExecutionContext) -> list[str]:
    """The tenants of this run: one partition, or the range a backfill launches as one run
    (single-run policy), so that N tenants cost one dbt invocation, not N."""
    return sorted(context.partition_keys)


def _run_dbt(
    context: dg.AssetExecutionContext, dbt: DbtCliResource, tenant_ids: Sequence[str] | None
):
    os.environ.update(dbt_connection_env(migrated_url()))
    # Cautious: a test joining a model of another asset (churn_risk -> customers) runs with
    # the asset that holds all its parents, not with the first one to build.
    # Unit tests check the SQL, not the data: CI and analysts run them, scheduled runs need not.
    args = [
        "build",
        "--vars",
        dbt_vars(tenant_ids),
        "--indirect-selection",
        "cautious",
        "--exclude-resource-type",
        "unit_test",
    ]
    yield from dbt.cli(args, context=context).stream()


SEGMENT_SIZES_SQL = """
SELECT tenant_id, segment, count(*) FROM marts.rfm_segments WHERE tenant_id = ANY(%s)
 GROUP BY 1, 2 ORDER BY 1, 3 DESC
"""


def segment_metadata(conn: psycopg.Connection, tenant_ids: Sequence[str]) -> dict:
    """Segment sizes as a table, and a number per segment (plotted over time) when the run
    is one tenant's: a run over several records the same metadata on each of them."""
    sizes = conn.execute(SEGMENT_SIZES_SQL, (list(tenant_ids),)).fetchall()
    table = "| tenant | segment | customers |\n|---|---|---|\n" + "\n".join(
        f"| {t} | {s} | {n} |" for t, s, n in sizes
    )
    metadata: dict = {"segments": dg.MetadataValue.md(table)}
    if len(tenant_ids) == 1:
        metadata.update({f"segment_size/{segment}": count for _, segment, count in sizes})
        metadata["segment_chart"] = dg.MetadataValue.md(bar_chart(sizes))
    return metadata


def bar_chart(sizes: Sequence[tuple[str, str, int]], width: int = 30) -> str:
    """Segment sizes as a text bar chart: readable in the UI's Markdown view."""
    largest = max((n for _, _, n in sizes), default=0)
    if not largest:
        return "no segments"
    label = max(len(s) for _, s, _ in sizes)
    rows = [f"{s:<{label}} {'█' * max(1, round(width * n / largest))} {n}" for _, s, n in sizes]
    return "```\n" + "\n".join(rows) + "\n```"


_tenant_dbt = {
    "manifest": MANIFEST,
    "project": dbt_project,
    "dagster_dbt_translator": translator,
    "partitions_def": tenants,
    # A backfill of many tenants is one run and one dbt build for all of them: dbt's start-up
    # and per-model overhead is paid once, and the set-based SQL covers every tenant.
    "backfill_policy": dg.BackfillPolicy.single_run(),
    "pool": "dbt",
}


@dbt_assets(
    name="dbt_tenant_models", select=TENANT_MODELS, exclude=SCORING_AND_TESTS, **_tenant_dbt
)
def dbt_tenant_models(context: dg.AssetExecutionContext, dbt: DbtCliResource):
    """Staging, identity resolution, customers and RFM segments for the run's tenants."""
    tenant_ids = run_tenants(context)
    rfm_output = dbt_tenant_models.get_output_name_for_asset_key(dg.AssetKey("rfm_segments"))
    for event in _run_dbt(context, dbt, tenant_ids):
        if isinstance(event, dg.Output) and event.output_name == rfm_output:
            with WarehouseResource().connect() as conn:
                extra = segment_metadata(conn, tenant_ids)
            event = event.with_metadata({**event.metadata, **extra})
        yield event


@dbt_assets(name="dbt_tenant_scoring", select=SCORING_MODELS, **_tenant_dbt)
def dbt_tenant_scoring(context: dg.AssetExecutionContext, dbt: DbtCliResource):
    """Churn risk for the run's tenants, from their history and the fitted P(alive)."""
    yield from _run_dbt(context, dbt, run_tenants(context))


@dbt_assets(
    name="dbt_audiences",
    manifest=MANIFEST,
    project=dbt_project,
    select=AUDIENCE_MODELS,
    dagster_dbt_translator=translator,
    pool="dbt",
)
def dbt_audiences(context: dg.AssetExecutionContext, dbt: DbtCliResource):
    """Audience materialized views over every tenant, refreshed concurrently."""
    yield from _run_dbt(context, dbt, None)


SUMMARY_SQL = """
SELECT customer_key, frequency_x, recency_t_x_days, age_t_days, mean_repeat_spend,
       revenue / nullif(purchase_days, 0)
  FROM intermediate.int_customers__purchase_summary
 WHERE tenant_id = %s
"""


@dg.asset(
    partitions_def=tenants,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[get_asset_key_for_model([dbt_tenant_models], "int_customers__purchase_summary")],
    group_name="marts",
    kinds={"python", "scipy", "postgres"},
    automation_condition=ANALYTICS_AUTOMATION,
    metadata={"dagster/table_name": "analytics_python.customer_predictions"},
)
def customer_predictions(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    """P(alive), expected purchases and CLV over 1, 3 and 5 years per customer.

    BG/NBD and Gamma-Gamma fitted per tenant of the run by maximum likelihood (`analytics/clv.py`);
    a tenant whose data cannot support the fit gets the documented heuristic, and the
    `model` column says which one each row came from.
    """
    as_of = datetime.now(UTC).date()
    fitted: list[tuple[str, int, Predictions]] = []
    with warehouse.connect() as conn:
        for tenant_id in run_tenants(context):
            customers, result = _predict_tenant(conn, tenant_id, as_of)
            # Tenant by tenant: a failure later in a long run keeps the tenants already done.
            conn.commit()
            fitted.append((tenant_id, customers, result))
    if len(fitted) == 1:
        _, customers, result = fitted[0]
        return dg.MaterializeResult(metadata=_metadata(result, customers))
    # A run over several tenants records this on each of them: a table, not per-tenant numbers.
    return dg.MaterializeResult(
        metadata={
            "tenants_in_run": len(fitted),
            "tenants": dg.MetadataValue.md(_fits_table(fitted)),
        }
    )


def _predict_tenant(conn: psycopg.Connection, tenant_id: str, as_of) -> tuple[int, Predictions]:
    rows = conn.execute(SUMMARY_SQL, (tenant_id,)).fetchall()
    keys = [r[0] for r in rows]
    x, t_x, T, m_x, spend = (np.array([r[i] or 0 for r in rows], dtype=float) for i in range(1, 6))
    result = predict(x, t_x, T, m_x, spend)
    conn.execute(
        "DELETE FROM analytics_python.customer_predictions WHERE tenant_id = %s", (tenant_id,)
    )
    _copy_predictions(conn, tenant_id, as_of, keys, x, t_x, T, m_x, result)
    _record_fit(conn, tenant_id, as_of, len(keys), int((x > 0).sum()), result)
    return len(keys), result


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


def _copy_predictions(conn, tenant_id, as_of, keys, x, t_x, T, m_x, result: Predictions) -> None:
    columns = (
        "tenant_id, customer_key, as_of, frequency_x, recency_t_x_days, age_t_days,"
        " mean_repeat_spend, p_alive, p_no_purchase_90d, expected_purchases_1y,"
        " expected_purchases_3y, expected_purchases_5y, clv_1y, clv_3y, clv_5y, model"
    )
    purchases, value = result.expected_purchases, result.clv
    with conn.cursor().copy(
        f"COPY analytics_python.customer_predictions ({columns}) FROM STDIN"
    ) as copy:
        for i, key in enumerate(keys):
            copy.write_row(
                (
                    tenant_id,
                    key,
                    as_of,
                    int(x[i]),
                    int(t_x[i]),
                    int(T[i]),
                    round(m_x[i], 2),
                    float(result.p_alive[i]),
                    float(result.p_no_purchase_90d[i]),
                    *(float(purchases[m][i]) for m in HORIZON_MONTHS),
                    *(round(float(value[m][i]), 2) for m in HORIZON_MONTHS),
                    result.model,
                )
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
