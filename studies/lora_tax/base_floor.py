"""Each base MoE GEMM as a fraction of its own floor, from the committed base-GEMM recording.

    python -m studies.lora_tax.base_floor        # writes data/lora_tax/base_floor.csv (+ .meta.json, sealed)
    table()                                      # the same table as a DataFrame

The base GEMM times are the `compare` section of data/kernels/kernels_base.csv (studies/kernels/record_base.py: the
tile table's kernel at each preset, op and M, CUDA-graph replays, the median of each session), over the sessions that
timed the latest session's tile at that point, as studies/kernels/read.py's `base_sessions` combines them. A GEMM's
floor (studies/kernels/read_floors.py: `gemm_floor`) is the larger of its bytes (the hit experts' weights, its input and
its output, once each) over the copy bandwidth and its FLOPs over the matmul ceiling, both measured on the H200
(`read_floors.ceilings`: the highest recorded, so every fraction is an upper bound on the kernel's own). `of_floor` =
floor / the sessions' median time; `of_floor_lo` / `_hi` the slowest / fastest session's. The goal: >= 0.85 at
M >= 4096 (`goal_met`; empty below 4096).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.provenance import DATA

from studies.kernels import read as kread
from studies.kernels.read_floors import ceilings, gemm_floor

GOAL, GOAL_MIN_M = 0.85, 4096
OUT = DATA / "lora_tax" / "base_floor.csv"
COLUMNS = ["preset", "op", "M", "bound", "bytes", "flops", "floor_us", "tile", "sessions", "session_names", "table_us",
           "table_us_min", "table_us_max", "of_floor", "of_floor_lo", "of_floor_hi", "goal", "goal_met", "copy_gbps",
           "matmul_tflops"]


def table(c: dict | None = None, path=None) -> pd.DataFrame:
    """A row per (preset, op, M) of the committed compare sections (28: 2 presets x 2 ops x 7 token counts)."""
    c = ceilings() if c is None else c
    got: dict = {}
    for r in kread.session_runs(path):
        for x in r.compare.itertuples():
            got.setdefault((x.preset, x.op, int(x.M)), []).append((r.name, float(x.table_us), str(x.table_tile)))
    rows = []
    for (preset, op, M), g in got.items():
        g = [s for s in g if s[2] == g[-1][2]]  # the sessions that timed the latest session's tile here
        t = np.array([s[1] for s in g])
        f = gemm_floor(preset, op, M, c)
        of = f["floor_us"] / float(np.median(t))
        goal = GOAL if M >= GOAL_MIN_M else math.nan
        fl, lo, hi = f["floor_us"], float(t.max()), float(t.min())
        rows.append(dict(preset=preset, op=op, M=M, bound=f["bound"], bytes=f["bytes"], flops=f["flops"], floor_us=fl,
                         tile=g[-1][2], sessions=len(g), session_names=" ".join(s[0] for s in g),
                         table_us=float(np.median(t)), table_us_min=hi, table_us_max=lo, of_floor=of,
                         of_floor_lo=fl / lo, of_floor_hi=fl / hi, goal=goal,
                         goal_met=(of >= GOAL) if M >= GOAL_MIN_M else None, copy_gbps=c["copy_gbps"],
                         matmul_tflops=c["matmul_tflops"]))
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["preset", "op", "M"], kind="stable").reset_index(drop=True)


def write(out: Path = OUT, c: dict | None = None) -> pd.DataFrame:
    """The table written whole (temp file + rename), its metadata beside it, then its seal."""
    c = ceilings() if c is None else c
    t = table(c)
    tables.write_csv_atomic(out, t, COLUMNS)
    src = kread.KERNELS_DIR / "kernels_base.csv"
    meta_path = out.with_name(out.name.replace(".csv", ".meta.json"))
    tables.write_json_atomic(meta_path, dict(
        about="studies/lora_tax/base_floor.py: each base MoE GEMM (compare section of data/kernels/kernels_base.csv) "
              "as a fraction of its floor", source=str(src.relative_to(DATA.parent)), source_seal=schemas.seal(src),
        ceilings={k: c[k] for k in ("copy_gbps", "matmul_tflops", "runs")}, goal=f">= {GOAL} of the floor at M >= "
                                                                               f"{GOAL_MIN_M}"))
    schemas.write_seal(out, meta_path)
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    t = write(a.out)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(t[["preset", "op", "M", "bound", "floor_us", "table_us", "of_floor", "of_floor_lo", "of_floor_hi",
                 "goal_met"]].to_string(index=False))
    big = t[t.M >= GOAL_MIN_M]
    print(f"goal >= {GOAL:.0%} of the floor at M >= {GOAL_MIN_M}: {int(big.goal_met.sum())} of {len(big)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
