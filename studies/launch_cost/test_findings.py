"""The launch-cost recorder's rows (studies/launch_cost/record.py), run on the tiny preset on any machine: every path
the plan can return has its steps, each timed with the kernels and then the checks taken out (put back afterwards),
and Triton's binder is timed with the arguments each step launched. No figure is asserted: the figures are a GPU's,
in data/launch_cost/."""
import torch

from lora_moe_lab.config import get_shape
from lora_moe_lab.kernels import common, configs, fused_moe_lora
from studies.launch_cost import record as R


def test_every_path_has_its_steps_and_parts():
    kernel, check = fused_moe_lora.fused_moe_lora_kernel, common.check_tensor
    df = R.record("tiny", [4], inner=1, reps=10)
    steps = set(zip(df.path, df.step))
    for p in ("separate", "decode"):
        assert {(p, "prepare"), (p, "gate_up delta"), (p, "down delta")} <= steps
    assert {("packed", "gate_up gemm"), ("packed", "down gemm")} <= steps
    # the wide build's gate_up jumps to each pair's tail after the last K step: it runs only where the GEMM's tile
    # steps evenly over K (this GPU's tile; elsewhere the plan hands it to packed and the recorder has no wide rows)
    sh = get_shape("tiny")
    bm = configs.moe_block_m(4, sh.top_k, sh.num_experts, sh.hidden, sh.intermediate)
    even = sh.hidden % configs.gemm_config(4, bm, 2 * sh.intermediate, sh.hidden, sh.num_experts).block_k == 0
    assert ({("wide", "gate_up gemm"), ("wide", "down gemm")} <= steps) == even
    timed = df[df["error"].isna()] if "error" in df else df  # a direct launcher call that failed says why
    assert {"no_triton", "no_checks", "binder"} <= set(df.part) and (timed.host_us > 0).all()
    assert ("launcher" in set(df.part)) == torch.cuda.is_available()
    binder = df[df.part == "binder"]
    # Triton's binder is timed for every step that launches a kernel, with the launches the step made
    for p, st in [(p, st) for p, st in steps if p != "empty" and st != "prepare"]:
        assert len(binder[(binder.path == p) & (binder.step == st)]) == 1, (p, st)
    assert set(binder[binder.path == "empty"].step) == {"1 pointer", "12 pointers, 23 ints"}
    assert fused_moe_lora.fused_moe_lora_kernel is kernel and common.check_tensor is check  # put back



# -- the committed recording, read and rendered (studies/launch_cost/read.py, block.py) --------------------------------
# No figure is typed here: each expectation is recomputed from the file itself.
def _copy(tmp_path):
    """The first committed recording and its metadata (with the seal) copied into tmp_path."""
    import shutil

    from lora_moe_lab.instruments.analysers import schemas as S
    from studies.launch_cost import read

    src = read.files()[0]
    shutil.copy(src, tmp_path / src.name)
    shutil.copy(S.meta_path(src, read.KIND), tmp_path)
    return tmp_path / src.name


def _damage(f, col, value, part=None, error=None) -> int:
    """One cell of the copy (the first row of `part` in its second half) set to `value`, written as text and resealed:
    only the schema or the reader can refuse it. Returns the row (1-based)."""
    import pandas as pd

    from lora_moe_lab.instruments.analysers import schemas as S

    df = pd.read_csv(f, dtype=str, keep_default_na=False)
    i = next(i for i in range(len(df) // 2, len(df)) if part is None or df.loc[i, "part"] == part)
    if col is None:
        df = df.drop(columns=[value])
    else:
        df.loc[i, col] = value
    if error is not None:
        df["error"] = ""
        df.loc[i, "error"] = error
    df.to_csv(f, index=False)
    S.write_seal(f, kind="launch_cost")
    return i + 1


def test_the_committed_recordings_read_one_gpu_each_under_the_recorders_name():
    from studies.launch_cost import read

    for p in read.files():
        df = read.read(p)
        gpu = df["gpu"].iloc[0]
        assert p.name == f"launch_cost_{gpu.replace(' ', '_')}.csv" and set(df["part"]) <= set(read.PARTS)
        assert set(df["gpu"]) == {gpu} and len(read.table(df)) == len(set(zip(df.path, df.step, df.M)))


def test_a_damaged_copy_is_refused_naming_the_file_and_row(tmp_path):
    import pytest

    from lora_moe_lab.instruments.analysers.schemas import RecordingError
    from studies.launch_cost import read

    cases = {"negative host_us": ("host_us", "-5", None, ["'host_us'", "-5"]),
             "a part no recorder writes": ("part", "fastest", None, ["'part'", "fastest"]),
             "a full row without a time": ("host_us", "", "full", ["'host_us'", "'full'", "error"]),
             "a launcher row without a time or an error": ("host_us", "", "launcher", ["'host_us'", "'launcher'"]),
             "a missing column": (None, "part", None, ["missing column", "'part'"])}
    for n, (damage, (col, value, part, words)) in enumerate(cases.items()):
        (tmp_path / str(n)).mkdir()
        f = _copy(tmp_path / str(n))
        row = _damage(f, col, value, part)
        with pytest.raises(RecordingError) as e:
            read.read(f)
        msg = str(e.value)
        assert msg.startswith(f"{f}: {'header' if col is None else f'row {row}'}: "), (damage, msg)
        assert all(w in msg for w in words), (damage, msg)


def test_a_launcher_row_whose_direct_call_failed_reads_without_a_time(tmp_path):
    from studies.launch_cost import block, read

    f = _copy(tmp_path)
    _damage(f, "host_us", "", "launcher", error="TypeError: the launcher takes other arguments")
    df = read.read(f)
    assert len(read.failed(df)) == 1 and "| failed |" in block.gpu_table("a GPU", f, df)


def test_the_block_names_the_gpu_and_its_floor_from_the_file():
    import re

    from studies.launch_cost import block, read

    text = block.launch_cost_block()
    assert text in (read.files()[0].parent / "README.md").read_text()  # rendered (scripts/readme_tables.py)
    for p in read.files():
        df = read.read(p)
        gpu = df["gpu"].iloc[0]
        assert f"#### {gpu}\n" in text and "The floor: " in text
        empty = df[(df.path == "empty") & (df.part == "full")]
        args = empty.step.map(lambda s: sum(int(n) for n in re.findall(r"\d+", s)))
        one, most = empty.host_us[args.idxmin()], empty.host_us[args.idxmax()]
        assert f"an empty one-pointer launch takes **{one:.1f} µs**" in text
        assert f"{args.max()} arguments" in text and f"**{most / one:.2f}×**" in text
        binder = df[df.part == "binder"]  # the steps that launch a kernel
        launching = set(zip(binder.path, binder.step, binder.M))
        low = min((r.host_us, r.path, r.step, r.M) for r in df[df.part == "full"].itertuples()
                  if r.path not in ("empty", "base") and (r.path, r.step, r.M) in launching)
        assert f"{low[1]} {low[2]} at M = {low[3]}, takes {low[0]:.1f} µs: **{low[0] / one:.2f}×**" in text
        full = df[df.part == "full"]
        for r in full[full.path != "empty"].itertuples():  # every full call is in the table
            assert f"{r.host_us:.1f}" in text, (r.path, r.step, r.M)
