"""KILL faults: the sweep and prefill CLIs killed (SIGKILL, by their own pid) after their first row, then
resumed: the file reads with pandas, holds no key twice, and the resume completes or refuses by name. And
scripts/record.py refuses a GPU section on a machine without the GPU before it builds or writes anything."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers import ROOT, load_script
from lora_moe_lab.instruments.recorders import bench
from lora_moe_lab.instruments.recorders import prefill as P

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), CUDA_VISIBLE_DEVICES="")
# the killed run: a long grid (60 rows; tokens is the outer loop), the resume: its first tokens only (4 rows), so
# that the kill always lands mid-run and the resume stays short however loaded the machine is
LONG = ["--tokens", "8", "16", "24", "32", "40", "48", "56", "64", "72", "80", "88", "96", "104", "112", "120"]
SWEEP = ["sweep", "--preset", "tiny", "--guards", "sync", "cpu_flag", "--active", "0", "0.5",
         "--device", "cpu", "--backend", "torch", "--warmup", "0", "--requests", "4", "--no-progress"]
PREFILL = ["--preset", "tiny", "--layers", "1", "--requests", "2", "--input-len", "4", "--chunk", "4",
           "--guards", "sync", "cpu_flag", "--adapters", "none", "--device", "cpu", "--backend", "torch",
           "--warmup-reps", "0", "--no-progress", "--no-profile"]


def start_and_kill(module: str, argv: list[str], out: Path, rows: int = 1, timeout: float = 60.0) -> int:
    """Start `python -m module argv`, wait until `out` has `rows` data rows, SIGKILL it by its pid. Returns the
    rows there at the kill; the process must still have been running (else the fault was not injected)."""
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], env=ENV, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            if out.exists() and out.read_bytes().count(b"\n") >= rows + 1:
                break
            if proc.poll() is not None:
                err = proc.stderr.read().decode()[-2000:]
                pytest.fail(f"{module} ended (rc {proc.returncode}) before its row: {err}")
            time.sleep(0.01)
        assert proc.poll() is None, "finished before the kill: no fault injected"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return out.read_bytes().count(b"\n") - 1


def test_kill_sweep_then_resume_completes(tmp_path, capsys):
    out = tmp_path / "s.csv"
    args = [*SWEEP, "--reps", "20", "--out", str(out)]
    done = start_and_kill("lora_moe_lab.instruments.recorders.bench", [*args, *LONG], out)
    assert 1 <= done < 60 and len(pd.read_csv(out)) == done  # the kill left whole rows only
    assert bench.main([*args, "--tokens", "8", "--resume"]) == 0
    df = pd.read_csv(out)
    assert len(df) == max(done, 4) and not df.duplicated(bench.KEY_COLUMNS).any() and (df["median_us"] > 0).all()
    assert len(df[df["tokens"] == 8]) == 4


def test_kill_sweep_cut_tail_then_resume_drops_the_cut_row(tmp_path, capsys):
    out = tmp_path / "s.csv"
    args = [*SWEEP, "--reps", "20", "--out", str(out)]
    done = start_and_kill("lora_moe_lab.instruments.recorders.bench", [*args, *LONG], out, rows=2)
    out.write_bytes(out.read_bytes()[:-25])  # and the disk lost the end of the last write
    with pytest.raises(SystemExit):
        bench.main(["lost", str(out)])  # refused, never a ratio from a cut number
    assert f"row {done} is cut" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a quicker resume would mix settings: refused by name
        bench.main([*args, "--tokens", "8", "--resume", "--reps", "2"])
    err = capsys.readouterr().err
    assert f"row {done} was cut" in err and "reps=20, this run has reps=2" in err
    assert bench.main([*args, "--tokens", "8", "--resume"]) == 0
    df = pd.read_csv(out)
    assert len(df) == (4 if done <= 4 else done - 1) and not df.duplicated(bench.KEY_COLUMNS).any()
    assert len(df[df["tokens"] == 8]) == 4
    assert bench.main(["lost", str(out)]) == 0  # whole again, and sealed


def test_kill_prefill_then_resume_completes(tmp_path, capsys):
    out = tmp_path / "p.csv"
    args = [*PREFILL, "--reps", "300", "--out", str(out)]
    start_and_kill("lora_moe_lab.instruments.recorders.prefill", args, out, rows=3)  # repetition 1 half done
    args[args.index("300")] = "4"  # repetitions are the key's `rep`, not a setting: a shorter resume is allowed
    assert P.main([*args, "--resume"]) == 0
    df = pd.read_csv(out)
    assert len(df) == 2 * 4 and not df.duplicated(P.KEY_COLUMNS + ["rep"]).any()
    s = pd.read_csv(out.with_suffix(".summary.csv"))
    assert len(s) == 2 and ((s["reps"] + s["warmup_dropped"]) == 4).all()  # every guard has every repetition


def test_kill_prefill_then_resume_with_another_seed_refuses(tmp_path, capsys):
    out = tmp_path / "p.csv"
    args = [*PREFILL, "--reps", "300", "--out", str(out)]
    done = start_and_kill("lora_moe_lab.instruments.recorders.prefill", args, out)
    before = out.read_bytes()
    with pytest.raises(SystemExit) as e:
        P.main([*args, "--resume", "--seed", "7"])
    assert e.value.code == 2 and f"{out}: row 1: its rows were made with seed=0" in capsys.readouterr().err
    assert out.read_bytes() == before and len(pd.read_csv(out)) == done


# ---------------------------------------------------------------------------------------------
# scripts/record.py: the device first
@pytest.mark.parametrize("section,args,gpus,refused", [
    ("guards", [], (0, []), True), ("production_tp", [], (1, ["NVIDIA H200"]), True),
    ("guards", [], (1, ["NVIDIA H200"]), False), ("guards", ["--dry"], (0, []), False),
    ("replay", [], (0, []), False), ("kernels", ["--help"], (0, []), False),
])
def test_record_checks_the_device_first(section, args, gpus, refused):
    rec = load_script("record")
    why = rec.check_device(section, args, probe=lambda: gpus)
    assert (why is not None) == refused
    if refused:
        assert section in why and "CUDA GPU" in why and RECORDINGS_KIND(rec, section) in why


def RECORDINGS_KIND(rec, section):
    return rec.RECORDINGS[section][1]


def test_record_guards_on_cpu_exits_2_and_writes_nothing(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "record.py"), "guards", "--out", str(tmp_path)],
                       env=dict(ENV, OUT=str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "guards: needs 1 CUDA GPU" in r.stderr and os.listdir(tmp_path) == []
