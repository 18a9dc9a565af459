"""studies/lora_tax/record.py on the CPU (--smoke: tiny preset, 2 layers, eager): both regimes, every adapter
setting, rows and repetitions appended and sealed, read back through their schemas and pooled by the reader; a
session is recorded once; without --smoke and without CUDA it refuses before anything is built or written."""
import json

import pytest

from lora_moe_lab import runtime
from lora_moe_lab.instruments.analysers import schemas as S
from studies.lora_tax import read as R
from studies.lora_tax import record as rec


def _argv(out, *more):
    return ["--smoke", "--out", str(out), "--decode-tokens", "8", "--warmup", "1", *more]


def test_smoke_run_writes_sealed_rows_and_the_reader_pools_them(tmp_path):
    assert rec.main(_argv(tmp_path)) == 0
    df = S.read_csv(tmp_path / rec.CSV, "lora_tax", dtype={"ranks": str})  # the seal and the schema
    reps = S.read_csv(tmp_path / rec.REPS_CSV, "lora_tax_reps")
    assert list(df.columns) == rec.COLUMNS and len(df) == 6  # 2 regimes x 3 settings, eager
    assert set(zip(df.ranks, df["mix"])) == {("16,16,16,16", "even"), ("8,16,32,64", "even"),
                                            ("8,16,32,64", "r64_70pct")}
    assert set(df.regime) == {"prefill", "decode"} and set(df["mode"]) == {"eager"} and set(df.session) == {"s1"}
    assert (df.t_lora_floor_ms > 0).all() and ((df.floor_ratio > 0) & (df.floor_ratio < 1)).all()
    assert df.status.isin(["ok", "unstable"]).all() and (df.n == 10).all()
    ok = df[df.status == "ok"]  # a busy CPU's timings may not settle: those cells are `unstable`, NaN
    assert (ok.ratio.between(ok.lo, ok.hi)).all() and df.interval.str.contains("bootstrap").all()
    assert ((ok.ratio - ok.off_ms / ok.on_ms).abs() < 1e-9).all()  # ratio of the medians
    assert df[df.status == "unstable"].ratio.isna().all()
    hot = df[df["mix"] == "r64_70pct"].set_index("regime").r64_share
    assert hot["prefill"] == 11 / 16 and hot["decode"] == 6 / 8  # round(0.7 R) requests on the rank-64 adapter
    # every timed call: per block the off arm and each setting's arm, reps repetitions each; in decode the mixed
    # settings' `_padded` arms too (the same batch, the rows' ranks unset)
    assert len(reps) == 10 * ((2 + 3) + (2 + 3 + 2)) and set(reps.arm) == {
        "off", "r16", "mixed_even", "mixed_r64_70pct", "mixed_even_padded", "mixed_r64_70pct_padded"}
    padded = reps[reps.arm.str.endswith("_padded")]
    assert set(padded.regime) == {"decode"} and set(padded.ranks) == {"8,16,32,64"}
    meta = json.loads((tmp_path / "lora_tax.meta.json").read_text())
    assert meta["files"][rec.CSV] == S.seal(tmp_path / rec.CSV) and "s1" in meta["sessions"]
    assert meta["sessions"]["s1"]["ceilings"]["copy_gbps"] > 1000 and meta["sessions"]["s1"]["cells_written"] == 6
    # session s2 appends; the reader pools s1 and s2
    assert rec.main(_argv(tmp_path, "--session", "s2", "--regimes", "prefill")) == 0
    s = R.write(tmp_path / rec.CSV)
    assert list(s.columns) == R.COLUMNS and len(s) == 6
    assert S.read_csv(tmp_path / "summary.csv", "lora_tax_summary").shape[0] == 6
    pre = s[s.regime == "prefill"]
    assert pre.sessions.max() <= 2 and s[s.regime == "decode"].sessions.max() <= 1


def test_a_session_is_recorded_once(tmp_path):
    argv = _argv(tmp_path, "--regimes", "decode", "--cells", "*/r16/*")
    assert rec.main(argv) == 0
    with pytest.raises(SystemExit):
        rec.main(argv)
    assert rec.main(argv + ["--overwrite"]) == 0
    df = S.read_csv(tmp_path / rec.CSV, "lora_tax", dtype={"ranks": str})
    assert len(df) == 1 and df.setting.tolist() == ["r16"]


@pytest.mark.parametrize("argv", [["--session", "one"], ["--reps", "5"], ["--shapes", "qwen9"],
                                  ["--cells", "nothing/*"], ["--chunk", "30", "--requests", "16"]])
def test_bad_arguments_are_refused(tmp_path, argv):
    with pytest.raises(SystemExit):
        rec.main(_argv(tmp_path) + argv)
    assert not (tmp_path / rec.CSV).exists()


@pytest.mark.skipif(runtime.has_cuda(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_before_building(tmp_path):
    with pytest.raises(rec.NeedsCuda, match="no CUDA GPU"):
        rec.main(["--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_adapters_per_request():
    r16, even, hot = rec.SETTINGS
    assert rec.request_counts(16, r16) == [4, 4, 4, 4] and rec.request_counts(16, even) == [4, 4, 4, 4]
    assert rec.request_counts(16, hot) == [2, 2, 1, 11] and rec.request_counts(64, hot) == [7, 6, 6, 45]
    assert rec.request_counts(128, hot) == [13, 13, 12, 90]
    a = rec.assign(64, hot)
    assert [a.count(i) for i in range(4)] == [7, 6, 6, 45] and len(set(a[:8])) > 1  # spread, not in blocks
    assert rec.geometry("prefill", 16384, 16) == [1024] * 16 and rec.geometry("decode", 64, 16) == [1] * 64
    ids = {c.id for c in rec.cells(["prefill", "decode"], [rec.QWEN3, rec.TP4], ["eager", "graph"], 16384, [64, 128])}
    assert len(ids) == (2 + 2 * 2) * 3 * 2 and "prefill/qwen3-30b-a3b-tp4/16384/r16/graph" in ids


def test_a_cell_row_is_the_ratio_of_the_kept_medians_with_its_interval():
    """cell_row on timings with a drifting start: the drift is dropped from both arms, the ratio is median(off) /
    median(on) over the kept repetitions, with the paired bootstrap interval; the floor at the setting's own ranks."""
    from lora_moe_lab.instruments.analysers import stats
    from studies.kernels.read_floors import ceilings

    off = [30.0, 20.0] + [10.0 + 0.01 * i for i in range(12)]
    on = [33.0, 22.0] + [11.0 + 0.01 * ((5 * i) % 12) for i in range(12)]
    samples = {"off": off, "mixed_even": on}
    chk = stats.warmup_check(samples)
    cell = rec.Cell("decode", rec.QWEN3, 64, rec.SETTINGS[1], "graph")
    r = rec.cell_row(cell, [1] * 64, samples, chk, ceilings(), 48, {})
    assert chk.dropped == 2 and r["n"] == 12 and r["status"] == "ok" and r["warmup_dropped"] == 2
    assert abs(r["ratio"] - r["off_ms"] / r["on_ms"]) < 1e-12 and r["lo"] <= r["ratio"] <= r["hi"] < 1
    assert r["ranks"] == "8,16,32,64" and r["pool_max_rank"] == 64 and r["r64_share"] == 0.25
    floor = rec.floors.forward_floor_us(rec.QWEN3, [(8, 16), (16, 16), (32, 16), (64, 16)], ceilings(), 48)
    assert abs(r["t_lora_floor_ms"] - floor / 1e3) < 1e-12
    assert abs(r["floor_ratio"] - r["off_ms"] / (r["off_ms"] + floor / 1e3)) < 1e-12


def test_the_pool_swap_frees_the_old_pool_before_the_new_one():
    """One model for both pool maxima: the old pool (its stacks, packed and wide copies) is unreferenced before the
    new one is allocated, or a 48-layer model would hold both."""
    import gc
    import weakref

    a, _ = rec.parse(["--smoke"])
    lab = rec.build("decode", "tiny", a)
    lab.pool.load("x", rank=8)
    old = weakref.ref(lab.pool)
    assert rec.with_pool(lab, 64) is lab
    gc.collect()
    assert old() is None and lab.pool.max_rank == 64 and lab.model.pool is lab.pool and not lab.pool.loaded()
