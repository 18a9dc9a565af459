"""Benchmark sweeps: tiny sweeps on CPU, CSV schema, resume, bad arguments."""
import csv
import json

import pandas as pd
import pytest
from helpers import assert_cli_refused

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import bench
from lora_moe_lab.model.lab import split_tokens
from lora_moe_lab.instruments.recorders.bench import COLUMNS, KEY_COLUMNS, SweepSpec, run_sweep

TINY = dict(presets=["tiny"], tokens=[8, 16], guards=["sync", "cpu_flag", "launch_always"], active=[0.0, 0.5],
            warmup=0, reps=2, device="cpu", requests=4)


def test_tiny_sweep_writes_tidy_rows(tmp_path):
    out = tmp_path / "s.csv"
    df = run_sweep(SweepSpec(**TINY), out, progress=False)
    with out.open() as f:
        assert next(csv.reader(f)) == COLUMNS
    assert len(df) == 2 * 3 * 2 and list(df.columns) == COLUMNS
    assert df["error"].isna().all()
    timer, gpu = ("wall", "cpu")  # TINY runs on the CPU, also on a GPU machine: wall clock, CPU rows
    assert (df["layers"] == 2).all() and (df["timer"] == timer).all() and (df["gpu"] == gpu).all()
    assert (df["reps"] == 2).all() and (df["median_us"] > 0).all()
    assert ((df["p10_us"] <= df["median_us"]) & (df["median_us"] <= df["p90_us"])).all()
    # the sync guard syncs once per layer; the others never
    assert (df.loc[df.guard == "sync", "syncs_per_forward"] == 2).all()
    assert (df.loc[df.guard != "sync", "syncs_per_forward"] == 0).all()
    assert not df.duplicated(KEY_COLUMNS).any()
    meta = json.loads((tmp_path / "s.meta.json").read_text())
    assert meta["columns"] == COLUMNS and meta["sessions"][0]["rows_planned"] == 12
    loaded = bench.load_sweep(out)
    assert len(loaded) == 12 and loaded.attrs["meta"]["key"] == KEY_COLUMNS


def test_resume_after_interruption_keeps_rows_and_finishes(tmp_path):
    out = tmp_path / "s.csv"
    k = 5

    def boom(row, i):
        if i + 1 == k:
            raise KeyboardInterrupt("simulated interruption")

    with pytest.raises(KeyboardInterrupt):
        run_sweep(SweepSpec(**TINY), out, progress=False, on_row=boom)
    first = pd.read_csv(out)
    assert len(first) == k  # every finished row was flushed before the interruption
    with pytest.raises(FileExistsError):
        run_sweep(SweepSpec(**TINY), out, progress=False)
    seen = []
    df = run_sweep(SweepSpec(**TINY), out, resume=True, progress=False, on_row=lambda r, i: seen.append(r))
    assert len(seen) == 12 - k and len(df) == 12
    assert not df.duplicated(KEY_COLUMNS).any()
    pd.testing.assert_frame_equal(df.iloc[:k].reset_index(drop=True), first)  # old rows untouched
    assert len(json.loads((tmp_path / "s.meta.json").read_text())["sessions"]) == 2
    # nothing left to do
    assert len(run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)) == 12


def test_failed_rows_are_recorded_and_measured_again_on_resume(tmp_path):
    out = tmp_path / "s.csv"

    def broken_build(**kw):
        raise RuntimeError("no weights today\nsecond line")

    spec = SweepSpec(**dict(TINY, tokens=[8], active=[0.0]))
    df = run_sweep(spec, out, progress=False, build=broken_build)
    assert (df["error"] == "RuntimeError: no weights today").all() and df["median_us"].isna().all()
    df = run_sweep(spec, out, resume=True, progress=False)
    # the error rows are replaced (one row per key; the schema's key is unique), their messages kept in the meta
    assert len(df) == 3 and df["error"].isna().all()
    assert len(bench.clean(df)) == 3
    replaced = json.loads((tmp_path / "s.meta.json").read_text())["sessions"][-1]["replaced_errors"]
    assert len(replaced) == 3 and replaced[0]["error"] == "RuntimeError: no weights today"


def test_resume_refuses_another_schema(tmp_path):
    out = tmp_path / "s.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="schema"):
        run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)


def test_resume_key_normalises_csv_strings():
    row = dict(preset="tiny", layers="2", tokens="16.0", guard="sync", active="0.50", rank=16, mode="eager",
               dtype="float32", backend="torch", requests=4, skew="0.0")
    assert bench.row_key(row) == bench.row_key(dict(row, layers=2, tokens=16, active=0.5, rank="16", skew=0))


def test_grid_uses_itertools_product_order_and_preset_layers():
    g = SweepSpec(**dict(TINY, presets=["tiny", "qwen3-30b-a3b"], tokens=[2, 16])).resolved().grid()
    assert len(g) == 2 * 2 * 3 * 2
    assert g[0]["preset"] == "tiny" and g[0]["layers"] == 2 and g[-1]["layers"] == 48
    assert g[0]["requests"] == 2 and g[-1]["requests"] == 4  # never more requests than tokens
    assert split_tokens(10, 4) == [3, 3, 2, 2]


@pytest.mark.parametrize("field,value,match", [
    ("presets", ["nope"], "unknown preset"), ("guards", ["maybe"], "unknown guard"),
    ("tokens", [0], "positive"), ("tokens", [-3], "positive"), ("active", [1.5], r"\[0, 1\]"),
    ("ranks", [0], "positive"), ("modes", ["lazy"], "unknown mode"), ("tokens", [], "empty"),
])
def test_spec_rejects_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        SweepSpec(**dict(TINY, **{field: value})).resolved()


@pytest.mark.skipif(runtime.has_cuda(), reason="checks the CPU-only message")
def test_graph_mode_needs_a_gpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        SweepSpec(**dict(TINY, modes=["graph"])).resolved()


def test_time_lost_per_sync_pairs_rows():
    base = dict(gpu="cpu", preset="tiny", layers=2, rank=16, mode="eager", dtype="float32", backend="torch",
                requests=4, error=None)
    rows = [dict(base, tokens=16, active=0.0, guard="sync", median_us=500.0, syncs_per_forward=2),
            dict(base, tokens=16, active=0.0, guard="cpu_flag", median_us=400.0, syncs_per_forward=0),
            dict(base, tokens=16, active=0.0, guard="launch_always", median_us=450.0, syncs_per_forward=0),
            dict(base, tokens=32, active=0.0, guard="sync", median_us=900.0, syncs_per_forward=2),
            dict(base, tokens=32, active=0.0, guard="cpu_flag", median_us=None, syncs_per_forward=0,
                 error="OOM")]
    t = bench.time_lost_per_sync(pd.DataFrame(rows))
    assert len(t) == 1
    r = t.iloc[0]
    assert (r.t_sync_us, r.t_cpu_flag_us, r.lost_us, r.us_per_sync) == (500.0, 400.0, 100.0, 50.0)
    assert r.ratio == pytest.approx(1.25)
    s = bench.summary_table(pd.DataFrame(rows))
    assert s.loc[(s.guard == "sync") & (s.tokens == 16), "us_per_sync"].item() == 50.0
    assert s.loc[s.guard == "cpu_flag", "ratio"].isna().all()


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    assert "examples:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        bench.main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--resume" in out and "(default: 10)" in out and "examples:" in out
    for sub in ("lost", "meta"):
        with pytest.raises(SystemExit):
            bench.main([sub, "--help"])
        assert "examples:" in capsys.readouterr().out


@pytest.mark.parametrize("args,msg", [
    (["--preset", "qwen4"], "unknown preset 'qwen4'"),
    (["--guards", "sometimes"], "invalid choice: 'sometimes'"),
    (["--tokens", "0"], "expected a positive integer, got '0'"),
    (["--tokens", "16", "-4"], "expected a positive integer"),
    (["--tokens", "abc"], "expected a positive integer"),
    (["--active", "2"], "fraction in [0, 1]"),
    (["--mode", "turbo"], "invalid choice: 'turbo'"),
    (["--reps", "0"], "expected a positive integer"),
    (["--dtype", "int8"], "unknown dtype"),
])
def test_cli_rejects_bad_args(tmp_path, capsys, args, msg):
    out = tmp_path / "x.csv"
    assert_cli_refused(bench.main, ["sweep", "--out", str(out), *args], msg, capsys, absent=[out])


def test_cli_sweep_resume_and_lost(tmp_path, capsys):
    out = str(tmp_path / "c.csv")
    args = ["sweep", "--preset", "tiny", "--tokens", "8", "--guards", "sync", "cpu_flag", "--active", "0",
            "--reps", "1", "--warmup", "0", "--device", "cpu", "--no-progress", "--out", out]
    assert bench.main(args) == 0
    table = capsys.readouterr().out
    assert "median_ms" in table and "us_per_sync" in table
    assert "Measured on a CPU" in table and "not a GPU bubble" in table  # what a CPU figure means
    with pytest.raises(SystemExit) as e:  # exists, no --resume
        bench.main(args)
    assert e.value.code == 2 and "--resume" in capsys.readouterr().err
    assert bench.main(args + ["--resume"]) == 0
    assert len(pd.read_csv(out)) == 2
    assert bench.main(["lost", out]) == 0 and "us_per_sync" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.has_cuda(), reason="needs a CUDA GPU")
def test_gpu_event_timing_and_graph_sweep(tmp_path):
    from lora_moe_lab.instruments.recorders.timing import time_device
    from lora_moe_lab.model.lab import build_lab

    lab = build_lab("tiny", dtype="bfloat16")
    x = lab.random_input(64)
    b, t = lab.make_batch([None, None], [32, 32])
    tm = time_device(lambda: lab.model(x, b, t, guard="cpu_flag"), warmup=2, reps=5)
    assert tm.timer == "cuda_events" and tm.median_us > 0
    df = run_sweep(SweepSpec(**dict(TINY, device="cuda", modes=["eager", "graph"], dtype="bfloat16")),
                   tmp_path / "g.csv", progress=False)
    assert df["error"].isna().all()
    assert (df.loc[df["mode"] == "graph", "syncs_per_forward"] == 0).all()


def test_lost_works_on_every_csv_in_data_or_says_why_not(capsys):
    from pathlib import Path

    from lora_moe_lab.provenance import DATA

    for p in sorted(Path(DATA).rglob("*.csv")):
        try:
            assert bench.main(["lost", str(p)]) == 0
        except SystemExit as e:  # argparse's error: exit status 2 and a message naming the problem
            assert e.code == 2 and "is not a timing table" in capsys.readouterr().err, p
