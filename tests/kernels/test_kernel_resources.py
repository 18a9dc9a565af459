"""studies/kernels/resources.py: the static resources of a build, compiled for sm_90 without a GPU."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return subprocess.run([sys.executable, str(ROOT / "studies/kernels/resources.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_a_build_compiles_for_hopper_and_reports_its_resources():
    # Its own process: the script must import the kernels without the interpreter this test process runs.
    r = run("--preset", "qwen3-30b-a3b-tp4", "--op", "down", "--M", "64", "--tile", "bm16/bn64/bk64/g1/w4/s3/tma",
            "--lora", "layer")
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    assert "lora_down" in line and "registers" in line and "program(s) per SM" in line, r.stdout
    r = run("--preset", "qwen3-30b-a3b-tp4", "--op", "down", "--M", "64", "--tile", "bm16/bn64/bk64/g1/w4/s3/tma/p1")
    assert r.returncode == 0 and "/p1" in r.stdout and "registers" in r.stdout, r.stderr[-2000:]


def test_programs_per_sm_and_the_tile_names():
    # host-side only: importing the script here would set TRITON_INTERPRET=0 in this test process
    from lora_moe_lab.instruments.recorders import tile_arms as ta

    # the LoRA down delta at M = 8192 (ncu: 233 registers, 12 % occupancy = two programs of 4 warps)
    assert ta.programs_per_sm(dict(regs=233, shared=36 * 1024), 4) == 2
    assert ta.programs_per_sm(dict(regs=95, shared=96 * 1024), 8) == 2  # by registers and by shared memory
    assert ta.programs_per_sm(dict(regs=64, shared=200 * 1024), 4) == 1  # by shared memory
    bm, cfg = ta.config_of("bm128/bn256/bk64/g16/w8/s4/tma/p2/flat/cap128")
    assert (bm, cfg.block_n, cfg.w_desc, cfg.persistent, cfg.flatten, cfg.max_regs) == (128, 256, True, 2, True, 128)
    _, masked = ta.config_of("bm128/bn256/bk64/g16/w8/s4/tma/masked")
    assert not masked.w_desc and not masked.even  # the recordings' table_masked arm had no TMA
    bm, sub = ta.config_of("bm128/bn256/bk64/g8/w8/s2/tma/p2/flat/m64")
    assert (bm, sub.sub_m, sub.persistent, sub.flatten) == (128, 64, 2, True)
    assert ta.cfg_str(bm, sub) == "bm128/bn256/bk64/g8/w8/s2/tma/p2/flat/m64"
    assert ta.table_tile(sub)["sub_m"] == 64 and "sub_m" not in ta.table_tile(cfg)
