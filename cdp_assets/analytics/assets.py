"""Analytics as assets: dbt models per tenant, the CLV fit between them, audiences for all."""

import json
import os
from datetime import UTC, datetime

import dagster as dg
import numpy as np
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


def dbt_vars(tenant_id: str | None) -> str:
    """`--vars` for one tenant (or all), as of today in UTC."""
    values = {"as_of": datetime.now(UTC).date().isoformat()}
    if tenant_id is not None:
        # The macros refuse such an id too, but dbt would first choke on its YAML (JSON
        # escapes of characters beyond the BMP are not YAML) with a baffling error.
        if not SLUG.fullmatch(tenant_id):
            raise ValueError(f"tenant id {tenant_id[:80]!r} is not a slug")
        values["tenant_id"] = tenant_id
    return json.dumps(values)


def _run_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource, tenant_id: str | None):
    os.environ.update(dbt_connection_env(migrated_url()))
    # Cautious: a test joining a model of another asset (churn_risk -> customers) runs with
    # the asset that holds all its parents, not with the first one to build.
    # Unit tests check the SQL, not the data: CI and analysts run them, scheduled runs need not.
    args = [
        "build",
        "--vars",
        dbt_vars(tenant_id),
        "--indirect-selection",
        "cautious",
        "--exclude-resource-type",
        "unit_test",
    ]
    yield from dbt.cli(args, context=context).stream()


SEGMENT_SIZES_SQL = """
SELECT segment, count(*) FROM marts.rfm_segments WHERE tenant_id = %s GROUP BY 1 ORDER BY 2 DESC
"""


def segment_metadata(conn, tenant_id: str) -> dict:
    """Segment sizes: numeric per segment (plotted over time) and one table to read."""
    sizes = conn.execute(SEGMENT_SIZES_SQL, (tenant_id,)).fetchall()
    table = "| segment | customers |\n|---|---|\n" + "\n".join(f"| {s} | {n} |" for s, n in sizes)
    return {
        "segments": dg.MetadataValue.md(table),
        **{f"segment_size/{segment}": count for segment, count in sizes},
    }


_tenant_dbt = {
    "manifest": MANIFEST,
    "project": dbt_project,
    "dagster_dbt_translator": translator,
    "partitions_def": tenants,
    "backfill_policy": dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
    "pool": "dbt",
}


@dbt_assets(
    name="dbt_tenant_models", select=TENANT_MODELS, exclude=SCORING_AND_TESTS, **_tenant_dbt
)
def dbt_tenant_models(context: dg.AssetExecutionContext, dbt: DbtCliResource):
    """Staging, identity resolution, customers and RFM segments for one tenant."""
    tenant_id = context.partition_key
    rfm_output = dbt_tenant_models.get_output_name_for_asset_key(dg.AssetKey("rfm_segments"))
    for event in _run_dbt(context, dbt, tenant_id):
        if isinstance(event, dg.Output) and event.output_name == rfm_output:
            with WarehouseResource().connect() as conn:
                event = event.with_metadata({**event.metadata, **segment_metadata(conn, tenant_id)})
        yield event


@dbt_assets(name="dbt_tenant_scoring", select=SCORING_MODELS, **_tenant_dbt)
def dbt_tenant_scoring(context: dg.AssetExecutionContext, dbt: DbtCliResource):
    """Churn risk for one tenant, from its history and the fitted P(alive)."""
    yield from _run_dbt(context, dbt, context.partition_key)


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
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=1),
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

    BG/NBD and Gamma-Gamma fitted per tenant by maximum likelihood (`analytics/clv.py`);
    a tenant whose data cannot support the fit gets the documented heuristic, and the
    `model` column says which one each row came from.
    """
    tenant_id = context.partition_key
    as_of = datetime.now(UTC).date()
    with warehouse.connect() as conn:
        rows = conn.execute(SUMMARY_SQL, (tenant_id,)).fetchall()
        keys = [r[0] for r in rows]
        x, t_x, T, m_x, spend = (
            np.array([r[i] or 0 for r in rows], dtype=float) for i in range(1, 6)
        )
        result = predict(x, t_x, T, m_x, spend)
        with conn.transaction():
            conn.execute(
                "DELETE FROM analytics_python.customer_predictions WHERE tenant_id = %s",
                (tenant_id,),
            )
            _copy_predictions(conn, tenant_id, as_of, keys, x, t_x, T, m_x, result)
            _record_fit(conn, tenant_id, as_of, len(keys), int((x > 0).sum()), result)
    return dg.MaterializeResult(metadata=_metadata(result, len(keys)))


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
