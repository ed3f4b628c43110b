"""Our BG/NBD + Gamma-Gamma fit against the `lifetimes` package on each tenant's own data.

Both fit the same per-customer summary the `customer_predictions` asset reads (x, t_x, T in
days, m_x), each timed as the best of three; each side's parameters are then scored with the
same log-likelihood, so a difference in parameters can be judged by which one fits better.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from cdp_assets.analytics import clv
from cdp_assets.analytics.prediction_refresh import SUMMARY_MODEL, read_fit_inputs

BGNBD = ("r", "alpha", "a", "b")
GAMMA_GAMMA = ("p", "q", "gamma")


def _summary(conn: psycopg.Connection, tenant_id: str) -> tuple[np.ndarray, ...]:
    (inputs,) = read_fit_inputs(conn, SUMMARY_MODEL, [tenant_id])
    return inputs.x, inputs.t_x, inputs.T, inputs.m_x


# Each fit is timed this many times and the fastest kept: the machine may be shared.
REPEATS = 3


def _best_of(fit: Callable[[], Any]) -> tuple[float, Any]:
    timings = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = fit()
        timings.append(time.perf_counter() - started)
    return min(timings), result


def _ours(x, t_x, T, m_x) -> tuple[float, dict[str, float]]:
    seconds, (bg, gg) = _best_of(lambda: (clv.fit_bgnbd(x, t_x, T), clv.fit_gamma_gamma(x, m_x)))
    return seconds, {**vars(bg.params), **vars(gg.params)}


def _lifetimes(x, t_x, T, m_x) -> tuple[float, dict[str, float]]:
    from lifetimes import BetaGeoFitter, GammaGammaFitter

    spend = (x > 0) & (m_x > 0)
    seconds, (bg, gg) = _best_of(
        lambda: (
            BetaGeoFitter().fit(x, t_x, T),
            GammaGammaFitter().fit(x[spend], m_x[spend]),
        )
    )
    return seconds, {
        **{name: float(bg.params_[name]) for name in BGNBD},
        "p": float(gg.params_["p"]),
        "q": float(gg.params_["q"]),
        "gamma": float(gg.params_["v"]),  # lifetimes calls the scale v
    }


def _log_likelihoods(params: dict[str, float], x, t_x, T, m_x) -> dict[str, float]:
    return {
        "bgnbd": clv.bgnbd_log_likelihood(clv.BgNbdParams(*(params[n] for n in BGNBD)), x, t_x, T),
        "gamma_gamma": clv.gamma_gamma_log_likelihood(
            clv.GammaGammaParams(*(params[n] for n in GAMMA_GAMMA)), x, m_x
        ),
    }


def _scipy_message(printed: io.StringIO) -> list[str]:
    """The `message:` line of a scipy result lifetimes printed, in brackets, if any."""
    match = re.search(r"^\s*message: (.+)$", printed.getvalue(), re.MULTILINE)
    return [f"({match.group(1).strip()})"] if match else []


def compare_tenant(conn: psycopg.Connection, tenant_id: str) -> dict[str, Any]:
    """Times, parameters and log-likelihoods of both fits on one tenant's customers."""
    x, t_x, T, m_x = _summary(conn, tenant_id)
    row: dict[str, Any] = {"tenant_id": tenant_id, "customers": int(x.size)}
    problem = clv.data_problem(x, m_x) if x.size else "no customers"
    if problem:
        return {**row, "skipped": problem}
    row["repeaters"] = int((x > 0).sum())
    ours_seconds, ours = _ours(x, t_x, T, m_x)
    row["ours"] = {"seconds": round(ours_seconds, 4), "params": ours}
    row["ours"]["log_likelihood"] = _log_likelihoods(ours, x, t_x, T, m_x)
    # lifetimes prints scipy's whole result when a fit fails to converge: its message goes
    # into the report, not onto the console.
    printed = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed):
            warnings.simplefilter("ignore")  # pandas deprecations inside lifetimes 0.11
            theirs_seconds, theirs = _lifetimes(x, t_x, T, m_x)
    except ImportError:
        return {**row, "lifetimes": {"error": "lifetimes is not installed (the test extra)"}}
    except Exception as error:  # a failed fit is a result to report, not a crash
        reason = " ".join([f"{type(error).__name__}: {error}".strip(), *_scipy_message(printed)])
        return {**row, "lifetimes": {"error": reason[:300]}}
    row["lifetimes"] = {
        "seconds": round(theirs_seconds, 4),
        "params": theirs,
        "log_likelihood": _log_likelihoods(theirs, x, t_x, T, m_x),
    }
    row["max_relative_param_difference"] = max(
        abs(ours[n] - theirs[n]) / max(abs(theirs[n]), 1e-12) for n in ours
    )
    row["speedup"] = theirs_seconds / ours_seconds if ours_seconds else None
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the tenants both sides fitted."""
    fitted = [r for r in rows if "lifetimes" in r and "seconds" in r["lifetimes"]]
    ours = sum(r["ours"]["seconds"] for r in fitted)
    theirs = sum(r["lifetimes"]["seconds"] for r in fitted)
    # Positive: our parameters fit the data better than lifetimes' (total log-likelihood).
    gains = [
        sum(r["ours"]["log_likelihood"].values()) - sum(r["lifetimes"]["log_likelihood"].values())
        for r in fitted
    ]
    return {
        "tenants_compared": len(fitted),
        "tenants_skipped": [
            {"tenant_id": r["tenant_id"], "reason": r.get("skipped") or r["lifetimes"]["error"]}
            for r in rows
            if r not in fitted
        ],
        "ours_seconds": round(ours, 3),
        "lifetimes_seconds": round(theirs, 3),
        "speedup": round(theirs / ours, 2) if ours else None,
        "max_relative_param_difference": max(
            (r["max_relative_param_difference"] for r in fitted), default=None
        ),
        "min_log_likelihood_gain": min(gains, default=None),
        "max_log_likelihood_gain": max(gains, default=None),
    }
