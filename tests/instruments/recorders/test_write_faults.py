"""Writes that cannot half-happen, resumes that never corrupt, arguments refused before any work (in-process).

Every case asserts a named error (the message names the file, row, column or parameter) or correct handling
(the file reads with pandas, no key twice, the right values). The KILL faults (a real SIGKILL of a CLI in a
subprocess) are in tests/test_record_cli_faults.py."""
import json
import os

import pandas as pd
import pytest
from helpers import assert_cli_refused

from lora_moe_lab.instruments.recorders import bench, tables
from lora_moe_lab.instruments.recorders import prefill as P
from lora_moe_lab.instruments.recorders.bench import COLUMNS, KEY_COLUMNS, SweepSpec, run_sweep

TINY = dict(presets=["tiny"], tokens=[8], guards=["sync", "cpu_flag"], active=[0.0, 0.5], warmup=0, reps=2,
            device="cpu", requests=4, backend="torch")
PREFILL = ["--preset", "tiny", "--layers", "1", "--requests", "2", "--input-len", "4", "--chunk", "4",
           "--guards", "sync", "cpu_flag", "--adapters", "none", "--reps", "2", "--device", "cpu", "--backend", "torch",
           "--warmup-reps", "0", "--no-progress", "--no-profile"]


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory):
    """One finished tiny sweep (4 rows), copied by the tests that damage it."""
    out = tmp_path_factory.mktemp("sweep") / "s.csv"
    run_sweep(SweepSpec(**TINY), out, progress=False)
    return out


def copy_sweep(src, dst_dir, name="s.csv"):
    dst = dst_dir / name
    dst.write_bytes(src.read_bytes())
    (dst_dir / (name.split(".")[0] + ".meta.json")).write_bytes(tables.sibling_meta(src).read_bytes())
    return dst


def cut_inside_median(path):
    """Cut the last row inside its median_us (63258.03 -> 632): what a write cut short leaves."""
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    last = data[last_start:].decode()
    fields = last.split(",")
    i = COLUMNS.index("median_us")
    cut_at = len(",".join(fields[:i])) + 1 + 3
    path.write_bytes(data[:last_start] + last[:cut_at].encode())
    return fields[i]


def sealed_before_the_cut(path):
    """The seal as the appender leaves it when a write is cut: of the rows before the cut one."""
    data = path.read_bytes()
    path.write_bytes(data[:data.rfind(b"\n") + 1])
    tables.seal(path, tables.sibling_meta(path))
    path.write_bytes(data)


# ---------------------------------------------------------------------------------------------
# tables: the appender and the checks
def test_append_creates_file_at_first_row_only(tmp_path):
    p = tmp_path / "t.csv"
    assert tables.append_rows(p, [], ["a", "b"]) == 0 and not p.exists()  # no rows: no (empty) file
    tables.append_rows(p, [dict(a=1, b=2)], ["a", "b"])
    tables.append_rows(p, pd.DataFrame([dict(a=3, b="x,\ny")]), ["a", "b"])
    df = pd.read_csv(p)
    assert df["a"].tolist() == [1, 3] and df["b"].tolist()[1] == "x,\ny"
    seal = json.loads((tmp_path / "t.meta.json").read_text())["files"]["t.csv"]
    assert seal["rows"] == 2 and len(seal["sha256"]) == 64


@pytest.mark.parametrize("tail,row", [("3,", 2), ("3", 2), ("3,4,5\n", 2)])
def test_append_refuses_a_cut_or_bad_tail(tmp_path, tail, row):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n" + tail)
    before = p.read_bytes()
    with pytest.raises(tables.CutRowError, match=f"{p}: row {row}"):
        tables.append_rows(p, [dict(a=5, b=6)], ["a", "b"])
    assert p.read_bytes() == before  # nothing written onto the unterminated line


def test_append_refuses_another_header_naming_both_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(tables.HeaderMismatchError, match=r"column 2: the file has 'b', this recorder writes 'x'"):
        tables.append_rows(p, [dict(a=1, x=2, c=3)], ["a", "x", "c"])


def test_resumable_drops_a_cut_row_atomically(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n3,4\n5,6")
    df = tables.check_resumable(p, ["a", "b"], {})
    assert len(df) == 2 and p.read_text() == "a,b\n1,2\n3,4\n"
    assert f"{p}: row 3 was cut" in capsys.readouterr().err
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # the temp file is gone
    with pytest.raises(tables.CutRowError, match="row 3 is cut"):
        p.write_text("a,b\n1,2\n3,4\n5,6")
        tables.check_resumable(p, ["a", "b"], {}, drop_cut=False)


def test_a_damaged_middle_row_is_refused(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n3\n5,6\n")
    with pytest.raises(tables.DamagedRowError, match=f"{p}: row 2: 1 fields, the header has 2"):
        tables.check_resumable(p, ["a", "b"], {})


@pytest.mark.parametrize("col,want", [("seed", 1), ("dtype", "float16")])
def test_resumable_refuses_other_settings(tmp_path, col, want):
    p = tmp_path / "t.csv"
    p.write_text("a,seed,dtype\n1,0,float32\n")
    with pytest.raises(tables.SettingsMismatchError, match=f"row 1: .*{col}=.*this run has {col}={want}"):
        tables.check_resumable(p, ["a", "seed", "dtype"], {"seed": 0, "dtype": "float32", col: want})
    assert len(tables.check_resumable(p, ["a", "seed", "dtype"], {"seed": "0.0", "dtype": "float32"})) == 1


def test_resumable_refuses_duplicate_keys(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("k,v\n1,a\n2,b\n1.0,c\n")
    with pytest.raises(tables.DuplicateKeyError, match="row 3 repeats the key"):
        tables.check_resumable(p, ["k", "v"], {}, key=["k"])


def test_atomic_write_replaces_whole(tmp_path):
    p = tmp_path / "m.json"
    tables.write_json_atomic(p, {"a": 1})
    tables.write_json_atomic(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2} and os.listdir(tmp_path) == ["m.json"]


def test_harness_leaves_no_empty_csv(tmp_path):
    from lora_moe_lab.instruments.recorders.harness import Recorder

    r = Recorder("x", tmp_path, rows=[])
    r.section("boom", lambda: 1 / 0)  # fails before its first row
    assert not (tmp_path / "x.csv").exists() and "ZeroDivisionError" in (tmp_path / "x.meta.json").read_text()


# ---------------------------------------------------------------------------------------------
# bench sweep: resume
def test_sweep_resume_drops_a_cut_row_and_measures_it_again(sweep_csv, tmp_path, capsys):
    out = copy_sweep(sweep_csv, tmp_path)
    cut_inside_median(out)
    sealed_before_the_cut(out)
    with pytest.raises(tables.CutRowError, match=f"{out}: row 4 is cut"):
        tables.check_tail(out)
    df = run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)
    assert "row 4 was cut" in capsys.readouterr().err
    assert len(df) == 4 and not df.duplicated(KEY_COLUMNS).any() and (df["median_us"] > 0).all()
    assert pd.read_csv(out).shape == (4, len(COLUMNS))
    assert json.loads(tables.sibling_meta(out).read_text())["files"]["s.csv"]["rows"] == 4


def test_a_refused_resume_leaves_a_sealed_cut_row_for_the_next_one(sweep_csv, tmp_path, capsys):
    """The seal covers the row the disk cut (sealed after its write): a resume with other settings is refused and
    leaves the file as it was, so the resume that follows still finds it agreeing with its seal."""
    out = copy_sweep(sweep_csv, tmp_path)
    cut_inside_median(out)
    cut = out.read_bytes()
    with pytest.raises(tables.SettingsMismatchError, match="reps="):
        run_sweep(SweepSpec(**dict(TINY, reps=3)), out, resume=True, progress=False)
    assert out.read_bytes() == cut and "row 4 was cut" in capsys.readouterr().err
    df = run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)
    assert len(df) == 4 and not df.duplicated(KEY_COLUMNS).any() and (df["median_us"] > 0).all()
    assert json.loads(tables.sibling_meta(out).read_text())["files"]["s.csv"]["rows"] == 4


@pytest.mark.parametrize("change,name", [(dict(seed=1), "seed"), (dict(reps=3), "reps"), (dict(warmup=1), "warmup")])
def test_sweep_resume_refuses_other_settings(sweep_csv, tmp_path, change, name):
    out = copy_sweep(sweep_csv, tmp_path)
    before = out.read_bytes()
    with pytest.raises(tables.SettingsMismatchError, match=f"{out}: row 1: .*{name}=.*--overwrite"):
        run_sweep(SweepSpec(**dict(TINY, **change)), out, resume=True, progress=False)
    assert out.read_bytes() == before
    df = run_sweep(SweepSpec(**dict(TINY, **change)), out, overwrite=True, progress=False)  # --overwrite: afresh
    assert len(df) == 4 and (df[name] == change[name]).all()


def test_sweep_seed_and_device_are_columns(sweep_csv):
    df = pd.read_csv(sweep_csv)
    assert {"seed", "device", "warmup", "reps", "dtype", "backend"} <= set(df.columns)
    assert (df["seed"] == 0).all() and (df["device"] == "cpu").all()


def test_sweep_that_fails_before_its_first_row_leaves_no_csv(tmp_path):
    out = tmp_path / "s.csv"

    def dies(**kw):
        raise SystemExit("killed while building")

    with pytest.raises(SystemExit):
        run_sweep(SweepSpec(**TINY), out, progress=False, build=dies)
    assert not out.exists()
    assert len(run_sweep(SweepSpec(**TINY), out, progress=False)) == 4  # the rerun is not blocked


# ---------------------------------------------------------------------------------------------
# bench lost: a cut or damaged sweep is refused, never read as a number
def test_lost_refuses_a_cut_median(sweep_csv, tmp_path, capsys):
    out = copy_sweep(sweep_csv, tmp_path)
    cut_inside_median(out)
    with pytest.raises(SystemExit) as e:
        bench.main(["lost", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{out}: row 4 is cut" in err and "ratio" not in err


def test_lost_refuses_a_damaged_value(sweep_csv, tmp_path, capsys):
    out = copy_sweep(sweep_csv, tmp_path)
    df = pd.read_csv(out)
    df.loc[1, "median_us"] = -5.0
    tables.write_csv_atomic(out, df)
    tables.seal(out, tables.sibling_meta(out))
    with pytest.raises(SystemExit) as e:
        bench.main(["lost", str(out)])
    assert e.value.code == 2 and f"{out}: row 2: column 'median_us'" in capsys.readouterr().err


def test_lost_reads_a_whole_sweep(sweep_csv, capsys):
    assert bench.main(["lost", str(sweep_csv)]) == 0 and "ratio" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# arguments: a named argparse error before any work
@pytest.mark.parametrize("args,msg", [
    (["--device", "foo"], "argument --device: expected cpu, cuda, cuda:N or auto, got 'foo'"),
    (["--device", "cuda:x"], "argument --device: expected cpu, cuda, cuda:N or auto"),
    (["--device", "cuda:99"], "argument --device: 'cuda:99'"),
    (["--max-minutes", "inf"], "argument --max-minutes: expected a finite positive number, got 'inf'"),
    (["--max-minutes", "-1"], "argument --max-minutes: expected a finite positive number"),
    (["--seed", "-1"], "argument --seed: expected a seed"),
    (["--active", "True"], "argument --active: expected a fraction in [0, 1], got 'True'"),
    (["--active", "nan"], "argument --active: expected a fraction in [0, 1], got 'nan'"),
    (["--warmup", "1.5"], "argument --warmup: expected an integer >= 0"),
    (["--requests", "True"], "argument --requests: expected a positive integer"),
])
def test_sweep_cli_refuses_bad_values(tmp_path, capsys, args, msg):
    out = tmp_path / "x.csv"
    assert_cli_refused(bench.main, ["sweep", "--out", str(out), *args], msg, capsys, absent=[out])


@pytest.mark.parametrize("args,msg", [
    (["--guard-sites", "inf"], "argument --guard-sites: expected guard decisions per layer"),
    (["--guard-sites", "0.5"], "argument --guard-sites: expected guard decisions per layer"),
    (["--guard-sites", "nan"], "argument --guard-sites"),
    (["--device", "foo"], "argument --device: expected cpu, cuda, cuda:N or auto, got 'foo'"),
    (["--warmup-reps", "-1"], "argument --warmup-reps: expected an integer >= 0"),
    (["--chunk", "0"], "argument --chunk: expected a positive integer"),
    (["--host-us-per-layer", "inf"], "argument --host-us-per-layer: expected a finite number >= 0"),
    (["--overlap-ms", "-1"], "argument --overlap-ms: expected a finite number >= 0"),
    (["--max-minutes", "0"], "argument --max-minutes: expected a finite positive number"),
    (["--reps", "True"], "argument --reps: expected a positive integer"),
    (["--dtype", "int8"], "argument --dtype: unknown dtype 'int8'"),
])
def test_prefill_cli_refuses_bad_values(tmp_path, capsys, args, msg):
    out = tmp_path / "p.csv"
    assert_cli_refused(P.main, [*PREFILL, "--out", str(out), *args], msg, capsys, absent=[out])


# ---------------------------------------------------------------------------------------------
# prefill: foreign files, second runs, unfinished repetitions
def test_prefill_refuses_a_sweep_csv(sweep_csv, tmp_path, capsys):
    out = copy_sweep(sweep_csv, tmp_path)
    meta = tables.sibling_meta(out)
    before, meta_before = out.read_bytes(), meta.read_bytes()
    for extra in ([], ["--resume"], ["--overwrite"]):
        with pytest.raises(SystemExit) as e:
            P.main([*PREFILL, "--out", str(out), *extra])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{out}: header differs" in err and "the file has 'gpu'" in err
        assert "this recorder writes 'preset'" in err
    assert out.read_bytes() == before and meta.read_bytes() == meta_before  # neither rows nor metadata touched


def test_prefill_second_run_is_refused_and_resume_skips(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert P.main([*PREFILL, "--out", str(out)]) == 0
    before = out.read_bytes()
    with pytest.raises(SystemExit) as e:
        P.main([*PREFILL, "--out", str(out)])
    assert e.value.code == 2 and f"{out} exists: pass --resume" in capsys.readouterr().err
    assert P.main([*PREFILL, "--out", str(out), "--resume"]) == 0  # everything there: nothing measured
    assert out.read_bytes() == before
    df = pd.read_csv(out)
    assert len(df) == 4 and not df.duplicated(P.KEY_COLUMNS + ["rep"]).any()
    with pytest.raises(SystemExit) as e:
        P.main([*PREFILL, "--out", str(out), "--resume", "--seed", "3"])
    assert e.value.code == 2 and "seed=0, this run has seed=3" in capsys.readouterr().err


def test_prefill_resume_finishes_an_unfinished_repetition(tmp_path, capsys):
    out = tmp_path / "p.csv"
    argv = [*PREFILL, "--out", str(out)]
    argv[argv.index("--reps") + 1] = "3"
    assert P.main(argv) == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][:7])  # rep 2 half done, its last row cut
    sealed_before_the_cut(out)
    assert P.main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "was cut" in err and "repetitions left unfinished" in err
    df = pd.read_csv(out)
    assert len(df) == 6 and not df.duplicated(P.KEY_COLUMNS + ["rep"]).any()
    assert sorted(df["rep"].unique()) == [0, 1, 2]
    s = pd.read_csv(out.with_suffix(".summary.csv"))
    assert (s["reps"] == 3).all() and len(s) == 2  # every guard has every repetition: the pairs broadcast


def test_prefill_resume_refuses_other_guards(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert P.main([*PREFILL, "--out", str(out)]) == 0
    argv = [*PREFILL, "--out", str(out), "--resume"]
    argv[argv.index("cpu_flag")] = "launch_always"
    with pytest.raises(SystemExit) as e:
        P.main(argv)
    assert e.value.code == 2 and f"{out}: row" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# writers that cannot collide: one writer per output, a resume that verifies, failed rows that are not exit 0
def _hold_lock(path):
    """Another process holding the output's lock (it prints its pid once it holds it)."""
    import subprocess
    import sys

    # the lock's protocol (tables.lock_output), without importing the package: flock on <out>.lock, the pid in it
    code = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1] + '.lock', os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, f'{os.getpid()}\\n'.encode())\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    h = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert h.stdout.readline().strip() == "held"
    return h


@pytest.mark.parametrize("writer", ["sweep", "prefill", "claim"])
def test_a_second_writer_on_one_output_is_refused_naming_the_holder(writer, tmp_path, capsys):
    out = tmp_path / "o.csv"
    h = _hold_lock(out)
    try:
        if writer == "sweep":
            with pytest.raises(tables.OutputLockedError, match=rf"{out}: another writer \(pid {h.pid}\)"):
                run_sweep(SweepSpec(**TINY), out, progress=False)
        elif writer == "prefill":
            with pytest.raises(SystemExit):
                P.main([*PREFILL, "--out", str(out)])
            assert f"another writer (pid {h.pid})" in capsys.readouterr().err
        else:
            with pytest.raises(tables.OutputLockedError, match=f"pid {h.pid}"):
                tables.claim(out)
        assert not out.exists()
    finally:
        h.kill()
        h.wait()
    with tables.holding(out):  # the holder gone: the lock is free again (and released after the block)
        pass
    assert str(out.with_name("o.csv.lock").resolve()) not in tables._HELD


def test_resume_onto_an_edited_table_is_refused_not_resealed(sweep_csv, tmp_path):
    from lora_moe_lab.instruments.analysers.schemas import RecordingError

    out = copy_sweep(sweep_csv, tmp_path)
    df = pd.read_csv(out)
    df.loc[1, "median_us"] = df.loc[1, "median_us"] * 0.5  # one value edited by hand, the rows kept
    df.to_csv(out, index=False)
    before = out.read_bytes()
    with pytest.raises(RecordingError, match=rf"{out}: meta: content hash differs"):
        run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)
    assert out.read_bytes() == before


def test_resume_keeps_a_whole_row_written_after_the_last_seal(sweep_csv, tmp_path, capsys):
    out = copy_sweep(sweep_csv, tmp_path)
    data = out.read_bytes()
    out.write_bytes(data[:data.rstrip(b"\n").rfind(b"\n") + 1])  # the seal of 3 rows, then the 4th row written
    tables.seal(out, tables.sibling_meta(out))
    out.write_bytes(data)
    df = run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)
    assert "row 4 was written after the last seal" in capsys.readouterr().err and len(df) == 4


def test_a_sweep_with_failed_rows_exits_non_zero_and_says_how_many(tmp_path, capsys, monkeypatch):
    def oom(lab, p, **kw):
        if p["guard"] == "sync":
            raise RuntimeError("CUDA out of memory (made up)")
        return real(lab, p, **kw)

    def real(lab, p, **kw):  # a measured row, without building a model
        return dict(warmup=0, reps=2, median_us=1.0, p10_us=1.0, p90_us=1.0, mean_us=1.0, wall_median_us=1.0,
                    timer="wall", syncs_per_forward=0, error="")

    monkeypatch.setattr(bench, "measure", oom)
    lab = type("Lab", (), {"shape": type("Shape", (), {"num_layers": 2})()})()  # what the sweep reads of a lab
    monkeypatch.setattr(bench.LabCache, "get", lambda self, **kw: lab)
    out = tmp_path / "s.csv"
    spec = ["--preset", "tiny", "--tokens", "8", "--guards", "sync", "cpu_flag", "--active", "0.5", "--warmup", "0",
            "--reps", "2", "--device", "cpu", "--requests", "4", "--backend", "torch", "--no-progress"]
    assert bench.main(["sweep", "--out", str(out), *spec]) == 1
    err = capsys.readouterr().err
    assert f"1 of 2 rows failed (their errors are in {out}'s error column" in err and "out of memory" in err
