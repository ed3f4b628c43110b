"""Every failed run becomes a row of `cdp.sync_errors`, and an alert when a webhook is set."""

import time
from datetime import UTC, datetime

import dagster as dg

from cdp_assets.lib import settings
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.sync_errors import (
    failed_partitions,
    per_tenant,
    record_sync_errors,
    sync_error_from_run,
)
from cdp_assets.ops.webhook import UI_URL_ENV, WEBHOOK_ENV, alert_payload, post_alert


@dg.run_failure_sensor(
    name="sync_errors_sensor",
    monitor_all_code_locations=True,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Records each failed run in cdp.sync_errors (a row per tenant it failed for: its"
    " assets, the error's type and redacted message) and posts it to"
    f" ${WEBHOOK_ENV} when set, linking to the run in the UI at ${UI_URL_ENV}.",
)
def sync_errors_sensor(context: dg.RunFailureSensorContext, warehouse: WarehouseResource) -> None:
    run = context.dagster_run
    record = context.instance.get_run_record_by_id(run.run_id)
    ended = record.end_time if record is not None and record.end_time else time.time()
    failed = failed_partitions(context.instance, run.run_id)
    at = datetime.fromtimestamp(ended, UTC)
    errors = per_tenant(sync_error_from_run(run, context.failure_event, failed, at), failed)
    with warehouse.connect() as conn:
        recorded = record_sync_errors(conn, errors)
    if not recorded:  # seen before: its alert went out then
        context.log.info(f"run {run.run_id} is already in cdp.sync_errors")
        return
    tenants = ", ".join(e.tenant_id for e in errors if e.tenant_id) or "none"
    context.log.info(f"run {run.run_id} recorded: tenants {tenants}, {errors[0].error_type}")
    url = settings.value(WEBHOOK_ENV)
    if url:
        post_alert(url, alert_payload(errors, settings.value(UI_URL_ENV)), context.log)
