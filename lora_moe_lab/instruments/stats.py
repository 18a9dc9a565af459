"""Intervals that survive a rerun, and a warm-up that is checked instead of assumed.

    drop_warmup(samples)            -> Warmup(kept, dropped, stable): drift detection
    median_ci(x, conf=0.95)         -> (median, lo, hi): distribution-free order-statistic interval
    bootstrap_paired(a, b, stat)    -> (estimate, lo, hi): percentile bootstrap over the pairs
    paired_change_pct(fix, base)    -> (median %, lo, hi) of 100 * (fix / base - 1), paired per rep
    between_sessions(a, b)          -> the reader's figure from two sessions: the wider, honest one

Why not "the 2.5-97.5 percentile of the repetitions": with 5 repetitions that is nearly their
min-max range, a spread of the data, not an interval for the median. The order-statistic interval
below has a guaranteed coverage for any continuous distribution (no normality), and at n = 10 the
95 % interval of the median is [x(2), x(9)] with 97.9 % coverage; at n < 6 no such 95 % interval
exists and median_ci says so instead of printing one.

Drift: a GPU's first repetitions often run at other clocks (boost ramp, allocator growth, lazy
module load). The canonical guards recording of 2026-11-30 ran repetitions 0-5 at ~42 ms and the
rest at ~29 ms. `drop_warmup` drops a leading run that differs from the tail by more than the
tail's own spread, and says so; it refuses (UnstableWarmup) when no stable tail is left.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

MIN_PAIRED_REPS = 10  # the project's rule: at least 10 paired repetitions behind a figure
METHOD_MEDIAN = "order-statistic 95 % interval of the median (binomial, distribution-free)"
METHOD_BOOT = "percentile bootstrap (10,000 resamples) of the paired per-repetition changes, 95 %"


class UnstableWarmup(RuntimeError):
    """The repetitions never settle: no stable tail of at least `min_keep` repetitions."""


class TooFewRepetitions(ValueError):
    """Fewer repetitions than an interval at the asked confidence needs."""


def _arr(x, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    if not len(a):
        raise TooFewRepetitions(f"{what}: no repetitions")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what}: non-finite values {a[~np.isfinite(a)][:3].tolist()}")
    return a


def median_ci(x: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """Median and the order-statistic interval [x(k), x(n-k+1)] with the largest k whose binomial
    coverage P(k <= B(n, 1/2) <= n-k) is still >= conf. Valid for any continuous distribution."""
    if not 0.5 < conf < 1:
        raise ValueError(f"conf must be in (0.5, 1), got {conf!r}")
    a = np.sort(_arr(x, "median_ci"))
    n = len(a)
    from scipy.stats import binom

    k_best = None
    for k in range(1, n // 2 + 1):  # 1-based order statistic
        cover = binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5)
        if cover >= conf:
            k_best = k
    if k_best is None:
        raise TooFewRepetitions(f"{n} repetitions give no {conf:.0%} order-statistic interval of the median "
                                f"(needs n >= 6 at 95 %)")
    return float(np.median(a)), float(a[k_best - 1]), float(a[n - k_best])


def bootstrap_paired(a: Sequence[float], b: Sequence[float], stat: Callable[[np.ndarray, np.ndarray], float]
                     | None = None, *, n_boot: int = 10_000, conf: float = 0.95, seed: int = 0
                     ) -> tuple[float, float, float]:
    """Percentile bootstrap of a statistic of PAIRED samples (a[i], b[i] ran back to back in one
    repetition): resample repetitions, keep the pairs together. Default statistic: the median of
    a - b. Needs at least MIN_PAIRED_REPS pairs."""
    a, b = _arr(a, "bootstrap_paired a"), _arr(b, "bootstrap_paired b")
    if len(a) != len(b):
        raise ValueError(f"paired samples of different lengths: {len(a)} and {len(b)}")
    if len(a) < MIN_PAIRED_REPS:
        raise TooFewRepetitions(f"{len(a)} paired repetitions; a bootstrap interval needs >= {MIN_PAIRED_REPS}")
    stat = stat or (lambda x, y: float(np.median(x - y)))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    boots = np.array([stat(a[i], b[i]) for i in idx])
    q = (1 - conf) / 2
    return float(stat(a, b)), float(np.quantile(boots, q)), float(np.quantile(boots, 1 - q))


def paired_change_pct(fix: Sequence[float], base: Sequence[float], **kw) -> tuple[float, float, float]:
    """Median over repetitions of 100 * (fix / base - 1), with its paired bootstrap interval."""
    return bootstrap_paired(fix, base, lambda x, y: float(np.median(100.0 * (x / y - 1.0))), **kw)


@dataclass(frozen=True)
class Warmup:
    kept: np.ndarray  # indices of the repetitions kept (the stable tail)
    dropped: int  # leading repetitions dropped as warm-up drift
    stable: bool
    note: str


def drop_warmup(samples: Sequence[float], *, min_keep: int = MIN_PAIRED_REPS, rel_tol: float = 0.05) -> Warmup:
    """The stable tail of a sequence of repetitions, in time order.

    Reference: the second half of the sequence. Its inner 80 % range, widened by rel_tol of its
    median, is the stable band; the leading run of repetitions outside the band is warm-up drift
    and is dropped. The tail left must then show no trend (its halves' medians agree within the
    band's half-width) and hold at least `min_keep` repetitions, else UnstableWarmup."""
    x = _arr(samples, "drop_warmup")
    n = len(x)
    if n < min_keep:
        raise TooFewRepetitions(f"{n} repetitions; the rule is >= {min_keep} after the warm-up")
    ref = x[n // 2:]
    med = float(np.median(ref))
    lo, hi = float(np.quantile(ref, 0.1)) - rel_tol * med, float(np.quantile(ref, 0.9)) + rel_tol * med
    d = 0
    while d < n and not (lo <= x[d] <= hi):
        d += 1
    tail = x[d:]
    if len(tail) < min_keep:
        raise UnstableWarmup(f"only {len(tail)} of {n} repetitions are stable (the first {d} drift: "
                             f"{x[:min(d, 4)].round(3).tolist()} against a stable band [{lo:.3g}, {hi:.3g}]); "
                             f"the rule is >= {min_keep}: run more repetitions; not averaged")
    h = len(tail) // 2
    m1, m2 = float(np.median(tail[:h])), float(np.median(tail[h:]))
    if abs(m1 - m2) > (hi - lo) / 2:
        raise UnstableWarmup(f"the repetitions trend: first-half median {m1:.4g}, second-half {m2:.4g} "
                             f"(band half-width {(hi - lo) / 2:.3g}); the timings never settle; not averaged")
    note = f"dropped the first {d} of {n} repetitions as warm-up drift" if d else f"no warm-up drift in {n} repetitions"
    return Warmup(np.arange(d, n), d, True, note)


def between_sessions(a: tuple[float, float, float], b: tuple[float, float, float]) -> dict:
    """Two sessions' (estimate, lo, hi) of one figure -> what a reader sees. Agree (intervals
    overlap): the pooled estimate (mean of the two) with the union of the intervals. Disagree: the
    union too, flagged, so the reader sees the wider, honest range, never the narrower one."""
    (e1, l1, h1), (e2, l2, h2) = a, b
    overlap = max(l1, l2) <= min(h1, h2)
    return dict(estimate=(e1 + e2) / 2, lo=min(l1, l2), hi=max(h1, h2), spread=abs(e1 - e2),
                agree=bool(overlap), sessions=2)


def fmt_ci(est: float, lo: float, hi: float, unit: str = "", signed: bool = False, nd: int = 1) -> str:
    f = f"{{:{'+' if signed else ''}.{nd}f}}"
    if any(map(lambda v: v is None or (isinstance(v, float) and math.isnan(v)), (lo, hi))):
        return f.format(est) + unit
    return f"{f.format(est)}{unit} [{f.format(lo)}, {f.format(hi)}]"
