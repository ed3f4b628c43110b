"""Stages 2-6: ingestion, analytics, activation, the Master Data write-back and the daily
increment, each as the Dagster runs production launches (the jobs the schedules, sensors and
backfills use)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import psycopg
import requests

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.google.assets import google_customer_match
from cdp_assets.activation.jobs import activation_push
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.push_requests import change_requests, changed_audiences
from cdp_assets.activation.vtex_masterdata.assets import vtex_masterdata_fields
from cdp_assets.activation.vtex_masterdata.writeback import AUDIENCE as MASTERDATA_AUDIENCE
from cdp_assets.activation.vtex_masterdata.writeback import DEFAULT_FIELDS, DEFAULT_UPDATED_AT_FIELD
from cdp_assets.analytics.feed_changes import changes_requests
from cdp_assets.analytics.jobs import ANALYTICS_JOB, AUDIENCES_JOB, CHANGES_JOB, CHURN_HOLDOUT_JOB
from cdp_assets.partitions import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    order_months,
    tenant_month_range_tags,
    tenants,
)
from cdp_assets.tenants.registry import Tenant, list_tenants
from cdp_assets.tenants.runs import block_request, tenant_blocks
from cdp_assets.vtex.client import CATALOG_WINDOW
from cdp_assets.vtex.feed import FeedSettings, enabled_feeds, turn_feed_on
from cdp_assets.vtex.jobs import FEED_SYNC_JOB, ORDERS_SYNC_JOB, TENANT_SYNC_JOB
from cdp_assets.vtex.resources import VtexResource
from cdp_assets.vtex.schedules import order_sync_requests
from cdp_assets.vtex.sensors import feed_block_requests
from cdp_devkit.bench import clv_compare
from cdp_devkit.bench.environment import (
    DBT_DURATION,
    GOOGLE_PROCESSING_SECONDS,
    META_TOKEN_REF,
    Bench,
    RunRecord,
    RunRequest,
)
from cdp_devkit.bench.measure import StageResult, Stopwatch, consistency_check, stage
from cdp_devkit.sandbox import credentials_for

# RFM segments are disjoint, so their members add up to distinct customers. Taken in this
# order (the most valuable first) until the tenant's share of the Meta target is reached.
RFM_AUDIENCES = (
    "audience_rfm_champions",
    "audience_rfm_loyal_customers",
    "audience_rfm_potential_loyalists",
    "audience_rfm_at_risk",
    "audience_rfm_cant_lose_them",
    "audience_rfm_need_attention",
    "audience_rfm_about_to_sleep",
    "audience_rfm_promising",
    "audience_rfm_new_customers",
    "audience_rfm_hibernating",
    "audience_rfm_lost",
)
INGESTION_ASSETS = ("vtex_products", "vtex_skus", "vtex_customers", "vtex_orders")
WAREHOUSE_COUNTS_SQL = """
SELECT (SELECT count(*) FROM raw_vtex.orders), (SELECT count(*) FROM raw_vtex.products),
       (SELECT count(*) FROM raw_vtex.skus), (SELECT count(*) FROM raw_vtex.customers),
       (SELECT count(*) FROM raw_vtex.rejects)
"""


def _as_run(
    job_name: str, request: dg.RunRequest, run_config: dict[str, Any] | None = None
) -> RunRequest:
    """A run request of a schedule or sensor, for the bench's run workers; its own run config
    unless `run_config` is given."""
    return RunRequest(
        job_name,
        request.run_key or job_name,
        partition_key=request.partition_key and str(request.partition_key),
        tags=dict(request.tags),
        asset_selection=request.asset_selection,
        run_config=run_config if run_config is not None else dict(request.run_config) or None,
    )


SLOWEST_DBT_NODES = 8


def _dbt_summary(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """dbt's own run time of its models (from their materializations) and tests (from their
    checks) over the runs, and the slowest of them. Summed over dbt's threads: work, not
    wall time."""
    nodes: dict[tuple[str, str], float] = {}
    for run in runs:
        for asset, values in run.metadata.items():
            if DBT_DURATION in values:
                nodes[("model", asset)] = nodes.get(("model", asset), 0.0) + values[DBT_DURATION]
        for test, seconds in run.outcome.test_seconds.items():
            nodes[("test", test)] = nodes.get(("test", test), 0.0) + seconds
    if not nodes:
        return {}
    totals = {
        f"{kind}_seconds": round(sum(s for (k, _), s in nodes.items() if k == kind), 3)
        for kind in ("model", "test")
    }
    slowest = sorted(nodes.items(), key=lambda item: item[1], reverse=True)[:SLOWEST_DBT_NODES]
    return {
        "dbt": {
            **totals,
            "slowest": [
                {"kind": kind, "node": name, "seconds": round(seconds, 3)}
                for (kind, name), seconds in slowest
            ],
        }
    }


def _largest_run_peak(largest: RunRecord, runs: Sequence[RunRecord]) -> dict[str, Any]:
    """The run whose worker peaked highest (`largest`, one of `runs`), with the RSS it started
    from (what the forked definitions and the instance hold), and the range of every run's
    start RSS: each run has a process of its own, so none starts with what another left."""
    starts = [run.outcome.rss_start_mb for run in runs]
    return {
        "job": largest.job,
        "label": largest.label,
        "rss_start_mb": round(largest.outcome.rss_start_mb, 1),
        "peak_rss_mb": round(largest.outcome.peak_mb, 1),
        "runs": len(runs),
        "start_rss_range_mb": [round(min(starts), 1), round(max(starts), 1)],
    }


@contextmanager
def _stage(bench: Bench, name: str) -> Iterator[StageResult]:
    """`stage`, and the run whose worker peaked highest among the runs inside it (not those a
    stage times apart after it). A run worker reports its own high-water mark when its run
    ends, exactly: one that lived less than the sampling interval may have gone unsampled."""
    earlier = len(bench.runner.records)
    with stage(name, bench.url) as result:
        yield result
    runs = bench.runner.records[earlier:]
    if not runs:
        return
    largest = max(runs, key=lambda run: run.outcome.peak_mb)
    result.largest_run_peak = _largest_run_peak(largest, runs)
    if largest.outcome.peak_mb > result.child_peak_rss_mb:
        result.child_peak_rss_mb, result.child_peak_process = largest.outcome.peak_mb, "run worker"


def _runs_summary(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """Time inside steps per step key, and the rest of the runs' wall time (Dagster's own
    work: run and event storage, resource setup, process-level bookkeeping)."""
    steps: dict[str, float] = {}
    for run in runs:
        for step, seconds in run.step_seconds.items():
            steps[step] = steps.get(step, 0.0) + seconds
    run_seconds = sum(run.seconds for run in runs)
    return {
        "runs": len(runs),
        "run_seconds": round(run_seconds, 3),
        "step_seconds": {step: round(value, 3) for step, value in sorted(steps.items())},
        "outside_steps_seconds": round(run_seconds - sum(steps.values()), 3),
        **_dbt_summary(runs),
    }


def _sandbox_delta(before: dict[str, Any], after: dict[str, Any], wall: float) -> dict[str, Any]:
    served = after["served_total"] - before["served_total"]
    cpu = after["cpu_seconds"] - before["cpu_seconds"]
    return {
        "requests": served,
        "requests_per_second": round(served / wall, 1) if wall else 0.0,
        "sandbox_cpu_seconds": round(cpu, 3),
        # Near 1: the sandbox (one process, one core) was the bottleneck, not our client.
        "sandbox_busy_share": round(cpu / wall, 3) if wall else 0.0,
    }


# --- stage 2: ingestion -------------------------------------------------------------------------


def _sandbox_sku_count(bench: Bench) -> int:
    """SKUs the stores hold, from the catalog's product -> SKU map (GetProductAndSkuIds), not the
    SKU listing the `vtex_skus` asset reads."""
    total = 0
    with requests.Session() as session:
        for account in bench.tenant_ids:
            key, token = credentials_for(account)
            session.headers.update({"X-VTEX-API-AppKey": key, "X-VTEX-API-AppToken": token})
            start, products = 1, 1
            while start <= products:
                reply = session.get(
                    f"{bench.sandbox.account_url(account)}/api/catalog_system/pvt/products/"
                    "GetProductAndSkuIds",
                    params={"_from": start, "_to": start + CATALOG_WINDOW - 1},
                    timeout=60,
                )
                reply.raise_for_status()
                body = reply.json()
                total += sum(len(skus) for skus in body["data"].values())
                products = int(body["range"]["total"])
                start += CATALOG_WINDOW
    return total


def _serving_ceiling(bench: Bench, threads: int, requests_total: int) -> dict[str, Any]:
    """The sandbox's own rate for Get order with a minimal client (no parsing, no landing):
    what our client's rate should be compared with."""
    account = bench.tenant_ids[0]
    with bench.connect() as conn:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT order_id FROM raw_vtex.orders WHERE tenant_id = %s LIMIT %s",
                (account, requests_total),
            )
        ]
    key, token = credentials_for(account)
    base = f"{bench.sandbox.account_url(account)}/api/oms/pvt/orders/"

    def fetch(share: list[str]) -> None:
        with requests.Session() as session:
            session.headers.update({"X-VTEX-API-AppKey": key, "X-VTEX-API-AppToken": token})
            for order_id in share:
                session.get(base + order_id, timeout=30).raise_for_status()

    workers = [threading.Thread(target=fetch, args=(ids[i::threads],)) for i in range(threads)]
    before = bench.sandbox.stats()
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    return {"client_threads": threads, **_sandbox_delta(before, bench.sandbox.stats(), wall)}


def run_ingestion(bench: Bench) -> StageResult:
    """Every tenant's catalog and customers (`vtex_tenant_sync`) and its whole order history
    (`vtex_orders_sync` over every month, one run per tenant as a UI backfill does)."""
    watch = Stopwatch()
    runs: list[RunRecord] = []
    first_month = order_months.get_partition_key_for_timestamp(
        datetime.combine(bench.specs[0].history_start, datetime.min.time(), UTC).timestamp()
    )
    last_month = order_months.get_last_partition_key()
    before = bench.sandbox.stats()
    with _stage(bench, "ingestion") as result:
        # Largest tenants first (the scale lists them so), so the batches do not end on one.
        with watch.part("catalog_and_customers"):
            runs += bench.runner.run_all(
                [RunRequest(TENANT_SYNC_JOB, t, partition_key=t) for t in bench.tenant_ids]
            )
        with watch.part("orders"):
            runs += bench.runner.run_all(
                [
                    RunRequest(
                        ORDERS_SYNC_JOB, t, tags=tenant_month_range_tags(t, first_month, last_month)
                    )
                    for t in bench.tenant_ids
                ]
            )
        received = {
            asset: int(sum(run.total("rows_received", [asset]) for run in runs))
            for asset in INGESTION_ASSETS
        }
        result.records = sum(received.values())
    sandbox = _sandbox_delta(before, bench.sandbox.stats(), result.wall_seconds)
    bench.echo(f"  ingestion: {result.records:,} records in {result.wall_seconds:.1f} s")
    orders_seconds = watch.seconds["orders"]
    with bench.connect() as conn:
        orders, products, skus, customers, rejects = conn.execute(WAREHOUSE_COUNTS_SQL).fetchone()
    result.details = {
        "parts_seconds": watch.rounded(),
        "records_received": received,
        "orders_per_second": round(received["vtex_orders"] / orders_seconds, 1),
        "sandbox": sandbox,
        "sandbox_ceiling": [
            _serving_ceiling(bench, threads, 3000 if bench.scale.name != "small" else 1000)
            for threads in (1, 8)
        ],
        **_runs_summary(runs),
        "consistency": [
            consistency_check(
                "orders landed == sandbox orders", sum(s.total_orders for s in bench.specs), orders
            ),
            consistency_check(
                "products landed == sandbox products",
                sum(s.products for s in bench.specs),
                products,
            ),
            consistency_check("SKUs landed == sandbox SKUs", _sandbox_sku_count(bench), skus),
            consistency_check(
                "customers landed == sandbox CL records",
                sum(s.customers for s in bench.specs),
                customers,
            ),
            consistency_check("rejects", 0, rejects),
        ],
    }
    return result


# --- stage 3: analytics -------------------------------------------------------------------------


PREDICTIONS_SQL = """
SELECT coalesce(sum(n), 0)::bigint, jsonb_object_agg(model, n)
  FROM (SELECT model, count(*) AS n FROM analytics_python.customer_predictions GROUP BY 1) m
"""


def _all_tenants_run(bench: Bench, job_name: str) -> RunRequest:
    """One run of a tenant job over every tenant (what a backfill of all tenants launches
    under the single-run policy)."""
    keys = bench.instance.get_dynamic_partitions(tenants.name)
    tags = {RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]}
    return RunRequest(job_name, "all tenants", tags=tags)


def _refresh_analytics(bench: Bench, watch: Stopwatch, runs: list[RunRecord]) -> None:
    """What the daily refresh runs: every tenant's dbt models, CLV fit and churn scoring in
    one run, then every audience view."""
    with watch.part("tenant_refresh"):
        runs.append(bench.runner.run(_all_tenants_run(bench, ANALYTICS_JOB)))
    with watch.part("audiences_refresh"):
        runs.append(bench.runner.run(_all_tenants_run(bench, AUDIENCES_JOB)))


def run_analytics(bench: Bench) -> StageResult:
    """The first build of the daily refresh from the staged raw data; then, timed apart, the
    weekly churn holdout's first run. The holdout validates the churn bands (its own job on
    its own schedule): no audience or prediction waits for it, so it is not part of the
    stage's time. (Beside the audiences it took longer: dbt steps run one at a time, pool
    `dbt`, so the two runs only waited on each other.)"""
    watch = Stopwatch()
    runs: list[RunRecord] = []
    with _stage(bench, "analytics") as result:
        _refresh_analytics(bench, watch, runs)
    started = time.perf_counter()
    holdout = bench.runner.run(_all_tenants_run(bench, CHURN_HOLDOUT_JOB))
    holdout_seconds = time.perf_counter() - started
    # What one tenant's refresh costs (the automation's run when only that tenant changed):
    # the largest tenant, its data unchanged since the build, so only dbt's fixed costs, the
    # incremental models' search and the tenant's whole rebuild of its marts remain.
    largest = bench.tenant_ids[0]
    started = time.perf_counter()
    single = bench.runner.run(RunRequest(ANALYTICS_JOB, largest, partition_key=largest))
    single_seconds = time.perf_counter() - started
    with bench.connect() as conn:
        (customers,) = conn.execute("SELECT count(*) FROM marts.customers").fetchone()
        predictions, models = conn.execute(PREDICTIONS_SQL).fetchone()
        (summaries,) = conn.execute(
            "SELECT count(*) FROM intermediate.int_customers__purchase_summary"
        ).fetchone()
        (holdout_rows,) = conn.execute("SELECT count(*) FROM marts.churn_holdout").fetchone()
        (largest_customers,) = conn.execute(
            "SELECT count(*) FROM marts.customers WHERE tenant_id = %s", (largest,)
        ).fetchone()
        bench.echo(
            f"  analytics: {customers:,} customers in {result.wall_seconds:.1f} s"
            f" (weekly churn holdout apart: {holdout_seconds:.1f} s; the largest tenant's"
            f" refresh alone: {single_seconds:.1f} s)"
        )
        started = time.perf_counter()
        clv_rows = [clv_compare.compare_tenant(conn, account) for account in bench.tenant_ids]
    result.records = customers
    result.records_label = "customers"
    result.details = {
        "parts_seconds": watch.rounded(),
        "prediction_rows_by_model": models or {},
        **_runs_summary(runs),
        "churn_holdout": {"seconds": round(holdout_seconds, 3), **_runs_summary([holdout])},
        "largest_tenant_refresh": {
            "tenant_id": largest,
            "customers": largest_customers,
            "seconds": round(single_seconds, 3),
            **_runs_summary([single]),
        },
        "clv_vs_lifetimes": {
            **clv_compare.summarize(clv_rows),
            "wall_seconds": round(time.perf_counter() - started, 3),
            "tenants": clv_rows,
        },
        "consistency": [
            consistency_check(
                "customer_predictions rows == purchase summary rows", summaries, predictions
            ),
            consistency_check("churn holdout rows > 0", True, holdout_rows > 0),
        ],
    }
    return result


# --- stage 4: activation ------------------------------------------------------------------------


def _choose_audiences(bench: Bench, conn: psycopg.Connection) -> dict[str, list[str]]:
    """Per tenant, RFM segments in value order until its share of the Meta target is covered."""
    sizes: dict[str, dict[str, int]] = {}
    for audience, tenant_id, members in conn.execute(
        "SELECT audience, tenant_id, members FROM audiences.audience_catalog"
        " WHERE audience = ANY(%s)",
        (list(RFM_AUDIENCES),),
    ):
        sizes.setdefault(tenant_id, {})[audience] = members
    total = sum(sum(by_audience.values()) for by_audience in sizes.values())
    share = min(1.0, bench.scale.meta_members / total) if total else 0.0
    chosen: dict[str, list[str]] = {}
    for tenant_id in bench.tenant_ids:
        by_audience = sizes.get(tenant_id, {})
        goal = share * sum(by_audience.values())
        picked, covered = [], 0
        for audience in RFM_AUDIENCES:
            if covered >= goal:
                break
            if by_audience.get(audience):
                picked.append(audience)
                covered += by_audience[audience]
        chosen[tenant_id] = picked
    return chosen


def _register_destinations(bench: Bench, chosen: dict[str, list[str]]) -> list[str]:
    platforms = ["meta"] + (["google_data_manager"] if bench.scale.google else [])
    with bench.connect() as conn:
        for index, (tenant_id, audiences) in enumerate(chosen.items()):
            for platform in platforms:
                destination = Destination(
                    f"{tenant_id}_{platform}",
                    tenant_id,
                    platform,
                    bench.meta_accounts[tenant_id]
                    if platform == "meta"
                    else str(3_000_000_001 + index),
                    credential_refs={"access_token": META_TOKEN_REF} if platform == "meta" else {},
                    ad_user_data_consent="GRANTED",
                    ad_personalization_consent="GRANTED",
                    # Every chosen segment goes, however small, so the counts add up.
                    min_audience_size=1,
                )
                add_destination(conn, destination)
                for audience in audiences:
                    add_audience(conn, destination.destination_id, audience)
        conn.commit()
    return platforms


def _platform_members(bench: Bench, platform: str) -> int:
    """Members the platform's sandbox holds, over every tenant's lists."""
    return bench.platforms.members()["meta" if platform == "meta" else "google"]


ASSET_OF_PLATFORM = {
    "meta": meta_custom_audiences.key,
    "google_data_manager": google_customer_match.key,
    "vtex_masterdata": vtex_masterdata_fields.key,
}
ACTIVATION_ASSET = {
    "meta": "meta_custom_audiences",
    "google_data_manager": "google_customer_match",
    "vtex_masterdata": "vtex_masterdata_fields",
}


def _push(bench: Bench, platform: str, run_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One platform's push for every tenant, as the triggers group them: one run per block of
    neighbouring tenants (here, one block)."""
    with bench.connect() as conn:
        tenant_rows = list_tenants(conn, active_only=True)
    blocks = tenant_blocks(bench.instance.get_dynamic_partitions(tenants.name), tenant_rows)
    started = time.perf_counter()
    runs = bench.runner.run_all(
        [
            _as_run(
                activation_push.name,
                block_request(block, "bench", [ASSET_OF_PLATFORM[platform]]),
                run_config,
            )
            for block in blocks
        ]
    )
    seconds = time.perf_counter() - started
    asset = [ACTIVATION_ASSET[platform]]
    totals = {
        name: int(sum(run.total(name, asset) for run in runs))
        for name in ("desired", "added", "removed", "unchanged", "rejected", "pending", "requests")
    }
    return {"seconds": round(seconds, 3), **totals, **_runs_summary(runs)}


# A platform that processes what it acknowledged (Data Manager) confirms it by the sync after its
# verdict; a push that still finds requests pending reads them again. More pushes than this
# means the verdicts never come.
SETTLING_PUSHES = 20
# Per platform, the requests its first push sent (from `since` on: a re-used database holds
# earlier ones) and how long each waited for its verdict: from the acknowledgement (sent_at)
# to the sync that read the verdict (settled_at).
VERDICT_LATENCY_SQL = """
SELECT count(*),
       count(*) FILTER (WHERE r.status = 'pending'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.settled_at - r.sent_at)),
       max(extract(epoch FROM r.settled_at - r.sent_at))
  FROM cdp.destination_requests r
  JOIN cdp.destinations d USING (destination_id)
 WHERE d.platform = %s AND r.sent_at >= %s
"""


def _settle(
    bench: Bench, platform: str, first: dict[str, Any], since: datetime
) -> dict[str, Any] | None:
    """The pushes that read the platform's verdicts on the first push (started at `since`) and
    confirm its members, until none is pending; None for a platform that confirms on
    acknowledgement."""
    if not first["pending"]:
        return None
    pushes: list[dict[str, Any]] = []
    while not pushes or pushes[-1]["pending"]:
        if len(pushes) == SETTLING_PUSHES:
            raise RuntimeError(
                f"{platform}: {pushes[-1]['pending']:,} members still await the platform's"
                f" verdict after {SETTLING_PUSHES} pushes"
            )
        pushes.append(_push(bench, platform))
    with bench.connect() as conn:
        requests_sent, still_pending, p50, latest = conn.execute(
            VERDICT_LATENCY_SQL, (platform, since)
        ).fetchone()
    return {
        "pushes": len(pushes),
        "seconds": round(sum(push["seconds"] for push in pushes), 3),
        "confirmed": first["pending"] - pushes[-1]["pending"],
        "requests": requests_sent,
        "requests_pending": still_pending,
        "verdict_latency_p50_seconds": round(float(p50 or 0), 3),
        "verdict_latency_max_seconds": round(float(latest or 0), 3),
        "sandbox_processing_seconds": GOOGLE_PROCESSING_SECONDS,
    }


def run_activation(bench: Bench) -> StageResult:
    """Per destination: the first push of every tenant's audiences; where the platform gives
    its verdict later (Data Manager), the pushes that read it and confirm the members, timed
    apart with the requests' wait for it; then an unchanged re-sync, with nothing pending."""
    with bench.connect() as conn:
        chosen = _choose_audiences(bench, conn)
    platforms = _register_destinations(bench, chosen)
    pushes: dict[str, dict[str, Any]] = {}
    consistency = []
    with _stage(bench, "activation") as result:
        for platform in platforms:
            since = datetime.now(UTC)
            first = _push(bench, platform)
            settling = _settle(bench, platform, first, since)
            resync = _push(bench, platform)
            pushes[platform] = {"first_push": first, "unchanged_resync": resync}
            settled = ""
            if settling is not None:
                pushes[platform]["settling"] = settling
                settled = (
                    f", {settling['confirmed']:,} confirmed by the verdicts in"
                    f" {settling['seconds']:.1f} s (a request waited"
                    f" {settling['verdict_latency_max_seconds']:.1f} s at most)"
                )
            bench.echo(
                f"  activation {platform}: {first['added']:,} members in {first['seconds']:.1f} s"
                f"{settled}, unchanged re-sync {resync['seconds']:.1f} s"
            )
            consistency += [
                consistency_check(
                    f"{platform}: members in the sandbox == added on first push",
                    first["added"],
                    _platform_members(bench, platform),
                ),
                consistency_check(
                    f"{platform}: unchanged re-sync sends nothing",
                    0,
                    resync["added"] + resync["removed"],
                ),
                consistency_check(
                    f"{platform}: members awaiting a verdict after the re-sync",
                    0,
                    resync["pending"],
                ),
            ]
        result.records = sum(p["first_push"]["added"] for p in pushes.values())
    result.records_label = "members pushed"
    result.details = {
        "audiences_per_tenant": {t: len(a) for t, a in chosen.items()},
        "meta_members_target": bench.scale.meta_members,
        "destinations": pushes,
        "consistency": consistency,
    }
    return result


# --- stage 5: Master Data write-back ------------------------------------------------------------

# VTEX publishes no rate for Master Data document writes: its Master Data reference warns that
# high write volumes trigger throttling, without a figure
# (https://developers.vtex.com/docs/api-reference/masterdata-api), and its limits per account
# and route "vary throughout the day and are not disclosed", a limited request answered 429
# with Retry-After (https://developers.vtex.com/docs/guides/how-to-load-test-a-store). The one
# per-account figure it does publish is 6,000 requests a minute (Get order,
# https://developers.vtex.com/docs/api-reference/orders-api#get-/api/oms/pvt/orders/-orderId-):
# the sandbox holds each account to it for this stage, and the client keeps the platform's
# default pace below it, taken from the account's budget shared with ingestion.
MASTERDATA_REQUESTS_PER_MINUTE = 6_000
MASTERDATA_CLIENT_RATE = 80.0  # VtexResource's default requests per second per account
# The customers the write-back has documents for, as it reads them (masterdata_writeback.py).
CL_DOCUMENTS_SQL = """
SELECT count(*) FROM intermediate.int_identity__customer_keys i
  JOIN marts.customers c USING (tenant_id, customer_key)
 WHERE i.record_id LIKE 'cl:%'
"""


def _masterdata_admin(bench: Bench, account: str) -> str:
    return f"{bench.sandbox.base_url}/_sandbox/{account}/masterdata"


def _add_cl_fields(bench: Bench) -> None:
    """The write-back's default fields on every store's CL entity, as the merchant creates them
    in the Admin (`cdp destinations check` says how)."""
    fields = [(name, "Varchar 50") for name in DEFAULT_FIELDS]
    fields.append((DEFAULT_UPDATED_AT_FIELD, "Date and Time"))
    with requests.Session() as session:
        for account in bench.tenant_ids:
            for name, kind in fields:
                session.post(
                    f"{_masterdata_admin(bench, account)}/fields",
                    json={"name": name, "type": kind},
                    timeout=30,
                ).raise_for_status()


def _cl_written(bench: Bench) -> tuple[int, int]:
    """CL documents holding values a PATCH wrote, and documents a PATCH created, in all stores."""
    documents = created = 0
    with requests.Session() as session:
        for account in bench.tenant_ids:
            reply = session.get(f"{_masterdata_admin(bench, account)}/written", timeout=120)
            reply.raise_for_status()
            written = reply.json()
            documents += len(written["values"])
            created += len(written["created"])
    return documents, created


def _write_back(bench: Bench) -> dict[str, Any]:
    """Every tenant's Master Data destination pushed at the client's default pace, and what the
    sandbox received: requests and PATCH requests (throttled ones included), and 429s."""
    run_config = {
        "resources": {"vtex": {"config": {"requests_per_second": MASTERDATA_CLIENT_RATE}}}
    }
    before = bench.sandbox.stats()["accounts"]
    pushed = _push(bench, "vtex_masterdata", run_config)
    after = bench.sandbox.stats()["accounts"]

    def sent(count: Callable[[dict[str, Any]], int]) -> int:
        return sum(count(after[a]) - count(before[a]) for a in bench.tenant_ids)

    return {
        **pushed,
        "requests_sent": sent(lambda account: account["total"]),
        "patch_requests": sent(lambda account: account["requests"].get("patch_document", 0)),
        "throttled_429": sent(lambda account: account["faults"].get("budget", 0)),
    }


def run_masterdata(bench: Bench) -> StageResult:
    """Every tenant's segment, CLV tier and churn band written to its CL documents, then an
    unchanged re-run, with the sandbox holding each account to its request budget."""
    _add_cl_fields(bench)
    with bench.connect() as conn:
        for tenant_id in bench.tenant_ids:
            destination = Destination(f"{tenant_id}_masterdata", tenant_id, "vtex_masterdata")
            add_destination(conn, destination)
            add_audience(conn, destination.destination_id, MASTERDATA_AUDIENCE)
        conn.commit()
        (documents,) = conn.execute(CL_DOCUMENTS_SQL).fetchone()
    bench.sandbox.set_faults({"requests_per_minute": MASTERDATA_REQUESTS_PER_MINUTE})
    try:
        with _stage(bench, "masterdata") as result:
            first = _write_back(bench)
            rerun = _write_back(bench)
            result.records = first["added"]
    finally:
        bench.sandbox.clear_faults()
    result.records_label = "CL documents written"
    written, created = _cl_written(bench)
    bench.echo(
        f"  masterdata: {first['added']:,} CL documents in {first['seconds']:.1f} s"
        f" ({first['requests_sent']:,} requests, {first['throttled_429']} throttled);"
        f" unchanged re-run {rerun['seconds']:.1f} s, {rerun['patch_requests']} written"
    )
    result.details = {
        "requests_per_minute_per_account": MASTERDATA_REQUESTS_PER_MINUTE,
        "client_requests_per_second": MASTERDATA_CLIENT_RATE,
        "first_write": first,
        "unchanged_rerun": rerun,
        "consistency": [
            consistency_check("CL documents written == customers with one", documents, written),
            consistency_check(
                "CL documents written == added on first write", first["added"], written
            ),
            consistency_check("CL documents created by the write-back", 0, created),
            consistency_check("unchanged re-run writes nothing", 0, rerun["patch_requests"]),
        ],
    }
    return result


# --- stage 6: daily increment -------------------------------------------------------------------

# The increment's orders as landed: the new ones, and the changed ones updated at all (their
# stamp is the increment's), created in the 48 hours before it, and both. Matched by (tenant,
# order id): order ids are the stores' own, and at large scale one store's new id was another's
# old one (45,001 matches for 45,000 new orders by id alone).
INCREMENT_ORDER_ASSETS = ["vtex_orders", "vtex_orders_feed"]
INCREMENT_LANDED_SQL = """
SELECT count(*) FILTER (WHERE increment.is_new),
       count(*) FILTER (WHERE NOT increment.is_new AND change_stamp >= %(at)s),
       count(*) FILTER (WHERE NOT increment.is_new
                          AND creation_date >= %(at)s - interval '48 hours'),
       count(*) FILTER (WHERE NOT increment.is_new AND change_stamp >= %(at)s
                          AND creation_date >= %(at)s - interval '48 hours')
  FROM raw_vtex.orders
  JOIN unnest(%(tenants)s::text[], %(ids)s::text[], %(is_new)s::boolean[])
       AS increment (tenant_id, order_id, is_new) USING (tenant_id, order_id)
"""


def turn_feeds_on(bench: Bench) -> None:
    """The orders feed on for every tenant (`cdp tenants feed --on`), every status change."""
    vtex = VtexResource()
    with bench.connect() as conn:
        for tenant in list_tenants(conn, active_only=True):
            turn_feed_on(conn, vtex.client_for(tenant), tenant.tenant_id, FeedSettings())


def _drain_feeds(bench: Bench) -> list[RunRecord]:
    """What the feed sensor requests, tick after tick, until it requests nothing: a run per
    block of the tenants due (every tenant at first, then those whose last drain found events:
    a run reads at most MAX_LOTS_PER_RUN lots of each feed)."""
    partition_order = bench.instance.get_dynamic_partitions(tenants.name)
    runs: list[RunRecord] = []
    while True:
        with bench.connect() as conn:
            feeds = enabled_feeds(conn)
        requests = feed_block_requests(feeds, partition_order, set(), datetime.now(UTC))
        if not requests:
            return runs
        runs += bench.runner.run_all([_as_run(FEED_SYNC_JOB, request) for request in requests])


def _changes_refreshes(
    bench: Bench, tenant_rows: list[Tenant], since: datetime
) -> list[RunRequest]:
    """What `feed_changes_sensor` requests once the drains landed orders: one refresh of the
    analytics and audiences per block of the tenants whose orders landed since `since` (every
    tenant here, with changed orders in each store)."""
    with bench.connect() as conn:
        landed = {
            tenant_id
            for (tenant_id,) in conn.execute(
                "SELECT DISTINCT tenant_id FROM raw_vtex.orders WHERE synced_at >= %s", (since,)
            )
        }
    order = bench.instance.get_dynamic_partitions(tenants.name)
    return [
        _as_run(CHANGES_JOB, request)
        for request in changes_requests(landed, tenant_rows, order, f"landed-{since:%H%M%S}")
    ]


def run_increment(bench: Bench) -> StageResult:
    """New and changed orders appear in every store, whose orders feed is on; then what
    production runs next: the 48-hour order sync of every tenant (as the twice-daily schedule
    requests it), a drain of every feed (the changes to orders older than 48 hours), the refresh
    of analytics and audiences that the drains' landings request (the chain's, one run for
    the tenants concerned), and activation. Timed from the increment being in the sandbox to
    the last push."""
    plan = dict(zip(bench.tenant_ids, bench.scale.increment(), strict=True))
    turn_feeds_on(bench)
    at = datetime.now(UTC)
    started = time.perf_counter()
    affected: dict[str, tuple[list[str], list[str]]] = {}
    for account, (new, changed) in plan.items():
        ids = bench.sandbox.mutate(account, seed=7, changed=changed, new=new, at=at)
        affected[account] = (ids[:changed], ids[changed:])
    mutate_seconds = time.perf_counter() - started
    watch = Stopwatch()
    runs: list[RunRecord] = []
    with _stage(bench, "increment") as result:
        with bench.connect() as conn:
            tenant_rows = list_tenants(conn, active_only=True)
        with watch.part("orders_sync"):
            runs += bench.runner.run_all(
                [
                    _as_run(ORDERS_SYNC_JOB, sync)
                    for sync in order_sync_requests(
                        tenant_rows,
                        bench.instance.get_dynamic_partitions(tenants.name),
                        datetime.now(UTC),
                    )
                ]
            )
        with watch.part("feed_drain"):
            runs += _drain_feeds(bench)
        with watch.part("refresh"):
            runs += bench.runner.run_all(_changes_refreshes(bench, tenant_rows, at))
        with watch.part("activation"), bench.connect() as conn:
            # What the audience-change sensor requests on its next tick.
            changes = change_requests(
                changed_audiences(conn),
                tenant_rows,
                bench.instance.get_dynamic_partitions(tenants.name),
            )
            runs += bench.runner.run_all([_as_run(activation_push.name, r) for r in changes])
        orders_read = int(
            sum(run.total("rows_received", ["vtex_orders"]) for run in runs)
            + sum(run.total("orders_fetched", ["vtex_orders_feed"]) for run in runs)
        )
        result.records = orders_read
        result.records_label = "orders read"
    bench.echo(f"  increment: {result.wall_seconds:.1f} s from increment to pushed audiences")
    orders_by_kind = [
        (account, order_id, is_new)
        for account, (changed, new) in affected.items()
        for ids, is_new in ((changed, False), (new, True))
        for order_id in ids
    ]
    accounts, ids, is_new = (list(column) for column in zip(*orders_by_kind, strict=True))
    new_count = sum(is_new)
    with bench.connect() as conn:
        (orders,) = conn.execute("SELECT count(*) FROM raw_vtex.orders").fetchone()
        new_landed, changed_seen, changed_in_window, window_seen = conn.execute(
            INCREMENT_LANDED_SQL, {"at": at, "tenants": accounts, "ids": ids, "is_new": is_new}
        ).fetchone()
    activation = [run for run in runs if run.job == activation_push.name]
    assets = list(ACTIVATION_ASSET.values())
    result.details = {
        "new_orders": new_count,
        "changed_orders": len(ids) - new_count,
        "mutate_seconds": round(mutate_seconds, 3),
        "parts_seconds": watch.rounded(),
        "orders_per_second": round(orders_read / watch.seconds["orders_sync"], 1),
        "orders_inserted": int(
            sum(run.total("rows_inserted", INCREMENT_ORDER_ASSETS) for run in runs)
        ),
        "orders_updated": int(
            sum(run.total("rows_updated", INCREMENT_ORDER_ASSETS) for run in runs)
        ),
        "feed_events": int(sum(run.total("feed_events", ["vtex_orders_feed"]) for run in runs)),
        "members_added": int(sum(run.total("added", assets) for run in activation)),
        "members_removed": int(sum(run.total("removed", assets) for run in activation)),
        # Status changes of orders created before the 48-hour window are not re-read by the
        # List sync (VTEX lists by creation date); the orders feed carries them.
        "changed_orders_in_48h_window": changed_in_window,
        "changed_orders_updated": changed_seen,
        **_runs_summary(runs),
        "consistency": [
            consistency_check(
                "orders landed == sandbox orders after the increment",
                sum(s.total_orders for s in bench.specs) + new_count,
                orders,
            ),
            consistency_check("new orders landed", new_count, new_landed),
            consistency_check(
                "changed orders in the 48-hour window updated", changed_in_window, window_seen
            ),
            consistency_check(
                "changed orders updated (List sync and feed)", len(ids) - new_count, changed_seen
            ),
        ],
    }
    return result
