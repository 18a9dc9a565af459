"""The canonical guards recording: the median's distribution-free interval, paired differences per
repetition with their bootstrap interval, the warm-up check (drift dropped from every arm alike,
unstable points not averaged), two sessions pooled into the wider figure, the sweep view the
simulator reads, and clear errors for a file of another schema."""
import math

import numpy as np
import pandas as pd
import pytest

from guards_synth import session_rows, write_session
from lora_moe_lab.instruments.analysers import stats
from lora_moe_lab.instruments.analysers.recordings import (SAMPLE_COLUMNS, combine_sessions, load_guards,
                                                 median_ci, warmup_check)


def test_median_ci_order_statistics():
    x = np.arange(1.0, 16.0)  # n = 15: the 95 % interval of the median is [x(4), x(12)]
    med, lo, hi = median_ci(np.random.default_rng(0).permutation(x))
    assert (med, lo, hi) == (8.0, 4.0, 12.0)
    assert median_ci([1.0, 2.0, 3.0])[1] == -math.inf  # too few samples for 95 %: unbounded, not a lie
    assert math.isnan(median_ci([])[0])


def _write(tmp_path, reps=11, base=1000.0, lost=48 * 40.0):
    rng = np.random.default_rng(1)
    rows = []
    for M in (16, 4096):
        for rep in range(reps):
            noise = rng.normal(0, 20.0)  # shared by the repetition: the pairing cancels it
            for v, t, syncs in (("sync", base + lost, 48), ("cpu_flag", base, 0), ("graph", base * 0.8, 0)):
                rows.append(dict(preset="tiny", layers=48, tokens=M, active=0.0, variant=v,
                                 guard="cpu_flag" if v == "graph" else v, mode="graph" if v == "graph" else "eager",
                                 rep=rep, us=t + noise + rng.normal(0, 1.0), syncs_per_forward=syncs))
    p = tmp_path / "g.csv"
    pd.DataFrame(rows, columns=SAMPLE_COLUMNS).to_csv(p, index=False)
    (tmp_path / "g.meta.json").write_text('{"gpu": "NVIDIA H200", "git_commit": "abcdef0123", '
                                          '"date_utc": "2026-11-30"}')
    return p


def test_paired_lost_per_sync_and_labels(tmp_path):
    rec = load_guards(_write(tmp_path))
    assert rec.label == "H200 · commit abcdef0 · 2026-11-30"
    p = rec.paired("sync", "cpu_flag")
    assert len(p) == 2 and (p["n"] == 11).all() and (p["status"] == "unchecked").all()  # an old file: as recorded
    assert np.allclose(p["us_per_sync"], 40.0, atol=0.5)  # 40 us per sync, noise paired away
    assert (p["lost_lo95_us"] < p["lost_us"]).all() and (p["lost_us"] < p["lost_hi95_us"]).all()
    assert (p["lost_hi95_us"] - p["lost_lo95_us"] < 10.0).all()  # the shared noise (sd 20) cancels
    assert (p["ratio_lo95"] < p["ratio"]).all() and (p["ratio"] < p["ratio_hi95"]).all()
    assert p["method"].str.contains("bootstrap").all()
    s = rec.summary()
    assert set(s["variant"]) == {"sync", "cpu_flag", "graph"} and (s["lo95_us"] <= s["median_us"]).all()
    sw = rec.as_sweep()
    assert set(sw["mode"]) == {"eager", "graph"} and (sw["gpu"] == "NVIDIA H200").all()


def test_wrong_schema_and_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="studies/guards/record.py"):
        load_guards(tmp_path / "none.csv")
    with pytest.raises(FileNotFoundError, match="studies/guards/record.py"):
        load_guards(tmp_path)  # a folder without any recording
    bad = tmp_path / "bad.csv"
    pd.DataFrame(dict(preset=["tiny"], median_us=[1.0])).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="not a guards recording"):
        load_guards(bad)
    with pytest.raises(ValueError, match="no variant 'nope'"):
        load_guards(_write(tmp_path)).paired("nope")


# ---------------------------------------------------------------------------------------------- warm-up
def test_warmup_check_drops_the_largest_drift_from_every_arm():
    rng = np.random.default_rng(0)
    flat = lambda: 100 + rng.normal(0, 0.5, 16)  # noqa: E731
    sync = flat()
    sync[:4] += 40  # 4 leading repetitions drift
    cpu = flat()
    cpu[:2] += 30
    c = warmup_check({"sync": sync, "cpu_flag": cpu, "graph": flat()})
    assert c.stable and c.dropped == 4 and c.per_arm == {"sync": 4, "cpu_flag": 2, "graph": 0}
    assert "dropped the first 4 of 16" in c.note
    never = flat()
    never[:8] += 40  # 8 of 16 drift: fewer than 10 stable repetitions are left
    u = warmup_check({"sync": never, "cpu_flag": flat()})
    assert not u.stable and u.status == "unstable" and u.per_arm["sync"] is None and "sync" in u.note
    with pytest.raises(ValueError, match="same repetitions"):
        warmup_check({"sync": flat(), "cpu_flag": flat()[:12]})


def test_leading_drift_is_dropped_from_every_arm_and_kept_in_the_file(tmp_path):
    drift = {(16, "sync"): 3, (16, "cpu_flag"): 1, (4096, "sync"): 8}  # M=4096: 8 of 16 drift -> unstable
    f = write_session(tmp_path, "s1", drift=drift)
    raw = pd.read_csv(f)
    assert len(raw) == 2 * 2 * 16 * 4  # nothing removed
    rec = load_guards(f)
    assert rec.checked and rec.sessions == ["s1"]
    w = rec.warmup().set_index(["tokens", "active"])
    assert w.loc[(16, 0.0), "dropped"] == 3 and w.loc[(16, 0.0), "kept"] == 13 and w.loc[(16, 0.0), "status"] == "ok"
    assert "sync 3" in w.loc[(16, 0.0), "note"] and "cpu_flag 1" in w.loc[(16, 0.0), "note"]
    assert w.loc[(4096, 0.0), "status"] == "unstable" and w.loc[(4096, 0.0), "kept"] == 0
    p = rec.paired().set_index(["tokens", "active"])
    assert p.loc[(16, 0.0), "n"] == 13 and p.loc[(16, 0.0), "n_dropped"] == 3
    k = raw[(raw.tokens == 16) & (raw.active == 0.0) & (raw.rep >= 3)]
    a, b = (k[k.variant == v].sort_values("rep").us.to_numpy() for v in ("sync", "cpu_flag"))
    assert np.isclose(p.loc[(16, 0.0), "lost_us"], stats.bootstrap_paired(a, b)[0])  # on the kept pairs only
    assert np.isclose(p.loc[(16, 0.0), "us_per_sync"], 40.0, atol=1.0)
    assert p.loc[(4096, 0.0), "status"] == "unstable" and math.isnan(p.loc[(4096, 0.0), "us_per_sync"])
    assert not p.loc[(4096, 0.0), "stable"] and "not averaged" in p.loc[(4096, 0.0), "note"]
    s = rec.summary().set_index(["tokens", "active", "variant"])
    assert math.isnan(s.loc[(4096, 0.0, "cpu_flag"), "median_us"]) and s.loc[(16, 0.0, "graph"), "n"] == 13
    assert not ((rec.as_sweep().tokens == 4096) & (rec.as_sweep().active == 0.0)).any()  # nothing to fit on
    # the same check applied by the reader to a file recorded without it
    legacy = tmp_path / "old_guards.csv"
    session_rows("old", drift=drift).drop(columns="session").to_csv(legacy, index=False)
    assert load_guards(legacy).paired()["status"].eq("unchecked").all()
    again = load_guards(legacy, check_warmup=True).warmup().set_index(["tokens", "active"])
    assert again.loc[(16, 0.0), "dropped"] == 3 and again.loc[(4096, 0.0), "status"] == "unstable"


def test_two_sessions_pooled_into_the_wider_figure(tmp_path):
    write_session(tmp_path, "s1", lost_per_sync=40.0, seed=1, drift={(16, "sync"): 2})
    write_session(tmp_path, "s2", lost_per_sync=60.0, seed=2, drift={(4096, "cpu_flag"): 9})  # s2: 4096 unstable
    rec = load_guards(tmp_path)  # the folder: both session files
    assert rec.sessions == ["s1", "s2"] and rec.path == tmp_path
    assert rec.label == "s1: H200 · commit abcs100 · 2026-12-01; s2: H200 · commit abcs200 · 2026-12-02"
    per = rec.paired(by_session=True).set_index(["session", "tokens", "active"])
    p = rec.paired().set_index(["tokens", "active"])
    one, two = per.loc[("s1", 16, 0.0)], per.loc[("s2", 16, 0.0)]
    want = stats.between_sessions(*[(r.us_per_sync, r.us_per_sync_lo95, r.us_per_sync_hi95) for r in (one, two)])
    r = p.loc[(16, 0.0)]
    assert np.isclose(r.us_per_sync, want["estimate"]) and np.isclose(r.us_per_sync, 50.0, atol=1.5)
    assert (r.us_per_sync_lo95, r.us_per_sync_hi95) == (want["lo"], want["hi"])  # the union: the wider range
    assert not r.agree and r.sessions == 2 and r.session == "s1+s2"  # 40 vs 60 us: beyond their intervals
    assert np.isclose(r.spread_us_per_sync, 20.0, atol=3.0) and r.n == 14  # n: the fewer kept (s1 dropped 2)
    # a point unstable in one session rests on the other, and says so
    q = p.loc[(4096, 0.0)]
    assert q.stable and q.sessions == 1 and q.session == "s1" and "unstable in s2" in q.note
    assert np.isclose(q.us_per_sync, per.loc[("s1", 4096, 0.0), "us_per_sync"])
    same = combine_sessions([(1.0, 0.5, 1.5), (1.2, 0.8, 1.6)])
    assert same["agree"] and (same["lo"], same["hi"]) == (0.5, 1.6)
    assert combine_sessions([(1.0, 0.5, 1.5)])["spread"] == 0.0
    s = rec.summary()
    assert (s.groupby(["tokens", "active", "variant"]).size() == 1).all() and "agree_median" in s
    (tmp_path / "x").mkdir()
    write_session(tmp_path / "x", "s1")
    with pytest.raises(ValueError, match="same session"):
        load_guards([tmp_path / "h200_guards_s1.csv", tmp_path / "x" / "h200_guards_s1.csv"])


def test_loaders_default_to_the_catalog():
    """No path: the catalog's entries (data/catalog.json); the module names no file."""
    from lora_moe_lab.instruments.analysers import recordings as R
    from lora_moe_lab.provenance import catalog

    assert R.session_files() == catalog("guards") and load_guards().paths == catalog("guards")
    assert R.guards_dir() == catalog("guards")[0].parent == R.session_files()[0].parent
    canon = R.load_kernel_run()
    assert canon.name == R.run_name(catalog("kernel_run.canonical"))
    assert R.load_kernel_run(path=catalog("kernel_run.compact")).name == R.run_name(catalog("kernel_run.compact"))
    sweep = R.load_kernel_run(path=catalog("kernel_run.tile_sweep"))
    assert R.load_kernel_run(R.run_name(catalog("kernel_run.tile_sweep"))).rows.equals(sweep.rows)
    with pytest.raises(AttributeError, match="has no attribute 'GUARDS_CSV'"):
        R.GUARDS_CSV  # noqa: B018  (the former names: the catalog's entries)


def test_a_session_folder_handed_is_read_by_its_layout(tmp_path):
    from lora_moe_lab.instruments.analysers import recordings as R

    write_session(tmp_path, "s1")
    write_session(tmp_path, "s2")
    assert [p.name for p in R.session_files(tmp_path)] == ["h200_guards_s1.csv", "h200_guards_s2.csv"]
    assert load_guards(R.session_files(tmp_path)).sessions == load_guards(tmp_path).sessions == ["s1", "s2"]
