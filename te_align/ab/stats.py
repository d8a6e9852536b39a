"""Paired A/B statistics: mean difference, 95% interval across seeds and a plain verdict. No torch.

Both arms of one seed share the seed's data order, noise and LoRA initialisation, so the per-seed
differences ``A - B`` are the observations (a paired design). The interval is Student's t interval of
their mean: ``mean ± t(0.975, n - 1) · sd / sqrt(n)``. The verdict reads only the interval:

* it lies wholly on the profile's side of zero: ``"profile better"``;
* wholly on the trainer default's side: ``"trainer default better"``;
* it contains zero: ``"no measurable difference"``;
* the difference is degenerate (fewer than 2 seeds, or every seed's difference the same, so zero spread): no
  interval, no t p-value and ``"no verdict"`` (:data:`NO_VERDICT`): a zero-width interval from two equal seeds is
  not evidence of anything.

"Better" means lower for losses and higher for accuracies (:class:`Metric` says which).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "NO_DIFFERENCE",
    "NO_VERDICT",
    "PROFILE_BETTER",
    "TRAINER_BETTER",
    "Metric",
    "PairedSummary",
    "betainc",
    "holm",
    "holm_multipliers",
    "paired",
    "round_to_spread",
    "sd_ratio_interval",
    "sign_flip_p",
    "smallest_detectable",
    "t_interval",
    "t_quantile",
    "t_quantile_at",
    "t_two_sided_p",
]

PROFILE_BETTER = "profile better"
TRAINER_BETTER = "trainer default better"
NO_DIFFERENCE = "no measurable difference"
#: A degenerate difference (fewer than 2 seeds, or zero spread across seeds): no interval, no p, no verdict.
NO_VERDICT = "no verdict (degenerate: fewer than 2 seeds or no spread)"

# Two-sided 95% quantiles t(0.975, df) for df = 1..30 (standard tables); df > 30 uses the normal 1.96
# plus the first correction term of the Cornish-Fisher expansion.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip


def t_quantile(df: int) -> float:
    """t(0.975, df), the half-width factor of a two-sided 95% interval."""
    if df < 1:
        raise ValueError(f"t_quantile: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


@dataclass(frozen=True)
class Metric:
    """A scored quantity; ``higher_better`` for accuracies, not for losses."""

    name: str
    higher_better: bool
    unit: str = ""


@dataclass(frozen=True)
class PairedSummary:
    metric: Metric
    a: tuple[float, ...]
    b: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def diffs(self) -> tuple[float, ...]:
        return tuple(x - y for x, y in zip(self.a, self.b, strict=True))

    @property
    def a_mean(self) -> float:
        return statistics.fmean(self.a) if self.a else math.nan

    @property
    def b_mean(self) -> float:
        return statistics.fmean(self.b) if self.b else math.nan

    @property
    def diff_mean(self) -> float:
        return statistics.fmean(self.diffs) if self.diffs else math.nan

    @property
    def diff_sd(self) -> float:
        return statistics.stdev(self.diffs) if self.n > 1 else math.nan

    @property
    def degenerate(self) -> bool:
        """Fewer than 2 seeds, or every seed's difference equal (zero spread): no interval, p or verdict."""
        return self.n < 2 or self.diff_sd == 0

    @property
    def interval(self) -> tuple[float, float]:
        """95% interval of the mean difference A - B (NaN when :attr:`degenerate`)."""
        if self.degenerate:
            return math.nan, math.nan
        half = t_quantile(self.n - 1) * self.diff_sd / math.sqrt(self.n)
        return self.diff_mean - half, self.diff_mean + half

    @property
    def p_t(self) -> float:
        """Two-sided p-value of the paired t test of mean difference 0 (NaN when :attr:`degenerate`: with zero
        spread the t statistic is 0/0 or infinite, not a p-value)."""
        if self.degenerate:
            return math.nan
        t = self.diff_mean / (self.diff_sd / math.sqrt(self.n))
        return t_two_sided_p(t, self.n - 1)

    @property
    def p_signflip(self) -> float:
        """Exact two-sided sign-flip (paired permutation) p-value: the share of the 2^n sign patterns of the
        differences whose mean is at least as far from 0 as the observed one. Its smallest possible value is
        2^(1-n) (1/32 with 6 seeds)."""
        return sign_flip_p(self.diffs)

    @property
    def verdict(self) -> str:
        if self.degenerate:
            return NO_VERDICT
        lo, hi = self.interval
        if lo <= 0.0 <= hi:
            return NO_DIFFERENCE
        a_higher = lo > 0.0
        return TRAINER_BETTER if a_higher == self.metric.higher_better else PROFILE_BETTER


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t_two_sided_p: df must be >= 1, got {df}")
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-flip p-value of paired differences (all 2^n sign patterns; n <= 20)."""
    n = len(diffs)
    if n == 0:
        return math.nan
    if n > 20:
        raise ValueError(f"sign_flip_p: exact enumeration needs n <= 20, got {n}")
    observed = abs(sum(diffs))
    eps = 1e-12 * max(1.0, sum(abs(d) for d in diffs))
    hits = 0
    for mask in range(1 << n):
        total = sum(-d if mask >> i & 1 else d for i, d in enumerate(diffs))
        hits += abs(total) >= observed - eps
    return hits / (1 << n)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given; NaN stays NaN and is not counted)."""
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def holm_multipliers(pvalues: Sequence[float]) -> list[float]:
    """Per p-value, the factor Holm's step-down procedure multiplied it by before capping at 1:
    ``max over the steps up to its own of (m - j) p_(j)`` divided by its own p (NaN for NaN or zero p). A row's
    Holm-adjusted p is below alpha exactly when its own p is below ``alpha / factor``: the level its test was
    held to, which :func:`t_interval` turns into an interval in the verdict's terms."""
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, (m - rank) * pvalues[i])
        out[i] = running / pvalues[i] if pvalues[i] > 0 else math.nan
    return out


def t_quantile_at(p: float, df: int) -> float:
    """The t value whose two-sided tail probability is ``p`` (``t_quantile_at(0.05, 5)`` = 2.571), by bisection
    of :func:`t_two_sided_p`."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile_at: p must be in (0, 1), got {p}")
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def t_interval(diffs: Sequence[float], alpha: float) -> tuple[float, float]:
    """The two-sided ``1 - alpha`` t interval of the mean of paired differences (NaN when degenerate)."""
    n = len(diffs)
    if n < 2 or math.isnan(alpha):
        return math.nan, math.nan
    sd = statistics.stdev(diffs)
    if sd == 0:
        return math.nan, math.nan
    mean = statistics.fmean(diffs)
    half = t_quantile_at(min(alpha, 1.0 - 1e-12), n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def smallest_detectable(noise_sd: float, n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true mean difference a paired t test on ``n`` seeds detects with probability ``power`` at
    two-sided level ``alpha``, when one seed's difference varies with standard deviation ``noise_sd``:
    ``(t(1 - alpha/2, n - 1) + t(power, n - 1)) * noise_sd / sqrt(n)`` (the usual normal-shift approximation of
    the noncentral t). NaN with fewer than 2 seeds or no noise estimate."""
    if n < 2 or math.isnan(noise_sd) or math.isnan(alpha):
        return math.nan
    return (t_quantile_at(alpha, n - 1) + t_quantile_at(2.0 * (1.0 - power), n - 1)) * noise_sd / math.sqrt(n)


def sd_ratio_interval(a: Sequence[float], b: Sequence[float], *, resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """``(sd(a) / sd(b), low, high)``: the ratio of the arms' spreads across seeds with a 95% percentile bootstrap
    interval (seeds resampled in pairs, deterministic). NaN where a spread is 0 or fewer than 3 seeds."""
    import random

    n = len(a)
    if n != len(b) or n < 3:
        return math.nan, math.nan, math.nan
    sa, sb = statistics.stdev(a), statistics.stdev(b)
    if sb == 0:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        pick = [rng.randrange(n) for _ in range(n)]
        ra, rb = statistics.stdev([a[i] for i in pick]), statistics.stdev([b[i] for i in pick])
        if rb > 0:
            ratios.append(ra / rb)
    if len(ratios) < resamples // 2:
        return sa / sb, math.nan, math.nan
    ratios.sort()
    return sa / sb, ratios[int(0.025 * len(ratios))], ratios[min(len(ratios) - 1, int(0.975 * len(ratios)))]


def paired(metric: Metric, a: Sequence[float], b: Sequence[float]) -> PairedSummary:
    """The paired summary of per-seed values ``a`` (arm A) and ``b`` (arm B), in seed order."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values for arm A but {len(b)} for arm B")
    return PairedSummary(metric, tuple(float(x) for x in a), tuple(float(y) for y in b))


def round_to_spread(value: float, spread: float) -> str:
    """``value`` with as many decimals as ``spread`` (e.g. an interval half-width) supports: two
    significant digits of the spread. NaN spread gives three significant digits of the value."""
    if math.isnan(value):
        return "n/a"
    if math.isnan(spread) or spread <= 0:
        return f"{value:.3g}"
    decimals = max(0, 1 - math.floor(math.log10(abs(spread))))
    return f"{value:.{decimals}f}"
