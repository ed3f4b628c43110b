"""What the UI tells of each definition of the code location: what every schedule, sensor and
check does, who owns every asset, and where its code is."""

from pathlib import Path

import dagster as dg

from cdp_assets.analytics.dbt_files import DBT_PROJECT_DIR
from cdp_assets.definitions import defs

ROOT = Path(__file__).resolve().parent.parent
FORTY_EIGHT_HOUR_SCHEDULES = ("audiences_every_48_hours", "activation_every_48_hours")


def test_every_schedule_and_sensor_says_what_it_does():
    instigators = [*defs.schedules, *defs.sensors]
    assert len(instigators) >= 11
    assert [i.name for i in instigators if not (i.description or "").strip()] == []
    # Why a schedule of every 48 hours ticks every day: the reader of the UI sees the skips.
    for name in FORTY_EIGHT_HOUR_SCHEDULES:
        description = defs.get_schedule_def(name).description.lower()
        assert "cron" in description and "odd" in description, description


def test_every_asset_has_owners_by_group():
    graph = defs.resolve_asset_graph()
    nodes = [graph.get(key) for key in graph.get_all_asset_keys()]
    assert [n.key.to_user_string() for n in nodes if not n.owners] == []
    owners_of_group: dict[str, set[tuple[str, ...]]] = {}
    for node in nodes:
        owners_of_group.setdefault(node.group_name, set()).add(tuple(node.owners))
    assert all(len(owners) == 1 for owners in owners_of_group.values()), owners_of_group
    expected = {
        "vtex_orders": ["team:data-engineering"],
        "cdp/tenants": ["team:data-engineering"],
        "operations_metrics": ["team:data-engineering"],
        "stg_vtex__orders": ["team:analytics"],
        "customer_predictions": ["team:analytics"],
        "audience_win_back": ["team:analytics"],
        "meta_custom_audiences": ["team:marketing-ops"],
        "vtex_product_collections": ["team:marketing-ops"],
    }
    assert {key: graph.get(dg.AssetKey.from_user_string(key)).owners for key in expected} == (
        expected
    )


def code_references(node) -> list[tuple[Path, int | None]]:
    references = node.metadata["dagster/code_references"].code_references
    return [(Path(r.file_path), r.line_number) for r in references]


def test_every_asset_points_at_its_code():
    graph = defs.resolve_asset_graph()
    executable = [graph.get(key) for key in graph.executable_asset_keys]
    missing = [n.key.to_user_string() for n in executable if not code_references(n)]
    assert missing == []
    for node in executable:
        assert all(path.is_file() for path, _ in code_references(node)), node.key

    orders = code_references(graph.get(dg.AssetKey("vtex_orders")))
    assert [path for path, _ in orders] == [ROOT / "cdp_assets" / "vtex" / "assets.py"]
    assert orders[0][1] > 1
    # A dbt model: its SQL, and the Dagster asset that runs it.
    segments = [path for path, _ in code_references(graph.get(dg.AssetKey("rfm_segments")))]
    assert segments == [
        DBT_PROJECT_DIR / "models" / "marts" / "rfm_segments.sql",
        ROOT / "cdp_assets" / "analytics" / "assets.py",
    ]


def test_every_check_says_what_it_checks():
    graph = defs.resolve_asset_graph()
    specs = [spec for assets_def in graph.assets_defs for spec in assets_def.check_specs]
    assert len(specs) >= 45  # dbt tests (mostly one per model) and the Python checks
    assert [s.key.to_user_string() for s in specs if not (s.description or "").strip()] == []
    by_key = {spec.key.to_user_string(): spec.description for spec in specs}
    # A generic dbt test: what it asserts of which column of which model.
    not_null = by_key["stg_vtex__orders:not_null_stg_vtex__orders_order_total"]
    assert "not_null" in not_null and "order_total" in not_null and "stg_vtex__orders" in not_null
    # One test of a table's rows: its key, the columns never NULL, each rule quoted whole.
    rows = by_key["rfm_segments:keyed_rows_rfm_segments"]
    assert rows.startswith(
        "`keyed_rows` of `rfm_segments` (key tenant_id, customer_key; not_null recency_days,"
    )
    assert "rules `fm_score = (f_score + m_score) / 2`, `r_score between" in rows
    # A singular dbt test: the description of its properties file.
    assert "raw" in by_key["stg_vtex__orders:assert_staged_orders_match_raw"]
