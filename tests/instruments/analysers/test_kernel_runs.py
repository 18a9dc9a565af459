"""The kernel-run loader (studies/kernels/record_expand.py recordings): sections, LoRA's share against its byte
floor computed from the run's own rows, named errors (the study's figures of it: studies/kernels/test_findings.py)."""

import pytest
import torch
from helpers import write_kernel_run, load_script

from lora_moe_lab.instruments.analysers.recordings import load_kernel_run
from lora_moe_lab.instruments.recorders import harness


def test_share_floor_from_the_table_rows(tmp_path):
    run = write_kernel_run(tmp_path)
    assert "abc1234" in run.label
    sf = run.share_floor()
    assert len(sf) == 1
    r = sf.iloc[0]
    assert r.lora_bytes == pytest.approx(3e8)  # the table's gate_up and down rows, not the other tile
    assert r.floor_us == pytest.approx(75.0)  # 3e8 bytes at 4000 GB/s
    assert r.floor_share == pytest.approx(75.0 / 400.0)


def test_named_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="studies/kernels/record_expand.py"):
        load_kernel_run("nope", tmp_path)
    with pytest.raises(ValueError, match="no section 'floor'"):
        write_kernel_run(tmp_path).section("floor")


def test_the_committed_final_run_loads():
    sf = load_kernel_run().share_floor()
    assert {"qwen3-30b-a3b", "qwen3-30b-a3b-tp4"} <= set(sf["preset"])
    assert (sf["floor_share"] < sf["lora_share"]).all()  # no measurement below its byte floor


@pytest.mark.slow  # the study's tried expand builds: `make test-all` (the library's builds are tested in make test)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's check; on a GPU the recording runs 1000")
def test_random_delta_differential_covers_every_expand_build(monkeypatch):
    # studies/kernels/record_expand.py --sections random: every build of the expand loop (Triton's pipeliner, the hand
    # prefetch, the cap) against float64 with untouched rows bit-exact, on the CPU interpreter in float32.
    re_ = load_script("studies.kernels.record_expand")
    monkeypatch.setattr(re_, "BF", torch.float32)
    monkeypatch.setattr(harness, "_DRY", True)  # small M under the interpreter
    monkeypatch.setattr(harness, "ROWS", [])
    monkeypatch.setattr(re_, "ROWS", harness.ROWS)
    n = 2 * len(re_.RANDOM_BUILDS)  # each build on gate_up and on down
    re_.random_cases(torch.device("cpu"), n)
    r = harness.ROWS[-1]
    assert (r["section"], r["cases"], r["failures"]) == ("random", n, 0) and r["worst"] < 1e-5
    assert "xs3" in r["builds"] and "pf2" in r["builds"] and "r128" in r["builds"]


def _checked_candidates(monkeypatch, op: str, which: str):
    """record_expand.py's candidates `which` of `op` on the tiny preset at M = 16 (the table's tile for every block
    height), and the check's rows of that op: each candidate against float64 under the interpreter (float32, rank 8)."""
    from lora_moe_lab.instruments.recorders import kernel_cases as kc

    re_ = load_script("studies.kernels.record_expand")
    for mod in (re_, kc):
        monkeypatch.setattr(mod, "BF", torch.float32)
    monkeypatch.setattr(kc, "RANK", 8)
    monkeypatch.setattr(re_, "SWEEP_M", ())  # the check at M = 16 only
    monkeypatch.setattr(harness, "ROWS", [])
    monkeypatch.setattr(re_, "ROWS", harness.ROWS)
    table = re_.table_config(op, 16, re_.get_shape("tiny"), 16)
    cands = re_.candidates(op, 1024, 16, lambda bm: table, which)
    other = re_.candidates("gate_up" if op == "down" else "down", 1024, 16, lambda bm: table, which)
    re_.check("tiny", torch.device("cpu"), torch.Generator().manual_seed(0), float("inf"), which)
    rows = [r for r in harness.ROWS if r["section"] == "check" and r["op"] == op]
    assert {re_.cfg_str(bm, c) for bm, c in cands} <= {r["config"] for r in rows}
    assert all(r["ok"] and r["untouched_rows_identical"] for r in rows)
    assert other == [(16, table)]  # the other op keeps the table's tile
    return table, cands, kc


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's check; on a GPU the recording checks them")
def test_down_candidates_are_checked_against_float64(monkeypatch):
    # studies/kernels/record_expand.py --candidates down: every candidate of the down delta (narrower tiles, the
    # register cap, 4 stages) is in the check's list and computes the delta against float64, untouched rows bit-exact
    table, down, kc = _checked_candidates(monkeypatch, "down", "down")
    assert [c for _, c in down] == list(dict.fromkeys([table] + kc.down_candidates(table)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's check; on a GPU the recording checks them")
def test_gate_up_candidates_are_checked_against_float64(monkeypatch):
    # --candidates gate_up: every candidate of the separate gate_up delta (shrink depth and stages, warps, programs per
    # SM, block heights) against float64, untouched rows bit-exact
    table, gate_up, _ = _checked_candidates(monkeypatch, "gate_up", "gate_up")
    assert len(gate_up) > 10 and gate_up[0] == (16, table)
    assert {bm for bm, _ in gate_up} == {16, 32, 128} and {c.block_k for _, c in gate_up} >= {64, 128}
