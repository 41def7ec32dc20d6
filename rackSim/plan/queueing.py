"""Queueing bounds the screen uses (numpy, vectorised; seconds and requests/s).

* `mg1_wait_s`: Pollaczek-Khinchine mean wait of an M/G/1 FCFS queue,
  ``W = lambda E[S^2] / (2 (1 - rho))`` with ``rho = lambda E[S]`` (infinite at rho >= 1);
* `wait_quantile_s`: the q-quantile of that wait under the usual exponential tail
  ``P(wait > t) = rho exp(-rho t / W)`` (mass 1 - rho waits not at all; mean W), i.e.
  ``t_q = (W / rho) ln(rho / (1 - q))`` when rho > 1 - q, else 0;
* `occupancy_quantile`: the q-quantile of the number of requests in an M/G/infinity stage
  (a decode instance: every admitted request is served at once), Poisson with mean `mean`.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import poisson


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
