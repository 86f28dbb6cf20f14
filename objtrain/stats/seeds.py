"""Seeds and spread: mean ± sample std per arm and metric, and which gaps the seeds cannot resolve.

With K seeds an arm's metric is `mean ± s (K)` (s with ddof = 1) and a 95% interval `mean ± t·s/√K`.
Per metric the best arm is the best mean (lower for losses and bits, higher for accuracies).

Arms share seed k (initialisation of shared modules, data order), so two arms are compared by their
per-seed differences: the paired mean difference with its 95% t interval over the shared seeds
(`paired`). An arm whose paired interval against the best includes 0 is marked: the difference is not
resolved at this K, which is not the same as no difference (Dodge et al. 2020). Without
two shared seeds the pooled std √((s_a² + s_b²)/2) stands in. When every arm has the same value there is
no best (`tie`). Welch's t and its degrees of freedom are kept beside the paired interval.
With one seed there is no spread and nothing is marked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); 1.96 beyond.
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

LOWER_IS_BETTER = ("loss", "bpb", "bits_per_byte", "perplexity", "ppl", "nll", "error")


def t975(df: float) -> float:
    if df < 1:
        return float("nan")
    k = math.floor(df)
    return T975[k - 1] if k <= len(T975) else 1.96


def lower_is_better(metric: str) -> bool:
    name = metric.lower()
    return any(part in name for part in LOWER_IS_BETTER)


@dataclass
class Summary:
    mean: float
    std: float  # sample std (ddof = 1); nan with one value
    n: int
    ci95: float  # half-width of the 95% interval of the mean; nan with one value

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }


def summarise(values: list[float]) -> Summary:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Summary(float("nan"), float("nan"), 0, float("nan"))
    mean = sum(vals) / n
    if n == 1:
        return Summary(mean, float("nan"), 1, float("nan"))
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return Summary(mean, std, n, t975(n - 1) * std / math.sqrt(n))


def welch(a: Summary, b: Summary) -> tuple[float, float]:
    """Welch's t of `a - b` and its Welch-Satterthwaite degrees of freedom (nan where undefined)."""
    if a.n < 2 or b.n < 2:
        return float("nan"), float("nan")
    va, vb = a.std**2 / a.n, b.std**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:
        return (float("inf") if a.mean != b.mean else 0.0), float("nan")
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    return (a.mean - b.mean) / se, df


@dataclass
class Paired:
    """Per-seed differences `a - b` over the seeds both have."""

    delta: float  # mean difference
    ci95: float  # half-width of its 95% t interval; nan with fewer than 2 seeds
    n: int  # shared seeds
    std: float  # sample std of the differences

    @property
    def resolved(self) -> bool:
        """The interval excludes 0 (a difference of exactly 0 on every seed is not resolved)."""
        return math.isfinite(self.ci95) and abs(self.delta) > self.ci95

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """Paired difference `a - b` over the seeds (keys) both have, with its 95% t interval."""
    shared = sorted(set(a) & set(b))
    diffs = [float(a[k]) - float(b[k]) for k in shared]
    diffs = [d for d in diffs if math.isfinite(d)]
    s = summarise(diffs)
    if s.n == 0:
        return Paired(float("nan"), float("nan"), 0, float("nan"))
    if s.n > 1 and s.std == 0:  # the same difference on every seed: exact, resolved unless it is 0
        return Paired(s.mean, 0.0, s.n, 0.0)
    return Paired(s.mean, s.ci95, s.n, s.std)


def paired_eval_se(a: dict[str, list[float]], b: dict[str, list[float]]) -> float | None:
    """Standard error, in bits per byte, of the difference of two arms' scores over the same units
    (documents or tasks: `{"nats": [...], "bytes": [...]}` each): the delta method for a ratio of sums on
    the per-unit differences, as `objtrain.evaluation.middle.ratio_se`. None when the units differ."""
    nbytes = a["bytes"]
    k = len(nbytes)
    if nbytes != b["bytes"] or k < 2 or sum(nbytes) <= 0:
        return None
    diff = [x - y for x, y in zip(a["nats"], b["nats"], strict=True)]
    total = float(sum(nbytes))
    r = sum(diff) / total
    resid = sum((d - r * n) ** 2 for d, n in zip(diff, nbytes, strict=True))
    return math.sqrt(resid / (k * (k - 1))) / (total / k) / math.log(2)


@dataclass
class Ranking:
    metric: str
    lower_is_better: bool
    best: str  # arm name
    within_spread: list[str]  # arms (not the best) the seeds cannot tell apart from the best
    gaps: dict[str, dict[str, float | None]]  # arm -> {delta, spread, welch_t, welch_df, paired_ci95, ...}
    tie: bool = False  # every arm has the same mean: no arm is best


def rank(
    metric: str,
    summaries: dict[str, Summary],
    lower: bool | None = None,
    per_seed: dict[str, dict[int, float]] | None = None,
) -> Ranking | None:
    """The best arm for `metric` and the arms the seeds cannot tell apart from it (`lower`: whether
    lower is better; None = guess from the name). With `per_seed` values (arm -> seed -> value) the
    paired difference decides; without, the pooled seed spread."""
    scored = {name: s for name, s in summaries.items() if s.n > 0}
    if not scored:
        return None
    lower = lower_is_better(metric) if lower is None else lower
    best = (min if lower else max)(scored, key=lambda name: scored[name].mean)
    b = scored[best]
    within: list[str] = []
    gaps: dict[str, dict[str, float | None]] = {}
    for name, s in scored.items():
        if name == best:
            continue
        delta = s.mean - b.mean
        spread = math.sqrt((s.std**2 + b.std**2) / 2) if s.n > 1 and b.n > 1 else float("nan")
        t, df = welch(s, b)
        pair = (
            paired(per_seed[name], per_seed[best])
            if per_seed and name in per_seed and best in per_seed
            else None
        )
        if pair is not None and pair.n > 1:
            if not pair.resolved:
                within.append(name)
        elif math.isfinite(spread) and abs(delta) < spread:
            within.append(name)
        gap = {"delta": delta, "spread": spread, "welch_t": t, "welch_df": df}
        if pair is not None:
            gap |= {"paired_delta": pair.delta, "paired_ci95": pair.ci95, "paired_n": float(pair.n)}
        gaps[name] = {k: (v if math.isfinite(v) else None) for k, v in gap.items()}
    tie = len(scored) > 1 and all(s.mean == b.mean for s in scored.values())
    return Ranking(metric, lower, best, within, gaps, tie)


def fmt(s: Summary, digits: int = 4) -> str:
    """`1.2345 ± 0.0123` (or the value alone with one seed)."""
    if s.n == 0:
        return "—"
    if s.n == 1 or not math.isfinite(s.std):
        return f"{s.mean:.{digits}g}"
    return f"{s.mean:.{digits}g} ± {s.std:.2g}"
