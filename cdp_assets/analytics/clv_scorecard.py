"""How well CLV predicts: the BG/NBD + Gamma-Gamma fit as of a calibration date, scored on what
each customer then bought in the holdout period, beside a naive baseline.

Pure numpy/scipy with no database: per-customer arrays in, a scorecard out.

- Predicted: E[Y(h) | x, t_x, T] repeat purchase days in the holdout's h days (FHL 2005a
  eq. (10)) and that times the Gamma-Gamma expected spend per purchase day (note 025).
- Baseline: each customer's past rate carried forward, x/T·h purchase days and x·m_x/T·h
  spend: what a store would guess without a model.
- Per customer and in aggregate: mean absolute error, relative bias of the total, Spearman rank
  correlation, and the share of the holdout's actual total made by the top decile of customers
  as ranked by the prediction. The decile table (customers ranked by predicted spend) shows
  calibration across the range.

The model beats the baseline when, on spend, its error is lower, its top decile captures at least
as much as the baseline's, and its ranking is better than chance. The last condition matters
where purchases are random: there the model's predictions, shrunk towards the store's mean, have
a lower error than carrying noise forward, yet neither ranks anyone and a "high CLV" tier would
be arbitrary. A higher rank correlation than the baseline's is not required: the baseline ties
every one-time buyer at 0, and Spearman's tie handling then favours it even where the model is
plainly better (CDNOW).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import spearmanr

from cdp_assets.analytics import clv
from cdp_assets.analytics.predictions import Fit

FloatArray = NDArray[np.float64]

DECILES = 10
# The model's rank correlation with the holdout's spend must be positive at this significance.
RANK_SIGNIFICANCE = 0.01


@dataclass(frozen=True)
class Accuracy:
    """One predictor of one quantity (purchase days or spend) against the holdout's actuals."""

    predicted_total: float
    actual_total: float
    mean_absolute_error: float
    bias: float | None  # (Σ predicted − Σ actual) / Σ actual; None when nothing was bought
    rank_correlation: float | None  # Spearman; None when either side is constant
    rank_p_value: float | None
    top_decile_share: float | None  # of the actual total; None when nothing was bought


@dataclass(frozen=True)
class Decile:
    decile: int  # 1 = the highest predicted spend
    customers: int
    predicted_purchases: float  # means per customer
    actual_purchases: float
    baseline_purchases: float
    predicted_spend: float
    actual_spend: float
    baseline_spend: float


@dataclass(frozen=True)
class Scorecard:
    customers: int
    holdout_days: int
    model: str  # "bgnbd_gamma_gamma", or "heuristic" when the fit fell back (not scored)
    fallback_reason: str | None
    baseline_purchases: Accuracy
    baseline_spend: Accuracy
    model_purchases: Accuracy | None  # None when the model was not fitted
    model_spend: Accuracy | None
    deciles: tuple[Decile, ...]
    beats_baseline: bool
    # Per customer, in the input order.
    baseline_per_customer: tuple[FloatArray, FloatArray]  # purchase days, spend
    predicted_purchases: FloatArray | None
    predicted_spend: FloatArray | None


def accuracy(predicted: ArrayLike, actual: ArrayLike) -> Accuracy:
    """Per-customer predictions against actuals (same order, at least one customer)."""
    predicted, actual = (np.asarray(a, dtype=np.float64) for a in (predicted, actual))
    actual_total = float(actual.sum())
    predicted_total = float(predicted.sum())
    correlation = p_value = None
    if np.ptp(predicted) > 0 and np.ptp(actual) > 0:
        result = spearmanr(predicted, actual)
        correlation, p_value = float(result.statistic), float(result.pvalue)
    return Accuracy(
        predicted_total=predicted_total,
        actual_total=actual_total,
        mean_absolute_error=float(np.abs(predicted - actual).mean()),
        bias=(predicted_total - actual_total) / actual_total if actual_total else None,
        rank_correlation=correlation,
        rank_p_value=p_value,
        top_decile_share=top_decile_share(predicted, actual),
    )


def top_decile_share(predicted: ArrayLike, actual: ArrayLike) -> float | None:
    """The share of the actual total made by the tenth of customers (rounded up) with the
    highest predictions; ties keep the customers' order, so the result is reproducible."""
    predicted, actual = (np.asarray(a, dtype=np.float64) for a in (predicted, actual))
    total = actual.sum()
    if not total:
        return None
    top = np.argsort(-predicted, kind="stable")[: -(-predicted.size // DECILES)]
    return float(actual[top].sum() / total)


def baseline(
    x: FloatArray, T: FloatArray, m_x: FloatArray, days: float
) -> tuple[FloatArray, FloatArray]:
    """Past repeat purchase days and repeat spend per day of age, carried over `days`."""
    per_day = np.divide(days, T, out=np.zeros_like(T), where=T > 0)
    return x * per_day, x * m_x * per_day


def _deciles(
    predicted: tuple[FloatArray, FloatArray],
    actual: tuple[FloatArray, FloatArray],
    naive: tuple[FloatArray, FloatArray],
) -> tuple[Decile, ...]:
    order = np.argsort(-predicted[1], kind="stable")
    deciles = []
    for number, members in enumerate(np.array_split(order, DECILES), start=1):
        if not members.size:
            continue
        means = [float(a[members].mean()) for pair in (predicted, actual, naive) for a in pair]
        p_purchases, p_spend, a_purchases, a_spend, b_purchases, b_spend = means
        deciles.append(
            Decile(
                number,
                int(members.size),
                p_purchases,
                a_purchases,
                b_purchases,
                p_spend,
                a_spend,
                b_spend,
            )  # fmt: skip
        )
    return tuple(deciles)


def beats(model: Accuracy, naive: Accuracy) -> bool:
    """Lower error, a top decile as good, and a ranking better than chance (see the module)."""
    if model.rank_correlation is None or model.rank_p_value is None:
        return False
    return (
        model.mean_absolute_error < naive.mean_absolute_error
        and (model.top_decile_share or 0.0) >= (naive.top_decile_share or 0.0)
        and model.rank_correlation > 0
        and model.rank_p_value < RANK_SIGNIFICANCE
    )


def score_holdout(
    fitted: Fit,
    x: ArrayLike,
    t_x: ArrayLike,
    T: ArrayLike,
    m_x: ArrayLike,
    actual_purchases: ArrayLike,
    actual_spend: ArrayLike,
    holdout_days: int,
) -> Scorecard:
    """Score `fitted` (the tenant's fit as of the calibration date, on these customers) on the
    purchase days and spend each customer made in the `holdout_days` after it."""
    x, t_x, T, m_x, bought, spent = (
        np.asarray(a, dtype=np.float64) for a in (x, t_x, T, m_x, actual_purchases, actual_spend)
    )
    if not x.size:
        raise ValueError("no customers to score")
    naive = baseline(x, T, m_x, holdout_days)
    baseline_purchases, baseline_spend = accuracy(naive[0], bought), accuracy(naive[1], spent)
    model_purchases = model_spend = purchases = spend = None
    deciles: tuple[Decile, ...] = ()
    if fitted.bgnbd is not None and fitted.gamma_gamma is not None:
        purchases = clv.expected_purchases(fitted.bgnbd, holdout_days, x, t_x, T)
        spend = purchases * clv.expected_spend(fitted.gamma_gamma, x, m_x)
        model_purchases, model_spend = accuracy(purchases, bought), accuracy(spend, spent)
        deciles = _deciles((purchases, spend), (bought, spent), naive)
    return Scorecard(
        customers=int(x.size),
        holdout_days=holdout_days,
        model=fitted.model,
        fallback_reason=fitted.fallback_reason,
        baseline_purchases=baseline_purchases,
        baseline_spend=baseline_spend,
        model_purchases=model_purchases,
        model_spend=model_spend,
        deciles=deciles,
        beats_baseline=model_spend is not None and beats(model_spend, baseline_spend),
        baseline_per_customer=naive,
        predicted_purchases=purchases,
        predicted_spend=spend,
    )
