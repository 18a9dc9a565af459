"""Intervals that survive a rerun, and a warm-up that is checked instead of assumed.

    drop_warmup(samples)            -> Warmup(kept, dropped, stable): drift detection
    median_ci(x, conf=0.95)         -> (median, lo, hi): distribution-free order-statistic interval
    bootstrap_paired(a, b, stat)    -> (estimate, lo, hi): percentile bootstrap over the pairs
    paired_change_pct(fix, base)    -> (median %, lo, hi) of 100 * (fix / base - 1), paired per rep
    between_sessions(*figs)         -> the reader's figure from several sessions: the wider, honest one
    warmup_check({arm: samples})    -> WarmupCheck: the largest leading drift dropped from every arm

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

import functools
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
    k_best = _median_ci_rank(n, conf)
    if k_best is None:
        raise TooFewRepetitions(f"{n} repetitions give no {conf:.0%} order-statistic interval of the median "
                                f"(needs n >= 6 at 95 %)")
    return float(np.median(a)), float(a[k_best - 1]), float(a[n - k_best])


@functools.lru_cache(maxsize=None)
def _median_ci_rank(n: int, conf: float) -> int | None:
    """The largest 1-based k with P(k <= B(n, 1/2) <= n-k) >= conf (None: no such k): a function of n and conf
    only, so the readers' thousands of intervals compute it once per n."""
    from scipy.stats import binom

    k = np.arange(1, n // 2 + 1)
    cover = binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5)
    ok = k[cover >= conf]
    return int(ok.max()) if len(ok) else None


# Statistics of paired samples, vectorised over the resamples (axis -1 holds the repetitions):
# 10,000 Python calls per figure made the readers take seconds.
PAIRED_STATS = {
    "median_diff": lambda a, b: np.median(a - b, axis=-1),
    "ratio_of_medians": lambda a, b: np.median(a, axis=-1) / np.median(b, axis=-1),
    "median_change_pct": lambda a, b: np.median(100.0 * (a / b - 1.0), axis=-1),
}


def bootstrap_paired(a: Sequence[float], b: Sequence[float],
                     stat: str | Callable[[np.ndarray, np.ndarray], float] = "median_diff", *,
                     n_boot: int = 10_000, conf: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Percentile bootstrap of a statistic of PAIRED samples (a[i], b[i] ran back to back in one
    repetition): resample repetitions, keep the pairs together. `stat`: a name of PAIRED_STATS
    (vectorised; default the median of a - b) or a function of two 1-D arrays (one call per
    resample). Needs at least MIN_PAIRED_REPS pairs."""
    a, b = _arr(a, "bootstrap_paired a"), _arr(b, "bootstrap_paired b")
    if len(a) != len(b):
        raise ValueError(f"paired samples of different lengths: {len(a)} and {len(b)}")
    if len(a) < MIN_PAIRED_REPS:
        raise TooFewRepetitions(f"{len(a)} paired repetitions; a bootstrap interval needs >= {MIN_PAIRED_REPS}")
    if isinstance(stat, str) and stat not in PAIRED_STATS:
        raise ValueError(f"unknown statistic {stat!r}; choose one of {list(PAIRED_STATS)} or pass a function")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    if isinstance(stat, str):
        f = PAIRED_STATS[stat]
        est, boots = float(f(a, b)), f(a[idx], b[idx])
    else:
        est, boots = float(stat(a, b)), np.array([stat(a[i], b[i]) for i in idx])
    q = (1 - conf) / 2
    return est, float(np.quantile(boots, q)), float(np.quantile(boots, 1 - q))


def paired_change_pct(fix: Sequence[float], base: Sequence[float], **kw) -> tuple[float, float, float]:
    """Median over repetitions of 100 * (fix / base - 1), with its paired bootstrap interval."""
    return bootstrap_paired(fix, base, "median_change_pct", **kw)


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


def between_sessions(*figs: tuple[float, float, float]) -> dict:
    """Sessions' (estimate, lo, hi) of one figure -> what a reader sees: the mean of the estimates
    with the union of the intervals, the wider, honest range, and `agree` (all intervals share a
    point) to flag a disagreement. One session: that session's figure as it is."""
    if not figs:
        return dict(estimate=math.nan, lo=math.nan, hi=math.nan, spread=math.nan, agree=True, sessions=0)
    es, los, his = zip(*(tuple(map(float, f)) for f in figs))
    return dict(estimate=float(np.mean(es)), lo=min(los), hi=max(his), spread=max(es) - min(es),
                agree=bool(max(los) <= min(his)), sessions=len(figs))


# ----------------------------------------------------------------------------------------------
# The warm-up rule for interleaved, paired arms: one function for every recorder and reader
OK, UNSTABLE = "ok", "unstable"


@dataclass(frozen=True)
class WarmupCheck:
    n: int  # repetitions recorded (per arm)
    dropped: int  # leading repetitions dropped from every arm (0 when unstable: nothing is kept)
    stable: bool
    note: str
    per_arm: dict  # arm -> repetitions its own drift would drop, None where it never settles

    @property
    def status(self) -> str:
        return OK if self.stable else UNSTABLE


def warmup_check(arms, *, min_keep: int = MIN_PAIRED_REPS) -> WarmupCheck:
    """The warm-up verdict for one point: `arms` maps each variant to its repetitions in time order
    (the same repetitions for every arm: they were interleaved). Every arm goes through
    drop_warmup; the largest drop over the arms is taken from all of them, so the kept repetitions
    stay paired. Any arm that never settles (UnstableWarmup) makes the point unstable: its figures
    must not be averaged. Fewer than `min_keep` repetitions is an error (TooFewRepetitions)."""
    n = {k: len(v) for k, v in arms.items()}
    if len(set(n.values())) != 1:
        raise ValueError(f"interleaved arms must have the same repetitions, got {n}")
    n = next(iter(n.values()))
    per, why = {}, []
    for arm, x in arms.items():
        try:
            per[arm] = drop_warmup(x, min_keep=min_keep).dropped
        except UnstableWarmup as e:
            per[arm] = None
            why.append(f"{arm}: {e}")
    if why:
        return WarmupCheck(n, 0, False, f"unstable over {n} repetitions ({'; '.join(why)})", per)
    d = max(per.values())
    if not d:
        return WarmupCheck(n, 0, True, f"no warm-up drift in {n} repetitions", per)
    drift = ", ".join(f"{k} {v}" for k, v in per.items() if v)
    return WarmupCheck(n, d, True, f"dropped the first {d} of {n} repetitions from every arm as warm-up drift "
                                   f"(drift per arm: {drift})", per)


RUNS_METHOD = "95 % t-interval over independent runs, each a fresh process"


def between_runs(medians: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of a headline over independent runs: Student's t over the runs' medians. A within-run
    bootstrap describes one process (two runs of one H100 gave +7.1 % [7.1, 7.2] and +8.6 % [8.5, 8.7]); the
    machine's interval must hold the NEXT run, so it is built from the spread between runs. Needs >= 3 runs."""
    from scipy import stats as st

    x = _arr(medians, "medians")
    if len(x) < 3:
        raise ValueError(f"an interval over runs needs >= 3 independent runs, got {len(x)}")
    if not 0 < conf < 1:
        raise ValueError(f"conf must be in (0, 1), got {conf!r}")
    m, s = float(x.mean()), float(x.std(ddof=1))
    h = float(st.t.ppf(0.5 + conf / 2, len(x) - 1)) * s / np.sqrt(len(x))
    return m, m - h, m + h


def next_run_check(medians: Sequence[float], conf: float = 0.95) -> list[dict]:
    """Each run held out in turn: does it land inside the interval of the runs before it (in recorded order)? One
    row per run from the fourth on: the check that a headline interval holds the next run on the machine."""
    x = _arr(medians, "medians")
    rows = []
    for i in range(3, len(x)):
        m, lo, hi = between_runs(x[:i], conf)
        rows.append(dict(run=i, median=float(x[i]), lo=lo, hi=hi, inside=bool(lo <= x[i] <= hi)))
    return rows
