"""The gold–KL frontier of Gao, Schulman & Hilton 2022 ("Scaling Laws for Reward Model Overoptimization").

With ``d = √KL(π‖π_init)`` (nats^½) and the gold reward measured relative to the initial policy:

* RL (their eq. 2):          ``R_RL(d)  = d (α_RL − β_RL log d)``
* best-of-n (their eq. 1):   ``R_bon(d) = d (α_bon − β_bon d)``
* the KL of best-of-n against the sampling policy (their §2.2, after Stiennon et al. 2020):
  ``KL_bon(n) = log n − (n − 1)/n`` (nats).

Both functional forms are linear in (α, β), so the fits are ordinary least squares without an
intercept (``R(0) = 0``). CIs come from a bootstrap that resamples whole seeds (RL) or whole prompts
(best-of-n), so points of one run stay together, and (RL) from a Student-t interval over per-seed fits,
the one whose error rate at a few seeds is checked (:func:`seed_t_fit`).

Best-of-n is estimated without bias from ``N ≥ n`` samples per prompt (Nakano et al. 2021, App. I;
Gao et al. 2022, App. I): sorted by proxy score, the sample of rank ``i`` (1 = lowest) is the maximum
of a uniformly drawn n-subset with probability ``C(i − 1, n − 1) / C(N, n)``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

FORMS = ("rl", "bon")


def bon_kl(n: int | Sequence[int] | np.ndarray) -> np.ndarray | float:
    """``KL_bon(n) = log n − (n − 1)/n`` in nats (Gao et al. 2022 §2.2; Stiennon et al. 2020 App. G.3).

    Args:
        n: number of samples (≥ 1), scalar or array.
    Returns:
        float for a scalar ``n``, else an array of the same shape. ``KL_bon(1) = 0``.
    Raises:
        ValueError: some ``n < 1``.
    """
    arr = np.asarray(n, dtype=float)
    if np.any(arr < 1):
        raise ValueError(f"best-of-n needs n ≥ 1 (got {n})")
    out = np.log(arr) - (arr - 1.0) / arr
    return float(out) if np.ndim(out) == 0 else out


def gao_curve(d: Sequence[float] | np.ndarray, alpha: float, beta: float, form: str = "rl") -> np.ndarray:
    """Gold gain at ``d = √KL`` (nats^½): ``d(α − β log d)`` (``form="rl"``) or ``d(α − β d)`` (``"bon"``).

    ``R(0) = 0`` (the limit of ``d log d``). Raises ValueError for an unknown ``form`` (rl | bon).
    """
    d = np.asarray(d, dtype=float)
    return d * (alpha - beta * _shape(d, form))


def _shape(d: np.ndarray, form: str) -> np.ndarray:
    """The β regressor divided by d: ``log d`` (rl, 0 at d = 0) or ``d`` (bon)."""
    if form == "rl":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d > 0, np.log(np.where(d > 0, d, 1.0)), 0.0)
    if form == "bon":
        return d
    raise ValueError(f"frontier form must be one of {FORMS} (got {form!r})")


def fit_gao(d: Sequence[float], r: Sequence[float], form: str = "rl") -> dict[str, Any]:
    """Least-squares fit of :func:`gao_curve` to points ``(d_i, r_i)`` (non-finite points and ``d ≤ 0`` dropped).

    The model ``r = α·d − β·d·g(d)`` (``g = log`` for rl, identity for bon) is linear in (α, β), so
    this is OLS on the two regressors, no intercept (``numpy.linalg.lstsq``).

    Returns:
        ``{"alpha", "beta", "n_points", "rmse", "d_max", "d_peak", "error"}``. ``d_peak`` is the
        maximiser of the fitted curve when β > 0 (``exp(α/β − 1)`` for rl, ``α/(2β)`` for bon), else None.
        ``alpha``/``beta`` are None and ``error`` says why with fewer than 3 points or a singular design.
    Raises:
        ValueError: unknown ``form``.
    """
    _shape(np.zeros(1), form)
    x, y = np.asarray(d, dtype=float), np.asarray(r, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[keep], y[keep]
    out: dict[str, Any] = {"alpha": None, "beta": None, "n_points": int(len(x)), "rmse": None,
                           "d_max": float(x.max()) if len(x) else None, "d_peak": None, "error": None}
    if len(x) < 3:
        out["error"] = f"only {len(x)} points with KL > 0 (need ≥ 3)"
        return out
    X = np.column_stack([x, -x * _shape(x, form)])
    coef, _, rank, _ = np.linalg.lstsq(X, y, rcond=None)
    if rank < 2:
        out["error"] = "the points do not determine α and β (singular design)"
        return out
    alpha, beta = float(coef[0]), float(coef[1])
    resid = y - X @ coef
    out.update(alpha=alpha, beta=beta, rmse=float(np.sqrt(np.mean(resid**2))), d_peak=peak_d(alpha, beta, form))
    return out


def peak_d(alpha: float, beta: float, form: str = "rl") -> float | None:
    """The ``d`` that maximises the fitted curve (None when β ≤ 0: no peak).

    rl: ``dR/dd = α − β(log d + 1) = 0`` ⇒ ``d* = exp(α/β − 1)``; bon: ``d* = α / (2β)``.
    """
    if beta is None or not beta > 0:
        return None
    if form == "rl":
        z = alpha / beta - 1.0
        return float(math.exp(z)) if z < 700 else float("inf")
    return float(alpha / (2.0 * beta))


def kl_at(d: float | None) -> float | None:
    """The KL in nats at ``d = sqrt(KL)`` (the frontier's x axis, Gao et al. 2023 §3): ``d²``, computed as a float
    product so that a ``d`` whose square exceeds a float's range (a near-flat fit's peak, up to ``exp(699)``) gives
    ``+inf`` where Python's ``d ** 2`` raises OverflowError; None for None. Raises nothing.

    Example: ``kl_at(3.0) == 9.0``, ``kl_at(1e200) == inf``."""
    return None if d is None else float(d) * float(d)


def bootstrap_fit(groups: Sequence[tuple[Sequence[float], Sequence[float]]], form: str = "rl",
                  n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Fit :func:`fit_gao` to all points, and percentile bootstrap CIs that resample whole groups (every resample
    solved at once from its groups' sums, :func:`_refit_resamples`).

    Args:
        groups: one ``(d, r)`` pair of arrays per independent unit (a seed's evaluation curve, or a
            prompt's best-of-n curve); a resample draws as many groups with replacement.
    Returns:
        the :func:`fit_gao` dict plus ``alpha_ci``, ``beta_ci``, ``d_peak_ci`` (``[lo, hi]`` or None),
        ``n_groups``, ``n_resamples`` (valid refits) and ``confidence``. ``d_peak_ci`` counts a resample
        without a peak (β ≤ 0) as ``+inf``, so its upper end reads "no peak" when such resamples are common.
    Raises:
        ValueError: unknown ``form`` or ``confidence`` outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    groups = [(np.asarray(d, dtype=float), np.asarray(r, dtype=float)) for d, r in groups]
    d_all = np.concatenate([g[0] for g in groups]) if groups else np.zeros(0)
    r_all = np.concatenate([g[1] for g in groups]) if groups else np.zeros(0)
    out = fit_gao(d_all, r_all, form)
    out.update(alpha_ci=None, beta_ci=None, d_peak_ci=None, n_groups=len(groups), n_resamples=0, confidence=confidence)
    if out["alpha"] is None or len(groups) < 2:
        return out
    rng = np.random.default_rng(seed)
    # one group index vector per resample, drawn one resample at a time as a loop of refits would draw them
    picks = np.stack([rng.integers(0, len(groups), size=len(groups)) for _ in range(n_resamples)])
    a, b, p = _refit_resamples(groups, picks, form)
    if not len(a):
        return out
    q = [(1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100]
    out.update(alpha_ci=percentile_inf(a, q), beta_ci=percentile_inf(b, q), d_peak_ci=percentile_inf(p, q),
               n_resamples=len(a))
    return out


def _refit_resamples(groups: Sequence[tuple[np.ndarray, np.ndarray]], picks: np.ndarray,
                     form: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fit_gao` on every bootstrap resample at once: the fit is OLS on two regressors, so a resample's normal
    equations are the sums of its groups' (``picks``: ``[R, G]`` group indices, one row per resample). Returns the
    ``α``, ``β`` and ``d_peak`` (``+inf`` without a peak) of the resamples :func:`fit_gao` fits: at least 3 points and a
    design of rank 2, which for both forms means at least two distinct ``d`` (``d`` and ``d·g(d)`` are proportional
    only when ``g(d)``, an injective function, is constant)."""
    stats = np.zeros((len(groups), 6))  # per group: points, Σx², Σxz, Σz², Σxy, Σzy with x = d, z = −d·g(d)
    low, high = np.full(len(groups), np.inf), np.full(len(groups), -np.inf)  # per group: its smallest and largest d
    for i, (d, r) in enumerate(groups):
        keep = np.isfinite(d) & np.isfinite(r) & (d > 0)
        x, y = d[keep], r[keep]
        z = -x * _shape(x, form)
        stats[i] = (len(x), x @ x, x @ z, z @ z, x @ y, z @ y)
        if len(x):
            low[i], high[i] = x.min(), x.max()
    counts = np.stack([np.bincount(row, minlength=len(groups)) for row in picks]).astype(float)
    n, sxx, sxz, szz, sxy, szy = (counts @ stats).T
    ok = (n >= 3) & (low[picks].min(axis=1) < high[picks].max(axis=1))
    det = np.where(ok, sxx * szz - sxz**2, 1.0)
    alpha = ((szz * sxy - sxz * szy) / det)[ok]
    beta = ((sxx * szy - sxz * sxy) / det)[ok]
    peak = np.array([p if (p := peak_d(float(al), float(be), form)) is not None else math.inf for al, be in zip(alpha, beta)])
    return alpha, beta, peak


def percentile_inf(values: Sequence[float], q: Sequence[float]) -> list[float]:
    """Percentiles ``q`` (in [0, 100]) of ``values`` by linear interpolation between order statistics
    (numpy's default ``method="linear"``), where ``+inf`` values are allowed: a percentile that falls on
    or next to an infinite order statistic is ``+inf``. (``np.percentile`` returns NaN there, with a
    RuntimeWarning, because it computes ``inf − inf``.) Equals ``np.percentile`` on finite values.

    Raises:
        ValueError: empty ``values``, a NaN or ``-inf`` among them, or a ``q`` outside [0, 100].
    """
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0 or np.isnan(x).any() or np.isneginf(x).any():
        raise ValueError("percentile_inf: values must be non-empty, without NaN or -inf")
    pos = np.asarray(q, dtype=float) / 100 * (x.size - 1)
    if (pos < 0).any() or (pos > x.size - 1).any():
        raise ValueError(f"percentile_inf: q must lie in [0, 100] (got {list(q)})")
    lo, hi = np.floor(pos).astype(int), np.ceil(pos).astype(int)
    frac = pos - lo
    out = []
    for i, j, f in zip(lo, hi, frac):
        if np.isinf(x[i]) or (f > 0 and np.isinf(x[j])):
            out.append(float("inf"))
        else:
            out.append(float(x[i] + (x[j] - x[i]) * f))
    return out


def seed_t_fit(groups: Sequence[tuple[Sequence[float], Sequence[float]]], form: str = "rl",
               confidence: float = 0.95) -> dict[str, Any]:
    """Fit :func:`fit_gao` to each group alone and give Student-t intervals for the mean α and β over groups.

    Each seed is one replicate (the summary-statistics approach to a random-effects fit): its fitted
    ``β_i`` is one observation, and the interval is ``mean ± t_{(1+c)/2, k−1} · sd / √k`` over the ``k``
    groups that could be fitted (``scipy.stats.t``). Unlike a percentile bootstrap over a handful of
    seeds, its false-positive rate for "β > 0" is checked in ``tests/test_frontier.py`` at n = 6.

    Args:
        groups: one ``(d, r)`` pair of arrays per seed (its evaluation curve).
        form: ``"rl"`` or ``"bon"``.
        confidence: two-sided level in (0, 1).
    Returns:
        ``{"alpha", "beta", "alpha_ci", "beta_ci", "n_groups", "n_fitted", "confidence", "per_group"}``
        (``per_group``: the ``[k]`` fitted β's; means and CIs None with fewer than 2 fitted groups).
    Raises:
        ValueError: unknown ``form`` or ``confidence`` outside (0, 1).
    """
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    fits = [fit_gao(d, r, form) for d, r in groups]
    fits = [f for f in fits if f["alpha"] is not None]
    out: dict[str, Any] = {"alpha": None, "beta": None, "alpha_ci": None, "beta_ci": None, "n_groups": len(groups),
                           "n_fitted": len(fits), "confidence": confidence, "per_group": [f["beta"] for f in fits]}
    if len(fits) < 2:
        return out
    q = float(stats.t.ppf((1 + confidence) / 2, len(fits) - 1))
    for key in ("alpha", "beta"):
        x = np.array([f[key] for f in fits])
        m, half = float(x.mean()), q * float(x.std(ddof=1)) / math.sqrt(len(x))
        out[key], out[f"{key}_ci"] = m, [m - half, m + half]
    return out


def bon_weights(N: int, n: int) -> np.ndarray:
    """``[N]`` probabilities that the sample of ascending rank ``i`` (0-based) is the best of a uniformly
    drawn ``n``-subset of ``N``: ``C(i, n − 1) / C(N, n)`` (zero for ``i < n − 1``; they sum to 1).

    Raises:
        ValueError: not ``1 ≤ n ≤ N``.
    """
    if not 1 <= n <= N:
        raise ValueError(f"best-of-n needs 1 ≤ n ≤ N (got n={n}, N={N})")
    from scipy.special import gammaln

    i = np.arange(N, dtype=float)
    w = np.zeros(N)
    ok = i >= n - 1
    log_c = gammaln(i[ok] + 1) - gammaln(n) - gammaln(i[ok] - n + 2)  # log C(i, n−1)
    log_total = gammaln(N + 1) - gammaln(n + 1) - gammaln(N - n + 1)  # log C(N, n)
    w[ok] = np.exp(log_c - log_total)
    return w


def bon_estimate(proxy: np.ndarray, values: np.ndarray, ns: Sequence[int]) -> np.ndarray:
    """Unbiased best-of-n estimates of ``E[values of the proxy-best of n samples]``, per prompt.

    Args:
        proxy: ``[M, N]`` proxy scores of N samples for each of M prompts.
        values: ``[M, N]`` what to average for the selected sample (gold or proxy scores).
        ns: the n's (each 1 ≤ n ≤ N).
    Returns:
        ``[M, len(ns)]``. Ties in ``proxy`` are broken by sample order (stable sort).
    Raises:
        ValueError: shapes differ or an n is out of range.
    """
    proxy, values = np.asarray(proxy, dtype=float), np.asarray(values, dtype=float)
    if proxy.shape != values.shape or proxy.ndim != 2:
        raise ValueError(f"proxy and values must both be [M, N] (got {proxy.shape} and {values.shape})")
    order = np.argsort(proxy, axis=1, kind="stable")
    v_sorted = np.take_along_axis(values, order, axis=1)
    W = np.stack([bon_weights(proxy.shape[1], n) for n in ns], axis=1)  # [N, len(ns)]
    return v_sorted @ W


#: The file a pipeline's best-of-n stage writes its curve to (``{"n", "kl", "d", "gold", "proxy", "gold_gain",
#: "gold_per_prompt", "proxy_per_prompt"}``; e.g. :func:`harness.tasks.review_sentiment.bon.build_bon_curve`).
BON_CURVE_FILE = "bon.json"


def load_bon_curve(stage_dir: "str | Path") -> dict[str, Any]:
    """The best-of-n curve (:data:`BON_CURVE_FILE`) of a built best-of-n stage, whatever task built it.

    Raises:
        FileNotFoundError: the stage directory has no curve.
    """
    import json
    from pathlib import Path

    return json.loads((Path(stage_dir) / BON_CURVE_FILE).read_text())


__all__ = ["FORMS", "BON_CURVE_FILE", "load_bon_curve", "bon_kl", "gao_curve", "fit_gao", "peak_d", "kl_at", "bootstrap_fit", "seed_t_fit", "bon_weights", "bon_estimate"]
