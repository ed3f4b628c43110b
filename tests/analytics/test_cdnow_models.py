"""The dbt summary, the CLV fit and the RFM segments on CDNOW, against published figures.

CDNOW's transactions (shipped in the `lifetimes` package, read as data only) are landed as
VTEX orders of one tenant; dbt computes the BG/NBD inputs as of 1997-09-30 and the
`customer_predictions` asset fits them, which must give Fader, Hardie & Lee's estimates.
"""

from __future__ import annotations

import csv
import importlib.util
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import orjson
import pytest
from support import assert_bands_rank_repurchase, dbt_build, holdout_repurchase_rates

from cdp_assets.analytics.assets import customer_predictions
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.records import order_row
from cdp_assets.vtex.sync import ORDERS

DATASETS = Path(importlib.util.find_spec("lifetimes").submodule_search_locations[0]) / "datasets"
TENANT = "cdnow"
CALIBRATION_END = "1997-09-30"


def cdnow_orders() -> list[tuple]:
    """Each CDNOW transaction as a minimal invoiced VTEX order of customer `cdnow-<ID>`."""
    rows = []
    lines = (DATASETS / "CDNOW_sample.txt").read_text().split()
    for i in range(0, len(lines), 5):
        _, sample_id, day, _, dollars = lines[i : i + 5]
        created = datetime.strptime(day, "%Y%m%d").replace(hour=12, tzinfo=UTC)
        order_id = f"cdnow-{i // 5:05d}"
        doc = {
            "orderId": order_id,
            "status": "invoiced",
            "creationDate": created.isoformat(),
            "lastChange": created.isoformat(),
            "value": round(float(dollars) * 100),
            "items": [],
            "clientProfileData": {"userProfileId": f"cdnow-{int(sample_id)}"},
            "storePreferencesData": {"currencyCode": "USD"},
        }
        rows.append(order_row(doc, orjson.dumps(doc)))
    return rows


@pytest.fixture(scope="module")
def cdnow(warehouse_url):
    import psycopg

    with psycopg.connect(warehouse_url) as conn:
        add_tenant(conn, Tenant(TENANT, "cdnow", "CDNOW_KEY", "CDNOW_TOKEN", default_country="US"))
        with conn.transaction():
            upsert_documents(conn, ORDERS, TENANT, cdnow_orders())
    return warehouse_url


def published_summary() -> list[tuple[int, float, float]]:
    with open(DATASETS / "cdnow_customers_summary_with_transactions.csv") as f:
        return sorted((int(r["x"]), float(r["t_x"]), float(r["T"])) for r in csv.DictReader(f))


def test_the_dbt_summary_reproduces_the_published_cdnow_summary(cdnow, conn):
    dbt_build(cdnow, TENANT, "+int_customers__purchase_summary", CALIBRATION_END)
    rows = conn.execute(
        "SELECT frequency_x, recency_t_x_days, age_t_days"
        "  FROM intermediate.int_customers__purchase_summary WHERE tenant_id = %s",
        (TENANT,),
    ).fetchall()
    # The published file is in weeks rounded to two decimals; compare customer by customer
    # after sorting, so no identifier mapping is needed.
    ours = sorted((int(x), round(t_x / 7, 2), round(t / 7, 2)) for x, t_x, t in rows)
    assert len(ours) == 2357
    assert ours == published_summary()


def test_the_predictions_asset_finds_the_published_cdnow_parameters(cdnow, conn, instance):
    dbt_build(cdnow, TENANT, "+int_customers__purchase_summary", CALIBRATION_END)
    instance.add_dynamic_partitions("tenants", [TENANT])
    result = dg.materialize(
        [customer_predictions],
        partition_key=TENANT,
        instance=instance,
        resources={"warehouse": WarehouseResource()},
    )
    meta = {
        k: v.value
        for k, v in result.get_asset_materialization_events()[0].materialization.metadata.items()
    }
    assert meta["model"] == "bgnbd_gamma_gamma"
    # Fader, Hardie & Lee (2005) in weeks; we fit in days, so alpha is 7 times larger.
    assert meta["bgnbd_r"] == pytest.approx(0.243, rel=0.01)
    assert meta["bgnbd_alpha"] / 7 == pytest.approx(4.414, rel=0.01)
    assert meta["bgnbd_a"] == pytest.approx(0.793, rel=0.01)
    assert meta["bgnbd_b"] == pytest.approx(2.426, rel=0.01)
    # Fader & Hardie (2013): p, q, gamma on the same customers' mean repeat spend.
    assert meta["gg_p"] == pytest.approx(6.25, rel=0.01)
    assert meta["gg_q"] == pytest.approx(3.74, rel=0.01)
    assert meta["gg_gamma"] == pytest.approx(15.44, rel=0.01)


def test_churn_bands_rank_the_holdout_repurchase_rate(cdnow, conn, instance):
    """Bands as of the end of calibration; the 39-week holdout's repurchase rate must fall
    from the lowest to the highest risk band."""
    dbt_build(cdnow, TENANT, "+int_customers__purchase_summary", CALIBRATION_END)
    instance.add_dynamic_partitions("tenants", [TENANT])
    dg.materialize(
        [customer_predictions],
        partition_key=TENANT,
        instance=instance,
        resources={"warehouse": WarehouseResource()},
    )
    dbt_build(cdnow, TENANT, "+churn_risk", CALIBRATION_END)
    rates = holdout_repurchase_rates(conn, TENANT, CALIBRATION_END)
    print("CDNOW holdout repurchase rate by band:", rates)
    assert_bands_rank_repurchase(rates)
