"""Customer lifetime value maths: BG/NBD purchase counts, Gamma-Gamma spend, discounted CLV.

Pure numpy/scipy with no database: per-customer arrays in, per-customer arrays out.

Sources of the formulas
- BG/NBD: Fader, Hardie & Lee (2005a), "Counting Your Customers the Easy Way: An Alternative to
  the Pareto/NBD Model", Marketing Science 24(2) 275-284; Hardie's notes 021 (P(alive)) and
  027 (a likelihood that does not overflow).
- Gamma-Gamma: Fader & Hardie (2013), "The Gamma-Gamma Model of Monetary Value" (note 025), as
  used in Fader, Hardie & Lee (2005b), "RFM and CLV: Using Iso-Value Curves for Customer Base
  Analysis", JMR 42(4) 415-430.
- Discounted CLV: the monthly sum of lifetimes' `_customer_lifetime_value` and pymc-marketing's
  `customer_lifetime_value`.

Per customer, at an as-of date: `x` = repeat purchase days (purchase days - 1), `t_x` = time from
the first to the last purchase day, `T` = time from the first purchase day to the as-of date,
`m_x` = mean spend of the repeat purchase days (0 when x = 0). Any time unit works as long as
x, t_x, T and horizons share it: only α carries the unit (weeks to days multiplies α by 7).
Likewise only γ carries the currency unit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize
from scipy.special import digamma, expit, gammaln, hyp2f1

FloatArray = NDArray[np.float64]

# Fits search log-parameters in [-_LOG_BOUND, _LOG_BOUND] on data rescaled to a mean of 1, so
# one start point suits days or weeks and cents or units; a parameter ending on the edge means
# the likelihood wants it at 0 or infinity (e.g. no sign of dropout), not a finite optimum.
_LOG_BOUND = 10.0
# Tighter than scipy's defaults, which stopped a and b about 0.5 % short on daily data.
_LBFGSB_OPTIONS = {"ftol": 1e-13, "gtol": 1e-9, "maxiter": 1000}
# So tight that L-BFGS-B's line search often gives up at the optimum on rounding noise (gradient
# ~1e-8, "ABNORMAL_TERMINATION_IN_LNSRCH"); a fit stopping with a gradient below this counts as
# converged. The objective is the mean log-likelihood per customer.
_CONVERGED_GRADIENT = 1e-6

# Below this many repeat customers the fitted heterogeneity is mostly noise.
MIN_REPEATERS = 100


@dataclass(frozen=True)
class BgNbdParams:
    r: float
    alpha: float
    a: float
    b: float


@dataclass(frozen=True)
class GammaGammaParams:
    p: float
    q: float
    gamma: float


@dataclass(frozen=True)
class BgNbdFit:
    params: BgNbdParams
    log_likelihood: float
    converged: bool
    n_customers: int
    n_repeaters: int
    at_bound: tuple[str, ...]  # parameters that stopped on the edge of the search box


@dataclass(frozen=True)
class GammaGammaFit:
    params: GammaGammaParams
    log_likelihood: float
    converged: bool
    n_customers: int  # customers the fit used: x > 0 and m_x > 0
    at_bound: tuple[str, ...]


@dataclass(frozen=True)
class PurchaseSummary:
    customer_ids: np.ndarray  # sorted distinct ids with an order on or before the as-of day
    x: FloatArray
    t_x: FloatArray  # days
    T: FloatArray  # days
    m_x: FloatArray


def _floats(*arrays: ArrayLike) -> list[FloatArray]:
    return [np.asarray(a, dtype=np.float64) for a in np.broadcast_arrays(*arrays)]


# --- BG/NBD -------------------------------------------------------------------------------


def _bgnbd_ll_and_grad(
    params: BgNbdParams, x: FloatArray, t_x: FloatArray, T: FloatArray, weights: FloatArray
) -> tuple[float, FloatArray]:
    """Σ w·LL and its gradient with respect to (ln r, ln α, ln a, ln b)."""
    r, alpha, a, b = params.r, params.alpha, params.a, params.b
    repeat = x > 0
    # b + x - 1 may be negative when x = 0, where the A4 term does not exist anyway.
    b_x1 = np.where(repeat, b + x - 1, 1.0)
    a1 = gammaln(r + x) - gammaln(r) + r * np.log(alpha)
    a2 = gammaln(a + b) + gammaln(b + x) - gammaln(b) - gammaln(a + b + x)
    a3 = -(r + x) * np.log(alpha + T)
    a4 = np.where(repeat, np.log(a) - np.log(b_x1) - (r + x) * np.log(alpha + t_x), -np.inf)
    # ln(e^A3 + e^A4) by log-sum-exp: the direct sum over/underflows (note 027's #NUM! fix).
    mix = np.logaddexp(a3, a4)
    share3 = np.exp(a3 - mix)
    share4 = np.exp(a4 - mix)
    d_r = (
        digamma(r + x)
        - digamma(r)
        + np.log(alpha)
        - share3 * np.log(alpha + T)
        - share4 * np.log(alpha + t_x)
    )
    d_alpha = r / alpha - (r + x) * (share3 / (alpha + T) + share4 / (alpha + t_x))
    d_a = digamma(a + b) - digamma(a + b + x) + share4 / a
    d_b = digamma(a + b) + digamma(b + x) - digamma(b) - digamma(a + b + x) - share4 / b_x1
    grad = np.array(
        [r * weights @ d_r, alpha * weights @ d_alpha, a * weights @ d_a, b * weights @ d_b]
    )
    return float(weights @ (a1 + a2 + mix)), grad


def bgnbd_log_likelihood(
    params: BgNbdParams,
    x: ArrayLike,
    t_x: ArrayLike,
    T: ArrayLike,
    weights: ArrayLike | None = None,
) -> float:
    """Total BG/NBD log-likelihood, each customer (or pattern) counted `weights` times.

    FHL 2005a's likelihood in the form of Hardie's Excel note 004, per customer:
    LL = A1 + A2 + ln(e^A3 + [x>0]·e^A4) with
    A1 = lnΓ(r+x) − lnΓ(r) + r·ln α,  A2 = lnΓ(a+b) + lnΓ(b+x) − lnΓ(b) − lnΓ(a+b+x),
    A3 = −(r+x)·ln(α+T),  A4 = ln a − ln(b+x−1) − (r+x)·ln(α+t_x).
    """
    x, t_x, T = _floats(x, t_x, T)
    w = np.ones_like(x) if weights is None else np.broadcast_to(np.asarray(weights, float), x.shape)
    return _bgnbd_ll_and_grad(params, x, t_x, T, w)[0]


def _check_summary(x: FloatArray, t_x: FloatArray, T: FloatArray) -> None:
    if x.size == 0:
        raise ValueError("no customers to fit")
    if np.any(x < 0) or np.any(x != np.round(x)):
        raise ValueError("x must be whole numbers of repeat purchases, >= 0")
    if np.any(t_x < 0) or np.any(t_x > T):
        raise ValueError("t_x must satisfy 0 <= t_x <= T")
    # A repeat purchase at t_x = 0 makes the likelihood unbounded as α -> 0; with purchases
    # merged per day, x > 0 implies t_x >= 1 day.
    if np.any((x > 0) & (t_x == 0)):
        raise ValueError("t_x must be > 0 when x > 0 (repeat purchases are later purchase days)")


def _fit_log_params(
    objective: Callable[[FloatArray], tuple[float, FloatArray]], names: tuple[str, ...]
) -> tuple[FloatArray, bool, tuple[str, ...]]:
    """Minimise on log-parameters from 0 (all parameters 1 on the rescaled data).

    Returns the parameters, whether the fit converged and the names of those at a bound.
    """
    result = minimize(
        objective,
        np.zeros(len(names)),
        jac=True,
        method="L-BFGS-B",
        bounds=[(-_LOG_BOUND, _LOG_BOUND)] * len(names),
        options=_LBFGSB_OPTIONS,
    )
    free = np.abs(result.x) < _LOG_BOUND - 1e-3
    # At a bound the gradient points outwards and stays non-zero; judge the free parameters.
    converged = result.success or np.max(np.abs(result.jac[free]), initial=0) < _CONVERGED_GRADIENT
    at_bound = tuple(name for name, is_free in zip(names, free, strict=True) if not is_free)
    return np.exp(result.x), bool(converged), at_bound


def fit_bgnbd(x: ArrayLike, t_x: ArrayLike, T: ArrayLike) -> BgNbdFit:
    """Maximum-likelihood BG/NBD fit (FHL 2005a) with L-BFGS-B on log-parameters.

    Customers with identical (x, t_x, T) share one likelihood term, so the distinct patterns are
    fitted with their counts as weights (the compression Hardie uses in his spreadsheets): 200k
    simulated customers with CDNOW-like behaviour over three years of days are 92k patterns.
    """
    x, t_x, T = _floats(x, t_x, T)
    _check_summary(x, t_x, T)
    patterns, counts = np.unique(np.column_stack([x, t_x, T]), axis=0, return_counts=True)
    px, pt_x, pT = patterns.T
    weights = counts.astype(np.float64)
    # Time rescaled to a mean age of 1: r, a and b do not change, α is divided by the scale.
    scale = float(T.mean()) or 1.0

    def objective(log_params: FloatArray) -> tuple[float, FloatArray]:
        ll, grad = _bgnbd_ll_and_grad(
            BgNbdParams(*np.exp(log_params)), px, pt_x / scale, pT / scale, weights
        )
        # The mean, not the sum, so the tolerances mean the same for any number of customers.
        return -ll / x.size, -grad / x.size

    (r, alpha, a, b), converged, at_bound = _fit_log_params(objective, ("r", "alpha", "a", "b"))
    params = BgNbdParams(float(r), float(alpha * scale), float(a), float(b))
    return BgNbdFit(
        params=params,
        log_likelihood=bgnbd_log_likelihood(params, px, pt_x, pT, weights),
        converged=converged,
        n_customers=int(x.size),
        n_repeaters=int(np.count_nonzero(x > 0)),
        at_bound=at_bound,
    )


def _log_odds_dead(
    params: BgNbdParams, x: FloatArray, t_x: FloatArray, T: FloatArray
) -> FloatArray:
    """ln(a/(b+x−1)·((α+T)/(α+t_x))^{r+x}) for x > 0, −inf for x = 0."""
    r, alpha, a, b = params.r, params.alpha, params.a, params.b
    repeat = x > 0
    b_x1 = np.where(repeat, b + x - 1, 1.0)
    # In logs: the power overflows for frequent buyers who have been silent for long.
    log_odds = np.log(a) - np.log(b_x1) + (r + x) * (np.log(alpha + T) - np.log(alpha + t_x))
    return np.where(repeat, log_odds, -np.inf)


def probability_alive(
    params: BgNbdParams, x: ArrayLike, t_x: ArrayLike, T: ArrayLike
) -> FloatArray:
    """P(alive at T | x, t_x, T) = 1 / (1 + [x>0]·a/(b+x−1)·((α+T)/(α+t_x))^{r+x}).

    Hardie note 021. It is 1 for every x = 0 customer: in BG/NBD dropout
    can only happen right after a repeat purchase.
    """
    x, t_x, T = _floats(x, t_x, T)
    return expit(-_log_odds_dead(params, x, t_x, T))


def expected_purchases(
    params: BgNbdParams, t: ArrayLike, x: ArrayLike, t_x: ArrayLike, T: ArrayLike
) -> FloatArray:
    """E[Y(t) | x, t_x, T]: expected repeat purchases in (T, T+t] (FHL 2005a eq. (10)).

        E[Y(t)] = (a+b+x−1)/(a−1) · [1 − ((α+T)/(α+T+t))^{r+x} · 2F1(r+x, b+x; c; z)] · P(alive)
        with c = a+b+x−1 and z = t/(α+T+t).

    The 2F1 goes through Euler's transformation,
    2F1(r+x, b+x; c; z) = (1−z)^{a−1−r−x} · 2F1(a+b−1−r, a−1; c; z),
    whose (1−z)^{−r−x} cancels ((α+T)/(α+T+t))^{r+x} = (1−z)^{r+x}: both overflow/underflow for
    large x otherwise, and the remaining series does not grow with x. The 2F1 value is used
    directly, never its log: with a+b < 1 and x = 0, c < 0 and the 2F1 is negative while the
    result is fine (the NaN of lifetimes issue #442). a = 1 is a removable singularity that a
    fit does not land on exactly. With a large a (little dropout: a = 2,134, b = 16,864 on a
    synthetic store) Euler's form fails the other way, (1−z)^{a−1} underflowing to 0 while its
    2F1 overflows; there the untransformed product, finite then, is used.
    """
    t, x, t_x, T = _floats(t, x, t_x, T)
    return _purchases_if_alive(params, t, x, T) * probability_alive(params, x, t_x, T)


def _purchases_if_alive(params: BgNbdParams, t: FloatArray, x: FloatArray, T: FloatArray):
    """E[Y(t) | x, T, alive at T]: eq. (10) without its P(alive), which t_x enters only."""
    r, alpha, a, b = params.r, params.alpha, params.a, params.b
    z = t / (alpha + T + t)
    c = a + b + x - 1
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        tail = (1 - z) ** (a - 1) * hyp2f1(a + b - 1 - r, a - 1, c, z)
        if not np.all(np.isfinite(tail)):  # rare: the second 2F1 only then
            untransformed = (1 - z) ** (r + x) * hyp2f1(r + x, b + x, c, z)
            tail = np.where(np.isfinite(tail), tail, untransformed)
    return c / (a - 1) * (1 - tail)


def expected_purchases_new(params: BgNbdParams, t: ArrayLike) -> FloatArray:
    """E[X(t)]: expected repeat purchases of a new customer in (0, t] (FHL 2005a eq. (9)).

        E[X(t)] = (a+b−1)/(a−1) · [1 − (α/(α+t))^r · 2F1(r, b; a+b−1; t/(α+t))],

    which is eq. (10) at x = t_x = T = 0.
    """
    return expected_purchases(params, t, 0.0, 0.0, 0.0)


def probability_no_purchase(
    params: BgNbdParams, t: ArrayLike, x: ArrayLike, t_x: ArrayLike, T: ArrayLike
) -> FloatArray:
    """P(no purchase in (T, T+t] | x, t_x, T) = 1 − PA + PA·((α+T)/(α+T+t))^{r+x}.

    Derived from the model, not quoted: a dead customer never buys; an alive one has
    λ | history ~ Gamma(r+x, α+T) and does not buy with probability E[e^{−λt}].
    """
    t, x, t_x, T = _floats(t, x, t_x, T)
    alive = expit(-_log_odds_dead(params, x, t_x, T))
    silent_if_alive = ((params.alpha + T) / (params.alpha + T + t)) ** (params.r + x)
    return 1 - alive + alive * silent_if_alive


def simulate_bgnbd(
    params: BgNbdParams, n_customers: int, T: ArrayLike, seed: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Draw (x, t_x, T) from the BG/NBD process for customers observed for T after their first
    purchase (a scalar or one value per customer).

    λ ~ Gamma(r, rate α) and p ~ Beta(a, b). The customer dies right after repeat purchase N,
    N ~ Geometric(p) on 1, 2, ..., so x = min(K, N) with K ~ Poisson(λT) purchases in (0, T];
    given K, purchase times are K uniform order statistics on (0, T], so the x-th one is
    T·Beta(x, K−x+1).
    """
    rng = np.random.default_rng(seed)
    T = np.broadcast_to(np.asarray(T, dtype=np.float64), (n_customers,)).copy()
    rate = rng.gamma(params.r, 1 / params.alpha, n_customers)
    dropout = rng.beta(params.a, params.b, n_customers)
    purchases_before_death = rng.geometric(dropout)
    purchases_in_window = rng.poisson(rate * T)
    x = np.minimum(purchases_in_window, purchases_before_death)
    last = rng.beta(np.maximum(x, 1), purchases_in_window - x + 1)
    t_x = np.where(x > 0, T * last, 0.0)
    return x.astype(np.float64), t_x, T


# --- Gamma-Gamma ----------------------------------------------------------------------------


def _with_spend(x: FloatArray, m_x: FloatArray) -> NDArray[np.bool_]:
    """Customers the spend model can use: a repeat purchase and a positive mean spend
    (a Gamma density has no mass at 0)."""
    return (x > 0) & (m_x > 0)


def _gamma_gamma_ll_and_grad(
    params: GammaGammaParams, x: FloatArray, m: FloatArray
) -> tuple[float, FloatArray]:
    """Σ LL and its gradient with respect to (ln p, ln q, ln γ)."""
    p, q, g = params.p, params.q, params.gamma
    px = p * x
    ll = (
        gammaln(px + q)
        - gammaln(px)
        - gammaln(q)
        + q * np.log(g)
        + (px - 1) * np.log(m)
        + px * np.log(x)
        - (px + q) * np.log(g + x * m)
    )
    d_p = x * (digamma(px + q) - digamma(px) + np.log(m) + np.log(x) - np.log(g + x * m))
    d_q = digamma(px + q) - digamma(q) + np.log(g) - np.log(g + x * m)
    d_g = q / g - (px + q) / (g + x * m)
    return float(ll.sum()), np.array([p * d_p.sum(), q * d_q.sum(), g * d_g.sum()])


def gamma_gamma_log_likelihood(params: GammaGammaParams, x: ArrayLike, m_x: ArrayLike) -> float:
    """Total Gamma-Gamma log-likelihood of the mean repeat spends (Fader & Hardie 2013, note 025).

    Per customer with x > 0 and m_x > 0 (others are skipped):
    LL = lnΓ(px+q) − lnΓ(px) − lnΓ(q) + q·ln γ + (px−1)·ln m_x + px·ln x − (px+q)·ln(γ + x·m_x).
    """
    x, m_x = _floats(x, m_x)
    use = _with_spend(x, m_x)
    return _gamma_gamma_ll_and_grad(params, x[use], m_x[use])[0]


def fit_gamma_gamma(x: ArrayLike, m_x: ArrayLike) -> GammaGammaFit:
    """Maximum-likelihood Gamma-Gamma fit on the customers with x > 0 and m_x > 0.

    Raises ValueError when there is no such customer; `data_problem` says so beforehand.
    """
    x, m_x = _floats(x, m_x)
    use = _with_spend(x, m_x)
    if not use.any():
        raise ValueError("no customer with a repeat purchase and positive spend")
    x, m_x = x[use], m_x[use]
    # Money rescaled to a mean of 1: p and q do not change, γ is divided by the scale.
    scale = float(m_x.mean())

    def objective(log_params: FloatArray) -> tuple[float, FloatArray]:
        ll, grad = _gamma_gamma_ll_and_grad(GammaGammaParams(*np.exp(log_params)), x, m_x / scale)
        return -ll / x.size, -grad / x.size

    (p, q, gamma), converged, at_bound = _fit_log_params(objective, ("p", "q", "gamma"))
    params = GammaGammaParams(float(p), float(q), float(gamma * scale))
    return GammaGammaFit(
        params=params,
        log_likelihood=gamma_gamma_log_likelihood(params, x, m_x),
        converged=converged,
        n_customers=int(x.size),
        at_bound=at_bound,
    )


def expected_spend(params: GammaGammaParams, x: ArrayLike, m_x: ArrayLike) -> FloatArray:
    """Expected spend per future purchase day: p·(γ + x·m_x)/(p·x + q − 1) (note 025, eq. (5)).

    A weighted mean of the population mean p·γ/(q−1) and the customer's own m_x; for x = 0 it is
    the population mean (needs q > 1).
    """
    x, m_x = _floats(x, m_x)
    p, q, g = params.p, params.q, params.gamma
    return p * (g + x * m_x) / (p * x + q - 1)


def spend_frequency_correlation(x: ArrayLike, m_x: ArrayLike) -> float:
    """Pearson correlation of x and m_x over the customers the spend model uses.

    Gamma-Gamma assumes spend is independent of purchase frequency; a value far from 0 means
    its spend predictions are biased (CDNOW: 0.11). NaN with fewer than two such customers or
    no variation.
    """
    x, m_x = _floats(x, m_x)
    use = _with_spend(x, m_x)
    if use.sum() < 2 or np.ptp(x[use]) == 0 or np.ptp(m_x[use]) == 0:
        return float("nan")
    return float(np.corrcoef(x[use], m_x[use])[0, 1])


# --- CLV ------------------------------------------------------------------------------------


def customer_lifetime_value(
    bgnbd: BgNbdParams,
    gamma_gamma: GammaGammaParams,
    x: ArrayLike,
    t_x: ArrayLike,
    T: ArrayLike,
    m_x: ArrayLike,
    *,
    months: Sequence[int] = (12, 36, 60),
    days_per_month: float = 30.0,
    time_unit_days: float = 1.0,
    annual_discount_rate: float = 0.10,
) -> dict[int, FloatArray]:
    """Residual (future) CLV per horizon in months, discounted monthly.

        CLV_H = Σ_{k=1..H} S · (E[Y(kΔ)] − E[Y((k−1)Δ)]) / (1+d)^k

    as in lifetimes' `_customer_lifetime_value` and pymc-marketing's `customer_lifetime_value`,
    with S the Gamma-Gamma expected spend, Δ = days_per_month / time_unit_days the month in model
    time units (x, t_x and T being in units of `time_unit_days` days) and the monthly rate
    d = (1 + annual_discount_rate)^(1/12) − 1. The default annual rate is 10 % (d ≈ 0.797 %);
    lifetimes' default d = 0.01 per month is 12.68 % a year. Spend already made is not included.
    All horizons come from one loop over the longest one, as partial sums.
    """
    if not months or min(months) < 1:
        raise ValueError("months must be a non-empty list of horizons >= 1")
    x, t_x, T, m_x = _floats(x, t_x, T, m_x)
    # E[Y(t)] = E[Y(t) | alive] · P(alive), and the first depends on (x, T) only: customers
    # share far fewer of those pairs than they are (whole days, small counts), so the 2F1 of
    # every month runs once per pair, not once per customer.
    # As complex numbers, which sort by real then imaginary part: a 1-D unique, several times
    # faster than np.unique(axis=0) over the two columns.
    pairs, customer_pair = np.unique(x + 1j * T, return_inverse=True)
    pair_x, pair_T = pairs.real, pairs.imag
    step = days_per_month / time_unit_days
    monthly_factor = 1 / (1 + annual_discount_rate) ** (1 / 12)
    discounted = np.zeros_like(pair_x)  # Σ_k (E[Y(kΔ) | alive] − E[Y((k−1)Δ) | alive]) / (1+d)^k
    previous = np.zeros_like(pair_x)
    by_month: dict[int, FloatArray] = {}
    for k in range(1, max(months) + 1):
        purchases = _purchases_if_alive(bgnbd, np.full_like(pair_x, k * step), pair_x, pair_T)
        discounted += (purchases - previous) * monthly_factor**k
        previous = purchases
        if k in months:
            by_month[k] = discounted.copy()
    per_customer = expected_spend(gamma_gamma, x, m_x) * probability_alive(bgnbd, x, t_x, T)
    return {m: per_customer * by_month[m][customer_pair.ravel()] for m in months}


# --- Inputs and fallback --------------------------------------------------------------------


def _day_numbers(values: ArrayLike) -> NDArray[np.int64]:
    """Integer day numbers as given, or dates (np.datetime64, datetime.date, ISO strings) as
    days since 1970-01-01."""
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)
    return array.astype("datetime64[D]").astype(np.int64)


def summarize_purchases(
    customer_ids: ArrayLike, order_days: ArrayLike, amounts: ArrayLike, as_of: ArrayLike
) -> PurchaseSummary:
    """Per-customer x, t_x, T (days) and m_x from order rows, as of the end of day `as_of`.

    Days are calendar days (integers or dates) in the store's time zone; orders after `as_of`
    are ignored. Orders of one customer on one day are one purchase with their amounts summed,
    as in the CDNOW summary, lifetimes and pymc-marketing (BG/NBD counts purchase days).
    x = purchase days − 1, t_x = last − first day, T = as_of − first day, m_x = mean spend of
    the repeat days (the first day excluded, 0 when x = 0).
    """
    ids = np.asarray(customer_ids)
    days = _day_numbers(order_days)
    amounts = np.asarray(amounts, dtype=np.float64)
    if not ids.ndim == 1 or not ids.shape == days.shape == amounts.shape:
        raise ValueError("customer_ids, order_days and amounts must be 1-D and the same length")
    as_of_day = int(_day_numbers(as_of))
    kept = days <= as_of_day
    unique_ids, customer = np.unique(ids[kept], return_inverse=True)
    days, amounts = days[kept], amounts[kept]
    order = np.lexsort((days, customer))
    customer, days, amounts = customer[order], days[order], amounts[order]

    new_day = np.ones(customer.size, dtype=bool)
    new_day[1:] = (customer[1:] != customer[:-1]) | (days[1:] != days[:-1])
    day_customer, day = customer[new_day], days[new_day]
    day_amount = np.bincount(np.cumsum(new_day) - 1, weights=amounts, minlength=day.size)

    first = np.ones(day.size, dtype=bool)
    first[1:] = day_customer[1:] != day_customer[:-1]
    last = np.append(first[1:], True)
    n = unique_ids.size
    x = np.bincount(day_customer, minlength=n) - 1
    repeat_spend = np.bincount(day_customer[~first], weights=day_amount[~first], minlength=n)
    return PurchaseSummary(
        customer_ids=unique_ids,
        x=x.astype(np.float64),
        t_x=(day[last] - day[first]).astype(np.float64),
        T=(as_of_day - day[first]).astype(np.float64),
        m_x=np.divide(repeat_spend, x, out=np.zeros(n), where=x > 0),
    )


def data_problem(x: ArrayLike, m_x: ArrayLike, *, min_repeaters: int = MIN_REPEATERS) -> str | None:
    """Why a tenant's summary cannot support the fits (check before fitting), or None.

    Both models learn their heterogeneity from repeat customers: BG/NBD needs at least
    `min_repeaters` customers with x > 0, Gamma-Gamma as many with x > 0 and m_x > 0.
    """
    x, m_x = _floats(x, m_x)
    repeaters = int(np.count_nonzero(x > 0))
    if repeaters < min_repeaters:
        return f"only {repeaters} repeat customers (need {min_repeaters})"
    with_spend = int(np.count_nonzero(_with_spend(x, m_x)))
    if with_spend < min_repeaters:
        return f"only {with_spend} repeat customers with positive spend (need {min_repeaters})"
    return None


def fit_problem(bgnbd: BgNbdFit, gamma_gamma: GammaGammaFit) -> str | None:
    """Why fitted models should not be used for CLV, or None when they can be.

    Rules, in order: a parameter stopped on the edge of the search box (the likelihood keeps
    rising towards 0 or infinity, e.g. no sign of dropout or of spend heterogeneity, so the model
    is degenerate for this data); the optimiser did not converge or the likelihood is not finite;
    the Gamma-Gamma q <= 1, where the population mean spend p·γ/(q−1) used for x = 0 customers is
    undefined. BG/NBD a <= 1 is accepted: E[X(t)] and E[Y(t)] stay finite for finite t (CDNOW has
    a = 0.79); only the expected number of purchases over an unlimited lifetime diverges.
    """
    for name, fit in (("BG/NBD", bgnbd), ("Gamma-Gamma", gamma_gamma)):
        if fit.at_bound:
            return f"{name} fit is degenerate: {', '.join(fit.at_bound)} at the search bound"
        if not fit.converged or not np.isfinite(fit.log_likelihood):
            return f"{name} fit did not converge"
    if gamma_gamma.params.q <= 1:
        return f"Gamma-Gamma q = {gamma_gamma.params.q:.3g} <= 1: population mean spend undefined"
    return None
