"""Intervals: order-statistic median interval, paired bootstrap, drift detection, two sessions."""
import numpy as np
import pytest

from lora_moe_lab.instruments.analysers import stats


def test_median_ci_order_statistics_at_n10():
    x = np.arange(1.0, 11.0)[::-1]  # any order: the interval uses the sorted values
    med, lo, hi = stats.median_ci(x)
    assert med == 5.5 and (lo, hi) == (2.0, 9.0)  # [x(2), x(9)]: 97.9 % coverage at n = 10


def test_median_ci_refuses_too_few_and_bad_conf():
    with pytest.raises(stats.TooFewRepetitions, match="n >= 6"):
        stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError, match="conf"):
        stats.median_ci(np.arange(10.0), conf=1.2)
    with pytest.raises(ValueError, match="non-finite"):
        stats.median_ci([1.0] * 9 + [float("nan")])


def test_median_ci_covers_at_nominal_rate():
    rng = np.random.default_rng(1)
    hits = sum(lo <= 0.0 <= hi for _, lo, hi in (stats.median_ci(rng.standard_normal(12)) for _ in range(2000)))
    assert hits / 2000 >= 0.94


def test_bootstrap_paired_keeps_pairs_together():
    rng = np.random.default_rng(0)
    common = rng.normal(100, 20, size=15)  # a drift shared by both arms of a repetition
    a, b = common + 5 + rng.normal(0, 0.5, 15), common + rng.normal(0, 0.5, 15)
    est, lo, hi = stats.bootstrap_paired(a, b)
    assert lo < 5 < hi and hi - lo < 2  # pairing removes the shared drift
    with pytest.raises(stats.TooFewRepetitions, match=">= 10"):
        stats.bootstrap_paired(a[:9], b[:9])
    with pytest.raises(ValueError, match="different lengths"):
        stats.bootstrap_paired(a, b[:12])


def test_paired_change_pct():
    base = np.linspace(100, 110, 12)
    est, lo, hi = stats.paired_change_pct(base * 1.1, base)
    assert est == pytest.approx(10.0) and lo == pytest.approx(10.0) and hi == pytest.approx(10.0)


def test_drop_warmup_drops_the_leading_drift_and_says_so():
    rng = np.random.default_rng(2)
    x = np.r_[np.full(4, 42.0), 29 + rng.normal(0, 0.3, 12)]
    w = stats.drop_warmup(x)
    assert w.dropped == 4 and list(w.kept) == list(range(4, 16)) and "first 4 of 16" in w.note
    w0 = stats.drop_warmup(29 + rng.normal(0, 0.3, 12))
    assert w0.dropped == 0 and "no warm-up drift" in w0.note


def test_drop_warmup_refuses_unstable_or_short():
    with pytest.raises(stats.UnstableWarmup, match="only 9 of 15"):
        stats.drop_warmup(np.r_[np.full(6, 42.0), np.full(9, 29.0)])
    with pytest.raises(stats.UnstableWarmup, match="stable|trend"):
        stats.drop_warmup(np.linspace(20, 40, 16))
    with pytest.raises(stats.TooFewRepetitions):
        stats.drop_warmup(np.ones(5))


def test_between_sessions_reports_the_wider_figure():
    s = stats.between_sessions((6.6, 6.1, 9.1), (10.1, 9.1, 14.3))
    assert s["agree"] and (s["lo"], s["hi"]) == (6.1, 14.3)
    d = stats.between_sessions((6.6, 6.1, 8.0), (10.1, 9.1, 14.3))
    assert not d["agree"] and d["lo"] == 6.1 and d["hi"] == 14.3 and d["spread"] == pytest.approx(3.5)


def test_named_statistics_equal_their_per_resample_form():
    rng = np.random.default_rng(3)
    a, b = rng.normal(100, 5, 16), rng.normal(90, 5, 16)
    slow = {"median_diff": lambda x, y: float(np.median(x - y)),
            "ratio_of_medians": lambda x, y: float(np.median(x) / np.median(y)),
            "median_change_pct": lambda x, y: float(np.median(100 * (x / y - 1)))}
    for name, f in slow.items():  # the vectorised path computes the same resamples, the same figure
        assert np.allclose(stats.bootstrap_paired(a, b, name), stats.bootstrap_paired(a, b, f), rtol=1e-12)
    with pytest.raises(ValueError, match="unknown statistic"):
        stats.bootstrap_paired(a, b, "mean")


def test_warmup_check_keeps_pairs_and_flags_unstable_arms():
    flat = np.r_[np.full(16, 29.0)]
    c = stats.warmup_check({"sync": np.r_[np.full(3, 42.0), np.full(13, 31.0)], "cpu_flag": flat})
    assert c.stable and c.dropped == 3 and c.per_arm == {"sync": 3, "cpu_flag": 0} and c.status == stats.OK
    u = stats.warmup_check({"sync": np.linspace(20, 40, 16), "cpu_flag": flat})
    assert not u.stable and u.dropped == 0 and u.status == stats.UNSTABLE and u.per_arm["sync"] is None
    with pytest.raises(ValueError, match="same repetitions"):
        stats.warmup_check({"sync": flat, "cpu_flag": flat[:12]})


def test_between_sessions_one_and_three():
    assert stats.between_sessions((5.0, 4.0, 6.0)) == dict(estimate=5.0, lo=4.0, hi=6.0, spread=0.0, agree=True,
                                                           sessions=1)
    t = stats.between_sessions((5.0, 4.0, 6.0), (6.0, 5.5, 7.0), (9.0, 8.0, 10.0))
    assert t["sessions"] == 3 and (t["lo"], t["hi"]) == (4.0, 10.0) and not t["agree"]


def test_an_interval_over_runs_holds_what_the_runs_show():
    # the t-interval over run medians: t(0.975, 3) = 3.182; and each later run checked against the runs before it
    from lora_moe_lab.instruments.analysers.stats import between_runs, next_run_check

    rng = np.random.default_rng()
    x = rng.normal(8.0, 0.7, 4)
    m, lo, hi = between_runs(x)
    half = 3.182446305284263 * x.std(ddof=1) / 2.0
    assert m == pytest.approx(x.mean()) and (lo, hi) == pytest.approx((m - half, m + half))
    rows = next_run_check([7.1, 8.6, 7.9, 9.5, 30.0])
    assert [r["inside"] for r in rows] == [True, False]  # 9.5 inside [6.0, 9.7]; an outlier of 30 is not
    with pytest.raises(ValueError, match=">= 3 independent runs"):
        between_runs([7.1, 8.6])
