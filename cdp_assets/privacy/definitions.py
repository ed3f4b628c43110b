import dagster as dg

from cdp_assets.lib.run_bounds import MAX_RUNTIME_TAG
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.privacy.erase import (
    AwaitingPlatforms,
    RequestBusy,
    default_platform,
    open_erasures,
    run_erase,
)

PRIVACY_REQUESTS_JOB = "privacy_requests"

# The suppression list, which the purchase summary reads (dbt source `cdp.privacy_suppressions`):
# written by `cdp privacy`, not computed by Dagster.
privacy_suppressions_table = dg.AssetSpec(
    key=["cdp", "privacy_suppressions"],
    group_name="privacy",
    description="People suppressed per tenant by a privacy request (`cdp privacy suppress`,"
    " `erase`), as SHA-256 of their normalized identifiers: in no mart, audience or"
    " destination of the tenant from the next refresh on.",
    kinds={"postgres"},
    metadata={"dagster/table_name": "cdp.privacy_suppressions"},
)


@dg.op
def resume_open_erasures(context: dg.OpExecutionContext, warehouse: WarehouseResource) -> None:
    """Every erase still open carried on: those a process left midway, and those whose
    removals awaited a platform's verdict. One failing does not hold back the others; the
    run fails naming them."""
    stopped: list[str] = []
    with warehouse.connect() as conn:
        for request_id in open_erasures(conn):
            try:
                run_erase(conn, request_id, default_platform)
                context.log.info(f"erase request {request_id} completed")
            except (AwaitingPlatforms, RequestBusy) as waiting:
                context.log.info(f"erase request {request_id} still open: {waiting}")
            except Exception as error:
                stopped.append(f"{request_id} ({type(error).__name__})")
    if stopped:
        raise dg.Failure(
            f"erase requests stopped: {', '.join(stopped)}; `cdp privacy status` says why"
        )


@dg.job(name=PRIVACY_REQUESTS_JOB, tags={MAX_RUNTIME_TAG: str(30 * 60)})
def privacy_requests_job() -> None:
    resume_open_erasures()


privacy_requests_schedule = dg.ScheduleDefinition(
    job=privacy_requests_job,
    cron_schedule="15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every hour: carries on the erase requests still open, an interrupted one or"
    " one whose removals awaited a platform's verdict, until each is completed.",
)


def defs() -> dg.Definitions:
    return dg.Definitions(
        assets=[privacy_suppressions_table],
        jobs=[privacy_requests_job],
        schedules=[privacy_requests_schedule],
    )
