"""The lora_tax study's blocks (scripts/readme_tables.py collects `BLOCKS`): LoRA's cost end to end, from
data/lora_tax/summary.csv (studies/lora_tax/read.py pools the sessions)."""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA

SUMMARY = DATA / "lora_tax" / "summary.csv"
R16 = "16,16,16,16"
ANCHOR_SHORT = "An engine's, another model: 83–89 % (sglang#34803)"


def _summary() -> pd.DataFrame | None:
    return schemas.read_csv(SUMMARY, "lora_tax_summary") if SUMMARY.exists() else None


def _cell(d, regime, shape, tokens, mode="graph"):
    r = d[(d.regime == regime) & (d["shape"] == shape) & (d.tokens == tokens) & (d.ranks == R16) & (d["mode"] == mode)]
    return r.iloc[0] if len(r) and pd.notna(r.iloc[0].ratio) else None


def headline_block() -> str | None:
    d = _summary()
    if d is None:
        return None
    q, t = "qwen3-30b-a3b", "qwen3-30b-a3b-tp4"
    cells = [_cell(d, "prefill", q, 16384), _cell(d, "prefill", t, 16384), _cell(d, "decode", q, 64)]
    if any(c is None for c in cells):
        return None
    lo, hi = min(int(c.sessions) for c in cells), max(int(c.sessions) for c in cells)
    x = [f"{c.ratio:.2f}×" for c in cells]
    n = f"{lo}" if lo == hi else f"{lo}–{hi}"  # each cell's sessions on the path it runs today (read.py)
    where = f"[{n} H200 session{'s' * (hi > 1)}](data/lora_tax/README.md)"
    return (f"LoRA at rank 16, every request on an adapter ({where}, CUDA graphs): prefill at {x[0]} LoRA-off "
            f"throughput (qwen3 shapes), {x[1]} (a TP=4 rank); decode's MoE "
            f"part {x[2]} (M = 64). {ANCHOR_SHORT}.")


BLOCKS = {"lora-tax-headline": headline_block}
BLOCK_DATA = {"lora-tax-headline": "lora_tax"}
