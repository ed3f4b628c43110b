"""Analytics as assets, per tenant: the dbt models, the Python step between them (CLV
predictions: `prediction_refresh.py`, maths in `clv.py`), the CLV holdout scorecard
(`clv_holdout.py`) and the audiences."""

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import dagster as dg
import numpy as np
import psycopg
from dagster_dbt import dbt_assets, get_asset_key_for_model

from cdp_assets.analytics.automation import ANALYTICS_AUTOMATION
from cdp_assets.analytics.clv_holdout import score_tenants
from cdp_assets.analytics.clv_scorecard import Scorecard
from cdp_assets.analytics.dbt_files import (
    RUN_VARS_ENV,
    dbt_connection_env,
    keep_parse,
    refresh_exposures,
)
from cdp_assets.analytics.dbt_metadata import (
    freshness_metadata,
    holdout_metadata,
    previous_refreshes,
    segment_metadata,
    source_landings,
)
from cdp_assets.analytics.dbt_project import dbt_project, ensure_manifest, tenant_translator
from cdp_assets.analytics.prediction_refresh import (
    HOLDOUT_SUMMARY_MODEL,
    REFIT_AFTER_DAYS,
    SUMMARY_MODEL,
    Refreshed,
    fit_and_replace,
    refresh_predictions,
)
from cdp_assets.analytics.predictions import HORIZON_MONTHS
from cdp_assets.framework.dbt_cli import CdpDbtCliResource
from cdp_assets.lib import settings
from cdp_assets.lib.dagster_home import DBT_POOL
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import tenants
from cdp_assets.tenants.registry import SLUG

MANIFEST = ensure_manifest()
# What a dbt invocation streams to Dagster.
DbtEvent = (
    dg.Output
    | dg.AssetMaterialization
    | dg.AssetObservation
    | dg.AssetCheckResult
    | dg.AssetCheckEvaluation
)
# The analytics' as-of day, YYYY-MM-DD; unset (as in production), the day a refresh started.
AS_OF_ENV = "CDP_AS_OF"
WRITE_JSON_ENV = "DBT_WRITE_JSON"
# dbt logs to its file at debug by default: every query and connection event, formatted and
# written under a lock its threads queue for (the tenant-isolation tests' pipeline used 67 s of
# CPU with it, 63 s at info). At info, the file holds what dbt prints.
LOG_LEVEL_FILE_ENV = "DBT_LOG_LEVEL_FILE"
# Models by folder; their tests come by (cautious) indirect selection, so a test declared
# in a folder's YAML runs only with the asset that builds all of the models it reads.
TENANT_MODELS = " ".join(
    f"path:models/{layer},resource_type:model" for layer in ("staging", "intermediate", "marts")
)
# It reads the Python step's predictions, so it runs after it.
SCORING_MODELS = "churn_risk"
# The churn holdout's models (dbt tag `weekly`, with HOLDOUT_SUMMARY_MODEL): the validation of
# the bands. They run on the weekly schedule (`churn_holdout_weekly`), not on the daily path.
HOLDOUT_MODEL = "churn_holdout"
# With their tests (a test of churn_risk also reads customers: keep it out of the first step)
NOT_IN_TENANT_MODELS = "churn_risk+ tag:weekly+"
AUDIENCE_MODELS = "path:models/audiences,resource_type:model"


def as_of_day(started: datetime | None = None) -> str:
    """`CDP_AS_OF` if set, to rebuild the analytics as of a past day or keep a series of
    runs on one day across midnight; otherwise the day (UTC) `started`, or today."""
    pinned = settings.value(AS_OF_ENV)
    if not pinned:
        return (started or datetime.now(UTC)).astimezone(UTC).date().isoformat()
    try:
        return date.fromisoformat(pinned).isoformat()
    except ValueError:
        raise ValueError(f"{AS_OF_ENV} must be a day as YYYY-MM-DD, not {pinned[:40]!r}") from None


def refresh_started(context: dg.AssetExecutionContext) -> datetime | None:
    """When the refresh this step belongs to started: its run's creation, or the first run's
    for a re-execution. Every step of a refresh is as of that day, so that its marts, fits and
    scores agree even when midnight falls between them."""
    run = context.run
    record = context.instance.get_run_record_by_id(run.root_run_id or run.run_id)
    return record.create_timestamp if record else None


def dbt_vars(tenant_ids: Sequence[str] | None, started: datetime | None = None) -> str:
    """The run's vars (macro `run_var`) for some tenants (or all), as of
    `as_of_day(started)`."""
    values: dict = {"as_of": as_of_day(started)}
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
    context: dg.AssetExecutionContext, dbt: CdpDbtCliResource, tenant_ids: Sequence[str] | None
) -> Iterator[DbtEvent]:
    # Cautious: a test joining a model of another asset (churn_risk -> customers) runs with
    # the asset that holds all its parents, not with the first one to build.
    # Unit tests check the SQL, not the data: CI and analysts run them, scheduled runs need not.
    args = [
        "build",
        "--indirect-selection",
        "cautious",
        "--exclude-resource-type",
        "unit_test",
    ]
    # The run's variables go in this invocation's environment, not `--vars`: dbt re-parses
    # the whole project whenever those change (see run_var), and no other dbt command of this
    # process (a unit test overriding tenant_id with null, say) inherits this run's tenants.
    # Nor does it write manifest.json (twice per build) and run_results.json: the event log
    # holds each node's result. DBT_WRITE_JSON=true in the environment writes them.
    run_environment = {
        **dbt_connection_env(migrated_url()),
        RUN_VARS_ENV: dbt_vars(tenant_ids, refresh_started(context)),
        WRITE_JSON_ENV: settings.required(WRITE_JSON_ENV),
        LOG_LEVEL_FILE_ENV: settings.required(LOG_LEVEL_FILE_ENV),
    }
    # The dbt command starts here.
    invocation = dbt.forked_cli(args, context=context, env=run_environment)
    yield from invocation.stream()
    keep_parse(invocation.target_path, run_environment)


_tenant_dbt: dict[str, Any] = {
    "manifest": MANIFEST,
    "project": dbt_project,
    "dagster_dbt_translator": tenant_translator,
    "partitions_def": tenants,
    # A backfill of many tenants is one run and one dbt build for all of them: dbt's start-up
    # and per-model overhead is paid once, and the set-based SQL covers every tenant.
    "backfill_policy": dg.BackfillPolicy.single_run(),
    "pool": DBT_POOL,
}


def _with_metadata(
    assets_def: dg.AssetsDefinition,
    events: Iterator[DbtEvent],
    tenant_ids: Sequence[str],
    extra: Mapping[str, Callable[[psycopg.Connection, Sequence[str]], dict]],
) -> Iterator[DbtEvent]:
    """dbt's events, with `extra[model](conn, tenant_ids)` added to the named models' outputs."""
    by_output = {
        assets_def.get_output_name_for_asset_key(dg.AssetKey(model)): metadata
        for model, metadata in extra.items()
    }
    for event in events:
        if isinstance(event, dg.Output) and event.output_name in by_output:
            with WarehouseResource().connect() as conn:
                added = by_output[event.output_name](conn, tenant_ids)
            event = event.with_metadata({**event.metadata, **added})
        yield event


@dbt_assets(
    name="dbt_tenant_models", select=TENANT_MODELS, exclude=NOT_IN_TENANT_MODELS, **_tenant_dbt
)
def dbt_tenant_models(context: dg.AssetExecutionContext, dbt: CdpDbtCliResource):
    """Staging, identity resolution, customers and RFM segments for the run's tenants."""
    tenant_ids = run_tenants(context)
    events = _run_dbt(context, dbt, tenant_ids)
    yield from _with_metadata(
        dbt_tenant_models, events, tenant_ids, {"rfm_segments": segment_metadata}
    )


@dbt_assets(name="dbt_tenant_scoring", select=SCORING_MODELS, **_tenant_dbt)
def dbt_tenant_scoring(context: dg.AssetExecutionContext, dbt: CdpDbtCliResource):
    """Churn risk for the run's tenants, from their history and the fitted P(alive)."""
    yield from _run_dbt(context, dbt, run_tenants(context))


@dbt_assets(name="dbt_holdout_summary", select=HOLDOUT_SUMMARY_MODEL, **_tenant_dbt)
def dbt_holdout_summary(context: dg.AssetExecutionContext, dbt: CdpDbtCliResource):
    """The run's tenants' purchase summary as of the churn holdout's calibration date."""
    yield from _run_dbt(context, dbt, run_tenants(context))


@dbt_assets(name="dbt_churn_holdout", select=HOLDOUT_MODEL, **_tenant_dbt)
def dbt_churn_holdout(context: dg.AssetExecutionContext, dbt: CdpDbtCliResource):
    """The churn bands as of the calibration date beside who bought again since."""
    tenant_ids = run_tenants(context)
    events = _run_dbt(context, dbt, tenant_ids)
    yield from _with_metadata(
        dbt_churn_holdout, events, tenant_ids, {HOLDOUT_MODEL: holdout_metadata}
    )


@dbt_assets(name="dbt_audiences", select=AUDIENCE_MODELS, **_tenant_dbt)
def dbt_audiences(context: dg.AssetExecutionContext, dbt: CdpDbtCliResource):
    """The run's tenants' rows of every audience, replaced in one transaction per audience
    (readers see the old members or the new ones), other tenants' untouched; each output
    says how far behind the source's latest orders the audiences were; then the project's
    exposures, where each audience is sent."""
    tenant_ids = run_tenants(context)
    catalog = dg.AssetKey("audience_catalog")
    previous = previous_refreshes(context.instance, catalog, tenant_ids)
    with WarehouseResource().connect() as conn:
        landings = source_landings(conn, previous)
    for event in _run_dbt(context, dbt, tenant_ids):
        if isinstance(event, dg.Output):
            freshness = freshness_metadata(landings, datetime.now(UTC))
            event = event.with_metadata({**event.metadata, **freshness})
        yield event
    with WarehouseResource().connect() as conn:
        if refresh_exposures(conn):
            context.log.info("destinations changed: the project's exposures were written again")


def _python_step(
    name: str,
    summary: tuple[dg.AssetsDefinition, str],
    automation_condition: dg.AutomationCondition | None,
    description: str,
):
    """The asset decorator of a tenant-partitioned step reading the model `summary` (the dbt
    assets building it, its name) and writing `analytics_python.<name>`."""
    summary_assets, summary_model = summary
    return dg.asset(
        name=name,
        description=description,
        partitions_def=tenants,
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=[get_asset_key_for_model([summary_assets], summary_model)],
        group_name="marts",
        kinds={"python", "scipy", "postgres"},
        automation_condition=automation_condition,
        metadata={"dagster/table_name": f"analytics_python.{name}"},
    )


def _materialization(refreshed: list[Refreshed]) -> dg.MaterializeResult:
    if len(refreshed) == 1:
        return dg.MaterializeResult(metadata=_metadata(refreshed[0]))
    # A run over several tenants records this on each of them: a table, not numbers.
    return dg.MaterializeResult(
        metadata={
            "tenants_in_run": len(refreshed),
            "tenants": dg.MetadataValue.md(_fits_table(refreshed)),
        }
    )


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
    summary_model = summary[1]
    table = f"analytics_python.{name}"

    @_python_step(name, summary, automation_condition, description)
    def fit(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        with warehouse.connect() as reader, warehouse.connect() as writer:
            fitted = fit_and_replace(
                reader, writer, summary_model, table, run_tenants(context), record_fits
            )
        return _materialization(fitted)

    return fit


class PredictionsConfig(dg.Config):
    refit_after_days: int = REFIT_AFTER_DAYS
    """A tenant whose stored fit is as of this many days before its summary is fitted again."""
    refit: bool = False
    """Fit every tenant of the run again, whatever its stored fit."""


@_python_step(
    "customer_predictions",
    (dbt_tenant_models, SUMMARY_MODEL),
    ANALYTICS_AUTOMATION,
    description="""P(alive), expected purchases and CLV over 1, 3 and 5 years per customer.

    BG/NBD and Gamma-Gamma fitted per tenant by maximum likelihood (`analytics/clv.py`), again
    when the stored fit is a week old (config refit_after_days), missing, or the customers
    changed by a quarter; every other run scores the customers whose purchase summary changed
    with the stored parameters. A tenant whose data cannot support the fit gets the documented
    heuristic, and the `model` column says which one each row came from.""",
)
def customer_predictions(
    context: dg.AssetExecutionContext, config: PredictionsConfig, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    with warehouse.connect() as reader, warehouse.connect() as writer:
        refreshed = refresh_predictions(
            reader, writer, run_tenants(context), config.refit_after_days, config.refit
        )
    return _materialization(refreshed)


holdout_predictions = _predictions_asset(
    "holdout_predictions",
    (dbt_holdout_summary, HOLDOUT_SUMMARY_MODEL),
    # Run by the weekly churn holdout schedule.
    None,
    # Its fit, as of the calibration date, is the one clv_scorecard scores.
    record_fits=True,
    description="""The same fit as customer_predictions, as of the churn holdout's calibration
    date (var churn_holdout_days before as_of): the P(alive) marts.churn_holdout bands with,
    so the holdout tests the churn rules as they run today. Weekly.""",
)


def _fits_table(refreshed: list[Refreshed]) -> str:
    lines = [
        "| tenant | customers | scored | model | fit |",
        "|---|---:|---:|---|---|",
    ]
    for done in refreshed:
        fit = f"fitted: {done.fitted}" if done.fitted else f"stored, as of {done.fit_as_of}"
        lines.append(
            f"| {done.tenant_id} | {done.customers} | {done.scored} | {done.result.model} | {fit} |"
        )
    return "\n".join(lines)


def _metadata(refreshed: Refreshed) -> dict:
    result, customers, scored = refreshed.result, refreshed.customers, refreshed.scored
    metadata: dict = {
        "dagster/row_count": customers,
        "customers_scored": scored,
        "model": result.model,
        "fell_back": result.fallback_reason is not None,
        "fitted": refreshed.fitted is not None,
    }
    if refreshed.fitted:
        metadata["fit_reason"] = refreshed.fitted
    elif refreshed.fit_as_of:
        metadata["fit_as_of"] = refreshed.fit_as_of.isoformat()
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
    # Totals and quantiles of the tenant: when this run scored every customer.
    if customers and scored == customers:
        clv_1y = result.clv[12]
        metadata["mean_p_alive"] = float(result.p_alive.mean())
        metadata.update(
            {f"clv_{m // 12}y_total": float(result.clv[m].sum()) for m in HORIZON_MONTHS}
        )
        quantiles = np.quantile(clv_1y, [0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
        table = "| quantile | CLV 1y |\n|---|---|\n" + "\n".join(
            f"| p{int(q * 100)} | {v:,.2f} |"
            for q, v in zip((0.1, 0.25, 0.5, 0.75, 0.9, 0.99), quantiles, strict=True)
        )
        metadata["clv_1y_distribution"] = dg.MetadataValue.md(table)
    return metadata


CHECK_NAME = "clv_beats_naive_baseline"


def _listed(tenant_ids: list[str]) -> dg.MetadataValue:
    return dg.MetadataValue.md("\n".join(f"- {t}" for t in tenant_ids) or "none")


def _figures(card: Scorecard) -> dict:
    """Numbers plotted over time when the run is one tenant's."""
    figures: dict = {
        "customers": card.customers,
        "holdout_days": card.holdout_days,
        "beats_baseline": card.beats_baseline,
    }
    for quantity in ("purchases", "spend"):
        for who in ("model", "baseline"):
            accuracy = getattr(card, f"{who}_{quantity}")
            if accuracy is None:
                continue
            figures[f"{who}/{quantity}_predicted"] = accuracy.predicted_total
            figures[f"{who}/{quantity}_mae"] = accuracy.mean_absolute_error
            for name in ("bias", "rank_correlation", "top_decile_share"):
                value = getattr(accuracy, name)
                if value is not None:
                    figures[f"{who}/{quantity}_{name}"] = value
    figures["actual/purchases"] = card.baseline_purchases.actual_total
    figures["actual/spend"] = card.baseline_spend.actual_total
    return figures


def _deciles_table(card: Scorecard) -> str:
    lines = [
        "| decile | customers | purchases predicted | actual | baseline"
        " | spend predicted | actual | baseline |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d in card.deciles:
        lines.append(
            f"| {d.decile} | {d.customers} | {d.predicted_purchases:.3f} | {d.actual_purchases:.3f}"
            f" | {d.baseline_purchases:.3f} | {d.predicted_spend:,.2f} | {d.actual_spend:,.2f}"
            f" | {d.baseline_spend:,.2f} |"
        )
    return "\n".join(lines)


def _tenants_table(scored: list[tuple[str, date, Scorecard]]) -> str:
    lines = [
        "| tenant | calibrated | model | spend MAE | baseline | top decile | baseline | beats |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for tenant_id, calibration_date, card in scored:
        model, naive = card.model_spend, card.baseline_spend
        mae = f"{model.mean_absolute_error:,.2f}" if model else "-"
        top = f"{model.top_decile_share:.1%}" if model and model.top_decile_share else "-"
        naive_top = f"{naive.top_decile_share:.1%}" if naive.top_decile_share else "-"
        lines.append(
            f"| {tenant_id} | {calibration_date} | {card.model} | {mae}"
            f" | {naive.mean_absolute_error:,.2f} | {top} | {naive_top} | {card.beats_baseline} |"
        )
    return "\n".join(lines)


@dg.asset(
    name="clv_scorecard",
    description="""How well CLV predicts, per tenant: the BG/NBD + Gamma-Gamma fit as of the
    churn holdout's calibration date (holdout_predictions', fitted once) against each
    customer's purchase days and spend since, beside a naive baseline (the customer's past
    rate carried forward): error, bias, rank correlation, the top decile's share and a
    calibration table by decile. Weekly, with the churn holdout; `beats_baseline` gates what
    activation derives from CLV.""",
    partitions_def=tenants,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[
        get_asset_key_for_model([dbt_holdout_summary], HOLDOUT_SUMMARY_MODEL),
        get_asset_key_for_model([dbt_tenant_models], "int_orders__purchases"),
        holdout_predictions,
    ],
    group_name="marts",
    kinds={"python", "scipy", "postgres"},
    metadata={"dagster/table_name": "analytics_python.clv_scorecard"},
    check_specs=[
        dg.AssetCheckSpec(
            CHECK_NAME,
            asset="clv_scorecard",
            description="The CLV model predicts the holdout better than the naive baseline"
            " (warns, per tenant of the run, when it does not, or when the holdout's fit was"
            " missing and the tenant was not scored).",
        )
    ],
)
def clv_scorecard(
    context: dg.AssetExecutionContext, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    holdout_end = date.fromisoformat(as_of_day(refresh_started(context)))
    with warehouse.connect() as reader, warehouse.connect() as writer:
        scored, unfitted = score_tenants(reader, writer, run_tenants(context), holdout_end)
    failing = [tenant_id for tenant_id, _, card in scored if not card.beats_baseline]
    check = dg.AssetCheckResult(
        check_name=CHECK_NAME,
        passed=not failing and not unfitted,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "tenants_scored": len(scored),
            "not_better_than_baseline": _listed(failing),
            "not_scored_without_holdout_fit": _listed(unfitted),
        },
    )
    metadata: dict = {"tenants": dg.MetadataValue.md(_tenants_table(scored))}
    if len(scored) == 1:
        _, calibration_date, card = scored[0]
        metadata.update(_figures(card))
        metadata["calibration_date"] = calibration_date.isoformat()
        metadata["deciles"] = dg.MetadataValue.md(_deciles_table(card))
    return dg.MaterializeResult(metadata=metadata, check_results=[check])
