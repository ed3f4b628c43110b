"""Jobs over the analytics assets."""

from collections.abc import Sequence

import dagster as dg

from cdp_assets.analytics.assets import (
    clv_scorecard,
    customer_predictions,
    dbt_audiences,
    dbt_churn_holdout,
    dbt_holdout_summary,
    dbt_tenant_models,
    dbt_tenant_scoring,
    holdout_predictions,
)
from cdp_assets.analytics.automation import REFRESHES_WHAT_FOLLOWS
from cdp_assets.lib.run_bounds import run_bound
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG, TENANT_PARTITIONS, tenants
from cdp_assets.tenants.runs import QUEUED, run_tenants_of, runs_in_flight

ANALYTICS_JOB = "analytics_tenant_refresh"
CHANGES_JOB = "tenant_changes_refresh"
AUDIENCES_JOB = "audiences_refresh"
CHURN_HOLDOUT_JOB = "churn_holdout_refresh"


def _tenant_job(
    name: str,
    assets: Sequence[dg.AssetsDefinition],
    description: str,
    bound: str | None = None,
    refreshes_what_follows: bool = False,
):
    """A job over tenant-partitioned analytics assets, one run for one tenant or a range, bounded
    in time as its kind (`bound`: the job whose bound it shares, itself by default).
    `refreshes_what_follows`: its assets include every automated asset downstream of them, so
    its updates are no reason for the automation to run anything (automation.py)."""
    follows = {REFRESHES_WHAT_FOLLOWS: "true"} if refreshes_what_follows else {}
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(*assets),
        partitions_def=tenants,
        description=description,
        tags={**run_bound(bound or name), **follows},
    )


analytics_tenant_refresh = _tenant_job(
    ANALYTICS_JOB,
    [dbt_tenant_models, customer_predictions, dbt_tenant_scoring],
    "Tenants' dbt models, CLV fits and churn risk (one run for many).",
)
# The chain's step after a feed drain landed orders: the tenants' analytics and audiences in
# one run, so that the audiences follow their marts without another tick and run launch.
tenant_changes_refresh = _tenant_job(
    CHANGES_JOB,
    [dbt_tenant_models, customer_predictions, dbt_tenant_scoring, dbt_audiences],
    "Tenants whose orders changed (the orders feed landed some): their dbt models, CLV fits,"
    " churn risk and audiences (one run for many).",
    bound=ANALYTICS_JOB,
    refreshes_what_follows=True,
)
churn_holdout_refresh = _tenant_job(
    CHURN_HOLDOUT_JOB,
    [dbt_holdout_summary, holdout_predictions, dbt_churn_holdout, clv_scorecard],
    "Tenants' churn holdout: the bands as of 180 days ago against who bought again since, and"
    " the CLV scorecard on the same days (one run for many).",
)
audiences_refresh = _tenant_job(
    AUDIENCES_JOB,
    [dbt_audiences],
    "Tenants' rows of every audience, replaced from their marts (one run for many); other"
    " tenants' rows untouched.",
    refreshes_what_follows=True,
)


def tenants_in_flight(
    instance: dg.DagsterInstance, job_name: str, partition_order: Sequence[str]
) -> tuple[set[str], set[str]]:
    """(tenants with a run of `job_name` queued, tenants with one started). A queued run reads
    what landed before it starts: it absorbs new changes; a started one may have read its
    inputs already."""
    queued: set[str] = set()
    started: set[str] = set()
    for record in runs_in_flight(instance, job_name):
        run = record.dagster_run
        (queued if run.status in QUEUED else started).update(run_tenants_of(run, partition_order))
    return queued, started


def all_tenants_tags(instance: dg.DagsterInstance) -> dict[str, str]:
    """The tags of one run over every tenant partition the instance knows (a range: one dbt
    build for all of them)."""
    keys = instance.get_dynamic_partitions(TENANT_PARTITIONS)
    if not keys:
        raise LookupError("no tenant partition yet: register a tenant (`cdp tenants add`)")
    return {RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]}
