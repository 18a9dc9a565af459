"""The lora_tax cells over their device sessions: data/lora_tax/summary.csv from lora_tax.csv.

    python -m studies.lora_tax.read            # reads data/lora_tax/lora_tax.csv, writes summary.csv (+ its meta)
    summarize(load())                          # the same table as a DataFrame

A row per cell (regime, shape, tokens, ranks, mix, mode). Only the sessions whose cell is `ok` (its warm-up check
passed) are pooled, as stats.between_sessions pools a figure: `ratio` is the mean of the sessions' ratios, `lo` and `hi`
the union of their 95 % intervals (the lowest lo, the highest hi: the wider, honest range), `agree` whether the
intervals share a point; `floor_ratio` is the mean of the sessions' floor ratios (each is t_off / (t_off + the LoRA
floor), so it moves with the measured t_off only). `sessions` counts the sessions pooled; `note` names the others.

Superseded: data/lora_tax/superseded.csv names sessions' cells recorded on a path the library no longer runs (each
with its reason); they are left out of the pool and named in `note` (`s1: superseded`).

Goals (on the pooled ratio, the point estimate): cost = 1 - ratio, floor_cost = 1 - floor_ratio, cost_over_floor =
cost / floor_cost; `floor_goal_met` is cost <= 1.25 x floor_cost; `r16_goal_met` (rank-16 prefill cells only) is
ratio >= 0.92; `goal_met` both where both apply. Empty where no session is pooled.
"""
from __future__ import annotations

import argparse
import fnmatch
import math
from pathlib import Path

import numpy as np
import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.instruments.analysers.stats import between_sessions
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.provenance import DATA

FOLDER = DATA / "lora_tax"
CELL = ["regime", "shape", "tokens", "ranks", "mix", "mode"]
COLUMNS = CELL + ["ratio", "lo", "hi", "floor_ratio", "sessions", "cost", "floor_cost", "cost_over_floor",
                  "floor_goal_met", "r16_goal_met", "goal_met", "agree", "note"]
FLOOR_FACTOR, R16_GOAL = 1.25, 0.92
POOLING = ("ok sessions only, less the cells superseded.csv names; ratio: mean of the sessions' ratios, lo/hi: the "
           "union of their 95 % intervals (stats.between_sessions); floor_ratio: mean of the sessions'")
ORDER = {"regime": ["prefill", "decode"], "mix": ["even", "r64_70pct"], "mode": ["eager", "graph"]}


def load(path: str | Path | None = None) -> pd.DataFrame:
    """lora_tax.csv, checked (its seal in lora_tax.meta.json, the lora_tax schema)."""
    return schemas.read_csv(Path(path) if path is not None else FOLDER / "lora_tax.csv", "lora_tax",
                            dtype={"ranks": str})


SUPERSEDED = FOLDER / "superseded.csv"


def superseded(path=None) -> pd.DataFrame:
    """data/lora_tax/superseded.csv: (session, cells glob over regime/shape/tokens/setting/mode, why), the sessions'
    cells recorded on a path the library no longer runs (a tuned choice: a data file, each entry with its reason)."""
    p = Path(path) if path is not None else SUPERSEDED
    if not p.exists() and not p.with_name(p.stem + ".meta.json").exists():  # none written (its seal would say)
        return pd.DataFrame(columns=["session", "cells", "why"])
    t = schemas.read_csv(p, "lora_tax_superseded", dtype=str)  # its seal (superseded.meta.json), every field filled
    return t[["session", "cells", "why"]]


def mark_superseded(df: pd.DataFrame, sup: pd.DataFrame) -> pd.DataFrame:
    """df with status `superseded` where an entry of `sup` names the row's session and matches its cell id."""
    ids = (df.regime + "/" + df["shape"] + "/" + df.tokens.astype(str) + "/" + df.setting.fillna("").astype(str)
           + "/" + df["mode"])
    hit = pd.Series(False, index=df.index)
    for e in sup.itertuples():
        hit |= (df.session == e.session) & ids.map(lambda i, g=e.cells: fnmatch.fnmatchcase(i, g))
    return df.assign(status=df.status.where(~hit, "superseded"))


def summarize(df: pd.DataFrame, sup: pd.DataFrame | None = None) -> pd.DataFrame:
    """The cells over their sessions; `sup` (superseded.csv's entries; `write` reads the file beside the table)
    marks sessions' cells left out of the pool."""
    if sup is not None:
        df = mark_superseded(df, sup)
    rows = []
    for key, g in df.groupby(CELL, sort=False):
        ok = g[g.status == "ok"].sort_values("session")
        others = g[g.status != "ok"]
        note = "; ".join(f"{r.session}: {r.status}" for r in others.sort_values("session").itertuples())
        row = dict(zip(CELL, key), sessions=len(ok), note=note)
        if len(ok):
            b = between_sessions(*ok[["ratio", "lo", "hi"]].itertuples(index=False, name=None))
            row.update(ratio=b["estimate"], lo=b["lo"], hi=b["hi"], agree=b["agree"],
                       floor_ratio=float(ok.floor_ratio.mean()))
            cost, fcost = 1.0 - row["ratio"], 1.0 - row["floor_ratio"]
            r16 = row["regime"] == "prefill" and row["ranks"] == "16,16,16,16"
            row.update(cost=cost, floor_cost=fcost, cost_over_floor=cost / fcost if fcost > 0 else math.nan,
                       floor_goal_met=bool(cost <= FLOOR_FACTOR * fcost),
                       r16_goal_met=bool(row["ratio"] >= R16_GOAL) if r16 else None)
            row["goal_met"] = row["floor_goal_met"] and (row["r16_goal_met"] if r16 else True)
        else:
            row.update(floor_ratio=float(g.floor_ratio.mean()) if g.floor_ratio.notna().any() else math.nan)
        rows.append(row)
    out = pd.DataFrame(rows, columns=COLUMNS)
    if not len(out):
        return out
    for c, order in ORDER.items():
        out[c] = pd.Categorical(out[c], [x for x in order if x in set(out[c])] + sorted(set(out[c]) - set(order)))
    out = out.sort_values(["regime", "shape", "tokens", "ranks", "mix", "mode"], kind="stable")
    for c in ORDER:
        out[c] = out[c].astype(str)
    return out.reset_index(drop=True)


def write(src: str | Path | None = None, out: str | Path | None = None) -> pd.DataFrame:
    """summary.csv beside `src` (or at `out`), written whole, with summary.meta.json (the source's seal, the pooling
    rule) and the summary's seal."""
    src = Path(src) if src is not None else FOLDER / "lora_tax.csv"
    out = Path(out) if out is not None else src.with_name("summary.csv")
    s = summarize(load(src), superseded(src.with_name("superseded.csv")))
    tables.write_csv_atomic(out, s, COLUMNS)
    meta = out.with_name(out.name.replace(".csv", ".meta.json"))
    tables.write_json_atomic(meta, dict(about="studies/lora_tax/read.py: the lora_tax cells over their sessions",
                                        source=src.name, source_seal=schemas.seal(src), pooling=POOLING,
                                        goals=f"cost <= {FLOOR_FACTOR} x floor_cost; rank-16 prefill ratio >= "
                                              f"{R16_GOAL}"))
    schemas.write_seal(out, meta)
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=None, help="lora_tax.csv (default data/lora_tax/lora_tax.csv)")
    ap.add_argument("--out", type=Path, default=None, help="summary.csv (default beside --src)")
    a = ap.parse_args(argv)
    s = write(a.src, a.out)
    with pd.option_context("display.width", 220, "display.max_columns", 30, "display.float_format", "{:.3f}".format):
        print(s.drop(columns=["note"]).to_string(index=False))
    ok = s[s.sessions > 0]
    print(f"{len(s)} cells, {len(ok)} with an ok session; goal met at {int(np.sum(ok.goal_met.astype(bool)))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
