"""Paired A/B statistics: mean difference, 95% interval across seeds and a plain verdict. No torch.

Both arms of one seed share the seed's data order, noise and LoRA initialisation, so the per-seed
differences ``A - B`` are the observations (a paired design). The interval is Student's t interval of
their mean: ``mean ± t(0.975, n - 1) · sd / sqrt(n)``. The verdict reads only the interval:

* it lies wholly on the profile's side of zero: ``"profile better"``;
* wholly on the trainer default's side: ``"trainer default better"``;
* it contains zero (or fewer than 2 seeds): ``"no measurable difference"``.

"Better" means lower for losses and higher for accuracies (:class:`Metric` says which).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "NO_DIFFERENCE",
    "PROFILE_BETTER",
    "TRAINER_BETTER",
    "Metric",
    "PairedSummary",
    "paired",
    "round_to_spread",
    "t_quantile",
]  # fmt: skip

PROFILE_BETTER = "profile better"
TRAINER_BETTER = "trainer default better"
NO_DIFFERENCE = "no measurable difference"

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
    def interval(self) -> tuple[float, float]:
        """95% interval of the mean difference A - B (NaN with fewer than 2 seeds)."""
        if self.n < 2:
            return math.nan, math.nan
        half = t_quantile(self.n - 1) * self.diff_sd / math.sqrt(self.n)
        return self.diff_mean - half, self.diff_mean + half

    @property
    def verdict(self) -> str:
        lo, hi = self.interval
        if math.isnan(lo) or lo <= 0.0 <= hi:
            return NO_DIFFERENCE
        a_higher = lo > 0.0
        return TRAINER_BETTER if a_higher == self.metric.higher_better else PROFILE_BETTER


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
