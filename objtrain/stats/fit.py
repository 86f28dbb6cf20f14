"""Compute-efficiency curves: fit L(C) = E + A·C^(-α) over training FLOPs, bootstrap it, find crossovers.

The fit (Hoffmann et al. 2022's form): for a fixed α the model is linear in (E, A), so least squares
gives them in closed form; the sum of squared residuals is then a function of α alone (variable
projection), minimised over a log grid of α in [1e-3, 3] and refined by a parabola through the best grid
point and its neighbours. No optimiser is started from guesses, so nothing depends on initial values, and
every replicate of the bootstrap is the same few vectorised numpy operations.

Why least squares and not Hoffmann et al. 2022's Huber(δ = 1e-3) on log L (section 3.3): that loss is
robust when a fit has dozens of points and a few diverged runs (Chinchilla's 240). A shipped sweep has 4
compute points for 3 parameters: with δ = 1e-3 nearly every residual is past δ, so the fit is an L1 fit,
which passes exactly through 3 of the 4 points and ignores the fourth, whichever it is; one degree of
freedom cannot tell a diverged point from the curve. Seeds are averaged per point before fitting instead,
and the bootstrap over seeds and points carries a bad point into the intervals rather than hiding it.
Between log and linear residuals the weights differ by the ratio of the largest to the smallest value
(under 2x for the losses here), which least squares in the metric's own units keeps simple and exact.

- C is divided by the geometric mean of the measured FLOPs before fitting (conditioning); A is reported in
  the units of C itself.
- For a lower-is-better metric (a loss, bits per byte) E is held at or above 0: a negative floor is no
  floor, and the fit then becomes the no-offset power law A·C^(-α) (reported with `E_at_bound`).
- A fit is refused, never drawn, when there are fewer than 3 distinct compute points (`too_few_points`),
  or when the best α lies at an end of the grid or the curve runs the wrong way for the metric
  (`not_converged`: the points do not determine a saturating power law).
- E identified: beside the clamped fit the free one is reported; E counts as identified only when the free
  fit converges with E > 0 and the bootstrap interval of E stays above 0 (otherwise the
  no-offset exponent is reported, and said to be).
- Out of sample: the curve is refitted without the largest compute point and its prediction there set
  against the measured mean (`holdout`), the error beside the seeds' std at that point.
- Bootstrap over seeds and points: each replicate draws seed columns with replacement (the same draw for
  every point, and, from the same generator seed, for every arm: seed k is shared by all arms, so the
  replicates of two arms pair up) and points with replacement (redrawn until 3 distinct ones), averages
  each drawn point over the drawn seeds, and refits. Intervals are 2.5-97.5% percentiles over the
  replicates that converged, whose share is reported beside them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALPHAS = np.geomspace(1e-3, 3.0, 481)  # the exponent grid: steps of 1.7%
MIN_POINTS = 3  # E, A and α need at least three distinct compute values
EXTRAPOLATION = 3.0  # a crossover past 3x the largest measured compute is an extrapolation
SEARCH = 1000.0  # crossovers are looked for up to this factor past the largest measured compute


@dataclass
class PowerLaw:
    E: float
    A: float  # in units of FLOPs: L(C) = E + A * C ** -alpha
    alpha: float

    def __call__(self, c: Any) -> Any:
        # A·C^(-α) as exp(log A - α log C): A alone can overflow a float for large α and C
        c = np.asarray(c, dtype=float)
        return self.E + np.sign(self.A) * np.exp(np.log(abs(self.A) + 1e-300) - self.alpha * np.log(c))

    def to_dict(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha}


@dataclass
class Fit:
    status: str  # ok | too_few_points | not_converged
    reason: str  # why not ok, in words ("" when ok)
    law: PowerLaw | None
    compute: list[float]  # the points fitted (mean over seeds), sorted by compute
    values: list[float]
    lower_is_better: bool
    E_at_bound: bool = False  # E held at 0: the no-offset power law
    residual_rms: float | None = None  # of the point means about the fitted curve
    seed_std: float | None = None  # mean over points of the seeds' sample std: the noise to compare it with
    no_interval: str = ""  # why there are no intervals, where the bootstrap cannot give any
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # E, A, alpha: 95%
    replicates: int = 0  # bootstrap draws
    converged: int = 0  # of which the refit converged
    # Per replicate (NaN where it did not converge), in draw order: two arms fitted with the same
    # generator seed and grid pair up replicate by replicate (crossover intervals).
    boot: np.ndarray | None = None  # (replicates, 3): E, A (units of C), alpha
    # The fit with E left free beside the clamped one (lower-is-better metrics): E is identified when the
    # free fit converges with E > 0 and the bootstrap interval of E stays above 0.
    free: dict[str, Any] | None = None
    E_identified: bool | None = None
    # Out of sample: the curve fitted without the largest compute point, its prediction there against the
    # measured mean (with the seeds' std at that point for scale).
    holdout: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def c_min(self) -> float:
        return min(self.compute) if self.compute else math.nan

    @property
    def c_max(self) -> float:
        return max(self.compute) if self.compute else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "law": self.law.to_dict() if self.law is not None else None,
            "E_at_bound": self.E_at_bound,
            "residual_rms": self.residual_rms,
            "no_interval": self.no_interval,
            "seed_std": self.seed_std,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "replicates": self.replicates,
            "converged_replicates": self.converged,
            "points": [{"flops": c, "value": v} for c, v in zip(self.compute, self.values, strict=True)],
            "lower_is_better": self.lower_is_better,
            "free": self.free,
            "E_identified": self.E_identified,
            "holdout": self.holdout,
        }


def _profile(
    x: np.ndarray, y: np.ndarray, alphas: np.ndarray, nonneg_e: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares E and A (units of x) for every row of x, y (B, n) and every α (G,): (B, G) each,
    plus the sum of squared residuals."""
    z = x[:, None, :] ** -alphas[None, :, None]  # (B, G, n)
    yb = y[:, None, :]
    zm, ym = z.mean(-1, keepdims=True), yb.mean(-1, keepdims=True)
    szz = ((z - zm) ** 2).sum(-1)
    szy = ((z - zm) * (yb - ym)).sum(-1)
    a = szy / np.where(szz > 0, szz, np.inf)
    e = ym[..., 0] - a * zm[..., 0]
    if nonneg_e:
        # The best fit with E = 0 where the free one goes below it (the constrained optimum lies on the
        # boundary because the problem is a convex quadratic in (E, A)).
        a0 = (z * yb).sum(-1) / np.maximum((z * z).sum(-1), 1e-300)
        neg = e < 0
        e = np.where(neg, 0.0, e)
        a = np.where(neg, a0, a)
    sse = ((yb - e[..., None] - a[..., None] * z) ** 2).sum(-1)
    return e, a, sse


def _fit_rows(
    x: np.ndarray, y: np.ndarray, nonneg_e: bool, lower: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fit each row: (E, A in units of x, alpha, converged, E held at 0), each (B,)."""
    e, a, sse = _profile(x, y, ALPHAS, nonneg_e)
    best = np.argmin(sse, axis=1)
    interior = (best > 0) & (best < len(ALPHAS) - 1)
    # A parabola in log α through the best grid point and its two neighbours.
    i = np.clip(best, 1, len(ALPHAS) - 2)
    rows = np.arange(len(best))
    s0, s1, s2 = sse[rows, i - 1], sse[rows, i], sse[rows, i + 1]
    la = np.log(ALPHAS)
    h = la[1] - la[0]
    denom = s0 - 2 * s1 + s2
    shift = np.where(denom > 0, 0.5 * h * (s0 - s2) / np.where(denom > 0, denom, 1.0), 0.0)
    refined = np.exp(la[i] + np.clip(shift, -h, h))
    e_r, a_r, sse_r = (v[:, 0] if v.ndim == 2 else v for v in _refit(x, y, refined, nonneg_e))
    take = interior & (sse_r <= sse[rows, best])
    alpha = np.where(take, refined, ALPHAS[best])
    e_out = np.where(take, e_r, e[rows, best])
    a_out = np.where(take, a_r, a[rows, best])
    right_way = a_out > 0 if lower else a_out < 0
    finite = np.isfinite(e_out) & np.isfinite(a_out)
    at_bound = nonneg_e & (e_out <= 0)
    return e_out, a_out, alpha, interior & right_way & finite, at_bound


def _refit(
    x: np.ndarray, y: np.ndarray, alpha: np.ndarray, nonneg_e: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E, A, sse at one α per row (B,)."""
    z = x ** -alpha[:, None]
    zm, ym = z.mean(-1, keepdims=True), y.mean(-1, keepdims=True)
    szz = ((z - zm) ** 2).sum(-1)
    a = ((z - zm) * (y - ym)).sum(-1) / np.where(szz > 0, szz, np.inf)
    e = ym[:, 0] - a * zm[:, 0]
    if nonneg_e:
        a0 = (z * y).sum(-1) / np.maximum((z * z).sum(-1), 1e-300)
        neg = e < 0
        e, a = np.where(neg, 0.0, e), np.where(neg, a0, a)
    sse = ((y - e[:, None] - a[:, None] * z) ** 2).sum(-1)
    return e, a, sse


def fit_curve(
    compute: np.ndarray | list[float],
    values: np.ndarray | list[list[float]],
    lower_is_better: bool = True,
    nonneg_e: bool | None = None,
    replicates: int = 1000,
    seed: int = 0,
) -> Fit:
    """Fit L(C) = E + A·C^(-α) to `values` (points x seeds, NaN where a seed is missing) measured at
    `compute` (FLOPs per point), with bootstrap intervals over seeds and points (see the module doc).
    `nonneg_e` (default: `lower_is_better`) holds E at or above 0."""
    c = np.asarray(compute, dtype=float)
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[:, None]
    nonneg = lower_is_better if nonneg_e is None else nonneg_e
    keep = np.isfinite(c) & (c > 0) & np.isfinite(v).any(axis=1)
    c, v = c[keep], v[keep]
    order = np.argsort(c, kind="stable")
    c, v = c[order], v[order]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(v, axis=1) if len(v) else np.zeros(0)
    fit = Fit("ok", "", None, c.tolist(), means.tolist(), lower_is_better)
    distinct = len(np.unique(c))
    if distinct < MIN_POINTS:
        fit.status = "too_few_points"
        fit.reason = (
            f"{distinct} distinct compute point(s); a curve with E, A and α needs at least {MIN_POINTS}"
        )
        return fit
    ref = float(np.exp(np.log(c).mean()))
    x = c / ref
    e, a, alpha, conv, bound = _fit_rows(x[None, :], means[None, :], nonneg, lower_is_better)
    if not conv[0]:
        fit.status = "not_converged"
        if not (0 < np.argmin(np.abs(ALPHAS - alpha[0])) < len(ALPHAS) - 1):
            fit.reason = (
                f"the best exponent lies at the edge of the searched range ({ALPHAS[0]:g} to "
                f"{ALPHAS[-1]:g}): these points do not pin down a saturating power law"
            )
        else:
            fit.reason = "the fitted curve " + (
                "does not fall with compute" if lower_is_better else "does not rise with compute"
            )
        return fit
    fit.law = PowerLaw(float(e[0]), float(a[0] * ref ** alpha[0]), float(alpha[0]))
    fit.E_at_bound = bool(bound[0])
    fit.residual_rms = float(np.sqrt(np.mean((means - fit.law(c)) ** 2)))
    if v.shape[1] > 1 and (np.isfinite(v).sum(axis=1) > 1).any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fit.seed_std = float(np.nanmean(np.nanstd(v, axis=1, ddof=1)))
    fit.holdout = _holdout(c, v, lower_is_better, nonneg)
    if nonneg:
        ef, af, alf, convf, _ = _fit_rows(x[None, :], means[None, :], False, lower_is_better)
        fit.free = {"E": float(ef[0]), "A": float(af[0] * ref ** alf[0]), "alpha": float(alf[0]),
                    "converged": bool(convf[0])}  # fmt: skip
        fit.E_identified = bool(convf[0] and ef[0] > 0)
    else:
        fit.E_identified = True  # nothing held: the fit is the free one (its interval is checked below)
    if v.shape[1] == 1 and distinct <= MIN_POINTS:
        # One seed and three points: every replicate would redraw the same three points, so a bootstrap
        # would show no spread at all, which is not the same as none.
        fit.no_interval = "one seed and three points leave nothing to resample"
        replicates = 0
    if replicates > 0:
        boot = bootstrap(c, v, nonneg, lower_is_better, replicates, seed, ref)
        fit.boot = boot
        fit.replicates = replicates
        good = boot[np.isfinite(boot[:, 0])]
        fit.converged = len(good)
        if len(good) >= 2:
            for k, name in enumerate(("E", "A", "alpha")):
                lo, hi = np.percentile(good[:, k], [2.5, 97.5])
                fit.intervals[name] = (float(lo), float(hi))
            if lower_is_better and fit.intervals["E"][0] <= 0:
                fit.E_identified = False  # the seeds' replicates reach a floor of 0: no floor is pinned
    return fit


def _holdout(c: np.ndarray, v: np.ndarray, lower: bool, nonneg: bool) -> dict[str, Any]:
    """The fit without the largest compute point, checked on it (`status` says why not where it cannot)."""
    top = c == c.max()
    if len(np.unique(c[~top])) < MIN_POINTS:
        return {"status": "too_few_points", "reason": f"fewer than {MIN_POINTS + 1} distinct compute points"}
    rest = fit_curve(c[~top], v[~top], lower_is_better=lower, nonneg_e=nonneg, replicates=0)
    if not rest.ok or rest.law is None:
        return {"status": rest.status, "reason": rest.reason}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        measured = float(np.nanmean(v[top]))
        spread = v[top].ravel()
        spread = spread[np.isfinite(spread)]
    predicted = float(rest.law(float(c.max())))
    std = float(np.std(spread, ddof=1)) if len(spread) > 1 else None
    return {
        "status": "ok",
        "flops": float(c.max()),
        "predicted": predicted,
        "measured": measured,
        "error": predicted - measured,
        "relative_error": (predicted - measured) / measured if measured else None,
        "seed_std": std,
    }


def resample_indices(
    n_points: int, n_seeds: int, replicates: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point draws (B, P), seed draws (B, S), usable (B,)): the same arrays for every arm fitted over the
    same grid with the same generator seed, so their replicates pair up."""
    rng = np.random.default_rng(seed)
    points = np.empty((replicates, n_points), dtype=np.int64)
    seeds = rng.integers(0, n_seeds, size=(replicates, n_seeds))
    usable = np.ones(replicates, dtype=bool)
    for b in range(replicates):
        for _ in range(100):  # redraw until three distinct points (a curve needs them)
            draw = rng.integers(0, n_points, size=n_points)
            if len(np.unique(draw)) >= min(MIN_POINTS, n_points):
                break
        else:
            usable[b] = False
        points[b] = draw
    return points, seeds, usable


def bootstrap(
    c: np.ndarray,
    v: np.ndarray,
    nonneg: bool,
    lower: bool,
    replicates: int,
    seed: int,
    ref: float,
) -> np.ndarray:
    """(replicates, 3) of E, A (units of C), alpha; NaN rows where the refit did not converge."""
    points, seeds, usable = resample_indices(len(c), v.shape[1], replicates, seed)
    drawn = v[points[:, :, None], seeds[:, None, :]]  # (B, P, S)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a draw whose seeds are all missing: NaN
        y = np.nanmean(drawn, axis=2)
    x = c[points] / ref
    ok = usable & np.isfinite(y).all(axis=1)
    y = np.where(np.isfinite(y), y, 0.0)
    out = np.full((replicates, 3), np.nan)
    for lo in range(0, replicates, 250):  # bounded memory: (250, grid, points) at a time
        sl = slice(lo, lo + 250)
        e, a, alpha, conv, _ = _fit_rows(x[sl], y[sl], nonneg, lower)
        good = conv & ok[sl]
        out[sl][good] = np.stack([e, a * ref**alpha, alpha], axis=1)[good]
    return out


@dataclass
class Crossover:
    status: str  # within | near | extrapolated | none | no_fit | no_overlap
    c_star: float | None  # where the fitted curves cross (FLOPs), the first crossing past the smallest point
    interval: tuple[float, float] | None  # 2.5-97.5% over paired replicates that cross
    crossing_share: float | None  # share of paired replicates whose curves cross within the search range
    within_share: float | None  # share whose crossing lies inside the swept range
    ahead_before: str | None  # the better arm at the smallest shared compute
    ahead_after: str | None  # the better arm past the crossing
    c_lo: float
    c_hi: float
    note: str = ""
    resolved: bool | None = None  # whether the replicates' gap band supports the verdict (see crossover)
    # The gap L_a - L_b over the swept range: (C, 2.5%, 97.5%) over paired replicates.
    gap_band: list[tuple[float, float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "resolved": self.resolved,
            "gap_band": [list(row) for row in self.gap_band],
            "flops": self.c_star,
            "interval": list(self.interval) if self.interval else None,
            "crossing_share": self.crossing_share,
            "within_range_share": self.within_share,
            "ahead_before": self.ahead_before,
            "ahead_after": self.ahead_after,
            "swept_range": [self.c_lo, self.c_hi],
            "extrapolated": self.status == "extrapolated",
            "note": self.note,
        }


def _first_crossing(
    ea: np.ndarray, aa: np.ndarray, la: np.ndarray, eb: np.ndarray, ab: np.ndarray, lb: np.ndarray,
    c_lo: float, c_top: float,
) -> np.ndarray:  # fmt: skip
    """First C in [c_lo, c_top] where curves a and b cross, per row (NaN where they do not)."""
    logc = np.linspace(math.log(c_lo), math.log(c_top), 600)

    def diff(lc: np.ndarray) -> np.ndarray:
        fa = ea[:, None] + np.sign(aa)[:, None] * np.exp(
            np.log(np.abs(aa) + 1e-300)[:, None] - la[:, None] * lc
        )
        fb = eb[:, None] + np.sign(ab)[:, None] * np.exp(
            np.log(np.abs(ab) + 1e-300)[:, None] - lb[:, None] * lc
        )
        return fa - fb

    d = diff(np.broadcast_to(logc, (len(ea), len(logc))))
    sign = np.sign(d)
    change = (sign[:, :-1] * sign[:, 1:] < 0) | ((sign[:, 1:] == 0) & (sign[:, :-1] != 0))
    has = change.any(axis=1)
    first = np.argmax(change, axis=1)
    lo, hi = logc[first], logc[first + 1]
    rows = np.arange(len(ea))
    d_lo = d[rows, first]
    for _ in range(50):  # bisection on log C
        mid = 0.5 * (lo + hi)
        dm = diff(mid[:, None])[:, 0]
        left = np.sign(dm) == np.sign(d_lo)
        lo, hi = np.where(left, mid, lo), np.where(left, hi, mid)
        d_lo = np.where(left, dm, d_lo)
    return np.where(has, np.exp(0.5 * (lo + hi)), np.nan)


def crossover(name_a: str, fa: Fit, name_b: str, fb: Fit) -> Crossover:
    """Where arm b's fitted curve overtakes arm a's (or a's b's), between the larger of the two smallest
    measured computes and `SEARCH` times the smaller of the two largest, with a paired bootstrap interval."""
    lower = fa.lower_is_better
    c_lo, c_hi = max(fa.c_min, fb.c_min), min(fa.c_max, fb.c_max)
    if not (fa.ok and fb.ok) or fa.law is None or fb.law is None:
        missing = ", ".join(n for n, f in ((name_a, fa), (name_b, fb)) if not f.ok)
        return Crossover(
            "no_fit", None, None, None, None, None, None, c_lo, c_hi, f"no fitted curve for {missing}"
        )
    if not c_lo < c_hi:
        return Crossover(
            "no_overlap",
            None,
            None,
            None,
            None,
            None,
            None,
            c_lo,
            c_hi,
            "the two swept compute ranges do not overlap",
        )
    top = c_hi * SEARCH

    def arr(law: PowerLaw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.array([law.E]), np.array([law.A]), np.array([law.alpha])

    c_star = float(_first_crossing(*arr(fa.law), *arr(fb.law), c_lo, top)[0])

    def better(c: float) -> str:
        va, vb = float(fa.law(c)), float(fb.law(c))  # type: ignore[misc]
        return name_a if (va < vb) == lower else name_b

    before = better(c_lo)
    interval, share, within = None, None, None
    if fa.boot is not None and fb.boot is not None and len(fa.boot) == len(fb.boot):
        both = np.isfinite(fa.boot[:, 0]) & np.isfinite(fb.boot[:, 0])
        if both.any():
            ba, bb = fa.boot[both], fb.boot[both]
            cs = _first_crossing(ba[:, 0], ba[:, 1], ba[:, 2], bb[:, 0], bb[:, 1], bb[:, 2], c_lo, top)
            crossed = np.isfinite(cs)
            share = float(crossed.mean())
            within = float((crossed & (cs <= c_hi)).mean())
            if crossed.sum() >= 2:
                lo, hi = np.exp(np.percentile(np.log(cs[crossed]), [2.5, 97.5]))
                interval = (float(lo), float(hi))
    # Is the verdict resolved? The model-free companion of the crossing: the gap
    # L_a - L_b over the swept range in every paired replicate. An order is resolved where the 95% band of
    # the gap excludes 0; a crossover within the range, where the band excludes 0 at both ends with
    # opposite signs; no crossover, where it excludes 0 over the whole range.
    band: list[tuple[float, float, float]] = []
    resolved: bool | None = None
    if fa.boot is not None and fb.boot is not None and len(fa.boot) == len(fb.boot):
        both = np.isfinite(fa.boot[:, 0]) & np.isfinite(fb.boot[:, 0])
        if both.sum() >= 20:
            grid = np.geomspace(c_lo, c_hi, 9)
            ba, bb = fa.boot[both], fb.boot[both]
            gaps = np.stack(
                [PowerLaw(*ra)(grid) - PowerLaw(*rb)(grid) for ra, rb in zip(ba, bb, strict=True)]
            )
            lo, hi = np.percentile(gaps, [2.5, 97.5], axis=0)
            band = [(float(c), float(a), float(b)) for c, a, b in zip(grid, lo, hi, strict=True)]
            sign = np.where(lo > 0, 1, np.where(hi < 0, -1, 0))
    crossed = math.isfinite(c_star)
    if band:
        if crossed and c_star <= c_hi:
            resolved = bool(sign[0] != 0 and sign[-1] == -sign[0])
        else:
            resolved = bool((sign != 0).all() and (sign == sign[0]).all())
    doubt = {
        True: "",
        False: " (not resolved: the seeds' bootstrap band of the gap includes 0)",
        None: " (no bootstrap band: the fitted curves' verdict alone)",
    }[resolved]
    if not crossed:
        return Crossover(
            "none", None, interval, share, within, before, before, c_lo, c_hi,
            f"no crossover within the swept range (nor up to {SEARCH:g}x past it): {before} stays "
            f"ahead{doubt}", resolved, band,
        )  # fmt: skip
    after = name_b if before == name_a else name_a
    if c_star <= c_hi:
        status, note = "within", "within the swept range"
    elif c_star <= EXTRAPOLATION * c_hi:
        status, note = "near", f"past the largest point, within {EXTRAPOLATION:g}x of it"
    else:
        status, note = (
            "extrapolated",
            (
                f"no crossover within the swept range; the fits cross {c_star / c_hi:.3g}x past the largest "
                "point (extrapolated)"
            ),
        )
    return Crossover(
        status, c_star, interval, share, within, before, after, c_lo, c_hi, note + doubt, resolved, band
    )
