"""Per-customer predictions for one tenant: BG/NBD + Gamma-Gamma, or a heuristic fallback.

Inputs are the dbt summary's BG/NBD columns in days. The heuristic, used when the data
cannot support a fit (`clv.data_problem` / `clv.fit_problem` say why), is:
  rate     = purchase days / max(age, 30 days)            (purchases per day so far)
  gap      = own mean gap t_x / x, or the tenant's median gap (90 days if nobody repeated),
             part of the tenant's fit like the models' parameters
  P(alive) = exp(-(days since last purchase) / max(gap, 30))
  E[purchases over h days] = rate * h * P(alive)
  CLV_h    = spend per purchase day * that, discounted monthly like the model's CLV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from cdp_assets.analytics import clv
from cdp_assets.analytics.clv import BgNbdFit, GammaGammaFit

HORIZON_MONTHS = (12, 36, 60)
DAYS_PER_MONTH = 30.0
ANNUAL_DISCOUNT_RATE = 0.10
NO_PURCHASE_DAYS = 90.0


MODEL = "bgnbd_gamma_gamma"
HEURISTIC = "heuristic"
# The heuristic's gap for a tenant in which nobody repeated.
DEFAULT_GAP_DAYS = 90.0


@dataclass(frozen=True)
class Fit:
    """What scoring a tenant's customers takes from its fit, as analytics_python.clv_fits
    stores it: the models' parameters, or the heuristic's tenant gap and why it stood in."""

    model: str  # MODEL or HEURISTIC
    bgnbd: clv.BgNbdParams | None = None
    gamma_gamma: clv.GammaGammaParams | None = None
    heuristic_gap_days: float | None = None
    fallback_reason: str | None = None


@dataclass
class Predictions:
    fit: Fit
    p_alive: NDArray[np.float64]
    p_no_purchase_90d: NDArray[np.float64]
    expected_purchases: dict[int, NDArray[np.float64]]  # by horizon in months
    clv: dict[int, NDArray[np.float64]]
    # The fits themselves (likelihoods, convergence) when this call fitted the models; their
    # types by name, as the field `clv` hides the module inside the class.
    bgnbd: BgNbdFit | None = None
    gamma_gamma: GammaGammaFit | None = None
    fit_details: dict[str, float] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.fit.model

    @property
    def fallback_reason(self) -> str | None:
        return self.fit.fallback_reason


def predict(
    x: NDArray, t_x: NDArray, T: NDArray, m_x: NDArray, spend_per_day: NDArray
) -> Predictions:
    """Fit the models on a tenant's customers and predict; fall back to the heuristic."""
    x, t_x, T, m_x, spend_per_day = _arrays(x, t_x, T, m_x, spend_per_day)
    reason = clv.data_problem(x, m_x)
    if reason is None:
        bgnbd = clv.fit_bgnbd(x, t_x, T)
        gamma_gamma = clv.fit_gamma_gamma(x, m_x)
        reason = clv.fit_problem(bgnbd, gamma_gamma)
        if reason is None:
            result = score(
                Fit(MODEL, bgnbd.params, gamma_gamma.params), x, t_x, T, m_x, spend_per_day
            )
            result.bgnbd, result.gamma_gamma = bgnbd, gamma_gamma
            result.fit_details = {
                "spend_frequency_correlation": clv.spend_frequency_correlation(x, m_x),
            }
            return result
    repeat = x > 0
    own_gap = np.divide(t_x, x, out=np.zeros_like(x), where=repeat)
    gap = float(np.median(own_gap[repeat])) if repeat.any() else DEFAULT_GAP_DAYS
    return score(
        Fit(HEURISTIC, heuristic_gap_days=gap, fallback_reason=reason),
        x,
        t_x,
        T,
        m_x,
        spend_per_day,
    )


def score(
    fit: Fit, x: NDArray, t_x: NDArray, T: NDArray, m_x: NDArray, spend_per_day: NDArray
) -> Predictions:
    """Customers' predictions with a fit made earlier (or just now): per customer, they
    depend on the fit and the customer's own inputs only, so any subset of a tenant's
    customers scores as it would among all of them."""
    x, t_x, T, m_x, spend_per_day = _arrays(x, t_x, T, m_x, spend_per_day)
    if fit.model == MODEL:
        return _model_predictions(fit, x, t_x, T, m_x)
    return _heuristic_predictions(fit, x, t_x, T, spend_per_day)


def _arrays(*arrays: NDArray) -> list[NDArray[np.float64]]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _model_predictions(fit: Fit, x, t_x, T, m_x) -> Predictions:
    params, spend_params = fit.bgnbd, fit.gamma_gamma
    assert params is not None and spend_params is not None
    return Predictions(
        fit=fit,
        p_alive=clv.probability_alive(params, x, t_x, T),
        p_no_purchase_90d=clv.probability_no_purchase(params, NO_PURCHASE_DAYS, x, t_x, T),
        expected_purchases={
            m: clv.expected_purchases(params, m * DAYS_PER_MONTH, x, t_x, T) for m in HORIZON_MONTHS
        },
        clv=clv.customer_lifetime_value(
            params,
            spend_params,
            x,
            t_x,
            T,
            m_x,
            months=HORIZON_MONTHS,
            days_per_month=DAYS_PER_MONTH,
            annual_discount_rate=ANNUAL_DISCOUNT_RATE,
        ),
    )


def _heuristic_predictions(fit: Fit, x, t_x, T, spend_per_day) -> Predictions:
    repeat = x > 0
    own_gap = np.divide(t_x, x, out=np.zeros_like(x), where=repeat)
    gap = np.maximum(np.where(repeat, own_gap, fit.heuristic_gap_days), 30.0)
    p_alive = np.exp(-(T - t_x) / gap)
    rate = (x + 1) / np.maximum(T, 30.0)
    monthly_factor = 1 / (1 + ANNUAL_DISCOUNT_RATE) ** (1 / 12)
    expected, value = {}, {}
    for months in HORIZON_MONTHS:
        expected[months] = rate * months * DAYS_PER_MONTH * p_alive
        discount = sum(monthly_factor**k for k in range(1, months + 1)) / months
        value[months] = expected[months] * spend_per_day * discount
    return Predictions(
        fit=fit,
        p_alive=p_alive,
        p_no_purchase_90d=1 - p_alive + p_alive * np.exp(-rate * NO_PURCHASE_DAYS),
        expected_purchases=expected,
        clv=value,
    )
