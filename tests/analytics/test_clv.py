"""BG/NBD, Gamma-Gamma and CLV maths against the CDNOW reference values.

The CDNOW files ship inside the `lifetimes` package; only its data files are read here.
References: Fader, Hardie & Lee (2005a) for BG/NBD, Fader & Hardie (2013, note 025) for
Gamma-Gamma, lifetimes' own tests for the prediction values.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import approx_fprime

from cdp_assets.analytics import clv

CDNOW = Path(importlib.util.find_spec("lifetimes").submodule_search_locations[0]) / "datasets"


@pytest.fixture(scope="module")
def cdnow() -> dict[str, np.ndarray]:
    """The 39-week calibration summary in weeks: ID, x, t_x, T, zbar (mean repeat spend)."""
    table = np.loadtxt(
        CDNOW / "cdnow_customers_summary_with_transactions.csv", delimiter=",", skiprows=1
    )
    return dict(zip(("id", "x", "t_x", "T", "m_x"), table.T, strict=True))


@pytest.fixture(scope="module")
def bgnbd(cdnow) -> clv.BgNbdFit:
    return clv.fit_bgnbd(cdnow["x"], cdnow["t_x"], cdnow["T"])


@pytest.fixture(scope="module")
def gamma_gamma(cdnow) -> clv.GammaGammaFit:
    return clv.fit_gamma_gamma(cdnow["x"], cdnow["m_x"])


def test_cdnow_bgnbd_fit_matches_the_paper(bgnbd):
    params = bgnbd.params
    assert [params.r, params.alpha, params.a, params.b] == pytest.approx(
        [0.243, 4.414, 0.793, 2.426], rel=0.01
    )
    assert bgnbd.log_likelihood == pytest.approx(-9582.4, abs=0.1)
    assert (bgnbd.converged, bgnbd.n_customers, bgnbd.n_repeaters) == (True, 2357, 946)


def test_cdnow_gamma_gamma_fit_matches_note_025(gamma_gamma, cdnow):
    params = gamma_gamma.params
    assert [params.p, params.q, params.gamma] == pytest.approx([6.25, 3.74, 15.44], rel=0.01)
    assert gamma_gamma.log_likelihood == pytest.approx(-4055.92, abs=0.01)
    assert gamma_gamma.n_customers == 946
    assert clv.spend_frequency_correlation(cdnow["x"], cdnow["m_x"]) == pytest.approx(
        0.1139, abs=1e-4
    )


def test_cdnow_predictions(bgnbd, gamma_gamma):
    params = bgnbd.params
    assert clv.expected_purchases(params, 39, 2, 30.43, 38.86) == pytest.approx(1.226, abs=1e-3)
    assert clv.probability_alive(params, 2, 30.43, 38.86) == pytest.approx(0.7266, abs=1e-3)
    assert clv.expected_purchases_new(params, [1, 78]) == pytest.approx([0.0532, 1.858], abs=1e-3)
    assert clv.expected_spend(gamma_gamma.params, 2, 22.35) == pytest.approx(24.65, abs=0.01)
    # x = 0: P(alive) is 1, and P(no purchase in 52 weeks) is the alive customer's e^{-λt}.
    assert clv.probability_alive(params, 0, 0, 38.86) == 1.0
    assert clv.probability_no_purchase(params, 52, 0, 0, 38.86) == pytest.approx(0.8258, abs=1e-4)
    # A repeat customer who is never coming back again ends at 1 - P(alive).
    alive = clv.probability_alive(params, 2, 30.43, 38.86)
    assert clv.probability_no_purchase(params, 1e12, 2, 30.43, 38.86) == pytest.approx(1 - alive)


def test_cdnow_clv_with_lifetimes_weekly_settings(cdnow, bgnbd, gamma_gamma):
    # lifetimes with freq="W": monthly discount 0.01 and a month of 4.345 weeks.
    first3 = [cdnow[k][:3] for k in ("x", "t_x", "T", "m_x")]
    value = clv.customer_lifetime_value(
        bgnbd.params,
        gamma_gamma.params,
        *first3,
        months=(12,),
        days_per_month=4.345 * 7,
        time_unit_days=7.0,
        annual_discount_rate=1.01**12 - 1,
    )
    assert list(value) == [12]
    assert value[12] == pytest.approx([36.2785, 4.6375, 8.3441], abs=0.01)


def test_clv_horizons_are_partial_sums_of_one_loop(cdnow, bgnbd, gamma_gamma):
    first3 = [cdnow[k][:3] for k in ("x", "t_x", "T", "m_x")]
    in_weeks = {"time_unit_days": 7.0}
    value = clv.customer_lifetime_value(bgnbd.params, gamma_gamma.params, *first3, **in_weeks)
    assert list(value) == [12, 36, 60]
    assert np.all(value[12] < value[36]) and np.all(value[36] < value[60])
    alone = clv.customer_lifetime_value(
        bgnbd.params, gamma_gamma.params, *first3, months=(36,), **in_weeks
    )
    np.testing.assert_allclose(alone[36], value[36])


def test_raw_cdnow_sample_summarizes_to_the_published_summary(cdnow):
    # Columns: master id, sample id, YYYYMMDD, number of CDs, dollars (CRLF, whitespace).
    _, sample_id, yyyymmdd, _, dollars = np.loadtxt(CDNOW / "CDNOW_sample.txt", unpack=True)
    yyyymmdd = yyyymmdd.astype(np.int64)
    months = (yyyymmdd // 10000 - 1970) * 12 + yyyymmdd // 100 % 100 - 1
    days = months.astype("datetime64[M]").astype("datetime64[D]") + (yyyymmdd % 100 - 1)
    assert days.min() == np.datetime64("1997-01-01") and days.max() == np.datetime64("1998-06-30")

    summary = clv.summarize_purchases(
        sample_id.astype(np.int64), days, dollars, np.datetime64("1997-09-30")
    )
    np.testing.assert_array_equal(summary.customer_ids, cdnow["id"])
    np.testing.assert_array_equal(summary.x, cdnow["x"])
    np.testing.assert_allclose(summary.t_x / 7, cdnow["t_x"], atol=0.0051)
    np.testing.assert_allclose(summary.T / 7, cdnow["T"], atol=0.0051)
    np.testing.assert_allclose(summary.m_x, cdnow["m_x"], atol=0.006)


def test_summarize_merges_same_day_orders_and_ignores_later_ones():
    orders = [
        ("b", "2024-01-01", 10.0),
        ("a", "2024-01-05", 7.0),
        ("b", "2024-01-01", 5.0),
        ("b", "2024-01-11", 30.0),
        ("a", "2024-02-01", 99.0),  # after the as-of day
        ("b", "2024-01-04", 20.0),
        ("c", "2024-03-01", 1.0),  # only after the as-of day: not a customer yet
    ]
    ids, days, amounts = zip(*orders, strict=True)
    summary = clv.summarize_purchases(ids, days, amounts, "2024-01-31")
    np.testing.assert_array_equal(summary.customer_ids, ["a", "b"])
    np.testing.assert_array_equal(summary.x, [0, 2])  # b: Jan 1 (two orders), Jan 4, Jan 11
    np.testing.assert_array_equal(summary.t_x, [0, 10])
    np.testing.assert_array_equal(summary.T, [26, 30])
    np.testing.assert_array_equal(summary.m_x, [0, 25])  # the first day's 15 is excluded


def test_simulated_parameters_are_recovered():
    # Days-like units, ages spread over two years. Over 40 seeds the relative spread (1 sd) of
    # the estimates was r 1.1 %, α 1.7 %, a 2.6 %, b 3.8 %; the tolerances are about 4 sd.
    true = clv.BgNbdParams(r=0.5, alpha=10.0, a=0.8, b=2.5)
    ages = np.random.default_rng(1).uniform(0, 730, 20_000)
    x, t_x, T = clv.simulate_bgnbd(true, 20_000, ages, seed=2)
    fit = clv.fit_bgnbd(x, t_x, T)
    assert fit.converged and fit.at_bound == ()
    assert fit.params.r == pytest.approx(true.r, rel=0.05)
    assert fit.params.alpha == pytest.approx(true.alpha, rel=0.07)
    assert fit.params.a == pytest.approx(true.a, rel=0.11)
    assert fit.params.b == pytest.approx(true.b, rel=0.15)
    assert fit.log_likelihood >= clv.bgnbd_log_likelihood(true, x, t_x, T)


def test_a_plus_b_below_one_gives_finite_predictions():
    # lifetimes #442: 2F1(...; a+b-1 < 0; z) is negative, so its log is NaN there.
    params = clv.BgNbdParams(r=0.3, alpha=20.0, a=0.3, b=0.5)
    assert clv.expected_purchases(params, 365, 0, 0, 30) == pytest.approx(1.2314, abs=1e-4)
    # The closed form agrees with the simulated process (standard error of the mean ≈ 0.011).
    x, _, _ = clv.simulate_bgnbd(params, 200_000, 395.0, seed=3)
    assert x.mean() == pytest.approx(clv.expected_purchases_new(params, 395.0), abs=0.05)


def test_little_dropout_gives_finite_predictions():
    # Fitted on a synthetic store: Euler's form of the 2F1 gives 0 * inf there.
    params = clv.BgNbdParams(r=0.2026, alpha=89.91, a=2134.5, b=16863.6)
    expected = clv.expected_purchases(params, [90, 360, 1800], [0, 0, 3], [0, 0, 300], 623)
    assert np.all(np.isfinite(expected)) and np.all(expected > 0)
    # The closed form agrees with the simulated process (standard error of the mean ≈ 0.01).
    x, _, _ = clv.simulate_bgnbd(params, 200_000, 1800.0, seed=5)
    assert x.mean() == pytest.approx(clv.expected_purchases_new(params, 1800.0), abs=0.04)


def test_frequent_buyers_do_not_overflow():
    params = clv.BgNbdParams(r=0.243, alpha=30.9, a=0.793, b=2.426)  # CDNOW in days
    expected = clv.expected_purchases(params, [30, 365, 1825], 1000, 730, 730)
    assert np.all(np.isfinite(expected)) and np.all(np.diff(expected) > 0)
    assert clv.probability_alive(params, 1000, 100, 730) == pytest.approx(0.0, abs=1e-12)


def test_gradients_match_finite_differences(cdnow):
    x, t_x, T, m_x = (cdnow[k] for k in ("x", "t_x", "T", "m_x"))
    log_params = np.log([0.3, 5.0, 0.7, 2.0])
    weights = np.ones_like(x)

    def bgnbd(v):
        return clv._bgnbd_ll_and_grad(clv.BgNbdParams(*np.exp(v)), x, t_x, T, weights)

    numeric = approx_fprime(log_params, lambda v: bgnbd(v)[0], 1e-6)
    np.testing.assert_allclose(bgnbd(log_params)[1], numeric, rtol=1e-4)

    repeat = x > 0

    def spend(v):
        return clv._gamma_gamma_ll_and_grad(
            clv.GammaGammaParams(*np.exp(v)), x[repeat], m_x[repeat]
        )

    log_params = np.log([5.0, 3.0, 12.0])
    numeric = approx_fprime(log_params, lambda v: spend(v)[0], 1e-6)
    np.testing.assert_allclose(spend(log_params)[1], numeric, rtol=1e-4)


def test_cdnow_is_usable(cdnow, bgnbd, gamma_gamma):
    assert clv.data_problem(cdnow["x"], cdnow["m_x"]) is None
    assert clv.fit_problem(bgnbd, gamma_gamma) is None


def test_too_little_data_is_reported():
    assert clv.data_problem([0, 1, 0, 3, 2], [0, 10.0, 0, 12.0, 8.0]) == (
        "only 3 repeat customers (need 100)"
    )
    no_spend = clv.data_problem(np.ones(200), np.zeros(200))
    assert no_spend == "only 0 repeat customers with positive spend (need 100)"
    with pytest.raises(ValueError, match="positive spend"):
        clv.fit_gamma_gamma(np.ones(200), np.zeros(200))


def test_degenerate_fits_are_reported():
    rng = np.random.default_rng(0)
    x = rng.integers(1, 6, 300).astype(float)
    T = rng.integers(30, 365, 300).astype(float)
    # Everyone bought on the as-of day (no sign of dropout) and spends the same (no
    # heterogeneity): the likelihoods keep rising towards infinite b and infinite p, q.
    bgnbd = clv.fit_bgnbd(x, T, T)
    gamma_gamma = clv.fit_gamma_gamma(x, np.full(300, 50.0))
    assert clv.data_problem(x, np.full(300, 50.0)) is None
    assert "b" in bgnbd.at_bound and "q" in gamma_gamma.at_bound
    assert clv.fit_problem(bgnbd, gamma_gamma) == (
        "BG/NBD fit is degenerate: a, b at the search bound"
    )


@pytest.mark.parametrize(
    ("x", "t_x", "T", "message"),
    [([], [], [], "no customers"), ([1.5], [2], [3], "whole numbers"), ([1], [4], [3], "t_x <= T")],
)
def test_fit_refuses_impossible_summaries(x, t_x, T, message):
    with pytest.raises(ValueError, match=message):
        clv.fit_bgnbd(x, t_x, T)


def test_fit_refuses_a_repeat_purchase_on_the_first_day():
    # The likelihood would grow without bound as α -> 0 (found with t_x floored to whole days).
    with pytest.raises(ValueError, match="t_x must be > 0 when x > 0"):
        clv.fit_bgnbd([0, 2], [0, 0], [10, 10])
