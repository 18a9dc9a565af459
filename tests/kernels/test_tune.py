"""The tuner (instruments/recorders/tune.py, kernels/tune_tables.py) on a tiny layer under the interpreter, with an
injected timer (no wall time is asserted): it writes tables the house's loaders take, picks the fastest candidate
that matched float64 and names the runner-up, never picks one that missed, resumes from its state, and refuses bad
input by name: a card too small, a shape the kernels do not take, a resume with other settings, a committed table."""
import json

import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import MoEShape, get_shape
from lora_moe_lab.instruments.recorders import tune
from lora_moe_lab.kernels import plan_table, tiles
from lora_moe_lab.kernels import tune_tables as tt

SHAPE = MoEShape("tune-tiny", 32, 16, 2, 1, 1)
GRID = {16: [(16, 16, 1, 1, 1), (32, 16, 1, 1, 1)]}
PLANS = {op: [{"path": "separate"}, {"path": "packed"}] for op in plan_table.OPS}
LORAS = {op: [{"block_n": 16, "block_k": 16, "num_warps": 1, "num_stages": 1},
              {"block_n": 32, "block_k": 16, "num_warps": 1, "num_stages": 1}] for op in plan_table.OPS}
COMMIT = "0123456789abcdef"


def fake_timer(calls):
    """Times from the candidate alone: BLOCK_N 32 and the packed path are the faster; each call is counted."""
    def timer(fn, cell):
        calls.append(cell)
        fast = "bn32/" in cell["cand"] or "packed" in cell["cand"]
        return {"median_us": (10.0 if fast else 20.0) + cell["M"], "reps": 10, "timer": "fake"}
    return timer


# The kernels run where the suite runs them: under the interpreter on a CPU, on the GPU where there is one (Triton
# takes no CPU tensors there); the tables keep the interpreter's name either way, so the tests read one name.
DEV = runtime.default_device()


def run(tmp_path, calls=None, **kw):
    args = dict(device=str(DEV), allow_cpu=True, out=tmp_path / "state", tables=tmp_path / "tables", buckets=(1,),
                reps=1 if DEV.type == "cpu" else tune.MIN_GPU_REPS, gemm_grid=GRID, tma=(False,), plan_cands=PLANS,
                lora_cands=LORAS, commit=COMMIT, gpu=tune.CPU_NAME, timer=fake_timer([] if calls is None else calls))
    return tune.tune(SHAPE, **{**args, **kw})


@pytest.fixture
def read_from(monkeypatch):
    """Point the house's loaders at a folder (their caches cleared before and after)."""
    def clear():
        for f in (tiles._tables_of, tiles._recorded, tiles._source, tiles._followed_in, plan_table.load):
            f.cache_clear()

    def use(d):
        for mod in (tiles, plan_table):
            monkeypatch.setattr(mod, "TABLE_DIR", d)
        clear()
    yield use
    clear()


def test_a_tiny_shape_tuned_end_to_end_loads_through_the_checked_loaders(tmp_path, read_from):
    calls = []
    assert run(tmp_path, calls) is True
    assert len(calls) == 3 * 2 * 2  # every candidate of both GEMMs, both deltas and both plans, each timed once
    name = tiles.file_name(tune.CPU_NAME, 2, 32, 16)
    t = tiles.read(tmp_path / "tables" / name)  # the checked loader, the name against the content
    e = t["buckets"]["1"]
    assert e["block_m"] == 16 and e["gate_up"]["block_n"] == 32 and e["down"]["block_n"] == 32
    why = e["why"]["gate_up"]
    assert "median 11.00 us over 10 repetitions" in why and "runner-up bm16/bn16/" in why and "21.00 us" in why
    assert COMMIT in why and "0 failed" in why
    raw = json.loads((tmp_path / "tables" / plan_table.file_name(tune.CPU_NAME)).read_text())
    p = plan_table.check_table(raw, "written plan")
    for op in plan_table.OPS:
        assert p.entry(op, 1, 32, 16).path == "packed" and p.entry(op, 16384, 32, 16).path == "packed"
        assert "runner-up" in p.entry(op, 1, 32, 16).why and p.entry(op, 1).decided_by == (f"tune_{COMMIT[:12]}",)
    read_from(tmp_path / "tables")  # the tile table as the kernels look it up
    assert tiles.lookup(2, 32, 16, 1, gpu=tune.CPU_NAME)["gate_up"]["block_n"] == 32


def test_a_candidate_planted_wrong_is_rejected_by_the_float64_check(tmp_path, monkeypatch):
    """The faster candidate (BLOCK_N 32) is made to write a wrong row: it is recorded as failed with its error and
    the slower one that matched is chosen."""
    real = tune.moe_gemm

    def planted(x, w, al, k, out, **kw):
        y = real(x, w, al, k, out, **kw)
        if kw["config"].block_n == 32:
            y[0] += 1.0
        return y
    monkeypatch.setattr(tune, "moe_gemm", planted)
    assert run(tmp_path, what=("gemm",))
    t = tiles.read(tmp_path / "tables" / tiles.file_name(tune.CPU_NAME, 2, 32, 16))
    assert t["buckets"]["1"]["gate_up"]["block_n"] == 16 and "1 failed" in t["buckets"]["1"]["why"]["gate_up"]
    cells = json.loads(next((tmp_path / "state").glob("*.json")).read_text())["cells"]
    bad = [r for k, r in cells.items() if "/bn32/" in k]
    assert len(bad) == 2 and all(not r["ok"] and "against float64" in r["error"] for r in bad)


def test_the_why_counts_the_candidates_of_the_block_m_it_chose(tmp_path):
    """Two BLOCK_Ms of two tiles each, all matching float64: the pick's why says 2 candidates and 0 failed (the
    other BLOCK_M's tiles are not its failures)."""
    assert run(tmp_path, what=("gemm",), gemm_grid={16: GRID[16], 32: GRID[16]})
    t = tiles.read(tmp_path / "tables" / tiles.file_name(tune.CPU_NAME, 2, 32, 16))
    assert "least gate_up + down of 2" in t["buckets"]["1"]["why"]["down"]
    assert "2 candidates, 0 failed" in t["buckets"]["1"]["why"]["down"]


def test_a_run_stopped_by_its_budget_resumes_and_refuses_other_settings(tmp_path):
    ticks = iter(range(10 ** 6))
    calls = []
    assert run(tmp_path, calls, what=("gemm",), budget_s=4, clock=lambda: float(next(ticks))) is False
    first = len(calls)
    assert 0 < first < 4 and not (tmp_path / "tables").exists()
    with pytest.raises(tt.TuneError, match="pass --resume"):
        run(tmp_path, what=("gemm",))
    with pytest.raises(tt.ResumeMismatchError, match=r"commit: the state has '0123456789abcdef', this run 'fff'"):
        run(tmp_path, what=("gemm",), resume=True, commit="fff")
    with pytest.raises(tt.ResumeMismatchError, match="buckets"):
        run(tmp_path, what=("gemm",), resume=True, buckets=(1, 4))
    assert run(tmp_path, calls, what=("gemm",), resume=True) is True
    assert len(calls) == 4  # the finished cells were not run again


def test_bad_input_is_refused_by_name(tmp_path):
    with pytest.raises(tt.TuneError, match="no CUDA device"):
        run(tmp_path, allow_cpu=False, device="cpu")
    qwen = get_shape("qwen3-30b-a3b")
    with pytest.raises(tt.CardTooSmallError, match=r"needs \d+\.\d GiB, the card has 8\.0 GiB free"):
        tune.tune(qwen, device="cpu", allow_cpu=True, capacity=lambda: (8 * 2 ** 30, 16 * 2 ** 30))
    with pytest.raises(tt.UnsupportedShapeError, match="hidden=40 is not a multiple of 16"):
        tune.tune(SHAPE.with_(hidden=40), device="cpu", allow_cpu=True)
    with pytest.raises(tt.UnsupportedShapeError, match=r"token buckets \[3\]"):
        run(tmp_path, buckets=(1, 3))
    # a committed table (the H200's, git tracks it) is refused before any device work
    with pytest.raises(tt.CommittedTableError, match="git tracks it.*--overwrite"):
        tune.tune(qwen, device="cpu", allow_cpu=True, gpu="NVIDIA H200", what=("gemm",), out=tmp_path)
    # a file the tuner did not write, too; --overwrite replaces it
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / tiles.file_name(tune.CPU_NAME, 2, 32, 16)).write_text("{}")
    with pytest.raises(tt.CommittedTableError, match="the tuner did not write it"):
        run(tmp_path, what=("gemm",))
    assert run(tmp_path, what=("gemm",), overwrite=True)
    assert tune.main(["--preset", "tiny", "--out", str(tmp_path)]) == 2  # no GPU, no --allow-cpu


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_bucket_tuned_on_the_gpu(tmp_path):
    """CUDA events, >= 10 repetitions, the TP=4 shard's shape at one bucket and two tiles; the table loads."""
    assert tune.tune("qwen3-30b-a3b-tp4", device="cuda", out=tmp_path, tables=tmp_path, buckets=(64,), what=("gemm",),
                     gemm_grid={16: [(64, 128, 1, 4, 4), (128, 64, 1, 4, 4)]})
    t = tiles.read(next(tmp_path.glob("*_E128_H2048_I192.json")))
    assert "cuda_events" in t["buckets"]["64"]["why"]["gate_up"]


def test_a_second_shape_joins_the_plan_the_tuner_wrote():
    """Per GPU one plan file: each tuned shape's entries under `shapes`, `ops` the first shape's; untuned buckets
    take the tuned one below (the first tuned above the smallest)."""
    def picks(path):
        return {op: {m: {"path": path, "decided_by": ["t"], "why": f"{path} at {m}"} for m in (4, 64)}
                for op in plan_table.OPS}
    decode = {"max_pairs": 8}
    first = tt.plan_file("G", (2, 32, 16), picks("packed"), decode, None)
    both = plan_table.check_table(tt.plan_file("G", (2, 64, 32), picks("wide"), decode, first), "merged")
    assert both.entry("gate_up", 1).path == "packed" and both.entry("gate_up", 8192, 64, 32).path == "wide"
    assert both.entry("down", 16, 32, 16).path == "packed" and "not tuned at 16: the entry of bucket 4" in \
        both.entry("down", 16, 32, 16).why
    assert set(both.shapes) == {(32, 16), (64, 32)}


def test_the_tiles_the_code_takes_today_are_candidates():
    """The rule's tile and the recorded tables' (persistent builds and all) join the grid, once each, so a tuned
    table can only match or beat them."""
    k, E = 8, 128
    known = tt.known_tiles(8192, E, 2048, 192, k)
    keys = [tt.gemm_key(c) for c in tt.unique(tt.gemm_candidates(8192, k, E) + known + known)]
    assert len(keys) == len(set(keys)) and {tt.gemm_key(c) for c in known} <= set(keys)
    assert any("/p2/" in key for key in keys)  # the H200 TP=4 table's persistent down tile at 8192


def test_the_lora_tiles_tuned_become_this_gpus_rules(tmp_path, monkeypatch):
    """Each op's fastest delta tile per bucket becomes a rule of the GPU's own file, for this shape only, tried before
    rules.json's: a launch of this shape on that GPU takes it, any other shape rules.json's tile. A second shape joins
    the file; a file under another GPU's name, or with a bad tile, is a named TableError."""
    from lora_moe_lab.kernels import configs
    from lora_moe_lab.kernels.table_checks import TableError
    assert run(tmp_path, what=("lora",), buckets=(1, 4))
    f = tmp_path / "tables" / configs.gpu_rules_file(tune.CPU_NAME).name
    raw = json.loads(f.read_text())
    up = raw["lora_tile"]["rules"]
    assert [r["when"] for r in up] == [{"min_bucket": 4, "N": 16, "K": 32}, {"N": 16, "K": 32}]
    assert all(r["tile"]["block_n"] == 32 and "runner-up bn16/" in r["why"] for r in up)
    assert raw["lora_down_tile"]["rules"][0]["when"] == {"min_bucket": 4, "N": 32, "K": 16}
    monkeypatch.setattr(tiles, "TABLE_DIR", tmp_path / "tables")
    monkeypatch.setattr(tiles, "gpu_name", lambda: tune.CPU_NAME)
    monkeypatch.setattr(configs.runtime, "interpreter", lambda: False)  # the rules as a GPU reads them
    configs.rules.cache_clear()
    try:
        ours, other = configs.lora_config(64, 1, 2, 4, 16, 16, 32), configs.lora_config(64, 1, 2, 4, 16, 48, 32)
        assert ours.block_n == 32 and ours.num_warps == 1 and other.num_warps == 4  # rules.json's for another N
        assert configs.lora_down_config(1, 1, 2, 4, 16, 32, 16).block_n == 32
        # a second shape joins the file; the first keeps its rules
        joined = tt.rules_file(tune.CPU_NAME, (2, 64, 16), {"gate_up": {1: (LORAS["gate_up"][0], "w")}}, raw)
        assert len(joined["lora_tile"]["rules"]) == 3 and len(joined["lora_down_tile"]["rules"]) == 2
        with pytest.raises(TableError, match="its name says rules_cpu-interpreter.json, this GPU is 'G'"):
            configs.check_gpu_rules(raw, f, "G")
        raw["lora_tile"]["rules"][0]["tile"]["block_n"] = 2 ** 62
        f.write_text(json.dumps(raw))
        configs.rules.cache_clear()
        with pytest.raises(TableError, match="lora_tile rule 0.*block_n"):
            configs.lora_config(64, 1, 2, 4, 16, 16, 32)
    finally:
        monkeypatch.undo()
        configs.rules.cache_clear()


def test_every_default_lora_tile_is_one_the_rules_take():
    """A tuned tile is written as a rule and checked then, after a whole GPU run: every default candidate must pass
    the rules' checks (bounds, fields, LoRAKernelConfig) up front."""
    from lora_moe_lab.kernels import configs
    for op, key in tt.LORA_RULES.items():
        cands = tt.lora_candidates(op)
        assert len({tt.lora_key(t) for t in cands}) == len(cands) >= len(tt.LORA_TILES)
        rules = [{"when": {"N": 1}, "tile": t, "why": "candidate"} for t in cands]
        assert len(configs._tile_rules({"rules": rules}, "candidates", key, fallback=False)) == len(cands)
