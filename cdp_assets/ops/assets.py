"""The operations metrics in Dagster: an asset materialized every 15 minutes whose numeric
metadata plots each metric's aggregate over time beside its target and alert values, naming
the worst tenants (or accounts), with one asset check per metric (warn: a tenant misses the
target, error: one crossed the alert threshold), and an alert on the webhook when a tenant's
figure crosses its alert threshold."""

import dagster as dg

from cdp_assets.lib import settings
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.freshness import PLATFORM_FRESHNESS
from cdp_assets.ops.metric_alerts import alert_on_crossings
from cdp_assets.ops.metrics import (
    DEFAULT_THRESHOLDS,
    LABELS,
    SUBJECTS,
    MetricsReport,
    Severity,
    check_description,
    collect_metrics,
    worst_named,
)
from cdp_assets.ops.resources import OpsMetricsResource
from cdp_assets.ops.webhook import WEBHOOK_ENV
from cdp_assets.vtex.resources import VtexResource

ASSET = "operations_metrics"


def metrics_metadata(report: MetricsReport) -> dict[str, float | str]:
    """Per metric its aggregate, target and alert values (numbers: plotted over time, one plot
    each whatever the number of tenants) and its worst subjects by name; the totals they are
    made of."""
    metadata: dict[str, float | str] = {}
    for metric, threshold in report.thresholds.items():
        if metric in report.aggregates:
            metadata[metric] = round(report.aggregates[metric], 3)
        metadata[f"{metric}/target"] = threshold.target
        metadata[f"{metric}/alert"] = threshold.alert
        if metric in SUBJECTS:
            metadata[f"{metric}/worst"] = worst_named(report, metric)
    metadata.update({name: value for name, value in report.counts.items() if "/" not in name})
    return metadata


def metric_check_results(report: MetricsReport) -> list[dg.AssetCheckResult]:
    """Each metric's worst figure: passed when on target, else WARN, or ERROR past the alert."""
    results = []
    for metric, threshold in report.thresholds.items():
        worst = report.worst(metric)
        severity = worst.severity if worst else Severity.OK
        metadata: dict[str, float | str] = {"target": threshold.target, "alert": threshold.alert}
        if worst is not None:
            metadata["value"] = worst.value
            if worst.subject:
                metadata["subject"] = worst.subject
        results.append(
            dg.AssetCheckResult(
                asset_key=ASSET,
                check_name=metric,
                passed=severity == Severity.OK,
                severity=(
                    dg.AssetCheckSeverity.ERROR
                    if severity == Severity.ERROR
                    else dg.AssetCheckSeverity.WARN
                ),
                description=check_description(report, metric),
                metadata=metadata,
            )
        )
    return results


@dg.asset(
    name=ASSET,
    group_name="operations",
    kinds={"python", "postgres"},
    freshness_policy=dg.FreshnessPolicy.time_window(fail_window=PLATFORM_FRESHNESS[ASSET]),
    check_specs=[
        dg.AssetCheckSpec(name, asset=ASSET, description=LABELS[name])
        for name in DEFAULT_THRESHOLDS
    ],
)
def operations_metrics(
    context: dg.AssetExecutionContext,
    warehouse: WarehouseResource,
    vtex: VtexResource,
    ops_metrics: OpsMetricsResource,
) -> dg.MaterializeResult:
    """The old operations dashboard's KPIs, from Dagster's run storage and event log and from
    Postgres: sync success rate, average sync time per tenant, step error rate, VTEX request
    budget used per account (and its 429s), database connections. Each check warns when its
    metric misses the target and errors past the alert threshold, which is also posted once
    to $CDP_ALERT_WEBHOOK_URL. Thresholds: `ops_metrics` resource or $CDP_OPS_THRESHOLDS."""
    with warehouse.connect() as conn:
        report = collect_metrics(
            context.instance,
            conn,
            thresholds=ops_metrics.in_force(),
            requests_per_second=vtex.request_rate(),
        )
        # End the reads' transaction, so the states below commit (and unlock) right after
        # their posts rather than when this connection closes.
        conn.commit()
        for crossing in alert_on_crossings(conn, report, settings.value(WEBHOOK_ENV), context.log):
            figure = crossing.figure
            if crossing.recovered:
                context.log.info(f"{figure.key} = {figure.value:.1f}: recovered")
            else:
                context.log.warning(f"{figure.key} = {figure.value:.1f}: past its alert threshold")
    return dg.MaterializeResult(
        metadata=metrics_metadata(report), check_results=metric_check_results(report)
    )
