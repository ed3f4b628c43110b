"""Analytics as dbt assets, per tenant: the models (before and after the Python fits in
`prediction_assets.py`) and the audiences."""

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import dagster as dg
import psycopg
from dagster_dbt import dbt_assets

from cdp_assets.analytics.dbt_project import (
    dbt_connection_env,
    dbt_project,
    ensure_manifest,
    keep_parse,
    refresh_exposures,
    tenant_translator,
)
from cdp_assets.framework.dbt_cli import CdpDbtCliResource
from cdp_assets.lib import settings
from cdp_assets.lib.dagster_home import DBT_POOL
from cdp_assets.lib.warehouse import WarehouseResource, migrated_url
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
# Read by macro run_var.
RUN_VARS_ENV = "CDP_DBT_RUN_VARS"
# The analytics' as-of day, YYYY-MM-DD; unset (as in production), the day a refresh started.
AS_OF_ENV = "CDP_AS_OF"
WRITE_JSON_ENV = "DBT_WRITE_JSON"
# Models by folder; their tests come by (cautious) indirect selection, so a test declared
# in a folder's YAML runs only with the asset that builds all of the models it reads.
TENANT_MODELS = " ".join(
    f"path:models/{layer},resource_type:model" for layer in ("staging", "intermediate", "marts")
)
# It reads the Python step's predictions, so it runs after it.
SCORING_MODELS = "churn_risk"
# The churn holdout's models (dbt tag `weekly`): the validation of the bands. They run on
# the weekly schedule (`churn_holdout_weekly`), not on the daily path.
HOLDOUT_SUMMARY_MODEL = "int_customers__holdout_summary"
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
    }
    # The dbt command starts here.
    invocation = dbt.forked_cli(args, context=context, env=run_environment)
    yield from invocation.stream()
    keep_parse(invocation.target_path)


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


HOLDOUT_RATES_SQL = """
SELECT tenant_id, churn_band, count(*), avg(repurchased::integer), min(calibration_date)
  FROM marts.churn_holdout WHERE tenant_id = ANY(%s)
 GROUP BY 1, 2 ORDER BY 1, array_position(ARRAY['low', 'medium', 'high', 'lost'], churn_band)
"""


def holdout_metadata(conn: psycopg.Connection, tenant_ids: Sequence[str]) -> dict:
    """The churn holdout: per band, the customers and the share who bought again after the
    calibration date; as numbers too when the run is one tenant's."""
    rates = conn.execute(HOLDOUT_RATES_SQL, (list(tenant_ids),)).fetchall()
    table = "| tenant | band as of | band | customers | bought again |\n|---|---|---|---:|---:|\n"
    table += "\n".join(f"| {t} | {d} | {b} | {n} | {float(r):.1%} |" for t, b, n, r, d in rates)
    metadata: dict = {"holdout_repurchase": dg.MetadataValue.md(table)}
    if len(tenant_ids) == 1:
        for _, band, customers, rate, _ in rates:
            metadata[f"holdout_repurchase_rate/{band}"] = float(rate)
            metadata[f"holdout_customers/{band}"] = customers
    return metadata


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


# Per tenant: when the newest order landed in the source, and how long the oldest order
# landed since the tenant's previous audience refresh waited for this one.
SOURCE_LANDINGS_SQL = """
SELECT previous.tenant_id, max(orders.synced_at),
       min(orders.synced_at) FILTER (WHERE orders.synced_at > previous.refreshed_at)
  FROM unnest(%s::text[], %s::timestamptz[]) AS previous (tenant_id, refreshed_at)
  LEFT JOIN raw_vtex.orders AS orders USING (tenant_id)
 GROUP BY previous.tenant_id
"""


def previous_refresh(
    context: dg.AssetExecutionContext, asset_key: dg.AssetKey, tenant_id: str
) -> datetime | None:
    """When the tenant's audiences were last refreshed before this run (None: never)."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[tenant_id]), limit=1
    ).records
    return datetime.fromtimestamp(records[0].timestamp, UTC) if records else None


def source_landings(
    conn: psycopg.Connection, previous: Mapping[str, datetime | None]
) -> dict[str, tuple[datetime | None, datetime | None]]:
    """tenant -> (newest order landing, oldest landing since `previous[tenant]`), as this
    refresh reads its source."""
    tenant_ids = sorted(previous)
    epoch = datetime.fromtimestamp(0, UTC)
    since = [previous[tenant_id] or epoch for tenant_id in tenant_ids]
    rows = conn.execute(SOURCE_LANDINGS_SQL, (tenant_ids, since)).fetchall()
    return {tenant_id: (newest, oldest_waiting) for tenant_id, newest, oldest_waiting in rows}


def freshness_metadata(
    landings: Mapping[str, tuple[datetime | None, datetime | None]], refreshed_at: datetime
) -> dict:
    """The audiences' age against their source, per tenant: as numbers (plotted over time on
    the tenant's partition) when the run is one tenant's, as a table otherwise."""
    table = "| tenant | newest order landed | oldest change waited (s) |\n|---|---|---:|\n"
    table += "\n".join(
        f"| {t} | {newest:%Y-%m-%d %H:%M:%S} | {_waited(oldest, refreshed_at)} |"
        if newest
        else f"| {t} | no orders | |"
        for t, (newest, oldest) in sorted(landings.items())
    )
    metadata: dict = {"source_freshness": dg.MetadataValue.md(table)}
    if len(landings) == 1:
        ((newest, oldest),) = landings.values()
        if newest is not None:
            metadata["source_landed_at"] = dg.MetadataValue.timestamp(newest)
        if oldest is not None:
            metadata["seconds_behind_source"] = _waited(oldest, refreshed_at)
    return metadata


def _waited(landed: datetime | None, refreshed_at: datetime) -> float | str:
    return "" if landed is None else round((refreshed_at - landed).total_seconds(), 1)


@dbt_assets(name="dbt_audiences", select=AUDIENCE_MODELS, **_tenant_dbt)
def dbt_audiences(context: dg.AssetExecutionContext, dbt: CdpDbtCliResource):
    """The run's tenants' rows of every audience, replaced in one transaction per audience
    (readers see the old members or the new ones), other tenants' untouched; each output
    says how far behind the source's latest orders the audiences were; then the project's
    exposures, where each audience is sent."""
    tenant_ids = run_tenants(context)
    catalog = dg.AssetKey("audience_catalog")
    previous = {
        tenant_id: previous_refresh(context, catalog, tenant_id) for tenant_id in tenant_ids
    }
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
