"""Each adapter read at its own rank against the pool's padded rank, in the MoE part of decode.

    python -m studies.lora_tax.own_rank     # writes data/lora_tax/own_rank.csv (+ .meta.json, sealed)

The pool pads every adapter to its maximum rank (64 in the mixed settings: ranks 8, 16, 32, 64). The decode kernel
reads the batch's rank per row (kernels/lora_decode.py: `lora_ranks`), so a rank-8 adapter streams an eighth of a
rank-64 one's A. studies/lora_tax/record.py times, beside each mixed decode cell's arm, the same batch with those ranks
unset (`<setting>_padded`: every adapter at 64, the path before), in the same rotation. Per session and cell, from
lora_tax_reps.csv's kept repetitions: `speedup` = median(padded) / median(own) of the whole forward, with its
percentile bootstrap 95 % interval over the paired repetitions; `ratio_own` and `ratio_padded` are LoRA-on over
LoRA-off with each. `wins`: the interval lies above 1. The change is kept where it wins in two sessions.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from lora_moe_lab.instruments.analysers import schemas, stats
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.provenance import DATA

FOLDER = DATA / "lora_tax"
PADDED = "_padded"
BLOCK = ["session", "regime", "shape", "tokens", "pool_max_rank", "mode"]


def table(path=None) -> pd.DataFrame:
    reps = schemas.read_csv(path or FOLDER / "lora_tax_reps.csv", "lora_tax_reps", dtype={"ranks": str})
    rows = []
    for key, g in reps.groupby(BLOCK, sort=False):
        g = g[g.kept.astype(bool)]
        by = {arm: a.sort_values("rep").ms.to_numpy() for arm, a in g.groupby("arm")}
        for arm in sorted(a for a in by if a.endswith(PADDED)):
            own, padded, off = by.get(arm.removesuffix(PADDED)), by[arm], by.get("off")
            if own is None or off is None or not len(own) == len(padded) == len(off) >= stats.MIN_PAIRED_REPS:
                continue
            first = g[g.arm == arm].iloc[0]
            sp, lo, hi = stats.bootstrap_paired(padded, own, "ratio_of_medians")
            rows.append(dict(zip(BLOCK, key), ranks=first.ranks, mix=first.mix, setting=arm.removesuffix(PADDED),
                             n=len(own), own_ms=float(np.median(own)), padded_ms=float(np.median(padded)),
                             speedup=sp, lo=lo, hi=hi, wins=bool(lo > 1.0),
                             ratio_own=float(np.median(off) / np.median(own)),
                             ratio_padded=float(np.median(off) / np.median(padded))))
    return pd.DataFrame(rows)


def main() -> int:
    t = table()
    tables.write_table(FOLDER / "own_rank.csv", t, replace=True,
                       meta=dict(source="data/lora_tax/lora_tax_reps.csv (the *_padded arms and theirs)",
                                 interval="percentile bootstrap (10,000 resamples) of median(padded) / median(own) "
                                          "over the kept paired repetitions, 95 %", method=__doc__.strip()))
    with pd.option_context("display.width", 200):
        print(t.round(3).to_string(index=False) if len(t) else "no padded arms recorded yet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
