"""The tenant refresh follows the change: after new orders, changed orders, a customer merge
and a canceled order, the incremental refresh leaves every mart row exactly as a full rebuild
of the same data, and rewrites only the customers the change touched; the predictions score
the changed customers with the stored CLV fit."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import numpy as np
import psycopg
import pytest
from support import import_unavailable_orders, months_ago, register, run_dbt, sync
from support.dagster_services import wait_for

from cdp_assets.analytics.assets import (
    AS_OF_ENV,
    as_of_day,
    customer_predictions,
    dbt_tenant_models,
    dbt_tenant_scoring,
    dbt_vars,
)
from cdp_assets.analytics.dbt_files import RUN_VARS_ENV
from cdp_assets.analytics.dbt_project import dbt_resource
from cdp_assets.analytics.prediction_refresh import (
    PREDICTIONS_TABLE,
    SUMMARY_MODEL,
    read_fit_inputs,
    tenant_states,
)
from cdp_assets.analytics.predictions import score
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_devkit.sandbox import SandboxProcess, StoreSpec

TENANT = "inc_shop"
SHOP = StoreSpec(
    account="incshop",
    seed=11,
    customers=600,
    orders=2400,
    products=40,
    history_start=months_ago(30),
)
REFRESH = [dbt_tenant_models, customer_predictions, dbt_tenant_scoring]

# Every mart row of the tenant, in a fixed order; the build times left out (they differ by
# construction between two builds).
MART_ROWS = {
    "customers": "SELECT to_jsonb(m) - 'built_at' FROM marts.customers m",
    "rfm_segments": "SELECT to_jsonb(m) FROM marts.rfm_segments m",
    "churn_risk": "SELECT to_jsonb(m) FROM marts.churn_risk m",
    # A refit of the same inputs agrees to rounding noise, not bit for bit: estimates compared
    # to float4 precision (about 7 significant digits).
    "predictions": (
        "SELECT jsonb_build_object('customer_key', customer_key, 'as_of', as_of, 'model', model,"
        " 'x', frequency_x, 't_x', recency_t_x_days, 'T', age_t_days, 'estimates', array["
        "p_alive, p_no_purchase_90d, expected_purchases_1y, expected_purchases_3y,"
        " expected_purchases_5y, clv_1y, clv_3y, clv_5y]::float8[]::text[]::float4[]::text[])"
        " FROM analytics_python.customer_predictions m"
    ),
    "purchase_summary": (
        "SELECT to_jsonb(m) - 'built_at' FROM intermediate.int_customers__purchase_summary m"
    ),
}

# Each customer's latest order under its profile, two of them to merge.
PROFILE_ORDERS_SQL = """
SELECT DISTINCT ON (o.user_profile_id) o.order_id, k.customer_key
  FROM staging.stg_vtex__orders o
  JOIN intermediate.int_identity__customer_keys k
    ON k.tenant_id = o.tenant_id AND k.record_id = 'profile:' || o.user_profile_id
 WHERE o.tenant_id = %(tenant)s AND o.is_purchase
 ORDER BY o.user_profile_id, o.created_at DESC, o.order_id DESC
"""
# A raw order edited as a store's change lands: a new landing time.
EDIT_ORDER_SQL = """
UPDATE raw_vtex.orders SET payload = {edit}, summary = {summary}, synced_at = clock_timestamp()
 WHERE tenant_id = %(tenant)s AND order_id = %(order_id)s
"""
# New orders: copies of existing ones under new ids (the old ids and a suffix), created an
# hour ago, in the same tenant or another.
NEW_ORDERS_SQL = (
    "CREATE TEMPORARY TABLE new_orders ON COMMIT DROP AS SELECT * FROM raw_vtex.orders"
    " WHERE tenant_id = %(tenant)s AND order_id = ANY(%(order_ids)s)",
    "UPDATE new_orders SET tenant_id = %(to_tenant)s, order_id = order_id || %(suffix)s,"
    " creation_date = now() - interval '1 hour', change_stamp = now(),"
    " synced_at = clock_timestamp()",
    "INSERT INTO raw_vtex.orders SELECT * FROM new_orders",
)


def refresh(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    result = dg.materialize(
        REFRESH,
        partition_key=TENANT,
        instance=instance,
        resources={"dbt": dbt_resource(), "warehouse": WarehouseResource()},
    )
    assert result.success
    return result


def mart_rows(conn: psycopg.Connection) -> dict[str, list]:
    conn.commit()  # a fresh snapshot
    rows = {}
    for mart, sql in MART_ROWS.items():
        ordered = f'{sql} WHERE m.tenant_id = %s ORDER BY m.customer_key COLLATE "C"'
        rows[mart] = [row for (row,) in conn.execute(ordered, (TENANT,))]
    conn.commit()
    return rows


def built_at(conn: psycopg.Connection) -> dict[str, object]:
    conn.commit()  # a fresh snapshot, and none held while dbt replaces the tables
    rows = conn.execute(
        "SELECT customer_key, built_at FROM marts.customers WHERE tenant_id = %s", (TENANT,)
    ).fetchall()
    conn.commit()
    return dict(rows)


@pytest.fixture(scope="module")
def built(warehouse_url, instance, tmp_path_factory):
    """The shop ingested and its analytics built once, as of one day."""
    with temporary_environment({AS_OF_ENV: as_of_day()}):
        with SandboxProcess([SHOP]) as sandbox, psycopg.connect(warehouse_url) as conn:
            register(conn, TENANT, SHOP.account, history_start=SHOP.history_start)
            sync(instance, sandbox, TENANT, entities=("orders", "customers"))
            import_unavailable_orders(
                conn, sandbox, TENANT, SHOP.account, tmp_path_factory.mktemp("older")
            )
        refresh(instance)
        yield


def add_orders(
    conn: psycopg.Connection, order_ids: list[str], suffix: str, to_tenant: str = TENANT
) -> None:
    """Copies of the shop's orders, as new orders of the shop or of `to_tenant`."""
    params = {"tenant": TENANT, "order_ids": order_ids, "suffix": suffix, "to_tenant": to_tenant}
    for statement in NEW_ORDERS_SQL:
        conn.execute(statement, params)
    conn.commit()


def change_the_shop(conn: psycopg.Connection) -> dict[str, str]:
    """New orders, a changed order total, two customers merged through a shared document and
    a canceled order; the customer keys concerned."""
    latest = conn.execute(PROFILE_ORDERS_SQL, {"tenant": TENANT}).fetchall()
    (merged, merged_key), (donor, donor_key), (canceled, canceled_key), (changed, changed_key) = (
        latest[:4]
    )
    new_from = [order_id for order_id, _ in latest[10:40]]
    take_document = (
        "jsonb_set({column}, '{{clientProfileData,document}}', (SELECT payload -> "
        "'clientProfileData' -> 'document' FROM raw_vtex.orders WHERE tenant_id = %(tenant)s"
        " AND order_id = %(donor)s))"
    )
    cancel = """jsonb_set({column}, '{{status}}', '"canceled"')"""
    new_total = "jsonb_set({column}, '{{value}}', to_jsonb(({column} ->> 'value')::bigint + 9900))"
    for edit, order_id in ((take_document, merged), (cancel, canceled), (new_total, changed)):
        conn.execute(
            EDIT_ORDER_SQL.format(
                edit=edit.format(column="payload"), summary=edit.format(column="summary")
            ),
            {"tenant": TENANT, "order_id": order_id, "donor": donor},
        )
    add_orders(conn, new_from, "-again")
    return {
        "merged": merged_key,
        "donor": donor_key,
        "canceled": canceled_key,
        "changed": changed_key,
    }


def test_an_incremental_refresh_equals_a_full_rebuild(built, conn, instance, warehouse_url):
    with temporary_environment({AS_OF_ENV: as_of_day()}):
        before = built_at(conn)
        keys = change_the_shop(conn)
        refresh(instance)
        incremental = mart_rows(conn)
        after = built_at(conn)

        # The merge left one of the two customers; the others' figures moved.
        assert len({keys["merged"], keys["donor"]} & set(after)) == 1
        rewritten = {key for key, at in after.items() if before.get(key) != at}
        assert keys["changed"] in rewritten
        assert (keys["merged"] in rewritten) or (keys["donor"] in rewritten)
        # Only the customers the change touched were rewritten, not the tenant.
        assert 0 < len(rewritten) < len(after) / 5

        # Every tenant of the session's database is rebuilt: its tests would judge the other
        # tenants' predictions against summaries of another day, so the models alone run.
        run_dbt(
            warehouse_url,
            "run",
            "--full-refresh",
            "--select",
            "path:models/staging path:models/intermediate path:models/marts",
            "--exclude",
            "tag:weekly",
            "--vars",
            f"{{as_of: '{as_of_day()}'}}",
        )
        assert mart_rows(conn) == incremental
        refresh(instance)  # the predictions and churn scores fitted on the rebuilt summary
        assert mart_rows(conn) == incremental


def builds(conn: psycopg.Connection, sql: str) -> dict[str, object]:
    """customer_key -> the build a query's second column names, in a fresh snapshot."""
    conn.commit()
    rows = dict(conn.execute(sql, (TENANT,)).fetchall())
    conn.commit()
    return rows


SUMMARY_BUILDS_SQL = (
    f"SELECT customer_key, built_at FROM intermediate.{SUMMARY_MODEL} WHERE tenant_id = %s"
)
SCORED_BUILDS_SQL = (
    f"SELECT customer_key, summary_built_at FROM {PREDICTIONS_TABLE} WHERE tenant_id = %s"
)
FITS_SQL = "SELECT count(*) FROM analytics_python.clv_fits WHERE tenant_id = %s"
PREDICTION_ROWS_SQL = f"""
SELECT customer_key, frequency_x, recency_t_x_days, age_t_days, p_alive, p_no_purchase_90d,
       expected_purchases_1y, expected_purchases_3y, expected_purchases_5y,
       clv_1y::float8, clv_3y::float8, clv_5y::float8, model
  FROM {PREDICTIONS_TABLE} WHERE tenant_id = %s ORDER BY customer_key COLLATE "C"
"""


def test_a_refresh_scores_the_changed_customers_with_the_stored_fit(built, conn, instance):
    with temporary_environment({AS_OF_ENV: as_of_day()}):
        refresh(instance)  # whatever ran before, every customer scored as of today
        (fits,) = conn.execute(FITS_SQL, (TENANT,)).fetchone()
        summary_before = builds(conn, SUMMARY_BUILDS_SQL)
        scored_before = builds(conn, SCORED_BUILDS_SQL)
        assert scored_before == summary_before
        latest = conn.execute(PROFILE_ORDERS_SQL, {"tenant": TENANT}).fetchall()
        buyers = {key for _, key in latest[50:53]}
        add_orders(conn, [order_id for order_id, _ in latest[50:53]], "-scored")

        result = refresh(instance)

        summary_after = builds(conn, SUMMARY_BUILDS_SQL)
        changed = {key for key, at in summary_after.items() if summary_before.get(key) != at}
        assert changed == buyers
        scored_after = builds(conn, SCORED_BUILDS_SQL)
        assert scored_after == summary_after
        assert {key for key, at in scored_after.items() if scored_before[key] != at} == changed
        # No fit: the stored one scored the three customers.
        assert conn.execute(FITS_SQL, (TENANT,)).fetchone() == (fits,)
        (event,) = [
            e
            for e in result.get_asset_materialization_events()
            if e.asset_key == customer_predictions.key
        ]
        recorded = event.materialization.metadata
        assert recorded["fitted"].value is False
        assert recorded["customers_scored"].value == len(changed)

        # Every customer scored again with the stored parameters: the same rows.
        conn.commit()
        stored = tenant_states(conn, [TENANT])[TENANT].stored
        (inputs,) = read_fit_inputs(conn, SUMMARY_MODEL, [TENANT])
        full = score(stored.fit, inputs.x, inputs.t_x, inputs.T, inputs.m_x, inputs.spend_per_day)
        rows = conn.execute(PREDICTION_ROWS_SQL, (TENANT,)).fetchall()
        conn.commit()
        assert [row[0] for row in rows] == inputs.keys
        expected = zip(
            inputs.keys,
            inputs.x,
            inputs.t_x,
            inputs.T,
            full.p_alive,
            full.p_no_purchase_90d,
            *(full.expected_purchases[m] for m in (12, 36, 60)),
            *(np.round(full.clv[m], 2) for m in (12, 36, 60)),
            strict=True,
        )
        for row, (key, *numbers) in zip(rows, expected, strict=True):
            assert row[0] == key and row[-1] == full.model
            assert row[1:-1] == pytest.approx(numbers, rel=1e-12, abs=1e-9), key


# Tables whose statistics a refresh renews only when it changed much of the tenant's rows.
ANALYZED_TABLES = (
    "staging.stg_vtex__orders",
    "intermediate.int_identity__records",
    "marts.customers",
)
# An ANALYZE rewrites the table's rows of pg_statistic: their newest transaction id moves.
STATISTICS_SQL = "SELECT max(xmin::text::bigint) FROM pg_statistic WHERE starelid = %s::regclass"
TENANT_KNOWN_SQL = (
    "SELECT %s = ANY(most_common_vals::text::text[]) FROM pg_stats"
    " WHERE schemaname = %s AND tablename = %s AND attname = 'tenant_id'"
)
TENANT_ORDERS_SQL = (
    "SELECT order_id FROM raw_vtex.orders WHERE tenant_id = %s ORDER BY order_id LIMIT %s"
)


def statistics(conn: psycopg.Connection) -> dict[str, int]:
    conn.commit()
    stamps = {t: conn.execute(STATISTICS_SQL, (t,)).fetchone()[0] for t in ANALYZED_TABLES}
    conn.commit()
    return stamps


COUNTERS_SQL = (
    "SELECT n_tup_ins, n_tup_del, analyze_count FROM pg_stat_user_tables WHERE relid = %s::regclass"
)


def counters(conn: psycopg.Connection, table: str) -> tuple[int, int, int]:
    """The table's rows inserted and deleted and its ANALYZE commands, ever (the server's
    cumulative statistics, which a backend reports when its transactions end)."""
    conn.commit()
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute(COUNTERS_SQL, (table,)).fetchone()


def planner_view(conn: psycopg.Connection, table: str, written: int) -> dict:
    """What analyze_if_stale weighed for the tenant, beside the truth: to read a failure."""
    schema, name = table.split(".")
    (share,) = conn.execute(
        "SELECT t.frequency FROM pg_stats s, unnest(s.most_common_vals::text::text[],"
        " s.most_common_freqs) AS t (tenant_id, frequency) WHERE s.schemaname = %s"
        " AND s.tablename = %s AND s.attname = 'tenant_id' AND t.tenant_id = %s",
        (schema, name, TENANT),
    ).fetchone() or (None,)
    (rows,) = conn.execute(
        f"SELECT reltuples FROM pg_class WHERE oid = '{table}'::regclass"
    ).fetchone()
    (tenant_rows,) = conn.execute(
        f"SELECT count(*) FROM {table} WHERE tenant_id = %s", (TENANT,)
    ).fetchone()
    ((plan,),) = conn.execute(
        f"EXPLAIN (FORMAT JSON) SELECT FROM {table} WHERE tenant_id = %s", (TENANT,)
    ).fetchall()
    conn.commit()
    return {
        "written": written,
        "share": share,
        "reltuples": rows,
        "estimate": plan[0]["Plan"]["Plan Rows"],
        "tenant_rows": tenant_rows,
    }


def test_a_refresh_renews_the_statistics_only_when_it_changed_much(built, conn, instance):
    with temporary_environment({AS_OF_ENV: as_of_day()}):
        refresh(instance)  # whatever ran before, the tenant is up to date
        # Autovacuum would analyze on its own schedule; the test is about the refresh's.
        for table in ANALYZED_TABLES:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        conn.commit()
        try:
            before = statistics(conn)
            # The statistics know the tenant: its first build analyzed the tables.
            for table in ANALYZED_TABLES:
                schema, name = table.split(".")
                row = conn.execute(TENANT_KNOWN_SQL, (TENANT, schema, name)).fetchone()
                assert row and row[0], table
            (total,) = conn.execute(
                "SELECT count(*) FROM raw_vtex.orders WHERE tenant_id = %s", (TENANT,)
            ).fetchone()
            few = [o for (o,) in conn.execute(TENANT_ORDERS_SQL, (TENANT, 3))]
            add_orders(conn, few, "-few")
            refresh(instance)
            assert statistics(conn) == before

            # New orders as many as a fifth of the tenant's: its orders' statistics are renewed.
            many = [o for (o,) in conn.execute(TENANT_ORDERS_SQL, (TENANT, total // 5))]
            add_orders(conn, many, "-many")
            orders = "staging.stg_vtex__orders"
            counted = counters(conn, orders)
            planned = planner_view(conn, orders, 0)
            refresh(instance)
            after = statistics(conn)
            during = [now - then for now, then in zip(counters(conn, orders), counted, strict=True)]
            # In the message: the planner's view before and after, and the refresh's inserts,
            # deletes and ANALYZEs, by any session.
            assert after[orders] > before[orders], str(
                {**planner_view(conn, orders, len(many)), "before": planned, "during": during}
            )
        finally:
            conn.rollback()
            for table in ANALYZED_TABLES:
                conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
            conn.commit()


# Tenants of the test below: a large one the statistics know, and one new to them.
LARGE_TENANT, NEW_TENANT = "inc_large", "inc_new"
NEW_TENANT_ORDERS = 1_100  # over the 1,000 rows under which analyze_if_stale lets a tenant be


def stage_orders(warehouse_url: str, tenant_ids: list[str]) -> None:
    """The staged orders of some tenants, as a refresh of theirs builds them."""
    with temporary_environment({RUN_VARS_ENV: dbt_vars(tenant_ids)}):
        run_dbt(warehouse_url, "run", "--select", "stg_vtex__orders")


def test_a_run_of_several_tenants_renews_the_statistics_when_one_outgrew_them(
    built, conn, warehouse_url
):
    # One run stages a new tenant's orders beside a large tenant's: under a tenth of the rows
    # the planner expects of the two, and a thousand times the one row it expects of the new.
    orders = "staging.stg_vtex__orders"
    conn.execute(f"ALTER TABLE {orders} SET (autovacuum_enabled = false)")
    conn.commit()
    try:
        for tenant_id in (LARGE_TENANT, NEW_TENANT):
            register(conn, tenant_id, SHOP.account)
        shop_orders = [o for (o,) in conn.execute(TENANT_ORDERS_SQL, (TENANT, None))]
        for copy in range(-(-15 * NEW_TENANT_ORDERS // len(shop_orders))):
            add_orders(conn, shop_orders, f"-large{copy}", LARGE_TENANT)
        stage_orders(warehouse_url, [LARGE_TENANT])
        before = statistics(conn)[orders]
        row = conn.execute(TENANT_KNOWN_SQL, (NEW_TENANT, *orders.split("."))).fetchone()
        assert row and not row[0]  # the statistics do not know the new tenant yet

        add_orders(conn, shop_orders[:NEW_TENANT_ORDERS], "-new", NEW_TENANT)
        stage_orders(warehouse_url, [LARGE_TENANT, NEW_TENANT])
        assert statistics(conn)[orders] > before
        row = conn.execute(TENANT_KNOWN_SQL, (NEW_TENANT, *orders.split("."))).fetchone()
        assert row and row[0]
    finally:
        conn.rollback()
        tenants = [LARGE_TENANT, NEW_TENANT]
        for table in (orders, "raw_vtex.orders"):
            conn.execute(f"DELETE FROM {table} WHERE tenant_id = ANY(%s)", (tenants,))
        conn.execute("DELETE FROM cdp.tenants WHERE tenant_id = ANY(%s)", (tenants,))
        conn.execute(f"ALTER TABLE {orders} RESET (autovacuum_enabled)")
        conn.commit()


TENANT_TABLES_SQL = (
    "SELECT format('%I.%I', table_schema, table_name) FROM information_schema.tables"
    " WHERE table_schema IN ('staging', 'intermediate', 'marts') AND table_type = 'BASE TABLE'"
)


def test_a_tenants_build_does_not_wait_for_another_build_writing_its_tables(
    built, conn, warehouse_url
):
    # Another build (another tenant's refresh, an analyst's prod build) in the middle of
    # writing every table this build writes: its transaction holds what a write holds.
    with psycopg.connect(warehouse_url) as writer:
        tables = [name for (name,) in writer.execute(TENANT_TABLES_SQL)]
        assert "marts.customers" in tables and "staging.stg_vtex__orders" in tables
        for table in tables:
            writer.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE")
        # Waiting for it is an error after 30 s, not a test that hangs.
        with temporary_environment(
            {RUN_VARS_ENV: dbt_vars([TENANT], None), "PGOPTIONS": "-c lock_timeout=30s"}
        ):
            run_dbt(
                warehouse_url,
                "run",
                "--select",
                "path:models/staging path:models/intermediate path:models/marts",
                "--exclude",
                "tag:weekly churn_risk+",
            )
        writer.rollback()


# The backend waiting for a lock on a table, and the advisory locks it holds meanwhile.
WAITING_SQL = """
SELECT waiting.pid, count(held.*) FILTER (WHERE held.locktype = 'advisory' AND held.granted)
  FROM pg_locks AS waiting
  LEFT JOIN pg_locks AS held ON held.pid = waiting.pid
 WHERE waiting.relation = %s::regclass AND NOT waiting.granted
 GROUP BY waiting.pid
"""


def test_a_staging_models_statements_are_one_transaction(built, conn, warehouse_url):
    # The staged orders' delete and insert wait behind a reader's lock; meanwhile the build
    # still holds the tenant's lock its first statement took, as one transaction does.
    orders = "staging.stg_vtex__orders"

    def waiting_writers() -> list[tuple[int, int]]:
        rows = conn.execute(WAITING_SQL, (orders,)).fetchall()
        conn.rollback()
        return rows

    with psycopg.connect(warehouse_url) as reader:
        reader.execute(f"LOCK TABLE {orders} IN SHARE MODE")
        with ThreadPoolExecutor(1) as pool:
            build = pool.submit(stage_orders, warehouse_url, [TENANT])
            waiting = wait_for("the build waiting to write", waiting_writers, 60, every=0.2)
            reader.rollback()
            build.result()
    ((_pid, advisory_locks),) = waiting
    assert advisory_locks >= 1


def test_two_builds_replacing_one_view_at_once_both_succeed(built, conn, warehouse_url):
    # The first build's swap of the view is committed, and its drop of the old view (renamed
    # to a backup name, dropped with what depends on it) waits on a reader of a materialized
    # view over it; the second build replaces the view meanwhile, under names of its own.
    view = "staging.stg_vtex__products"
    conn.execute(f"CREATE MATERIALIZED VIEW public.reads_products AS SELECT * FROM {view}")
    conn.commit()
    build = ["run", "--select", "stg_vtex__products"]
    reader = psycopg.connect(warehouse_url)
    pool = ThreadPoolExecutor(2)
    try:
        # A read of a materialized view locks it alone (a view's would lock the products').
        reader.execute("SELECT FROM public.reads_products LIMIT 0")
        first = pool.submit(run_dbt, warehouse_url, *build)
        wait_for(
            "the first build dropping the old view",
            lambda: waiting_for(conn, "public.reads_products") or first.done(),
            timeout=120,
            every=0.2,
        )
        assert not first.done(), first.result()
        second = pool.submit(run_dbt, warehouse_url, *build)
        wait_for("the second build", second.done, timeout=60, every=0.5)
        second.result()
        reader.rollback()
        first.result()
    finally:
        reader.close()  # before waiting for the builds: the first waits for it
        pool.shutdown()
        conn.rollback()
        conn.execute("DROP MATERIALIZED VIEW IF EXISTS public.reads_products")
        conn.commit()
    row = conn.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", (view,))
    assert row.fetchone() == ("v",)


def waiting_for(conn: psycopg.Connection, relation: str) -> bool:
    """Whether a session waits for a lock on `relation`."""
    (waiting,) = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted", (relation,)
    ).fetchone()
    conn.rollback()
    return waiting > 0
