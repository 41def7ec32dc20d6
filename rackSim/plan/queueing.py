"""Queueing bounds the screen uses (numpy, vectorised; seconds and requests/s).

* `mg1_wait_s`: Pollaczek-Khinchine mean wait of an M/G/1 FCFS queue,
  ``W = lambda E[S^2] / (2 (1 - rho))`` with ``rho = lambda E[S]`` (infinite at rho >= 1);
* `wait_quantile_s`: the q-quantile of that wait under the usual exponential tail
  ``P(wait > t) = rho exp(-rho t / W)`` (mass 1 - rho waits not at all; mean W), i.e.
  ``t_q = (W / rho) ln(rho / (1 - q))`` when rho > 1 - q, else 0;
* `batched_prefill_s`: mean and variance of a request's time at a prefill instance that
  batches (each step computes what arrived during the one before), and `gamma_quantile` for
  its quantiles;
* `occupancy_quantile`: the q-quantile of the number of requests in an M/G/infinity stage
  (a decode instance: every admitted request is served at once), Poisson with mean `mean`.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import gamma, poisson


def mg1_wait_s(lam: np.ndarray, mean_s: np.ndarray, sq_mean_s: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(utilisation rho, mean wait W in s) of an M/G/1 queue with arrival rate `lam` (1/s)
    and service time mean `mean_s`, mean square `sq_mean_s` (s^2)."""
    rho = np.asarray(lam * mean_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.where(rho < 1, lam * sq_mean_s / (2 * (1 - rho)), np.inf)
    return rho, wait


def wait_quantile_s(wait: np.ndarray, rho: np.ndarray, q: float) -> np.ndarray:
    """The `q`-quantile of the M/G/1 wait of mean `wait` at utilisation `rho` (s)."""
    rho = np.asarray(rho, dtype=float)
    floor = 1.0 - q
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(rho > floor, wait / rho * np.log(np.maximum(rho, floor) / floor), 0.0)


def occupancy_quantile(mean: np.ndarray, q: float) -> np.ndarray:
    """The `q`-quantile of a Poisson count of mean `mean` (requests)."""
    return poisson.ppf(q, np.maximum(np.asarray(mean, dtype=float), 1e-9))


def batched_prefill_s(lam: np.ndarray, fixed_s: np.ndarray, per_token_s: np.ndarray,
                      u_mean: np.ndarray, u_sq_mean: np.ndarray, budget: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of the time from a request's arrival at a prefill instance to the
    end of its prompt (s, s^2), for an instance whose steps each compute what arrived during
    the step before, a step of x uncached tokens taking ``a + b x`` (`fixed_s`, `per_token_s`);
    requests arrive at `lam` per s with `u` uncached tokens (mean, mean square).

    Back to back, a step lasts ``T = a / (1 - b Lambda)`` on average (Lambda = lam E[u]
    tokens/s) with variance ``b^2 lam T E[u^2]`` (the compound Poisson tokens of one step's
    arrivals), taken as a gamma. A request that arrives during a step (share
    ``beta = min(1, lam (a + b E[u]))``: all of them once steps are back to back, one request's
    step each at light load) waits for the rest of it, R = U L for the length-biased step L,
    then its own step: a + b (u + the tokens that arrived during L). One that finds the
    instance idle takes a + b u. No backlog beyond the next step is kept: in the simulation
    the closed loop holds it off (blocked sessions send nothing), and a batched queue fed the
    same tokens as Poisson arrivals waits 1.4x longer (docs/planner.md). Saturated (a mean
    step would carry `budget` tokens or more, i.e. Lambda at or beyond the full-budget
    rate): infinite."""
    lam, a, b = (np.asarray(x, dtype=float) for x in (lam, fixed_s, per_token_s))
    u, u2 = np.asarray(u_mean, dtype=float), np.asarray(u_sq_mean, dtype=float)
    load = b * lam * u
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(load < 1, a / (1 - load), np.inf)
        var = b * b * lam * step * u2
        lb_mean = step + np.where(var > 0, var / step, 0.0)  # length-biased step
        lb_var = np.where(var > 0, var + (var / step) ** 2, 0.0)  # a gamma's (k + 1) theta^2
        rest_mean, rest_var = lb_mean / 2, (lb_var + lb_mean ** 2) / 3 - (lb_mean / 2) ** 2
        alone_mean, alone_var = a + b * u, b * b * (u2 - u * u)
        own_mean = alone_mean + load * lb_mean
        own_var = alone_var + b * b * lam * u2 * lb_mean + load ** 2 * lb_var
        busy_mean = rest_mean + own_mean
        busy_var = rest_var + own_var + load * lb_var  # + 2 Cov(R, own) = b Lambda Var(L)
        beta = np.minimum(1.0, lam * alone_mean)
        mean = beta * busy_mean + (1 - beta) * alone_mean
        sq = beta * (busy_var + busy_mean ** 2) + (1 - beta) * (alone_var + alone_mean ** 2)
        var_out = np.maximum(sq - mean ** 2, 0.0)
    saturated = ~(lam * u * step < np.asarray(budget, dtype=float))
    return np.where(saturated, np.inf, mean), np.where(saturated, np.inf, var_out)


def gamma_quantile(mean: np.ndarray, var: np.ndarray, q: float) -> np.ndarray:
    """The `q`-quantile of a gamma of this mean and variance (the mean where the variance
    is 0, infinite where the mean is)."""
    mean, var = np.asarray(mean, dtype=float), np.asarray(var, dtype=float)
    finite = np.isfinite(mean) & (var > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        shape = np.where(finite, mean * mean / var, 1.0)
        scale = np.where(finite, var / mean, 1.0)
    return np.where(finite, gamma.ppf(q, shape, scale=scale), mean)
