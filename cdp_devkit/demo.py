"""The end-to-end demo: embedded Postgres, the VTEX, Meta and Google sandboxes, three tenants,
every asset from VTEX ingestion to audiences pushed and collections written."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import psycopg

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.jobs import activation_push
from cdp_assets.analytics.jobs import (
    ANALYTICS_JOB,
    AUDIENCES_JOB,
    CHURN_HOLDOUT_JOB,
    all_tenants_tags,
)
from cdp_assets.definitions import defs
from cdp_assets.lib.dagster_home import prepare_dagster_home
from cdp_assets.lib.database import cdp_home
from cdp_assets.lib.migrations import migrated_url
from cdp_assets.ops.jobs import operations_metrics_job
from cdp_assets.partitions import (
    TENANT_PARTITIONS,
    month_start,
    order_months,
    tenant_month_range_tags,
)
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.tenants.sensors import plan_tenant_partitions
from cdp_assets.vtex.jobs import ORDERS_SYNC_JOB, TENANT_SYNC_JOB
from cdp_devkit.sandbox import (
    GoogleSandbox,
    MetaSandbox,
    SandboxProcess,
    StoreSpec,
    credentials_for,
    history_end_today,
)

# The stores hold orders since 2020 and end today. VTEX serves the orders of the last two
# years: the demo syncs this month and the DEMO_MONTHS before it, which lie whole within those
# years whatever the day. The older months show as missing in the UI's partition view: a
# backfill loads what VTEX still serves of them and records the rest unavailable from VTEX,
# whose orders `cdp tenants import-orders` imports from files.
HISTORY_START = date(2020, 1, 1)
DEMO_MONTHS = 22
DEMO_SYNC_FROM = month_start(datetime.now(UTC), DEMO_MONTHS).date()
# A year back, inside the synced months.
BUSY_DAY = (history_end_today() - timedelta(days=365)).date()


@dataclass(frozen=True)
class DemoTenant:
    tenant_id: str
    store: StoreSpec
    priority: int


DEMO_TENANTS = (
    DemoTenant(
        "acme",
        StoreSpec(account="acme", seed=11, customers=600, orders=2_000, products=120),
        priority=10,
    ),
    DemoTenant(
        "globex",
        StoreSpec(account="globex", seed=22, customers=2_500, orders=8_000, products=400),
        priority=20,
    ),
    # The largest one has a day with more orders than one VTEX list query can return.
    DemoTenant(
        "initech",
        StoreSpec(
            account="initech",
            seed=33,
            customers=5_000,
            orders=16_000,
            products=800,
            busy_day=BUSY_DAY,
            busy_day_orders=3_400,
        ),
        priority=30,
    ),
)


def demo_store_args() -> list[str]:
    """The demo stores as `--store` arguments of the sandbox command."""
    return [arg for demo in DEMO_TENANTS for arg in ("--store", demo.store.to_cli())]


def credential_refs(tenant_id: str) -> tuple[str, str]:
    prefix = f"VTEX_{tenant_id.upper()}"
    return f"{prefix}_APP_KEY", f"{prefix}_APP_TOKEN"


def register_demo_tenants(conn: psycopg.Connection, sandbox: SandboxProcess) -> list[Tenant]:
    """Register the demo tenants against the sandbox; their secrets go to this process's env."""
    os.environ["VTEX_BASE_URL_TEMPLATE"] = sandbox.base_url + "/{account}"
    # The sandbox is ours to load; VTEX's own limit does not apply on loopback.
    os.environ.setdefault("VTEX_REQUESTS_PER_SECOND", "5000")
    os.environ.setdefault("VTEX_COLLECTION_WRITES_PER_SECOND", "100")
    registered = []
    for demo in DEMO_TENANTS:
        key_ref, token_ref = credential_refs(demo.tenant_id)
        os.environ[key_ref], os.environ[token_ref] = credentials_for(demo.store.account)
        tenant = Tenant(
            demo.tenant_id,
            demo.store.account,
            key_ref,
            token_ref,
            priority=demo.priority,
            history_start=HISTORY_START,
        )
        add_tenant(conn, tenant)
        registered.append(tenant)
    conn.commit()
    return registered


DEMO_META_ACCOUNT = "1000000001"
DEMO_GOOGLE_CUSTOMER = "1234567890"
META_TOKEN_REF = "META_DEMO_ACCESS_TOKEN"
GOOGLE_TOKEN_REF = "GOOGLE_ADS_DEMO_DEVELOPER_TOKEN"
META_DEMO_TOKEN = "demo-meta-token"  # what the Meta sandbox accepts; not a real secret
BEST_SELLERS = {"audience": "audience_rfm_champions", "rank_by": "revenue", "days": 730}
WIN_BACK = {"audience": "audience_rfm_at_risk", "rank_by": "buyers", "days": 730, "top_n": 30}
# (destination, audiences or collection rules): each tenant uses a different mix.
DEMO_DESTINATIONS: dict[str, list[tuple[str, list[str] | dict[str, dict[str, Any]]]]] = {
    "acme": [
        ("meta", ["audience_rfm_champions", "audience_high_clv", "audience_win_back"]),
        ("vtex_collections", {"champions_best_sellers": BEST_SELLERS}),
    ],
    "globex": [
        ("meta", ["audience_rfm_champions", "audience_rfm_at_risk", "audience_high_churn_risk"]),
        ("google_data_manager", ["audience_rfm_loyal_customers", "audience_high_clv"]),
        ("vtex_collections", {"win_back_picks": WIN_BACK}),
    ],
    "initech": [
        ("google_ads", ["audience_rfm_champions", "audience_rfm_cant_lose_them"]),
        ("meta", ["audience_rfm_loyal_customers", "audience_new_customers"]),
    ],
}


def demo_sandboxes() -> contextlib.ExitStack:
    """Meta and Google sandboxes in this process; runs find them through the environment."""
    stack = contextlib.ExitStack()
    meta = stack.enter_context(MetaSandbox({META_DEMO_TOKEN: [DEMO_META_ACCOUNT]}))
    google = stack.enter_context(GoogleSandbox())
    os.environ["META_GRAPH_URL"] = meta.graph_url
    os.environ["GOOGLE_SANDBOX_ADDRESS"] = google.address
    os.environ[META_TOKEN_REF] = META_DEMO_TOKEN
    os.environ[GOOGLE_TOKEN_REF] = "demo-developer-token"
    return stack


def register_demo_destinations(conn: psycopg.Connection) -> None:
    for tenant_id, destinations in DEMO_DESTINATIONS.items():
        for platform, audiences in destinations:
            destination = Destination(
                f"{tenant_id}_{platform}",
                tenant_id,
                platform,
                {"meta": DEMO_META_ACCOUNT, "vtex_collections": ""}.get(
                    platform, DEMO_GOOGLE_CUSTOMER
                ),
                credential_refs={
                    "meta": {"access_token": META_TOKEN_REF},
                    "google_ads": {"developer_token": GOOGLE_TOKEN_REF},
                }.get(platform, {}),
                ad_user_data_consent="GRANTED",
                ad_personalization_consent="GRANTED",
                # acme is small: a lower floor than the default 100 lets its audiences go.
                min_audience_size={"vtex_collections": 1}.get(
                    platform, 25 if tenant_id == "acme" else 100
                ),
            )
            add_destination(conn, destination)
            rules = audiences if isinstance(audiences, dict) else dict.fromkeys(audiences, {})
            for audience, params in rules.items():
                add_audience(conn, destination.destination_id, audience, params)
    conn.commit()


def sync_tenant_partitions(instance: dg.DagsterInstance, conn: psycopg.Connection) -> list[str]:
    """What the tenant sensor does on a tick, applied at once."""
    existing = set(instance.get_dynamic_partitions(TENANT_PARTITIONS))
    added, removed, _ = plan_tenant_partitions(conn, existing)
    if added:
        instance.add_dynamic_partitions(TENANT_PARTITIONS, added)
    for key in removed:
        instance.delete_dynamic_partition(TENANT_PARTITIONS, key)
    return sorted((existing | set(added)) - set(removed))


def order_range_tags(tenant: Tenant) -> dict[str, str]:
    """One run over the demo's months of a tenant, as a backfill from the UI would do."""
    start = datetime.combine(max(tenant.history_start, DEMO_SYNC_FROM), datetime.min.time(), UTC)
    last = order_months.get_last_partition_key()
    assert last is not None  # monthly partitions from 2020 on
    return tenant_month_range_tags(
        tenant.tenant_id, order_months.get_partition_key_for_timestamp(start.timestamp()), last
    )


# The demo prints its own progress; Dagster's per-event console lines would drown it.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_job(
    instance: dg.DagsterInstance,
    job_name: str,
    label: str,
    echo: Callable[[str], None],
    **run: Any,
) -> None:
    started = time.monotonic()
    # dbt's own console lines go to a file; the run's events are in Dagster either way.
    with open(cdp_home() / "demo-output.log", "a") as log, contextlib.redirect_stdout(log):
        result = defs.resolve_job_def(job_name).execute_in_process(
            instance=instance, run_config=QUIET, raise_on_error=False, **run
        )
    if not result.success:
        raise RuntimeError(
            f"{job_name} failed ({label}); see run {result.run_id} in `cdp dev` or"
            f" {cdp_home() / 'demo-output.log'}"
        )
    echo(f"  {label}: {job_name} done in {time.monotonic() - started:.1f} s")


def materialize_tenant(
    instance: dg.DagsterInstance, tenant: Tenant, echo: Callable[[str], None]
) -> float:
    """Sync a tenant's VTEX assets and refresh its analytics; returns the seconds taken."""
    started = time.monotonic()
    tenant_id = tenant.tenant_id
    run_job(instance, TENANT_SYNC_JOB, tenant_id, echo, partition_key=tenant_id)
    run_job(instance, ORDERS_SYNC_JOB, tenant_id, echo, tags=order_range_tags(tenant))
    run_job(instance, ANALYTICS_JOB, tenant_id, echo, partition_key=tenant_id)
    # Weekly in production (churn_holdout_weekly): the check of the churn bands.
    run_job(instance, CHURN_HOLDOUT_JOB, tenant_id, echo, partition_key=tenant_id)
    return time.monotonic() - started


INGESTION_SQL = """
SELECT t.tenant_id,
       (SELECT count(*) FROM raw_vtex.orders o WHERE o.tenant_id = t.tenant_id),
       (SELECT count(*) FROM raw_vtex.products p WHERE p.tenant_id = t.tenant_id),
       (SELECT count(*) FROM raw_vtex.skus s WHERE s.tenant_id = t.tenant_id),
       (SELECT count(*) FROM raw_vtex.customers c WHERE c.tenant_id = t.tenant_id),
       (SELECT count(*) FROM raw_vtex.rejects r WHERE r.tenant_id = t.tenant_id)
  FROM cdp.tenants t WHERE t.tenant_id = ANY(%s) ORDER BY t.priority
"""
CLV_SQL = """
SELECT tenant_id, string_agg(DISTINCT model, ','), count(*),
       sum(clv_1y), sum(clv_3y), sum(clv_5y)
  FROM analytics_python.customer_predictions WHERE tenant_id = ANY(%s) GROUP BY 1 ORDER BY 1
"""
ACTIVATION_SQL = """
SELECT DISTINCT ON (destination_id, audience) destination_id, audience, status, added, removed,
       unchanged, rejected, coalesce(reason, match_info::text)
  FROM cdp.activation_runs WHERE tenant_id = ANY(%s)
 ORDER BY destination_id, audience, activation_run_id DESC
"""
HOLDOUT_SQL = """
SELECT tenant_id, churn_band, round(100 * avg(repurchased::integer)), count(*)
  FROM marts.churn_holdout WHERE tenant_id = ANY(%s)
 GROUP BY 1, 2 ORDER BY 1, array_position(ARRAY['low', 'medium', 'high', 'lost'], churn_band)
"""
SEGMENTS_SQL = """
SELECT tenant_id, segment, count(*) FROM marts.rfm_segments
 WHERE tenant_id = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 3 DESC
"""


def print_summary(
    conn: psycopg.Connection,
    tenant_ids: list[str],
    seconds: dict[str, float],
    echo: Callable[[str], None],
) -> None:
    echo("")
    echo(
        f"{'tenant':<10}{'orders':>9}{'products':>10}{'skus':>8}{'customers':>11}"
        f"{'rejects':>9}{'seconds':>9}"
    )
    for tenant_id, *counts in conn.execute(INGESTION_SQL, (tenant_ids,)).fetchall():
        echo(
            f"{tenant_id:<10}{counts[0]:>9}{counts[1]:>10}{counts[2]:>8}{counts[3]:>11}"
            f"{counts[4]:>9}{seconds[tenant_id]:>9.1f}"
        )
    echo("")
    echo(f"{'tenant':<10}{'model':<20}{'buyers':>8}{'CLV 1y':>14}{'CLV 3y':>14}{'CLV 5y':>14}")
    for tenant_id, model, buyers, *values in conn.execute(CLV_SQL, (tenant_ids,)).fetchall():
        echo(f"{tenant_id:<10}{model:<20}{buyers:>8}" + "".join(f"{v:>14,.2f}" for v in values))
    echo("")
    segments: dict[str, list[str]] = {}
    for tenant_id, segment, count in conn.execute(SEGMENTS_SQL, (tenant_ids,)).fetchall():
        segments.setdefault(tenant_id, []).append(f"{segment} {count}")
    for tenant_id in tenant_ids:
        echo(f"{tenant_id:<10}" + (", ".join(segments.get(tenant_id, [])) or "no segments"))
    echo("")
    echo("churn holdout: share of each band (as of 180 days ago) that bought again since")
    bands: dict[str, list[str]] = {}
    for tenant_id, band, percent, count in conn.execute(HOLDOUT_SQL, (tenant_ids,)).fetchall():
        bands.setdefault(tenant_id, []).append(f"{band} {percent}% of {count}")
    for tenant_id in tenant_ids:
        echo(f"{tenant_id:<10}" + (", ".join(bands.get(tenant_id, [])) or "no customers"))


def print_activation(
    conn: psycopg.Connection, tenant_ids: list[str], echo: Callable[[str], None]
) -> None:
    echo("")
    echo(
        f"{'destination':<30}{'audience':<32}{'status':<9}{'added':>7}{'removed':>8}"
        f"{'unchanged':>10}{'rejected':>9}  details"
    )
    for destination, audience, status, *counts, details in conn.execute(
        ACTIVATION_SQL, (tenant_ids,)
    ).fetchall():
        echo(
            f"{destination:<30}{audience:<32}{status:<9}{counts[0]:>7}{counts[1]:>8}"
            f"{counts[2]:>10}{counts[3]:>9}  {details[:90]}"
        )


def run_demo(echo: Callable[[str], None] = print) -> None:
    started = time.monotonic()
    url = migrated_url()
    prepare_dagster_home(url)
    echo(f"warehouse: {url.split('@')[-1]}")
    with SandboxProcess([d.store for d in DEMO_TENANTS]) as sandbox, demo_sandboxes():
        echo(f"VTEX sandbox on {sandbox.base_url}; Meta and Google sandboxes on loopback")
        with psycopg.connect(url) as conn:
            registered = register_demo_tenants(conn, sandbox)
            register_demo_destinations(conn)
            instance = dg.DagsterInstance.get()
            partitions = sync_tenant_partitions(instance, conn)
            echo(f"tenant partitions: {', '.join(partitions)}")
            seconds = {t.tenant_id: materialize_tenant(instance, t, echo) for t in registered}
            run_job(instance, AUDIENCES_JOB, "all tenants", echo, tags=all_tenants_tags(instance))
            for tenant in registered:
                run_job(
                    instance,
                    activation_push.name,
                    tenant.tenant_id,
                    echo,
                    partition_key=tenant.tenant_id,
                )
            # What `cdp status --check` and the health endpoint judge the platform by.
            run_job(instance, operations_metrics_job.name, "platform", echo)
            tenant_ids = [t.tenant_id for t in registered]
            print_summary(conn, tenant_ids, seconds, echo)
            print_activation(conn, tenant_ids, echo)
    echo(f"done in {time.monotonic() - started:.1f} s")
