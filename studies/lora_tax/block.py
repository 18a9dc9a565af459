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


SHORT = {"qwen3-30b-a3b": "qwen3", "qwen3-30b-a3b-tp4": "TP=4"}


def _iv(r, nd=3) -> str:
    return f"{r.ratio:.{nd}f} [{r.lo:.{nd}f}, {r.hi:.{nd}f}]"


def results_block() -> str | None:
    """Every pooled cell of summary.csv with a session on today's path: ratio, interval, sessions, cost over the
    floor's, and whether the goals hold; the cells still without one, named."""
    d = _summary()
    if d is None:
        return None
    ok, none = d[d.sessions > 0], d[d.sessions == 0]
    lines = [f"{int(ok.goal_met.fillna(False).astype(bool).sum())} of {len(ok)} pooled cells meet the goal. LoRA-on "
             "over LoRA-off throughput in graphs, percentile bootstrap 95 % (the union over sessions where two or "
             "more), its sessions, its cost over the floor's:", "",
             "| cell | rank 16 | mixed, even | mixed, `r64_70pct` |", "| --- | --- | --- | --- |"]
    g = ok[ok["mode"] == "graph"]
    for (regime, shape, tokens), part in g.groupby(["regime", "shape", "tokens"], sort=False):
        cells = []
        for ranks_16, mix in ((True, "even"), (False, "even"), (False, "r64_70pct")):
            r = part[((part.ranks == R16) == ranks_16) & (part.mix == mix)]
            cells.append("" if r.empty else
                         f"{_iv(r.iloc[0])} ({r.iloc[0].sessions}) {r.iloc[0].cost_over_floor:.1f}×")
        lines.append(f"| {regime} {SHORT.get(shape, shape)} M = {tokens} | " + " | ".join(cells) + " |")
    eager = ok[ok["mode"] == "eager"]
    if len(eager):
        lines += ["", "Eager (LoRA's host work; `summary.csv` has each cell): " + "; ".join(
            f"{reg} {eager[eager.regime == reg].ratio.min():.2f}–{eager[eager.regime == reg].ratio.max():.2f}"
            for reg in dict.fromkeys(eager.regime)) + "."]
    if len(none):
        groups = {}
        for r in none.itertuples():
            groups.setdefault(f"{r.regime} {SHORT.get(r.shape, r.shape)} M = {r.tokens}", set()).add(
                f"{'rank 16' if r.ranks == R16 else 'mixed'} {r.mode}")
        lines += ["", "No session on today's path yet: " + "; ".join(
            f"{k} ({', '.join(sorted(v))})" for k, v in groups.items()) + "."]
    return "\n".join(lines)


def own_rank_block() -> str | None:
    """own_rank.csv, graphs: padded over own per session, shape, M and mix (paired, bootstrap 95 %)."""
    f = DATA / "lora_tax" / "own_rank.csv"
    if not f.exists():
        return None
    d = schemas.read_csv(f, "own_rank")
    g = d[d["mode"] == "graph"]
    sessions = list(dict.fromkeys(g.session))
    lines = ["| decode, graph, padded over own | " + " | ".join(sessions) + " |", "| --- |" + " --- |" * len(sessions)]
    for (shape, tokens), part in g.groupby(["shape", "tokens"], sort=False):
        cells = []
        for s in sessions:
            rows = part[part.session == s]
            cells.append(" / ".join(f"{r.speedup:.3f} [{r.lo:.3f}, {r.hi:.3f}]" for r in rows.itertuples()) or "")
        lines.append(f"| {SHORT.get(shape, shape)}, M = {tokens}, " + " / ".join(dict.fromkeys(part.mix))
                     + " | " + " | ".join(cells) + " |")
    wins = g[g.wins]
    lines += ["", "Own ranks win (the interval above 1) at " + ", ".join(sorted(
        {f"{SHORT.get(r.shape, r.shape)} M = {r.tokens}" for r in wins.itertuples()})) + "; nowhere else."
              if len(wins) else "Own ranks win nowhere."]
    return "\n".join(lines)


def base_floor_block() -> str | None:
    """base_floor.csv: the points with a goal, how many meet it, and the nearest."""
    f = DATA / "lora_tax" / "base_floor.csv"
    if not f.exists():
        return None
    d = schemas.read_csv(f, "lora_tax_base_floor")
    g = d[d.goal.notna()]
    if g.empty:
        return None
    top = g.loc[g.of_floor.idxmax()]
    return (f"Goal ≥ {g.goal.iloc[0]:g} of the floor at M ≥ {int(g.M.min())}: met at {int(g.goal_met.sum())} of the "
            f"{len(g)} points; the nearest, {SHORT.get(top.preset, top.preset)} {top.op} M = {int(top.M)}, at "
            f"{top.of_floor:.2f}.")


BLOCKS = {"lora-tax-headline": headline_block, "lora-tax-results": results_block, "lora-tax-own-rank": own_rank_block,
          "lora-tax-base-floor": base_floor_block}
BLOCK_DATA = {k: "lora_tax" for k in BLOCKS}
