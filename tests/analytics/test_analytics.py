"""Analytics end to end: sandbox -> VTEX assets -> dbt models, CLV fit, churn, audiences,
and on to the activation assets."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import dagster as dg
import psycopg
import pytest
import requests
from dagster._core.definitions.reconstruct import ReconstructableRepository
from psycopg.types.json import Jsonb
from support import (
    HISTORY_START,
    assert_bands_rank_repurchase,
    dbt_build,
    holdout_repurchase_rates,
    import_unavailable_orders,
    months_ago,
    register,
    run_dbt,
    sync,
    vtex_for,
)

from cdp_assets.activation.destinations import Destination, add_audience, add_destination
from cdp_assets.activation.meta.assets import meta_custom_audiences
from cdp_assets.activation.meta.resources import MetaResource
from cdp_assets.activation.push_requests import changed_audiences
from cdp_assets.activation.vtex_collections.assets import vtex_product_collections
from cdp_assets.activation.vtex_collections.rules import collection_skus
from cdp_assets.analytics.assets import (
    AS_OF_ENV,
    RUN_VARS_ENV,
    as_of_day,
    customer_predictions,
    dbt_audiences,
    dbt_churn_holdout,
    dbt_holdout_summary,
    dbt_tenant_models,
    dbt_tenant_scoring,
    dbt_vars,
    holdout_predictions,
)
from cdp_assets.analytics.checks import audience_sizes_within_bounds
from cdp_assets.analytics.dbt_files import (
    DBT_EXECUTABLE,
    DBT_PROJECT_DIR,
    MANIFEST_PATH,
    project_files,
)
from cdp_assets.analytics.dbt_project import dbt_resource, ensure_manifest
from cdp_assets.analytics.jobs import ANALYTICS_JOB, all_tenants_tags
from cdp_assets.analytics.prediction_refresh import SUMMARY_MODEL, fit_and_replace
from cdp_assets.framework.dbt_fork import PARTIAL_PARSE
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.partitions import RANGE_END_TAG, RANGE_START_TAG
from cdp_devkit.sandbox import MetaSandbox, SandboxProcess, StoreSpec, credentials_for

SEGMENTS = {
    "Champions",
    "Loyal Customers",
    "Potential Loyalist",
    "New Customers",
    "Promising",
    "Need Attention",
    "About To Sleep",
    "At Risk",
    "Can't Lose Them",
    "Hibernating",
    "Lost",
}
# A store large enough for the BG/NBD fit, and one too small for a fit or for segments. The big
# one's history reaches back almost four years, its older half imported from files.
BIG = StoreSpec(
    account="bigshop",
    seed=7,
    customers=1500,
    orders=6000,
    products=80,
    history_start=months_ago(47),
)
TINY = StoreSpec(
    account="tinyshop", seed=8, customers=12, orders=30, products=10, history_start=HISTORY_START
)
TENANTS = {"an_big": BIG, "an_tiny": TINY}
# The big store again, as its own tenant, whose churn_risk the holdout test rebuilds as of
# the holdout's calibration date.
HOLDOUT_TENANT = "an_holdout"
# The daily refresh, and with it the weekly churn holdout.
DAILY_ASSETS = [dbt_tenant_models, customer_predictions, dbt_tenant_scoring]
TENANT_ASSETS = [*DAILY_ASSETS, dbt_holdout_summary, holdout_predictions, dbt_churn_holdout]


def resources() -> dict:
    return {"dbt": dbt_resource(), "warehouse": WarehouseResource()}


def refresh_tenant(
    instance: dg.DagsterInstance,
    tenant_id: str,
    assets: list[dg.AssetsDefinition] = DAILY_ASSETS,
) -> dg.ExecuteInProcessResult:
    """One tenant's daily refresh (the holdout too with `assets=TENANT_ASSETS`)."""
    return dg.materialize(
        assets,
        partition_key=tenant_id,
        instance=instance,
        resources=resources(),
    )


@pytest.fixture(scope="module", autouse=True)
def one_as_of_day():
    """Every build of the module is as of one day, even when the module runs across
    midnight (UTC): several tests compare builds made minutes apart."""
    with temporary_environment({AS_OF_ENV: as_of_day()}):
        yield


def test_the_as_of_day_can_be_pinned_and_is_checked():
    with temporary_environment({AS_OF_ENV: "2024-02-29"}):
        assert json.loads(dbt_vars(["an_big"])) == {"as_of": "2024-02-29", "tenant_id": ["an_big"]}
    with temporary_environment({AS_OF_ENV: "29/02/2024"}), pytest.raises(ValueError, match="YYYY"):
        dbt_vars(None)


@pytest.fixture(scope="module")
def analytics(warehouse_url, instance, tmp_path_factory):
    """Both tenants ingested (what VTEX no longer serves imported from files) and analysed,
    audiences refreshed; the per-tenant results."""
    import psycopg

    results = {}
    files = tmp_path_factory.mktemp("older-orders")
    with SandboxProcess(list(TENANTS.values())) as sandbox, psycopg.connect(warehouse_url) as conn:
        for tenant_id, spec in {**TENANTS, HOLDOUT_TENANT: BIG}.items():
            register(conn, tenant_id, spec.account, history_start=spec.history_start)
            sync(instance, sandbox, tenant_id)
            import_unavailable_orders(conn, sandbox, tenant_id, spec.account, files)
    for tenant_id in TENANTS:
        results[tenant_id] = refresh_tenant(instance, tenant_id, TENANT_ASSETS)
    results["audiences"] = dg.materialize(
        [dbt_audiences], instance=instance, resources=resources(), tags=all_tenants_tags(instance)
    )
    return results


def materialization(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    for event in result.get_asset_materialization_events():
        if event.asset_key == dg.AssetKey(asset):
            return {k: v.value for k, v in event.materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")


def test_customers_and_segments_per_tenant(analytics, conn):
    (big_customers,) = conn.execute(
        "SELECT count(*) FROM marts.customers WHERE tenant_id = 'an_big'"
    ).fetchone()
    assert big_customers > 100
    segments = dict(
        conn.execute(
            "SELECT segment, count(*) FROM marts.rfm_segments WHERE tenant_id = 'an_big' GROUP BY 1"
        ).fetchall()
    )
    assert set(segments) <= SEGMENTS and len(segments) >= 6
    assert sum(segments.values()) == big_customers
    # Too few customers for quintiles: no segments rather than noise.
    (tiny_segmented,) = conn.execute(
        "SELECT count(*) FROM marts.rfm_segments WHERE tenant_id = 'an_tiny'"
    ).fetchone()
    assert tiny_segmented == 0
    meta = materialization(analytics["an_big"], "rfm_segments")
    assert sum(v for k, v in meta.items() if k.startswith("segment_size/")) == big_customers
    largest = max(segments, key=segments.get)
    assert f"{largest} " in meta["segment_chart"] and "█" in meta["segment_chart"]


def test_the_fit_where_data_allows_and_the_fallback_where_not(analytics, conn):
    models = dict(
        conn.execute(
            "SELECT tenant_id, string_agg(DISTINCT model, ',')"
            " FROM analytics_python.customer_predictions"
            " WHERE tenant_id IN ('an_big', 'an_tiny') GROUP BY 1"
        ).fetchall()
    )
    assert models == {"an_big": "bgnbd_gamma_gamma", "an_tiny": "heuristic"}
    big = materialization(analytics["an_big"], "customer_predictions")
    assert big["bgnbd_r"] > 0 and big["gg_q"] > 1 and big["clv_1y_total"] > 0
    tiny = materialization(analytics["an_tiny"], "customer_predictions")
    assert "repeat customers" in tiny["fallback_reason"]
    (bad,) = conn.execute(
        "SELECT count(*) FROM analytics_python.customer_predictions"
        " WHERE p_alive NOT BETWEEN 0 AND 1 OR clv_1y < 0 OR clv_3y < clv_1y OR clv_5y < clv_3y"
    ).fetchone()
    assert bad == 0


def test_a_tenant_whose_predictions_fail_to_land_stops_the_run_keeping_the_tenants_done(
    analytics, conn, warehouse_url
):
    """A tenant's failed write fails the run before the next tenant is written, and the
    tenants written before it stay."""
    table = "analytics_python.predictions_refusing_an_tiny"
    conn.execute(
        f"CREATE TABLE {table} (LIKE analytics_python.customer_predictions INCLUDING ALL,"
        " CHECK (tenant_id <> 'an_tiny'))"
    )
    conn.commit()
    tenant_ids = ["an_big", "an_tiny", "an_unknown"]
    with (
        psycopg.connect(warehouse_url) as reader,
        psycopg.connect(warehouse_url) as writer,
        pytest.raises(psycopg.errors.CheckViolation),
    ):
        fit_and_replace(reader, writer, SUMMARY_MODEL, table, tenant_ids, False)
    landed = conn.execute(f"SELECT tenant_id, count(*) FROM {table} GROUP BY 1").fetchall()
    (big_customers,) = conn.execute(
        f"SELECT count(*) FROM intermediate.{SUMMARY_MODEL} WHERE tenant_id = 'an_big'"
    ).fetchone()
    assert big_customers > 0
    assert landed == [("an_big", big_customers)]


def test_churn_bands_cover_every_customer(analytics, conn):
    rows = dict(
        conn.execute(
            "SELECT churn_band, count(*) FROM marts.churn_risk"
            " WHERE tenant_id = 'an_big' GROUP BY 1"
        ).fetchall()
    )
    (customers,) = conn.execute(
        "SELECT count(*) FROM marts.customers WHERE tenant_id = 'an_big'"
    ).fetchone()
    assert set(rows) <= {"low", "medium", "high", "lost"} and sum(rows.values()) == customers


def test_audiences_hold_only_hashes_of_their_own_tenant(analytics, conn):
    audiences = conn.execute(
        "SELECT audience, tenant_id, members FROM audiences.audience_catalog"
    ).fetchall()
    assert {a for a, _, _ in audiences} >= {"audience_rfm_champions", "audience_high_churn_risk"}
    for audience, tenant_id, members in audiences:
        rows = conn.execute(
            f"SELECT count(*), count(*) FILTER (WHERE email_sha256 !~ '^[0-9a-f]{{64}}$'),"
            f" count(*) FILTER (WHERE customer_key NOT IN"
            f"   (SELECT customer_key FROM marts.customers c WHERE c.tenant_id = a.tenant_id))"
            f" FROM audiences.{audience} a WHERE tenant_id = %s",
            (tenant_id,),
        ).fetchone()
        assert rows == (members, 0, 0), audience
    # Every hashed e-mail of a tenant's audiences is the hash of one of its own customers' e-mails.
    (foreign,) = conn.execute(
        """
        SELECT count(*) FROM audiences.audience_rfm_champions a
         WHERE a.email_sha256 IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM marts.customers c
                WHERE c.tenant_id = a.tenant_id
                  AND encode(sha256(convert_to(c.email, 'UTF8')), 'hex') = a.email_sha256)
        """
    ).fetchone()
    assert foreign == 0


def test_dbt_unit_tests_pass(analytics, warehouse_url):
    """The SQL's own unit tests (RFM table, purchase statuses, identity rules, e-mail and
    phone normalization, churn bands), which scheduled runs skip."""
    output = run_dbt(warehouse_url, "test", "--select", "test_type:unit")
    assert "ERROR=0" in output and "PASS=0" not in output


def test_dbt_sessions_run_without_jit_and_keep_the_users_own_options(
    analytics, warehouse_url, monkeypatch
):
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=123456")
    output = run_dbt(
        warehouse_url,
        "show",
        "--inline",
        "select current_setting('jit') as jit, current_setting('work_mem') as work_mem,"
        " current_setting('statement_timeout') as statement_timeout",
        "--output",
        "json",
        "--log-format",
        "text",
    )
    shown = json.loads(output[output.index("{") : output.rindex("}") + 1])["show"]
    assert shown == [{"jit": "off", "work_mem": "64MB", "statement_timeout": "123456ms"}]


def test_refreshing_one_tenant_leaves_the_others_untouched(analytics, conn, instance):
    def fingerprint() -> tuple:
        return conn.execute(
            "SELECT md5(string_agg(s::text, '' ORDER BY customer_key)) FROM marts.rfm_segments s"
            " WHERE tenant_id = 'an_big'"
        ).fetchone()

    before = fingerprint()
    refresh_tenant(instance, "an_tiny")
    assert fingerprint() == before


IDENTITY_ROWS_SQL = "SELECT record_id, xmin::text FROM intermediate.{} WHERE tenant_id = 'an_big'"
# Without built_at: when a run built a row is all that may differ from a full rebuild.
IDENTITY_SQL = """
    SELECT to_jsonb(r) - 'built_at', k.customer_key FROM intermediate.int_identity__records r
      JOIN intermediate.int_identity__customer_keys k USING (tenant_id, record_id)
     WHERE r.tenant_id = 'an_big' ORDER BY r.record_id
"""
PROFILES_SQL = """
    SELECT to_jsonb(p) - 'built_at' FROM intermediate.int_customers__profiles p
     WHERE p.tenant_id = 'an_big' ORDER BY p.customer_key
"""
# Less the bookkeeping of a rebuild: when and from whom an order was taken.
PURCHASES_SQL = """
    SELECT to_jsonb(p) - 'built_at' - 'replaced_customer_key'
      FROM intermediate.int_orders__purchases p
     WHERE p.tenant_id = 'an_big' ORDER BY p.order_id
"""
PURCHASE_ROWS_SQL = (
    "SELECT order_id, xmin::text FROM intermediate.int_orders__purchases WHERE tenant_id = 'an_big'"
)
PROFILE_ROWS_SQL = (
    "SELECT customer_key, xmin::text FROM intermediate.int_customers__profiles"
    " WHERE tenant_id = 'an_big'"
)
# Each buyer's latest order (the one its record takes its keys from), with its customer.
LATEST_ORDERS_SQL = """
    SELECT DISTINCT ON (o.user_profile_id) o.order_id, o.user_profile_id, k.customer_key
      FROM staging.stg_vtex__orders o
      JOIN intermediate.int_identity__customer_keys k
        ON k.tenant_id = o.tenant_id AND k.record_id = 'profile:' || o.user_profile_id
     WHERE o.tenant_id = 'an_big'
     ORDER BY o.user_profile_id, o.created_at DESC, o.order_id DESC
"""
EDIT_PROFILE_SQL = """
    UPDATE raw_vtex.orders SET payload = {edit}, summary = {summary}, synced_at = clock_timestamp()
     WHERE tenant_id = 'an_big' AND order_id = %(order_id)s
"""


def _rewritten(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {record for record, version in after.items() if before.get(record) != version}


def test_identity_refresh_resolves_only_the_customers_a_change_touches(
    analytics, conn, instance, warehouse_url
):
    """An order taking another customer's document merges the two customers; an order losing
    its userProfileId becomes a guest record of its own. The refresh rewrites only the rows
    of the records, customers and orders concerned, and leaves both identity tables, the
    customers' profiles and the purchases exactly as a full rebuild would."""
    customers: dict[str, tuple[str, str]] = {}
    for order_id, profile, customer_key in conn.execute(LATEST_ORDERS_SQL):
        customers.setdefault(customer_key, (order_id, profile))
    (merged_key, (merged, merged_profile)), (donor_key, (donor, donor_profile)), (_, (guest, _)) = (
        list(customers.items())[:3]
    )
    originals = conn.execute(
        "SELECT order_id, payload, summary FROM raw_vtex.orders"
        " WHERE tenant_id = 'an_big' AND order_id = ANY(%s)",
        ([merged, guest],),
    ).fetchall()
    versions = {
        table: dict(conn.execute(IDENTITY_ROWS_SQL.format(table)).fetchall())
        for table in ("int_identity__records", "int_identity__customer_keys")
    }
    profile_versions = dict(conn.execute(PROFILE_ROWS_SQL).fetchall())
    purchase_versions = dict(conn.execute(PURCHASE_ROWS_SQL).fetchall())
    take_document = (
        "jsonb_set({column}, '{{clientProfileData,document}}', (SELECT payload -> "
        "'clientProfileData' -> 'document' FROM raw_vtex.orders WHERE tenant_id = 'an_big'"
        " AND order_id = %(donor)s))"
    )
    drop_profile = "{column} #- '{{clientProfileData,userProfileId}}'"
    try:
        for edit, order_id in ((take_document, merged), (drop_profile, guest)):
            conn.execute(
                EDIT_PROFILE_SQL.format(
                    edit=edit.format(column="payload"), summary=edit.format(column="summary")
                ),
                {"order_id": order_id, "donor": donor},
            )
        conn.commit()
        assert refresh_tenant(instance, "an_big").success
        conn.commit()  # a fresh snapshot
        keys = dict(
            conn.execute(
                "SELECT record_id, customer_key FROM intermediate.int_identity__customer_keys"
                " WHERE tenant_id = 'an_big'"
            ).fetchall()
        )
        # Two customers before (they were picked so), one now.
        assert keys[f"profile:{merged_profile}"] == keys[f"profile:{donor_profile}"]
        assert f"order:{guest}" in keys
        rewritten_records = _rewritten(
            versions["int_identity__records"],
            dict(conn.execute(IDENTITY_ROWS_SQL.format("int_identity__records")).fetchall()),
        )
        rewritten_keys = _rewritten(
            versions["int_identity__customer_keys"],
            dict(conn.execute(IDENTITY_ROWS_SQL.format("int_identity__customer_keys")).fetchall()),
        )
        assert {f"profile:{merged_profile}", f"order:{guest}"} <= rewritten_records
        assert len(rewritten_records) <= 3
        assert {f"profile:{merged_profile}", f"order:{guest}"} <= rewritten_keys
        assert len(rewritten_keys) < len(keys) / 20
        # One profile per customer, the merged-away customer's deleted; only the profiles of
        # the customers concerned rebuilt.
        profiles = dict(conn.execute(PROFILE_ROWS_SQL).fetchall())
        assert set(profiles) == set(keys.values())
        assert len({merged_key, donor_key} & set(profiles)) == 1
        rewritten_profiles = _rewritten(profile_versions, profiles)
        assert keys[f"profile:{merged_profile}"] in rewritten_profiles
        assert keys[f"order:{guest}"] in rewritten_profiles
        assert len(rewritten_profiles) < len(profiles) / 20
        # The orders of the merged customer (some changed customer_key) and the guest order
        # rebuilt; the other customers' orders kept as they were.
        purchases = dict(
            conn.execute(
                "SELECT order_id, customer_key FROM intermediate.int_orders__purchases"
                " WHERE tenant_id = 'an_big'"
            ).fetchall()
        )
        rewritten_purchases = _rewritten(
            purchase_versions, dict(conn.execute(PURCHASE_ROWS_SQL).fetchall())
        )
        merged_orders = {o for o, k in purchases.items() if k == keys[f"profile:{merged_profile}"]}
        assert merged in merged_orders
        assert merged_orders | {guest} <= rewritten_purchases
        assert len(rewritten_purchases) < len(purchases) / 20
        incremental = conn.execute(IDENTITY_SQL).fetchall()
        incremental_profiles = conn.execute(PROFILES_SQL).fetchall()
        incremental_purchases = conn.execute(PURCHASES_SQL).fetchall()
        conn.commit()  # the full refresh replaces the tables: no read may hold them
        run_dbt(
            warehouse_url,
            "run",
            "--full-refresh",
            "--select",
            "int_identity__records int_identity__customer_keys int_customers__profiles"
            " int_orders__purchases",
        )
        conn.commit()
        assert conn.execute(IDENTITY_SQL).fetchall() == incremental
        assert conn.execute(PROFILES_SQL).fetchall() == incremental_profiles
        assert conn.execute(PURCHASES_SQL).fetchall() == incremental_purchases
    finally:
        for order_id, payload, summary in originals:
            conn.execute(
                "UPDATE raw_vtex.orders SET payload = %s, summary = %s,"
                " synced_at = clock_timestamp() WHERE tenant_id = 'an_big' AND order_id = %s",
                (Jsonb(payload), Jsonb(summary), order_id),
            )
        conn.commit()
        assert refresh_tenant(instance, "an_big").success


def test_customers_keep_one_index_by_tenant_and_key_through_refreshes(analytics, conn, instance):
    """The activation reads members joined to `customers` by (tenant_id, customer_key): the
    index is there after the first build and stays one index after every refresh."""
    index_sql = (
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'marts' AND tablename = 'customers'"
    )
    assert refresh_tenant(instance, "an_tiny").success
    conn.commit()  # a fresh snapshot
    (definition,) = [row for (row,) in conn.execute(index_sql)]
    assert definition.endswith("(tenant_id, customer_key)")


KEYED_TABLE = "intermediate.int_orders__purchases"
KEY_TEST = "keyed_rows_int_orders__purchases"


def test_a_keyed_tables_uniqueness_test_reads_nothing_while_its_key_holds(
    analytics, conn, warehouse_url, tmp_path
):
    """The purchases keep (tenant_id, order_id) as their key: a unique index, both columns NOT
    NULL. Their test then does not group the rows; without the NOT NULL, a unique index lets
    repeated NULL keys through, and the test groups the rows and finds them."""
    not_null = conn.execute(
        "SELECT array_agg(attname::text ORDER BY attname) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnotnull AND attname IN ('tenant_id', 'order_id')",
        (KEYED_TABLE,),
    ).fetchone()[0]
    assert not_null == ["order_id", "tenant_id"]
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(f"INSERT INTO {KEYED_TABLE} SELECT * FROM {KEYED_TABLE} LIMIT 1")
    conn.rollback()
    key_test = ("test", "--select", KEY_TEST, "--target-path", str(tmp_path))
    assert f"PASS {KEY_TEST}" in run_dbt(warehouse_url, *key_test)
    (compiled,) = (tmp_path / "compiled").rglob("*.sql")  # the selected test alone
    assert "group by" not in compiled.read_text()

    repeated = f"""INSERT INTO {KEYED_TABLE} (tenant_id, order_id, customer_key)
        SELECT tenant_id, NULL, customer_key FROM {KEYED_TABLE} LIMIT 1"""
    conn.execute(f"ALTER TABLE {KEYED_TABLE} ALTER COLUMN order_id DROP NOT NULL")
    conn.execute(repeated)
    conn.execute(repeated)
    conn.commit()
    try:
        failed = run_dbt(warehouse_url, *key_test, succeeds=False)
    finally:
        conn.execute(f"DELETE FROM {KEYED_TABLE} WHERE order_id IS NULL")
        conn.execute(f"ALTER TABLE {KEYED_TABLE} ALTER COLUMN order_id SET NOT NULL")
        conn.commit()
    # Each of the two rows lacks its order_id, order_date and is_purchase (6); the key twice (1).
    assert f"FAIL 7 {KEY_TEST}" in failed
    assert "group by" in compiled.read_text()


# The tables a run updates row by row, each keeping its grain as a unique index.
KEYED_MODELS = {
    "stg_vtex__orders": ("tenant_id", "order_id"),
    "stg_vtex__order_items": ("tenant_id", "order_id", "item_index"),
    "stg_vtex__customers": ("tenant_id", "customer_id"),
    "int_identity__records": ("tenant_id", "record_id"),
    "int_identity__customer_keys": ("tenant_id", "record_id"),
    "int_customers__profiles": ("tenant_id", "customer_key"),
    "int_orders__purchases": ("tenant_id", "order_id"),
}


def test_every_keyed_tables_uniqueness_test_reads_nothing(analytics, warehouse_url, tmp_path):
    """Their tests pass without grouping the tables by their keys (a scan of each cost a
    daily refresh half a second on its critical path at seed scale)."""
    names = [f"keyed_rows_{model}" for model in KEYED_MODELS]
    output = run_dbt(warehouse_url, "test", "--select", *names, "--target-path", str(tmp_path))
    for name in names:
        assert f"PASS {name}" in output
    # Named by their tests, shortened with a hash where long.
    compiled = {path: path.read_text() for path in (tmp_path / "compiled").rglob("*.sql")}
    assert len(compiled) == len(names)
    assert [path.name for path, sql in compiled.items() if "group by" in sql] == []


def test_a_customer_key_in_two_tenants_fails_the_build(analytics, conn, warehouse_url):
    """A key is hashed with its tenant: one found in two tenants (a join on the key alone
    would cross them) fails the singular test."""
    keys = "intermediate.int_identity__customer_keys"
    (record,) = conn.execute(
        f"SELECT record_id FROM {keys} WHERE tenant_id = 'an_big' ORDER BY record_id LIMIT 1"
    ).fetchone()
    moved = f"""UPDATE {keys} SET customer_key = (
        SELECT customer_key FROM {keys} WHERE tenant_id = 'an_tiny' ORDER BY 1 LIMIT 1)
        WHERE tenant_id = 'an_big' AND record_id = %s"""
    conn.execute(f"CREATE TEMP TABLE saved AS SELECT * FROM {keys} WHERE record_id = %s", (record,))
    conn.execute(moved, (record,))
    conn.commit()
    try:
        failed = run_dbt(
            warehouse_url, "test", "--select", "assert_customer_key_in_one_tenant", succeeds=False
        )
    finally:
        conn.execute(
            f"UPDATE {keys} k SET customer_key = s.customer_key FROM saved s"
            " WHERE k.tenant_id = s.tenant_id AND k.record_id = s.record_id"
        )
        conn.commit()
    assert "FAIL 1 assert_customer_key_in_one_tenant" in failed
    assert "PASS assert_customer_key_in_one_tenant" in run_dbt(
        warehouse_url, "test", "--select", "assert_customer_key_in_one_tenant"
    )


AUDIENCE = "audience_rfm_champions"


def test_one_test_per_audience_finds_each_kind_of_bad_member(analytics, conn, warehouse_url):
    """Each audience has one test node (tests/generic/keyed_rows.sql) for its members' keys
    and identifiers, their uniqueness, their tenant and what else the audience promises; here a
    member moved to another tenant, one without a country and a repeated member are each
    found."""
    checks: dict[str, list[str]] = {}
    for evaluation in analytics["audiences"].get_asset_check_evaluations():
        assert evaluation.passed, evaluation.check_name
        checks.setdefault(evaluation.asset_key.path[-1], []).append(evaluation.check_name)
    members_checks = {
        audience: [name for name in names if name.startswith("keyed_rows")]
        for audience, names in checks.items()
        if audience != "audience_catalog"
    }
    assert len(members_checks) == 16
    assert all(len(names) == 1 for names in members_checks.values()), members_checks
    # No other test node on any audience; the catalog's own is its keyed_rows.
    assert checks["audience_catalog"] == ["keyed_rows_audience_catalog"]
    assert sum(len(names) for names in checks.values()) == len(members_checks) + 1

    audience = f"audiences.{AUDIENCE}"
    moved, uncountried, repeated = (
        key
        for (key,) in conn.execute(
            f"SELECT customer_key FROM {audience} WHERE tenant_id = 'an_big'"
            " ORDER BY customer_key LIMIT 3"
        )
    )
    conn.execute(
        f"CREATE TEMP TABLE saved_members AS SELECT * FROM {audience} WHERE tenant_id = 'an_big'"
    )
    conn.execute(f"UPDATE {audience} SET tenant_id = 'an_tiny' WHERE customer_key = %s", (moved,))
    conn.execute(f"UPDATE {audience} SET country = NULL WHERE customer_key = %s", (uncountried,))
    # The table's unique index lets a key with a NULL repeat: twice a member without a tenant.
    tenantless = "SELECT * FROM saved_members WHERE customer_key = %s"
    conn.execute(f"CREATE TEMP TABLE tenantless_members AS {tenantless}", (repeated,))
    conn.execute("UPDATE tenantless_members SET tenant_id = NULL")
    for _ in range(2):
        conn.execute(f"INSERT INTO {audience} SELECT * FROM tenantless_members")
    conn.commit()
    try:
        failed = run_dbt(
            warehouse_url, "test", "--select", f"{AUDIENCE},test_type:data", succeeds=False
        )
    finally:
        conn.execute(
            f"DELETE FROM {audience} WHERE tenant_id IS NULL OR customer_key = ANY(%s)",
            ([moved, uncountried],),
        )
        conn.execute(
            f"INSERT INTO {audience} SELECT * FROM saved_members WHERE customer_key = ANY(%s)",
            ([moved, uncountried],),
        )
        conn.execute("DROP TABLE saved_members, tenantless_members")
        conn.commit()
    (failure,) = re.findall(rf"FAIL (\d+) (keyed_rows_{AUDIENCE}\S*)", failed)
    # Moved: not the tenant's customer (1). No country: a required column (1). The repeated
    # member without a tenant: a required column (2), more than once (1), not the tenant's (2).
    assert int(failure[0]) == 7, failed
    assert f"PASS {failure[1]}" in run_dbt(
        warehouse_url, "test", "--select", f"{AUDIENCE},test_type:data"
    )


def test_a_tenants_run_tests_only_that_tenants_rows(
    analytics, conn, instance, warehouse_url, monkeypatch, tmp_path
):
    """One tenant's bad rows (a segment outside the table, a score missing) fail neither
    another tenant's run nor that run's checks: the dbt tests of a tenant's run read that
    tenant's rows. The same test over the bad tenant finds both, each row with its problem."""
    (first, segment, _), (second, _, frequency) = conn.execute(
        "SELECT customer_key, segment, frequency FROM marts.rfm_segments"
        " WHERE tenant_id = 'an_big' ORDER BY customer_key LIMIT 2"
    ).fetchall()
    corrupt = "UPDATE marts.rfm_segments SET {} = %s WHERE customer_key = %s"
    conn.execute(corrupt.format("segment"), ("Bogus", first))
    conn.execute(corrupt.format("frequency"), (None, second))
    conn.commit()
    try:
        result = refresh_tenant(instance, "an_tiny")
        # The tenant as Dagster's runs pass it: `--vars` would leave the project's kept
        # parse (which the next runs reuse) parsed with other vars.
        monkeypatch.setenv(RUN_VARS_ENV, dbt_vars(["an_big"]))
        test = ("test", "--select", "keyed_rows_rfm_segments", "--target-path", str(tmp_path))
        failed = run_dbt(warehouse_url, *test, succeeds=False)
        (compiled,) = (tmp_path / "compiled").rglob("*.sql")
        failing_rows = conn.execute(compiled.read_text()).fetchall()
        problems = {key: problem for _tenant, key, problem in failing_rows}
    finally:
        conn.execute(corrupt.format("segment"), (segment, first))
        conn.execute(corrupt.format("frequency"), (frequency, second))
        conn.commit()
    checks = [
        evaluation
        for evaluation in result.get_asset_check_evaluations()
        if evaluation.asset_key == dg.AssetKey("rfm_segments")
    ]
    assert [check.check_name for check in checks] == ["keyed_rows_rfm_segments"]
    assert all(check.passed for check in checks)
    # Recorded for the tenant's partition: the UI shows them as an_tiny's, whatever another
    # tenant's run recorded before or after.
    assert {check.partition for check in result.get_asset_check_evaluations()} == {"an_tiny"}
    assert "FAIL 2 keyed_rows_rfm_segments" in failed
    assert problems[first].startswith("not true: segment in ('Champions'")
    assert problems[second] == "frequency is null"


def test_a_refresh_reuses_the_last_parse_of_the_project(analytics, instance):
    """A run's tenants and date reach dbt in an env var, not `--vars` (which make dbt parse the
    whole project again), and each run keeps its parse for the next. dbt says whether it parsed
    in part at debug level, which its log file holds when the setting asks."""
    with temporary_environment({"DBT_LOG_LEVEL_FILE": "debug"}):
        result = refresh_tenant(instance, "an_tiny", TENANT_ASSETS)
    logs = list((DBT_PROJECT_DIR / "target").glob(f"*-{result.run_id[:7]}-*/dbt.log"))
    # The models before the fits and the scoring after them; the holdout's summary and bands.
    assert len(logs) == 4
    for log in logs:
        text = log.read_text()
        assert "Unable to do partial parsing" not in text
        assert "Partial parsing enabled" in text
        # The folder keeps the log; its parse went on to be the project's.
        assert not (log.parent / PARTIAL_PARSE).exists()


def test_a_refresh_parses_only_the_documents_that_landed_since(analytics, conn, instance):
    """Staging re-parses a raw order when it lands again (its synced_at moves), and leaves
    alone one whose document changed without landing: proof that the rest is not re-read."""
    landed, untouched = (
        order_id
        for (order_id,) in conn.execute(
            "SELECT order_id FROM raw_vtex.orders WHERE tenant_id = 'an_tiny'"
            " ORDER BY order_id LIMIT 2"
        )
    )
    staged_sql = """
        SELECT o.currency_code, o.landed_at, i.quantity
          FROM staging.stg_vtex__orders o
          JOIN staging.stg_vtex__order_items i USING (tenant_id, order_id)
         WHERE o.tenant_id = 'an_tiny' AND o.order_id = %s AND i.item_index = 0
    """
    untouched_before = conn.execute(staged_sql, (untouched,)).fetchone()
    # The document and its summary (what staging reads: the same shape) change together.
    changed = """jsonb_set(jsonb_set({column}, '{{storePreferencesData,currencyCode}}',
                                     to_jsonb(%(currency)s::text)),
                           '{{items,0,quantity}}', '97')"""
    edit = f"""
        UPDATE raw_vtex.orders
           SET payload = {changed.format(column="payload")},
               summary = {changed.format(column="summary")}{{landing}}
         WHERE tenant_id = 'an_tiny' AND order_id = %(order_id)s
     RETURNING synced_at
    """
    (landed_at,) = conn.execute(
        edit.replace("{landing}", ", synced_at = clock_timestamp()"),
        {"currency": "XTS", "order_id": landed},
    ).fetchone()
    original = conn.execute(
        "SELECT payload FROM raw_vtex.orders WHERE tenant_id = 'an_tiny' AND order_id = %s",
        (untouched,),
    ).fetchone()
    conn.execute(edit.replace("{landing}", ""), {"currency": "XXX", "order_id": untouched})
    conn.commit()
    try:
        assert refresh_tenant(instance, "an_tiny").success
        conn.commit()  # a fresh snapshot
        assert conn.execute(staged_sql, (landed,)).fetchone() == ("XTS", landed_at, 97)
        assert conn.execute(staged_sql, (untouched,)).fetchone() == untouched_before
    finally:
        conn.execute(
            "UPDATE raw_vtex.orders SET payload = %s WHERE tenant_id = 'an_tiny' AND order_id = %s",
            (Jsonb(original[0]), untouched),
        )
        conn.commit()


def test_one_run_over_several_tenants_matches_their_own_runs(analytics, conn, instance):
    """A backfill of many tenants runs as one run (single-run policy) with one dbt build for
    all of them; each tenant comes out as its own run left it, the others are untouched."""
    fingerprint_sql = (
        "SELECT tenant_id, md5(string_agg(s::text, '' ORDER BY customer_key))"
        " FROM (SELECT r.*, p.p_alive, p.clv_1y, c.churn_band FROM marts.rfm_segments r"
        "       JOIN analytics_python.customer_predictions p USING (tenant_id, customer_key)"
        "       JOIN marts.churn_risk c USING (tenant_id, customer_key)) s"
        " GROUP BY 1 ORDER BY 1"
    )
    customers_sql = "SELECT tenant_id, count(*) FROM marts.customers GROUP BY 1 ORDER BY 1"
    before = conn.execute(fingerprint_sql).fetchall(), conn.execute(customers_sql).fetchall()
    assert {t for t, _ in before[1]} >= {"an_big", "an_tiny"}
    result = dg.materialize(
        TENANT_ASSETS,
        instance=instance,
        resources=resources(),
        tags={RANGE_START_TAG: "an_big", RANGE_END_TAG: "an_tiny"},
    )
    assert result.success
    conn.commit()  # a fresh snapshot
    assert (conn.execute(fingerprint_sql).fetchall(), conn.execute(customers_sql).fetchall()) == (
        before
    )
    steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps == {a.op.name for a in TENANT_ASSETS}
    for asset in ("rfm_segments", "customer_predictions", "churn_risk", "churn_holdout"):
        partitions = {
            e.partition
            for e in result.get_asset_materialization_events()
            if e.asset_key == dg.AssetKey(asset)
        }
        assert partitions == {"an_big", "an_tiny"}, asset
    fits = materialization(result, "customer_predictions")
    assert fits["tenants_in_run"] == 2
    assert "| an_big |" in fits["tenants"] and "| an_tiny |" in fits["tenants"]
    assert "| an_big | Champions |" in materialization(result, "rfm_segments")["segments"]
    holdout = materialization(result, "churn_holdout")["holdout_repurchase"]
    assert "| an_big |" in holdout and "| low |" in holdout


def test_churn_holdout_ranks_repurchase_as_churn_risk_rebuilt_then_would(
    analytics, conn, instance, warehouse_url
):
    """Every refresh bands the customers as of the holdout's calibration date (180 days
    back) in marts.churn_holdout: the repurchase rate since must fall from the lowest to the
    highest risk band, the metadata and the ranking check must say so, and churn_risk itself
    rebuilt as of that date (the same store as another tenant) must give the same bands."""
    calibration_dates = conn.execute(
        "SELECT DISTINCT calibration_date FROM marts.churn_holdout WHERE tenant_id = 'an_big'"
    ).fetchall()
    assert len(calibration_dates) == 1
    calibration = calibration_dates[0][0].isoformat()
    rates = dict(
        (band, (n, float(rate)))
        for band, n, rate in conn.execute(
            "SELECT churn_band, count(*), avg(repurchased::int) FROM marts.churn_holdout"
            " WHERE tenant_id = 'an_big' GROUP BY 1"
        )
    )
    print("synthetic holdout repurchase rate by band:", rates)
    assert_bands_rank_repurchase(rates)
    meta = materialization(analytics["an_big"], "churn_holdout")
    for band, (customers, rate) in rates.items():
        assert meta[f"holdout_customers/{band}"] == customers
        assert meta[f"holdout_repurchase_rate/{band}"] == pytest.approx(rate)
    checks = {e.check_name: e.passed for e in analytics["an_big"].get_asset_check_evaluations()}
    assert checks["assert_churn_bands_rank_holdout_repurchase"] is True

    dbt_build(warehouse_url, HOLDOUT_TENANT, "+int_customers__purchase_summary", calibration)
    dg.materialize(
        [customer_predictions],
        partition_key=HOLDOUT_TENANT,
        instance=instance,
        resources=resources(),
    )
    dbt_build(warehouse_url, HOLDOUT_TENANT, "+churn_risk", calibration)
    rebuilt = holdout_repurchase_rates(conn, HOLDOUT_TENANT, calibration)
    assert {b: n for b, (n, _) in rebuilt.items()} == {b: n for b, (n, _) in rates.items()}
    for band, (_, rate) in rebuilt.items():
        assert rate == pytest.approx(rates[band][1])


def test_audiences_and_collections_reach_meta_and_vtex(analytics, conn, instance):
    """The dbt-built audience and marts feed the activation assets: Meta receives the
    Champions of an_big hashed, VTEX gets a collection of their best-selling SKUs, and a
    second run sends nothing."""
    os.environ["AN_META_TOKEN"] = "an-token"
    add_destination(
        conn,
        Destination(
            "an_big_meta",
            "an_big",
            "meta",
            "777",
            credential_refs={"access_token": "AN_META_TOKEN"},
            min_audience_size=1,
        ),
    )
    add_audience(conn, "an_big_meta", "audience_rfm_champions")
    add_destination(
        conn, Destination("an_big_vtex", "an_big", "vtex_collections", min_audience_size=1)
    )
    rule = {"audience": "audience_rfm_champions", "rank_by": "revenue", "days": 3650, "top_n": 12}
    add_audience(conn, "an_big_vtex", "champions_best_sellers", rule)
    conn.commit()
    champions = conn.execute(
        "SELECT count(*) FROM audiences.audience_rfm_champions a JOIN marts.customers c"
        " USING (tenant_id, customer_key)"
        " WHERE a.tenant_id = 'an_big' AND (c.email IS NOT NULL OR c.phone_e164 IS NOT NULL)"
    ).fetchone()[0]
    assert champions > 0
    best_sellers = [sku for sku, _, _ in collection_skus(conn, "an_big", rule)]
    assert len(best_sellers) == 12

    with MetaSandbox({"an-token": ["777"]}) as meta, SandboxProcess([BIG]) as vtex_sandbox:
        activation = {
            "warehouse": WarehouseResource(),
            "meta": MetaResource(graph_url=meta.graph_url),
            "vtex": vtex_for(vtex_sandbox, collection_writes_per_second=200),
        }
        for attempt in ("first", "second"):
            result = dg.materialize(
                [meta_custom_audiences, vtex_product_collections],
                partition_key="an_big",
                instance=instance,
                resources=activation,
            )
            pushed = {
                event.asset_key.path[-1]: event.materialization.metadata
                for event in result.get_asset_materialization_events()
            }
            added = {name: m["added"].value for name, m in pushed.items()}
            if attempt == "first":
                assert added == {
                    "meta_custom_audiences": champions,
                    "vtex_product_collections": 12,
                }
            else:
                assert added == {"meta_custom_audiences": 0, "vtex_product_collections": 0}
        (audience,) = meta.audiences("777")
        assert len(meta.members(audience["id"])) == champions
        (collection_id,) = conn.execute(
            "SELECT split_part(platform_audience_id, '/', 1) FROM cdp.destination_audiences"
            " WHERE destination_id = 'an_big_vtex'"
        ).fetchone()
        listed = requests.get(
            f"{vtex_sandbox.account_url('bigshop')}/api/catalog/pvt/collection/{collection_id}"
            "/products",
            params={"pageSize": 50},
            headers=dict(
                zip(
                    ("X-VTEX-API-AppKey", "X-VTEX-API-AppToken"),
                    credentials_for("bigshop"),
                    strict=True,
                )
            ),
        ).json()
        assert sorted(str(row["SkuId"]) for row in listed["Data"]) == sorted(best_sellers)
    assert changed_audiences(conn).get("an_big", {}).get("meta") is None


def test_audience_sizes_stay_within_bounds(analytics):
    result = audience_sizes_within_bounds(warehouse=WarehouseResource())
    assert result.passed, result.metadata["examples"].value
    assert result.metadata["audiences_checked"].value >= 16 * 2


def test_a_dbt_step_forks_its_dbt_from_a_step_process_of_the_platforms_executor(
    analytics, conn, instance
):
    """The churn scoring as production runs it: its step in a process of the platform's
    executor (forked from the preloaded forkserver), and its dbt forked from that step."""
    conn.execute("UPDATE marts.churn_risk SET churn_band = NULL WHERE tenant_id = 'an_tiny'")
    conn.commit()
    # The job as `dagster job execute -m cdp_assets.definitions` loads it.
    repository = ReconstructableRepository.for_module(
        "cdp_assets.definitions", "defs", working_directory=str(DBT_PROJECT_DIR.parent)
    )
    with dg.execute_job(
        repository.get_reconstructable_job(ANALYTICS_JOB),
        instance=instance,
        tags={"dagster/partition": "an_tiny"},
        asset_selection=[dg.AssetKey("churn_risk")],
    ) as result:
        assert result.success
        started = [e for e in result.all_events if e.event_type_value == "STEP_START"]
        (event,) = result.get_asset_materialization_events()
    assert event.asset_key == dg.AssetKey("churn_risk")
    # A process of its own, not this one (in-process execution would run it here).
    assert {e.pid for e in started} - {os.getpid()}
    (unbanded,) = conn.execute(
        "SELECT count(*) FROM marts.churn_risk WHERE tenant_id = 'an_tiny' AND churn_band IS NULL"
    ).fetchone()
    assert unbanded == 0


def test_the_dbt_resource_knows_the_cli_version_without_asking_the_cli():
    printed = subprocess.check_output([DBT_EXECUTABLE, "--version"], text=True)
    assert str(dbt_resource()._cli_version) == re.search(r"(\d+\.\d+\.\d+)", printed).group(1)


def test_the_manifest_freshness_check_reads_the_project_not_dbts_output():
    files = {path.relative_to(DBT_PROJECT_DIR) for path in project_files()}
    assert {Path("dbt_project.yml"), Path("models/marts/customers.sql")} <= files
    assert not [f for f in files if f.parts[0] in ("target", "logs")]
    assert MANIFEST_PATH.exists() and MANIFEST_PATH.parent.name == "target"  # not listed


def test_the_definitions_load_a_manifest_no_plain_dbt_command_writes():
    # `dbt parse` / `dbt build` in the project rewrite target/manifest.json in place.
    assert MANIFEST_PATH != DBT_PROJECT_DIR / "target" / "manifest.json"
    changed = DBT_PROJECT_DIR / "models" / "marts" / "customers.sql"
    changed.touch()
    assert ensure_manifest() == MANIFEST_PATH
    # Against the file this test changed: other workers' refreshes rewrite the exposures file
    # meanwhile, and the next load parses again for that.
    assert MANIFEST_PATH.stat().st_mtime >= changed.stat().st_mtime
    assert not list((DBT_PROJECT_DIR / "target").glob("parse-*"))  # no parse folder left


def test_no_model_runs_a_hook_outside_its_transaction_before_it():
    # dbt ends the connection's transaction to run such a hook, and the model's statements
    # then each commit on their own (test_incremental_analytics.py shows the effect).
    manifest = json.loads(ensure_manifest().read_text())
    before = {
        node["name"]
        for node in manifest["nodes"].values()
        if node["resource_type"] == "model"
        for hook in node["config"]["pre-hook"]
        if not hook["transaction"]
    }
    assert before == set()
    # Such hooks after the model, which run after its commit, are there (VACUUM needs them).
    assert any(
        not hook["transaction"]
        for node in manifest["nodes"].values()
        for hook in node["config"].get("post-hook", [])
    )
