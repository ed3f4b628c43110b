"""Per-customer predictions for one tenant: BG/NBD + Gamma-Gamma, or a heuristic fallback.

Inputs are the dbt summary's BG/NBD columns in days. The heuristic, used when the data
cannot support a fit (`clv.data_problem` / `clv.fit_problem` say why), is:
  rate     = purchase days / max(age, 30 days)            (purchases per day so far)
  gap      = own mean gap t_x / x, or the tenant's median gap (90 days if nobody repeated)
  P(alive) = exp(-(days since last purchase) / max(gap, 30))
  E[purchases over h days] = rate * h * P(alive)
  CLV_h    = spend per purchase day * that, discounted monthly like the model's CLV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from cdp_assets.analytics import clv

HORIZON_MONTHS = (12, 36, 60)
DAYS_PER_MONTH = 30.0
ANNUAL_DISCOUNT_RATE = 0.10
NO_PURCHASE_DAYS = 90.0


@dataclass
class Predictions:
    model: str  # "bgnbd_gamma_gamma" or "heuristic"
    p_alive: NDArray[np.float64]
    p_no_purchase_90d: NDArray[np.float64]
    expected_purchases: dict[int, NDArray[np.float64]]  # by horizon in months
    clv: dict[int, NDArray[np.float64]]
    fallback_reason: str | None = None
    bgnbd: clv.BgNbdFit | None = None
    gamma_gamma: clv.GammaGammaFit | None = None
    fit_details: dict[str, float] = field(default_factory=dict)


def predict(
    x: NDArray, t_x: NDArray, T: NDArray, m_x: NDArray, spend_per_day: NDArray
) -> Predictions:
    """Fit the models on a tenant's customers and predict; fall back to the heuristic."""
    x, t_x, T, m_x, spend_per_day = (
        np.asarray(a, dtype=np.float64) for a in (x, t_x, T, m_x, spend_per_day)
    )
    reason = clv.data_problem(x, m_x)
    if reason is None:
        bgnbd = clv.fit_bgnbd(x, t_x, T)
        gamma_gamma = clv.fit_gamma_gamma(x, m_x)
        reason = clv.fit_problem(bgnbd, gamma_gamma)
        if reason is None:
            return _model_predictions(bgnbd, gamma_gamma, x, t_x, T, m_x)
    return _heuristic_predictions(x, t_x, T, spend_per_day, reason)


def _model_predictions(
    bgnbd: clv.BgNbdFit, gamma_gamma: clv.GammaGammaFit, x, t_x, T, m_x
) -> Predictions:
    params = bgnbd.params
    return Predictions(
        model="bgnbd_gamma_gamma",
        p_alive=clv.probability_alive(params, x, t_x, T),
        p_no_purchase_90d=clv.probability_no_purchase(params, NO_PURCHASE_DAYS, x, t_x, T),
        expected_purchases={
            m: clv.expected_purchases(params, m * DAYS_PER_MONTH, x, t_x, T) for m in HORIZON_MONTHS
        },
        clv=clv.customer_lifetime_value(
            params,
            gamma_gamma.params,
            x,
            t_x,
            T,
            m_x,
            months=HORIZON_MONTHS,
            days_per_month=DAYS_PER_MONTH,
            annual_discount_rate=ANNUAL_DISCOUNT_RATE,
        ),
        bgnbd=bgnbd,
        gamma_gamma=gamma_gamma,
        fit_details={
            "spend_frequency_correlation": clv.spend_frequency_correlation(x, m_x),
        },
    )


def _heuristic_predictions(x, t_x, T, spend_per_day, reason: str) -> Predictions:
    repeat = x > 0
    own_gap = np.divide(t_x, x, out=np.zeros_like(x), where=repeat)
    tenant_gap = float(np.median(own_gap[repeat])) if repeat.any() else 90.0
    gap = np.maximum(np.where(repeat, own_gap, tenant_gap), 30.0)
    p_alive = np.exp(-(T - t_x) / gap)
    rate = (x + 1) / np.maximum(T, 30.0)
    monthly_factor = 1 / (1 + ANNUAL_DISCOUNT_RATE) ** (1 / 12)
    expected, value = {}, {}
    for months in HORIZON_MONTHS:
        expected[months] = rate * months * DAYS_PER_MONTH * p_alive
        discount = sum(monthly_factor**k for k in range(1, months + 1)) / months
        value[months] = expected[months] * spend_per_day * discount
    return Predictions(
        model="heuristic",
        p_alive=p_alive,
        p_no_purchase_90d=1 - p_alive + p_alive * np.exp(-rate * NO_PURCHASE_DAYS),
        expected_purchases=expected,
        clv=value,
        fallback_reason=reason,
    )
