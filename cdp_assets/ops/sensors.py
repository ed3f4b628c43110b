"""Every failed run becomes a row of `cdp.sync_errors`, and an alert when a webhook is set."""

import time
from datetime import UTC, datetime

import dagster as dg

from cdp_assets.lib import settings
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.ops.sync_errors import failed_assets, record_sync_error, sync_error_from_run
from cdp_assets.ops.webhook import UI_URL_ENV, WEBHOOK_ENV, alert_payload, post_alert


@dg.run_failure_sensor(
    name="sync_errors_sensor",
    monitor_all_code_locations=True,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Records each failed run in cdp.sync_errors (tenant, assets, the error's type and"
    f" redacted message) and posts it to ${WEBHOOK_ENV} when set, linking to the run in the UI"
    f" at ${UI_URL_ENV}.",
)
def sync_errors_sensor(context: dg.RunFailureSensorContext, warehouse: WarehouseResource) -> None:
    run = context.dagster_run
    record = context.instance.get_run_record_by_id(run.run_id)
    ended = record.end_time if record is not None and record.end_time else time.time()
    error = sync_error_from_run(
        run,
        context.failure_event,
        failed_assets(context.instance, run.run_id),
        datetime.fromtimestamp(ended, UTC),
    )
    with warehouse.connect() as conn:
        recorded = record_sync_error(conn, error)
    if not recorded:  # seen before: its alert went out then
        context.log.info(f"run {run.run_id} is already in cdp.sync_errors")
        return
    context.log.info(f"run {run.run_id} recorded: tenant {error.tenant_id}, {error.error_type}")
    url = settings.value(WEBHOOK_ENV)
    if url:
        post_alert(url, alert_payload(error, settings.value(UI_URL_ENV)), context.log)
