"""The CLV holdout scorecard: CDNOW's published holdout comparison, a synthetic store where the
model beats the naive baseline, and a store whose holdout purchases are random, where it does
not and the check warns.

Orders are landed as VTEX documents (as ingestion lands them), dbt builds the holdout summary,
and the `clv_scorecard` asset scores the tenant as of the holdout's calibration date.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import numpy as np
import orjson
import pytest
from support import HISTORY_START, run_dbt
from test_cdnow_models import cdnow_orders

from cdp_assets.analytics import clv
from cdp_assets.analytics.assets import (
    AS_OF_ENV,
    CHECK_NAME,
    as_of_day,
    clv_scorecard,
    holdout_predictions,
)
from cdp_assets.lib.environ import temporary_environment
from cdp_assets.lib.upsert import upsert_documents
from cdp_assets.lib.warehouse import WarehouseResource
from cdp_assets.tenants.registry import Tenant, add_tenant
from cdp_assets.vtex.records import order_row
from cdp_assets.vtex.sync import ORDERS
from cdp_devkit.sandbox import StoreSpec
from cdp_devkit.sandbox.vtex.generator import Store

HOLDOUT_DAYS = 180  # dbt var churn_holdout_days
SYNTHETIC = StoreSpec(
    account="scoreshop", seed=17, customers=1500, orders=6000, products=40,
    history_start=HISTORY_START,
)  # fmt: skip

# Fader, Hardie & Lee (2005a), CDNOW's 39-week holdout (weeks 40-78) by the number of repeat
# purchases in the 39-week calibration (7 = 7 or more): customers, mean actual repeat
# purchases, and the BG/NBD conditional expectation (the paper's conditional-expectation
# figure, tabulated by BTYD's walkthrough).
CDNOW_HOLDOUT = {
    0: (1411, 0.237, 0.225),
    1: (439, 0.697, 0.523),
    2: (214, 1.393, 1.044),
    3: (100, 1.560, 1.520),
    4: (62, 2.532, 2.164),
    5: (38, 2.947, 2.654),
    6: (29, 3.862, 3.504),
    7: (64, 6.359, 6.157),
}


def land(conn, tenant_id: str, documents: list[dict]) -> None:
    add_tenant(conn, Tenant(tenant_id, tenant_id.replace("_", ""), "KEY_REF", "TOKEN_REF"))
    rows = [order_row(doc, orjson.dumps(doc)) for doc in documents]
    with conn.transaction():
        upsert_documents(conn, ORDERS, tenant_id, rows)


def order(order_id: str, customer: str, created: datetime, cents: int) -> dict:
    return {
        "orderId": order_id,
        "status": "invoiced",
        "creationDate": created.isoformat(),
        "lastChange": created.isoformat(),
        "value": cents,
        "items": [],
        "clientProfileData": {"userProfileId": customer},
        "storePreferencesData": {"currencyCode": "BRL"},
    }


def random_store(seed: int, customers: int, as_of: datetime) -> list[dict]:
    """Customers who buy (at rates of their own, until they stop) before the calibration date,
    and after it orders given to customers drawn at random: the holdout owes nothing to the
    past."""
    rng = np.random.default_rng(seed)
    calibration = as_of - timedelta(days=HOLDOUT_DAYS)
    start = (calibration - timedelta(days=400)).replace(hour=12, minute=0, second=0)
    documents = []
    holdout_orders = 0
    for customer in range(customers):
        first = int(rng.integers(0, 400))
        last = min(400, first + int(rng.exponential(250)))
        rate = rng.gamma(0.8, 0.01 / 0.8)
        days = [first, *rng.integers(first, last + 1, rng.poisson(rate * (last - first)))]
        holdout_orders += rng.poisson(rate * HOLDOUT_DAYS)
        spend_scale = rng.gamma(4, 1 / 4)
        for day in days:
            cents = int(rng.gamma(2, 4000) * spend_scale) + 100
            documents.append((customer, start + timedelta(days=int(day)), cents))
    for customer in rng.integers(0, customers, holdout_orders):
        day = int(rng.integers(1, HOLDOUT_DAYS + 1))
        cents = int(rng.gamma(2, 4000)) + 100
        # Midnight: the last holdout day is today, whose noon may be still to come.
        documents.append((int(customer), calibration + timedelta(days=day), cents))
    return [
        order(f"rnd-{i:06d}", f"rnd-{customer}", created, cents)
        for i, (customer, created, cents) in enumerate(documents)
    ]


def build_holdout_summary(warehouse_url: str, tenant_ids: list[str], as_of: str, days: int):
    variables = {"tenant_id": tenant_ids, "as_of": as_of, "churn_holdout_days": days}
    run_dbt(
        warehouse_url, "build", "--select", "+int_customers__holdout_summary",
        "--vars", json.dumps(variables),
    )  # fmt: skip


def score(instance, tenant_id: str, as_of: str, fit: bool = True) -> dg.ExecuteInProcessResult:
    """The churn holdout's fit, then its scorecard, as the weekly refresh runs them; or the
    scorecard alone (`fit` False)."""
    instance.add_dynamic_partitions("tenants", [tenant_id])
    with temporary_environment({AS_OF_ENV: as_of}):
        return dg.materialize(
            [holdout_predictions, clv_scorecard] if fit else [clv_scorecard],
            partition_key=tenant_id,
            instance=instance,
            resources={"warehouse": WarehouseResource()},
        )


def scorecard_row(conn, tenant_id: str) -> dict:
    cursor = conn.execute(
        "SELECT * FROM analytics_python.clv_scorecard WHERE tenant_id = %s"
        " ORDER BY calibration_date",
        (tenant_id,),
    )
    names = [c.name for c in cursor.description]
    (row,) = cursor.fetchall()
    return dict(zip(names, row, strict=True))


def check_result(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == CHECK_NAME
    return evaluation


def materialization(result: dg.ExecuteInProcessResult) -> dict:
    (event,) = [
        e for e in result.get_asset_materialization_events() if e.asset_key == clv_scorecard.key
    ]
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.fixture(scope="module")
def today() -> str:
    """The day the synthetic and the random store are scored as of, taken once: a module run
    across midnight compares with the day it scored, not the next."""
    return as_of_day()


@pytest.fixture(scope="module")
def stores(warehouse_url, instance, today):
    """CDNOW as of 1998-06-30 with its 39-week holdout; the synthetic and the random store as
    of today with the platform's holdout; each scored once."""
    import psycopg

    now = datetime.fromisoformat(today).replace(tzinfo=UTC)
    store = Store(SYNTHETIC)
    synthetic = [
        orjson.loads(store.order_document(order_id))
        for order_id in store.order_ids()
        if not store.is_malformed(order_id)
    ]
    with psycopg.connect(warehouse_url) as conn:
        conn.execute("SELECT 1")  # the tenants' registry and the raw tables are migrated
        add_tenant(conn, Tenant("sc_cdnow", "sccdnow", "KEY_REF", "TOKEN_REF"))
        with conn.transaction():
            upsert_documents(conn, ORDERS, "sc_cdnow", cdnow_orders())
        land(conn, "sc_synthetic", synthetic)
        land(conn, "sc_random", random_store(3, 2000, now))
        conn.commit()
    build_holdout_summary(warehouse_url, ["sc_cdnow"], "1998-06-30", 273)
    build_holdout_summary(warehouse_url, ["sc_random", "sc_synthetic"], today, HOLDOUT_DAYS)
    return {
        "sc_cdnow": score(instance, "sc_cdnow", "1998-06-30"),
        "sc_synthetic": score(instance, "sc_synthetic", today),
        "sc_random": score(instance, "sc_random", today),
    }


def test_cdnow_holdout_reproduces_the_published_comparison(stores, conn):
    """Per calibration frequency, the actual holdout purchases are the published ones exactly
    and the model's expectations within 0.01; in aggregate, as the sums of those bins."""
    bins = conn.execute(
        """
        SELECT least(summary.frequency_x, 7), count(*), avg(scored.actual_purchases),
               avg(scored.predicted_purchases)
          FROM analytics_python.clv_scorecard_customers scored
          JOIN intermediate.int_customers__holdout_summary summary USING (tenant_id, customer_key)
         WHERE tenant_id = 'sc_cdnow' GROUP BY 1 ORDER BY 1
        """
    ).fetchall()
    assert {x: n for x, n, _, _ in bins} == {x: n for x, (n, _, _) in CDNOW_HOLDOUT.items()}
    for x, _, actual, predicted in bins:
        _, published_actual, published_expected = CDNOW_HOLDOUT[x]
        assert float(actual) == pytest.approx(published_actual, abs=0.0005)
        assert float(predicted) == pytest.approx(published_expected, abs=0.01)
    card = scorecard_row(conn, "sc_cdnow")
    assert str(card["calibration_date"]) == "1997-09-30" and card["holdout_days"] == 273
    assert card["model"] == "bgnbd_gamma_gamma" and card["customers"] == 2357
    published_actual = sum(n * a for n, a, _ in CDNOW_HOLDOUT.values())
    published_expected = sum(n * e for n, _, e in CDNOW_HOLDOUT.values())
    assert card["actual_purchases"] == pytest.approx(published_actual, abs=1)
    assert card["predicted_purchases"] == pytest.approx(published_expected, rel=0.005)
    # The model is closer per customer and in total than carrying each past rate forward.
    assert card["purchases_mae"] < card["baseline_purchases_mae"]
    assert abs(card["purchases_bias"]) < abs(card["baseline_purchases_bias"])
    assert card["beats_baseline"] is True
    assert check_result(stores["sc_cdnow"]).passed


def test_on_the_synthetic_store_the_model_beats_the_naive_baseline(stores, conn, today):
    card = scorecard_row(conn, "sc_synthetic")
    assert card["model"] == "bgnbd_gamma_gamma"
    assert card["calibration_date"] == datetime.fromisoformat(today).date() - timedelta(
        days=HOLDOUT_DAYS
    )
    assert card["spend_mae"] < card["baseline_spend_mae"]
    assert card["spend_top_decile_share"] >= card["baseline_spend_top_decile_share"]
    assert card["spend_rank_correlation"] > 0
    assert card["beats_baseline"] is True
    assert check_result(stores["sc_synthetic"]).passed
    meta = materialization(stores["sc_synthetic"])
    assert meta["model/spend_mae"] == pytest.approx(card["spend_mae"])
    assert meta["baseline/spend_mae"] == pytest.approx(card["baseline_spend_mae"])
    assert meta["actual/spend"] == pytest.approx(card["actual_spend"])
    assert "| 10 |" in meta["deciles"]
    deciles = conn.execute(
        "SELECT decile, customers, predicted_spend FROM analytics_python.clv_scorecard_deciles"
        " WHERE tenant_id = 'sc_synthetic' ORDER BY decile"
    ).fetchall()
    assert [d for d, _, _ in deciles] == list(range(1, 11))
    assert sum(n for _, n, _ in deciles) == card["customers"]
    predicted = [p for _, _, p in deciles]
    assert predicted == sorted(predicted, reverse=True)


def test_where_holdout_purchases_are_random_the_model_does_not_beat_it_and_the_check_warns(
    stores, conn
):
    card = scorecard_row(conn, "sc_random")
    # The model is fitted, so it is the comparison that fails, not a fallback.
    assert card["model"] == "bgnbd_gamma_gamma" and card["fallback_reason"] is None
    assert card["beats_baseline"] is False
    evaluation = check_result(stores["sc_random"])
    assert evaluation.passed is False
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert "sc_random" in evaluation.metadata["not_better_than_baseline"].value


def test_a_rerun_on_the_same_calibration_date_replaces_its_row(stores, conn, instance):
    before = scorecard_row(conn, "sc_cdnow")
    score(instance, "sc_cdnow", "1998-06-30")
    after = scorecard_row(conn, "sc_cdnow")  # still one row
    assert after["computed_at"] > before["computed_at"]
    assert after["predicted_spend"] == pytest.approx(before["predicted_spend"])
    (customers,) = conn.execute(
        "SELECT count(*) FROM analytics_python.clv_scorecard_customers WHERE tenant_id = 'sc_cdnow'"
    ).fetchone()
    assert customers == 2357


def test_the_scorecard_scores_the_fit_the_holdout_recorded_and_fits_nothing(stores, conn, instance):
    """Parameters changed in the holdout's recorded fit change the scorecard's predictions
    exactly as they predict: the scorecard reads the fit rather than fitting again."""
    conn.execute(
        "UPDATE analytics_python.clv_fits SET bgnbd_r = 2 * bgnbd_r"
        " WHERE tenant_id = 'sc_cdnow' AND as_of = '1997-09-30'"
    )
    conn.commit()
    params = clv.BgNbdParams(
        *conn.execute(
            "SELECT bgnbd_r, bgnbd_alpha, bgnbd_a, bgnbd_b FROM analytics_python.clv_fits"
            " WHERE tenant_id = 'sc_cdnow' ORDER BY fitted_at DESC LIMIT 1"
        ).fetchone()
    )
    x, t_x, T = np.array(
        conn.execute(
            "SELECT coalesce(frequency_x, 0), coalesce(recency_t_x_days, 0), age_t_days"
            " FROM intermediate.int_customers__holdout_summary WHERE tenant_id = 'sc_cdnow'"
        ).fetchall(),
        dtype=np.float64,
    ).T
    before = scorecard_row(conn, "sc_cdnow")
    fits = conn.execute("SELECT count(*) FROM analytics_python.clv_fits").fetchone()

    result = score(instance, "sc_cdnow", "1998-06-30", fit=False)

    assert conn.execute("SELECT count(*) FROM analytics_python.clv_fits").fetchone() == fits

    after = scorecard_row(conn, "sc_cdnow")
    expected = float(clv.expected_purchases(params, 273, x, t_x, T).sum())
    assert after["predicted_purchases"] == pytest.approx(expected, rel=1e-9)
    assert after["predicted_purchases"] > 1.1 * before["predicted_purchases"]
    assert check_result(result).metadata["not_scored_without_holdout_fit"].value == "none"

    conn.execute("DELETE FROM analytics_python.clv_fits WHERE tenant_id = 'sc_cdnow'")
    conn.commit()
    unfitted = score(instance, "sc_cdnow", "1998-06-30", fit=False)

    assert scorecard_row(conn, "sc_cdnow")["computed_at"] == after["computed_at"]  # untouched
    evaluation = check_result(unfitted)
    assert evaluation.passed is False
    assert "sc_cdnow" in evaluation.metadata["not_scored_without_holdout_fit"].value
