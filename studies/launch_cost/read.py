"""The launch-cost study's recordings, read: one CSV per GPU (catalog "launch_cost.gpus", written by
studies/launch_cost/record.py), each through its kind's checked reader (schemas.read_csv: the seal, the schema) and
the rules no single column can hold: a row without a time is a `launcher` row whose `error` says why (the direct call
to the compiled kernel's C launcher failed on that Triton), and a file holds one GPU's rows (a launch's host cost is
one machine's: its CPU, driver and Triton).

    files()       # the committed recordings, one per GPU
    read(path)    # one file, checked: RecordingError naming the file and the row
    by_gpu()      # GPU name -> (file, its rows)
    table(df)     # one row per (path, step, M) in the file's order, one column per part: host µs per call
    floor(df)     # the empty kernels' launches and the cheapest LoRA step that launches a kernel
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.instruments.analysers.schemas import RecordingError
from lora_moe_lab.provenance import catalog

KIND = "launch_cost"
PARTS = ("full", "no_triton", "no_checks", "binder", "launcher")
NOT_LORA = ("empty", "base")  # the empty kernels and the base GEMM: every other path is a LoRA path
KEY = ["path", "step", "M"]


def files() -> list[Path]:
    """The catalog's launch-cost recordings (an entry that matches nothing is an error, not an empty list)."""
    return catalog("launch_cost.gpus")


def read(path) -> pd.DataFrame:
    """One recording, checked; RecordingError naming the file and the first row that breaks a rule."""
    df = schemas.read_csv(path, KIND)
    err = df["error"].astype("string").str.strip() if "error" in df else pd.Series(pd.NA, index=df.index)
    said = err.notna() & (err != "")
    untimed = df["host_us"].isna() & ~((df["part"] == "launcher") & said)
    if untimed.any():
        i = int(untimed.to_numpy().argmax())
        raise RecordingError(path, i + 1, f"column 'host_us': empty on a {df['part'].iloc[i]!r} row with no "
                                          "error: only a launcher row whose direct call failed (its `error`) "
                                          "may lack a time")
    if "gpu" not in df:
        raise RecordingError(path, "header", "missing column 'gpu': a launch-cost file is one GPU's, named by it")
    first = df["gpu"].iloc[0]
    other = df["gpu"].isna() | (df["gpu"] != first)
    if other.any():
        i = int(other.to_numpy().argmax())
        raise RecordingError(path, i + 1, f"column 'gpu': {df['gpu'].iloc[i]!r} in a file of {first!r}: a "
                                          "launch-cost file is one GPU's")
    return df


def by_gpu() -> dict[str, tuple[Path, pd.DataFrame]]:
    out = {}
    for p in files():
        df = read(p)
        out[str(df["gpu"].iloc[0])] = (p, df)
    return dict(sorted(out.items()))


def table(df: pd.DataFrame) -> pd.DataFrame:
    """host_us per (path, step, M) and part, rows in the file's order; NaN where a step has no such part (or its
    direct launcher call failed: `failed(df)`)."""
    order = list(dict.fromkeys(zip(df["path"], df["step"], df["M"])))
    t = df.pivot(index=KEY, columns="part", values="host_us")
    return t.reindex(pd.MultiIndex.from_tuples(order, names=KEY)).reindex(columns=list(PARTS))


def failed(df: pd.DataFrame) -> set:
    """(path, step, M) of the launcher rows with no time: the direct call failed (the row's `error`)."""
    f = df[(df["part"] == "launcher") & df["host_us"].isna()]
    return set(zip(f["path"], f["step"], f["M"]))


def _args(step: str) -> int:
    """The arguments an empty kernel takes, from its step's label ("12 pointers, 23 ints" -> 35)."""
    return sum(int(n) for n in re.findall(r"\d+", step))


def floor(df: pd.DataFrame) -> dict | None:
    """The empty kernels' full launches (fewest and most arguments) and the cheapest full call of a LoRA step that
    launches a kernel (it has a binder row), each against the fewest-argument launch; None where the file has no
    empty kernel's full launch (a CPU's file)."""
    full = df[df["part"] == "full"]
    empty = full[full["path"] == "empty"].assign(args=lambda d: d["step"].map(_args)).sort_values("args")
    binder = df[df["part"] == "binder"]  # a step that launches no Triton kernel has no binder row
    launching = set(zip(binder["path"], binder["step"], binder["M"]))
    keys = pd.Series(list(zip(full["path"], full["step"], full["M"])), index=full.index)
    lora = full[~full["path"].isin(NOT_LORA) & keys.isin(launching)]
    if empty.empty or lora.empty:
        return None
    one, most, low = empty.iloc[0], empty.iloc[-1], lora.loc[lora["host_us"].idxmin()]
    return dict(one_us=float(one["host_us"]), one_args=int(one["args"]), most_us=float(most["host_us"]),
                most_args=int(most["args"]), most_step=str(most["step"]),
                most_ratio=float(most["host_us"] / one["host_us"]),
                lowest=(str(low["path"]), str(low["step"]), int(low["M"])), lowest_us=float(low["host_us"]),
                lowest_ratio=float(low["host_us"] / one["host_us"]))


def main(argv=None) -> int:
    for gpu, (p, df) in by_gpu().items():
        print(f"{gpu} ({p.name}):")
        print(table(df).round(1).to_string())
        print(floor(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
