"""Readers of the base MoE GEMM recordings (studies/kernels/record_base.py) and of the peers' carried figures.

    run = load_base_run()                 # kernels_base.csv, session base_run3: sweep, variants, compare (+ ncu)
    run.compare, run.variants, run.ncu    # tidy DataFrames
    versus_peers()                        # the table's kernel against vLLM's tuned kernel (carried figures)
    base_sessions()                       # the headline (table vs rules) in each device session, and between them
    fold = load_fold_run()                # kernels_fold.csv, session FOLD_RUN: LoRA folded into the base GEMM
    fold_table(fold), gemm_share(fold)    # folded against the separate deltas; LoRA's share of the two GEMMs
    fold_layer(fold)                      # LoRA's share of the whole MoE layer: separate, folded, the table's pick
    fold_sessions()                       # the fold headlines in each device session, and between them
    fold_counters()                       # the folded builds' ncu counters (fold_s2) beside the plain GEMM's
    load_counters(), kernel_counters()    # ncu counters of the base GEMMs and the LoRA deltas (base_s3), per kernel
    counter_sessions()                    # the counters both ncu sessions (base_run3, base_s3) read, side by side

The peers' base-GEMM figures (`data/kernels/peers_base_carried.csv`) come from a side-by-side run of
vLLM's Triton fused_moe_kernel with its own H200 tables against this lab's kernel as it was then
(the `lab_rules` rows), carried from the issue that asked for this comparison; no script here ran
vLLM. Two ratios are therefore given: `direct` (their time over ours, two different runs) and
`bridged`, which keeps every ratio inside one run: their time over the lab's kernel of that run
(the same run), times that old kernel over the table's kernel (this lab's run, paired: the
`rules_masked` arm, the rules' tiles with every load predicated, as the carried run had them).
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.instruments.analysers.recordings import KernelRun
from lora_moe_lab.instruments.analysers.stats import between_sessions
from lora_moe_lab.provenance import normalize_meta

from . import tidy

KERNELS_DIR = tidy.KERNELS

BASE_RUN = "base_run3"  # the canonical recording: sweep -> tile tables, variants, compare, ncu counters
# later device sessions of compare: base_s*, and the persist_s* runs that ran compare after their persist section
# (persist_s3, persist_s4: compare measured the tables with that run's picks; base_sessions combines a point only over
# the sessions that timed the latest session's tile there)
BASE_SESSION_GLOBS = ("base_s*", "persist_s*")  # session names in data/kernels/kernels_base.csv
# The counters (studies/kernels/record_base.py --ncu-run under ncu): base_s3 counts the base GEMMs as base_run3 did,
# and the LoRA deltas as the layer runs them: the decode kernel at M=16, the aligned kernel at M=1024 and 8192.
NCU_RUN = "base_s3"
NCU_REPEAT_RUN = "base_s4"  # the same 32 launches counted again in a later device session (426609a)
# The same 32 targets at the tables and LoRA configs as committed now (e7db815: persistent / early builds, the down
# delta's pipelined expand); the counters a reader should take for today's kernels. One session; the precision of a
# launch's counters is the base_s3 / base_s4 spread.
# base_s7 (72e44a3) counted the tables before the sub-block build and, at M = 8192 where BLOCK_M is 128, the
# `m64_p2_pf` arm; base_s8 (370bd51, another device session) counts the tables with it: the same 36 targets, where the
# TP=4 down table row of base_s8 is base_s7's m64_p2_pf launch (counter_sessions matches launches by build).
NCU_NOW_RUN = "base_s10"
NCU_NOW_REPEAT_RUN = "base_s9"
# base_s10 counts the tables of round 3 (f1a9f84: early gathers at TP=4 down M >= 8192, a persistent qwen3 down at
# 8192), base_s9 (5d0beeb) the ones before; both at M = 16, 1024 and 8192 with the SMs' active cycles (load balance).
SUBBLOCK_NCU_RUNS = ("base_s7", "base_s8")  # the TP=4 down table before and after the sub-block build
PEERS_BASE = "peers_base_carried.csv"
# studies/kernels/record_fold.py. fold_s1 timed an earlier build (pointer expand, intermediate in pair order; its
# differential is fold_s1check). From fold_s2 on every run has check, kernels and layer; fold_s2 has the counters
# of the three folded builds; fold_s3 on time the layer's build (rows_ptr) and the layer's own pick (picked_all);
# fold_s4 adds the two alignments side by side and the layer with the down GEMM folded; fold_s5 and fold_s6 time
# the Triton ordered alignment (fold_s5's kernel points stop at the first point where a register-capped arm did not
# compile: qwen3 after M=128, TP=4 after gate_up M=8192; fold_s6 leaves only that arm out) and fold_s6 the
# committed table's pick.
FOLD_RUN = "fold_s10"  # kernels and layer at the tables with the sub-block build (370bd51)
FOLD_CHECK_RUN = "fold_s5"  # the latest differential (fold_s6 ran no check section)
FOLD_NCU_RUN = "fold_s2"
FOLD_SESSIONS = ("fold_s2", "fold_s3", "fold_s4", "fold_s5", "fold_s6", "fold_s8", "fold_s9", "fold_s10",
                 "fold_s11")  # sessions of one script
# the sessions whose layer ran as the layer does now: the alignment ordered by LoRA row in Triton (ce2b959; fold_s4's
# layer paid a torch sort) and today's separate down delta, the one the fold must beat (Triton's pipelined expand,
# e7db815 on; fold_s5 and fold_s6 beat the hand-prefetch delta) and today's base tables (the sub-block build at TP=4
# down, 370bd51: fold_s8 and fold_s9, the layer section only, ran before it): the layer's figures are read over these.
# fold_s10 and fold_s11 ran on two fresh machines (fold_s10's first run, whose rows did not come back, is its log
# fold_s10_first_stdout.log.gz; the rows are a second run on the same machine).
FOLD_LAYER_SESSIONS = ("fold_s10", "fold_s11")
# per layer figure, the sessions that ran the same path: `picked_all` is the committed table, which folded nothing
# before 32fb474 (fold_s6 is the earliest session after it); a figure is compared only over the sessions named here
FOLD_FIGURE_SESSIONS = {"down_folded_share_pct": FOLD_LAYER_SESSIONS, "down_folded_over_separate": FOLD_LAYER_SESSIONS,
                        "picked_all_share_pct": ("fold_s6",)}


@dataclass
class BaseRun(KernelRun):
    """One run of studies/kernels/record_base.py (KernelRun's rows, meta, name, section, label) and its
    ncu counters, where the run has them."""

    ncu: pd.DataFrame | None = None

    @property
    def compare(self) -> pd.DataFrame:
        return self.section("compare")

    @property
    def variants(self) -> pd.DataFrame:
        return self.section("variants")


def load_base_run(name: str = BASE_RUN, path: str | Path | None = None, stem: str = "kernels_base") -> BaseRun:
    """Session `name` of the tidy table data/kernels/<stem>.csv (its rows, metadata and ncu counters)."""
    if not tidy.has(stem, name, path):
        raise FileNotFoundError(f"no session {name!r} in {tidy._dir(path) / (stem + '.csv')}: "
                                f"studies/kernels/record_{stem.removeprefix('kernels_')}.py records it on a GPU")
    meta = normalize_meta(tidy.meta(stem, name, path))
    ncu = tidy.rows(stem, name, path, ncu=True) if tidy.has(stem, name, path, ncu=True) else None
    return BaseRun(tidy.rows(stem, name, path), meta, name, ncu)


def load_peers(path: str | Path | None = None) -> pd.DataFrame:
    f = Path(path) if path is not None else KERNELS_DIR / PEERS_BASE
    if not f.exists():
        raise FileNotFoundError(f"no carried figures at {f}")
    return schemas.read_csv(f, "kernel_peers")


def versus_peers(run: BaseRun | None = None, peers: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (preset, op, M): the table's kernel (µs), vLLM's tuned kernel (carried µs), `direct` =
    vLLM / table, `bridged` = (vLLM / lab_rules, one carried run) x (lab kernel / table, this run,
    paired, with its 95 % interval carried through; `bridge_arm` says which arm: rules_masked where
    the run has it, else rules), and whether each passes 1.0 and 1.15. `run`: default `bridge_run()`."""
    run = run or bridge_run()
    p = peers if peers is not None else load_peers()
    masked = "rules_masked_over_table" in run.compare  # the kernel the carried run measured, in this run
    c = run.compare.set_index(["preset", "op", "M"])
    v = p[p.engine == "vllm_tuned"].set_index(["preset", "op", "M"]).time_us
    old = p[p.engine == "lab_rules"].set_index(["preset", "op", "M"]).time_us
    rows = []
    for key in c.index:
        if key not in v.index:
            continue
        r = c.loc[key]
        carried = v[key] / old[key]
        pre = "rules_masked" if masked else "rules"
        g = (r[f"{pre}_over_table"], r[f"{pre}_over_table_lo"], r[f"{pre}_over_table_hi"])
        rows.append(dict(preset=key[0], op=key[1], M=key[2], table_us=r.table_us, table_tile=r.table_tile,
                         vllm_us=v[key], lab_then_us=old[key], lab_now_us=r[f"{pre}_us"], bridge_arm=pre,
                         direct=v[key] / r.table_us, bridged=carried * g[0], bridged_lo=carried * g[1],
                         bridged_hi=carried * g[2], stable=bool(r.stable), run=run.name))
    out = pd.DataFrame(rows)
    out["ge_1"] = (out.direct >= 1.0) & (out.bridged >= 1.0)
    out["ge_1_15"] = (out.direct >= 1.15) & (out.bridged >= 1.15)
    return out


def peer_sessions(path: str | Path | None = None) -> list[pd.DataFrame]:
    """versus_peers in every session that timed the bridge arm (`rules_masked`) at the latest session's tiles, at
    every point: the same comparison in separate device sessions, oldest first, for the spread between them."""
    runs = [r for r in session_runs(path) if "rules_masked_over_table" in r.compare]
    vs = [versus_peers(r) for r in runs]
    if not vs:
        return []
    tiles = vs[-1].set_index(["preset", "op", "M"]).table_tile.astype(str)
    return [v for v in vs if v.set_index(["preset", "op", "M"]).table_tile.astype(str).reindex(tiles.index)
            .eq(tiles).all()]


def session_runs(path: str | Path | None = None) -> list[BaseRun]:
    """The canonical run, then every later run with a compare section (BASE_SESSION_GLOBS), in the order they ran
    (the date in their metadata)."""
    names = [n for g in BASE_SESSION_GLOBS for n in tidy.sessions("kernels_base", path) if fnmatch(n, g)]
    later = [load_base_run(n, path) for n in names]
    later = sorted((r for r in later if (r.rows.section == "compare").any()), key=lambda r: r.meta["date"])
    return [load_base_run(BASE_RUN, path)] + later


def bridge_run(path: str | Path | None = None) -> BaseRun:
    """The latest session that timed the carried run's own kernel (`rules_masked`), else the canonical run
    (whose bridge arm, `rules`, already has the predicate-free loads and so understates the table's gain)."""
    runs = session_runs(path)
    with_masked = [r for r in runs if "rules_masked_over_table" in r.compare]
    return with_masked[-1] if with_masked else runs[0]


def base_sessions(path: str | Path | None = None) -> pd.DataFrame:
    """The table's gain over the rules per (preset, op, M) in each device session (the canonical run
    and every base_s* session of compare) and between them (stats.between_sessions). Where the tables changed
    between sessions, only the sessions that timed the latest session's tile at that point are combined."""
    runs = session_runs(path)
    figs = {}
    for r in runs:
        for _, x in r.compare.iterrows():
            figs.setdefault((x.preset, x.op, x.M), []).append(
                (r.name, x.table_us, (x.rules_over_table, x.rules_over_table_lo, x.rules_over_table_hi),
                 x.get("table_tile")))
    rows = []
    for (pre, op, M), got in figs.items():
        got = [g for g in got if str(g[3]) == str(got[-1][3])]  # str: a run without the column has NaN
        b = between_sessions(*[g[2] for g in got])
        rows.append(dict(preset=pre, op=op, M=M, sessions=len(got), table_us=[round(g[1], 1) for g in got],
                         gain_per_session=[round(g[2][0], 3) for g in got], gain=b["estimate"], lo=b["lo"],
                         hi=b["hi"], agree=b["agree"]))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------
# The LoRA path folded into the base GEMM (studies/kernels/record_fold.py)
# ------------------------------------------------------------------------------------------------
def load_fold_run(name: str = FOLD_RUN, path: str | Path | None = None) -> BaseRun:
    """A run of studies/kernels/record_fold.py: `section("kernels")`, `section("check")` where it has one
    (the differential is its own run, FOLD_RUN + "check"), and `ncu`."""
    return load_base_run(name, path, stem="kernels_fold")


def fold_check(name: str = FOLD_CHECK_RUN, path: str | Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The folded path's differential: (random-case rows: cases, failures, worst; preset rows: M, rel_err, ok).
    From the run's own check section, else its separate differential run (name + "check", as fold_s1)."""
    rows = load_fold_run(name, path).rows if tidy.has("kernels_fold", name, path) else None
    if rows is None or not (rows.section == "check").any():
        rows = load_fold_run(name + "check", path).rows
    rows = rows[rows.section == "check"]
    rnd = rows.op.astype(str).str.startswith("random")
    return rows[rnd].reset_index(drop=True), rows[~rnd].reset_index(drop=True)


def _ci(name: str) -> list[str]:
    return [name, f"{name}_lo", f"{name}_hi"]


def fold_table(run: BaseRun | None = None) -> pd.DataFrame:
    """Per (preset, op, M): the base GEMM, the separate and folded deltas (µs, the folded one with its
    95 % interval), folded / separate and the folded GEMM with every adapter disabled over the base
    (both paired ratios with their intervals), and whether the point's repetitions were stable. Where the
    run has them (fold_s3 on): the layer's build (`rows_ptr`: ordered alignment, per-row shrink, pointer
    expand) over separate, its delta and its GEMM with every adapter disabled over the base; the base
    alignment and the one ordered by LoRA row in µs (fold_s4 on); the layer's build with a register cap of
    128 over without (`cap_over_rows_ptr`, from the run after fold_s4). Columns a run lacks are NaN."""
    k = (run or load_fold_run()).section("kernels")
    cols = (["preset", "op", "M", "base_us", "delta_separate_us", "delta_folded_us", "delta_folded_lo",
             "delta_folded_hi"] + _ci("folded_over_separate") + _ci("gemm_off_over_base")
            + ["folded_off_over_base", "folded_over_ptr"] + _ci("rows_ptr_over_separate")
            + ["delta_rows_ptr_us", "delta_rows_ptr_lo", "delta_rows_ptr_hi"] + _ci("gemm_rows_off_over_base")
            + ["rows_ptr_off_over_base"] + _ci("cap_over_rows_ptr") + ["align_us", "align_ordered_us", "stable"])
    return k.reindex(columns=cols).reset_index(drop=True)


def fold_layer(run: BaseRun | None = None) -> pd.DataFrame:
    """Per (preset, M): one MoE layer's time without LoRA (µs) and LoRA's share of it (%, median of the
    paired per-round shares, bootstrap 95 %) with the separate deltas, folded everywhere, folded with every
    adapter disabled, only the down GEMM folded (`down_folded`, fold_s4 on) and as the committed table picks
    (`picked_all`, fold_s3 on); folded, down_folded and picked over separate (paired ratios). Columns a run
    lacks are NaN."""
    k = (run or load_fold_run()).section("layer")
    cols = ["preset", "M", "base_us"]
    for nm in ("separate_all", "folded_all", "folded_none", "down_folded", "picked_all"):
        cols += _ci(f"{nm}_share_pct")
    cols += _ci("folded_over_separate") + _ci("down_folded_over_separate") + _ci("picked_over_separate") + ["stable"]
    return k.reindex(columns=cols).reset_index(drop=True)


def _gather(figs: dict, name: str, kernel_figs, layer_figs, only: dict, names) -> None:
    """Add session `name`'s estimates and intervals of each (figure, table) to figs, keyed (figure, preset, op or
    "layer", M); a figure named in `only` is taken from the sessions listed there only (its path changed)."""
    for specs, per_op in ((kernel_figs, True), (layer_figs, False)):
        for col, df in specs:
            if name not in only.get(col, names):
                continue
            for _, x in df.iterrows():
                if x[col] == x[col]:
                    key = (col, x.preset, x.op if per_op else "layer", int(x.M))
                    figs.setdefault(key, []).append((name, (x[col], x[f"{col}_lo"], x[f"{col}_hi"])))


def _session_rows(figs: dict) -> pd.DataFrame:
    """{(figure, preset, op, M): [(session, (estimate, lo, hi)), ...]} -> one row per figure with each session's
    estimate and stats.between_sessions over them (mean, union of the intervals, spread, agree)."""
    rows = []
    for (col, pre, op, M), got in figs.items():
        b = between_sessions(*[g[1] for g in got])
        rows.append(dict(figure=col, preset=pre, op=op, M=M, sessions=[g[0] for g in got],
                         per_session=[round(float(g[1][0]), 3) for g in got], estimate=b["estimate"], lo=b["lo"],
                         hi=b["hi"], spread=b["spread"], agree=b["agree"]))
    return pd.DataFrame(rows)


def fold_sessions(names: tuple[str, ...] = FOLD_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The fold headlines per (figure, preset, op, M) in each device session that has them and between them
    (stats.between_sessions: mean of the estimates, union of the intervals, `agree`): folded / separate and
    the layer's build / separate (kernels), LoRA's share of the layer with the separate deltas, with the down
    GEMM folded and as picked; a layer figure whose path changed between sessions only over FOLD_FIGURE_SESSIONS."""
    figs = {}
    for name in names:
        run = load_fold_run(name, path)
        has = set(run.rows["section"].unique())  # fold_s8 / fold_s9 ran the layer section only
        t = fold_table(run) if "kernels" in has else pd.DataFrame()
        lay = fold_layer(run) if "layer" in has else pd.DataFrame()
        _gather(figs, name, (("folded_over_separate", t), ("rows_ptr_over_separate", t)),
                (("separate_all_share_pct", lay), ("picked_all_share_pct", lay), ("down_folded_share_pct", lay),
                 ("down_folded_over_separate", lay)), FOLD_FIGURE_SESSIONS, names)
    return _session_rows(figs)


# The packed build (kernels/fused_moe_lora_packed.py), sections packed and layer of studies/kernels/record_fold.py.
# fold_s13
# timed a shrink variant (both slices per program, 8 warps) that lost to fold_s12's and was reverted; its figures are
# not the committed kernels', so it is not a session of the headline.
PACKED_SESSIONS = ("fold_s12", "fold_s14", "fold_s16")  # fold_s16 (08cbb61): the packed section only
# win_s4c: every shrink option; exp_s1c: + the expand without a loop and its L2 prefetch; exp_s2c: + two slots per
# expand dot (eight shards of 125 cases each)
PACKED_CHECK_RUNS = ("fold_s12c", "fold_s14c", "win_s4c", "exp_s1c", "exp_s2c", "exp_s6c")
PACKED_SHRINK_TRIAL = "fold_s13"
# The layer as committed (`picked_*`) ran the committed packed table only from fold_s14 on (fold_s12's committed table
# folded nothing; fold_s13's shrink was the reverted one): those figures are read over these sessions only.
PACKED_FIGURE_SESSIONS = {f: ("fold_s14",) for f in ("picked_all_share_pct", "picked_none_share_pct",
                                                       "picked_over_separate")}


# Two trials on the packed GEMM's disabled cost, both rejected (studies/kernels/README.md, "Builds no table takes"):
# the expand as the tail of the base GEMM's one K loop (tail_s1, 98de79c) and a launch-wide guard in the GEMM (fold_s15,
# 87b0771: with no adapter live, the plain GEMM's loop in the same kernel).
TAIL_TRIAL = "tail_s1"
GUARD_TRIAL = "fold_s15"


def disabled_trials(path: str | Path | None = None) -> pd.DataFrame:
    """Per (preset, op, M): the packed GEMM alone with every adapter disabled over the plain GEMM (paired, bootstrap
    95 %) as committed (PACKED_SESSIONS[-1], every block's range empty), in the tail trial (`tail`), and in the guard
    trial its plain branch (`guard_off`) and its packed branch with every range empty (`guard_idle`); and, enabled,
    the guard trial's packed build over the separate delta (`guard_enabled`) beside the committed one's."""
    com = packed_table(load_fold_run(PACKED_SESSIONS[-1], path))
    tail = load_base_run(TAIL_TRIAL, path, stem="kernels_fold").section("tail")
    guard = packed_table(load_fold_run(GUARD_TRIAL, path))
    gk = load_fold_run(GUARD_TRIAL, path).section("packed")
    key = ["preset", "op", "M"]
    out = com[key + _ci("gemm_packed_off_over_base") + _ci("packed_over_separate")].rename(
        columns=lambda c: c.replace("gemm_packed_off_over_base", "committed").replace("packed_over_separate",
                                                                                       "committed_enabled"))
    for nm, frame, col in (("tail", tail, "gemm_tail_off_over_base"), ("guard_off", guard, "gemm_packed_off_over_base"),
                           ("guard_idle", gk, "gemm_packed_idle_over_base"),
                           ("guard_enabled", guard, "packed_over_separate")):
        part = frame[key + _ci(col)].rename(columns=lambda c: c.replace(col, nm))
        out = out.merge(part, on=key, how="left")
    return out


def shrink_sweep(run: BaseRun | None = None) -> pd.DataFrame:
    """The packed shrink's tile sweep (kernels study: record_fold.py, shrink; GUARD_TRIAL's shrink is the committed
    one): per (preset, op, M) the committed tile's µs, the fastest tile, its µs and its paired ratio to the committed
    one (bootstrap 95 %)."""
    k = (run or load_fold_run(GUARD_TRIAL)).section("shrink")
    rows = []
    for (preset, op, M), g in k.groupby(["preset", "op", "M"], sort=False):
        best = g.loc[g.us.idxmin()]
        rows.append(dict(preset=preset, op=op, M=int(M), committed_us=float(g[g.tile == "bk64/w4/s3"].us.iloc[0]),
                         best=best.tile, best_us=float(best.us), best_over_committed=float(best.over_committed),
                         best_over_committed_lo=float(best.over_committed_lo),
                         best_over_committed_hi=float(best.over_committed_hi), tiles=len(g)))
    return pd.DataFrame(rows)


# The packed shrink in slot windows (studies/kernels/record_fold.py, section window), three machines: win_s1 (e5255d2:
# its
# one-dot shrink held 214 registers where the committed one holds 128, so its `shrink_*_over_committed` figures are
# against a slowed reference), win_s2 (3775a0a: fixed; x kept in L2, 8 warps, two slots per dot), win_s3 (dc7a25f:
# programs of 64 rows under a register cap of 128). The figures the sessions share are compared between them.
WINDOW_SESSIONS = ("win_s1", "win_s2", "win_s3")
WINDOW_COMPARED = ("win_s2", "win_s3")  # the sessions after the fix


def section_ratios(names: tuple[str, ...], section: str, suffixes: tuple[str, ...],
                   path: str | Path | None = None) -> pd.DataFrame:
    """Per session, preset, op and M of one record_fold.py section: each figure whose column ends with one of
    `suffixes` (a paired ratio `<arm>_over_<ref>`, or LoRA's share `<arm>_share_pct`) as figure, value and its
    bootstrap 95 % interval (lo, hi), with the microseconds of its arm (op "layer" for the layer section's rows)."""
    rows = []
    for name in names:
        k = load_fold_run(name, path).section(section)
        for _, r in k.iterrows():
            for col in k.columns:
                suf = next((x for x in suffixes if col.endswith(x)), None)
                if suf is None or pd.isna(r[col]) or f"{col}_lo" not in k.columns:
                    continue
                arm = col[:-len(suf)] if suf == "_share_pct" else col.rsplit("_over_", 1)[0]
                op = r.get("op")
                rows.append(dict(session=name, preset=r.preset, op=op if isinstance(op, str) else "layer", M=int(r.M),
                                 figure=col, value=float(r[col]), lo=float(r[f"{col}_lo"]), hi=float(r[f"{col}_hi"]),
                                 us=float(r.get(f"{arm}_us", float("nan")))))
    return pd.DataFrame(rows)


def ratio_spread(t: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    """The figures of `section_ratios` timed in every one of `names`, per (figure, preset, op, M): each session's
    value, and the union of their 95 % intervals (lo, hi) with the spread of the values (max / min - 1)."""
    rows = []
    for (fig, preset, op, M), g in t.groupby(["figure", "preset", "op", "M"], sort=False):
        if g.session.nunique() < len(names):
            continue
        rows.append(dict(figure=fig, preset=preset, op=op, M=M, **{s: float(v) for s, v in zip(g.session, g.value)},
                         lo=float(g.lo.min()), hi=float(g.hi.max()), spread=float(g.value.max() / g.value.min() - 1)))
    return pd.DataFrame(rows)


def fold_counters_of(names: tuple[str, ...], path: str | Path | None = None) -> pd.DataFrame:
    """The sessions' ncu passes (`<name>_kernels_fold_ncu.csv`: one profiled launch of each build's shrink and GEMM at
    M = 8192, never a timing), with the session's name."""
    return pd.concat([tidy.rows("kernels_fold", n, path, ncu=True).assign(session=n) for n in names],
                     ignore_index=True)


def shrink_windows(names: tuple[str, ...] = WINDOW_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The window section's ratios per session (`section_ratios`): a shrink build over the committed shrink on its
    alignment (`shrink_*_over_committed`), a path over the separate delta (`*_over_separate`)."""
    return section_ratios(names, "window", ("_over_committed", "_over_separate"), path)


def window_spread(names: tuple[str, ...] = WINDOW_COMPARED, path: str | Path | None = None) -> pd.DataFrame:
    """The window figures timed in every one of `names` and their spread between sessions (`ratio_spread`)."""
    return ratio_spread(shrink_windows(names, path), names)


def window_counters(names: tuple[str, ...] = WINDOW_COMPARED, path: str | Path | None = None) -> pd.DataFrame:
    """The window sessions' ncu passes (`fold_counters_of`)."""
    return fold_counters_of(names, path)


# The packed GEMM's expand (studies/kernels/record_fold.py, section expand), three machines: exp_s1 (2b38260) and exp_s2
# (3466e02) ran the loop, its L2 prefetch (`pf`), guarded steps without a loop (`un`), both (`unpf`), and exp_s2 two
# slots per dot (`d64`); exp_s3 (6dc8b10) the loop, `d64` and the dense build on the plain alignment. The layer section
# of exp_s2, exp_s3 and exp_s4 priced the per-shape fold table and the W1S shrink (`picked_all`) against the table
# before them (`prev_all`); exp_s3 also the candidate per slot with two slots per dot at M = 4096 (`cand_all`), which
# exp_s4's committed table is.
EXPAND_SESSIONS = ("exp_s1", "exp_s2", "exp_s3")
LAYER_TABLE_SESSIONS = ("exp_s2", "exp_s3")
# The layer at the committed table: exp_s3's candidate is the table committed since, and exp_s4 ran it as `picked`
# (its `cand` then repeated the same table: an A/A check of the paired method). In exp_s4 `prev` kept the 4096
# per-slot change (the layer section's PREV clears the per-shape folds and the shrink options only).
# Later: exp_s6 (33d68fb) the expand's first step loaded before the K loop (`early`, `early_d64`);
# exp_s7 (90719fe) and exp_s8 (0827783) `early` again and the packed GEMM on a program per tile (`ppt`, `ppt_d64`).
EARLY_SESSIONS = ("exp_s6", "exp_s7", "exp_s8")
TILE_SESSIONS = ("exp_s7", "exp_s8")
# The layer with configs.PACKED_TILE_SHAPE_TOKENS (a program per tile at TP=4 down M = 1024) over the layer without
# it: exp_s7's candidate (then a program per tile at every flattened shape: the figure at TP=4 M = 1024 is the taken
# tile's alone, since TP=4 gate_up is not flattened there) and the committed table over PREV in exp_s8 and exp_s9.
TILE_LAYER = (("exp_s7", "cand_all_over_picked"), ("exp_s8", "picked_all_over_prev"),
              ("exp_s9", "picked_all_over_prev"))
# The down GEMM's wide build (kernels/fused_moe_lora_packed.py, `moe_gemm_lora_wide`: u and B_packed as columns past K
# of the GEMM's own x and w), section wide of studies/kernels/record_fold.py on two machines: wide_s1 (79f9e23) and
# wide_s2
# (0fd9eef; between them only the K predicates of a tail that is not a multiple of BLOCK_K, which no preset has).
# wide_s1 also ran ncu (one launch each at M = 8192: the wide build beside the committed W1S packed path). The
# 1000-case differential: wide_s2c (0fd9eef); wide_s1c at 79f9e23 failed 4 of 1000 on that tail (its files did not
# come back; the fix and its test are in f4c0ab5).
WIDE_SESSIONS = ("wide_s1", "wide_s2")
WIDE_NCU_RUN = "wide_s1"
WIDE_CHECK_RUNS = ("wide_s2c",)
# The layer at the committed tables with the wide build (`picked`) over PREV, the same tables without it: lay_s1
# (0fd9eef) and lay_s2. Before them the committed table's sessions were exp_s8 and exp_s9 (the packed GEMM's tiles per
# shape), exp_s3's candidate and exp_s4 before those.
WIDE_LAYER = (("lay_s1", "picked_all_over_prev"), ("lay_s2", "picked_all_over_prev"))
# gate_up's wide build (`moe_gemm_lora_wide(gather=True)`: each pair's u past K in its token's row, the row pointers
# jumping there between two K steps), per block (`per_block`: each tile walks only its block's slots' columns of its
# own slice): section wide, op gate_up, on three machines: wg_s2 (b3a8435, both ops), wg_s3 (1d35c8a) and wg_s4
# (8f98dde; with the per-block paths paired against the separate delta). wg_s1 (00750f4) ran the build over all C
# columns only (it lost to the packed path: `path_wide_over_committed`). Counters: wg_n2 (the per-block build with the
# W1S shrink, `wide_blk`) and wg_n1 (over all columns, `wide_both`, beside the committed `packed_slot_w1s`), one launch
# each at M = 8192. The 1000-case differentials: wg_s2c (both ops, per block or not), wg_s1c (before per block).
WIDE_GU_SESSIONS = ("wg_s2", "wg_s3", "wg_s4")
WIDE_GU_NCU_RUNS = ("wg_n1", "wg_n2")
WIDE_GU_CHECK_RUNS = ("wg_s1c", "wg_s2c")
# The layer with gate_up's wide build (the committed tables, `picked`) over the tables before it (PREV): lay_s3
# (1d35c8a: qwen3 gate_up wide at M >= 8192 only; at 4096 both arms ran the separate delta) and lay_s4 (8f98dde: the
# committed tables, 4096 too).
WIDE_GU_LAYER = (("lay_s3", "picked_all_over_prev"), ("lay_s4", "picked_all_over_prev"))
WIDE_GU_COMMITTED = (("lay_s3", "picked"), ("lay_s4", "picked"))  # the tables with it: LoRA's share then
# The later tables (data/kernels/README.md): lay_s5 (d1abd34) timed the down GEMM's wide build at
# M = 128, 256 (kept: 0.980-0.995x at 256, a tie at 128) and TP=4 gate_up folded with its wide build at M >= 8192
# (taken back: 1.014-1.016x); lay_s6 (c6a3634) the shrink slot by slot with the first order kernel (a tie, disabled
# 1.007-1.008x); lay_s7 and lay_s8 (4293238) with the rebuilt one, the committed tables over W1S in block order.
ORDER_LAYER = (("lay_s7", "picked_all_over_prev"), ("lay_s8", "picked_all_over_prev"))
COMMITTED_LAYER = (("lay_s10", "picked"),)  # the committed tables since down's window
PARTS_LAYER = (("lay_s7", "picked"), ("lay_s8", "picked"))  # the tables before it: parts_s1, parts_s2 ran them
PREVIOUS_LAYER = (("lay_s1", "picked"), ("lay_s2", "picked"))


# gate_up's wide shrink with its blocks slot by slot (`lora_shrink_packed(slot_order=True)`), the shrink alone at
# qwen3's gate_up (studies/kernels/record_order.py, each arm a CUDA graph): ord_s2 (c6a3634) and ord_s3 (4293238),
# two machines. The order given (`*_slot_over_expert`) is the same quantity in both; with its computation
# (`*_slot_paid_over_expert`) ord_s2 ran the first order kernel (steps of 256 blocks, the keys gathered twice), ord_s3
# the rebuilt one (one step). ord_s1 (d1abd34) ran eagerly (Triton's host time in every arm) with the order by torch
# operations: a first look only. Counters ord_n1, ord_n2 (M = 8192, one launch each). gate_up's wide path with the
# ordered shrink over W1S in block order (`path_wide_blk_w1o_over_w1`): wg_s7, wg_s8 (the rebuilt kernel; wg_s6 the
# first).
ORDER_SESSIONS = ("ord_s2", "ord_s3")
ORDER_NCU_RUNS = ("ord_n1", "ord_n2")
ORDER_PATH_SESSIONS = ("wg_s7", "wg_s8")
# down's window of two slots: the wide section's down rows with the window's arms (dwin_s1, one
# session: the path over the layer's path on the ordered alignment, `path_wide_win_over_ordc`, and the share of the
# sets whose every block fit a window, `win_held`); the layer with it over the tables without it: lay_s9 (the window
# at 8192 and 16384) and lay_s10 (at 16384, the committed table)
WINDOW_SESSIONS = ("dwin_s1",)
WINDOW_LAYER = (("lay_s9", "picked_all_over_prev"), ("lay_s10", "picked_all_over_prev"))


def down_window(names: tuple[str, ...] = WINDOW_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """Per session, preset and M of the wide section's down rows that ran the window: how often it held
    (`win_held`), the path with it over the layer's path without (`path_wide_win_over_ordc`) and, with every adapter
    disabled, over the plain GEMM (`path_wide_win_off_over_base`), each with its bootstrap 95 % interval."""
    out = []
    for n in names:
        k = load_fold_run(n, path).section("wide")
        k = k[(k.op == "down") & k.win_held.notna()].copy()
        k.insert(0, "session", n)
        cols = ["session", "preset", "M", "win_held"]
        for f in ("path_wide_win_over_ordc", "path_wide_win_off_over_base"):
            cols += [f, f"{f}_lo", f"{f}_hi"]
        out.append(k[cols + ["path_wide_win_us", "path_wide_ordc_us"]])
    return pd.concat(out, ignore_index=True)


def shrink_order_trials(names: tuple[str, ...] = ORDER_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The shrink-order probe's paired ratios per session, M and figure (`slot_over_expert`: the order given;
    `slot_paid_over_expert`: with its computation; `requests_over_random`), per adapter mapping (random, requests),
    in `section_ratios`' long form (session, preset, op, M, figure, value, lo, hi): `ratio_spread` reads it."""
    rows = []
    for n in names:
        t = tidy.rows("shrink_order", n, path)
        for _, r in t.iterrows():
            for col in t.columns:
                if "_over_" in col and not col.endswith(("_lo", "_hi")):
                    rows.append(dict(session=n, preset=r.preset, op=r.op, M=int(r.M), figure=col, value=float(r[col]),
                                     lo=float(r[f"{col}_lo"]), hi=float(r[f"{col}_hi"])))
    return pd.DataFrame(rows)


def shrink_order_counters(names: tuple[str, ...] = ORDER_NCU_RUNS, path: str | Path | None = None) -> pd.DataFrame:
    """ncu's counters of the shrink in block order (`*_expert`) and slot by slot (`*_slot`), per mapping, M = 8192."""
    c = pd.concat([tidy.rows("shrink_order", n, path, ncu=True).assign(session=n) for n in names], ignore_index=True)
    return c[["session", "arm", "duration_us", "dram_pct_peak", "dram_bytes_over_floor", "l2_hit_pct",
              "achieved_occupancy_pct", "top_stall"]].reset_index(drop=True)


def wide_trials(names: tuple[str, ...] = WIDE_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The wide section's figures per session (`section_ratios`): the wide GEMM alone and with nothing live over the
    plain GEMM (`gemm_wide_over_base`, `off_wide_over_base`), the plain GEMM on the wide tensors' views
    (`base_view_over_base`), the path end to end over the committed packed path (`path_wide_over_committed`,
    `path_wide_w1_over_committed`: the ordered alignment with the W1S shrink) and over the separate delta, disabled
    over the plain GEMM (`path_*_off_over_base`), LoRA's added time in % of the plain GEMM (`*_added_pct`) and, since
    wg_s6, gate_up's per-block path with its shrink slot by slot over W1S in block order
    (`path_wide_blk_w1o_over_w1`)."""
    return section_ratios(names, "wide", ("_over_base", "_over_committed", "_over_separate", "_over_w1", "_added_pct"),
                          path)


def wide_layer(runs: tuple[tuple[str, str], ...] = WIDE_LAYER, path: str | Path | None = None) -> pd.DataFrame:
    """The layer with the wide build over the layer without it, per session (WIDE_LAYER), preset and M: value, lo,
    hi (paired, bootstrap 95 %)."""
    t = layer_tables(tuple(n for n, _ in runs), path)
    return pd.concat([t[(t.session == n) & (t.figure == f)] for n, f in runs], ignore_index=True)


def wide_counters(name: str = WIDE_NCU_RUN, path: str | Path | None = None) -> pd.DataFrame:
    """ncu's counters of the wide build's down path beside the committed packed path (`packed_slot_w1s`) at M = 8192,
    both presets: one profiled launch of each shrink and GEMM, never a timing."""
    c = fold_counters_of((name,), path)
    return c[c.op.str.endswith("down")][["preset", "op", "arm", "duration_us", "dram_pct_peak", "tensor_pipe_pct",
                                          "achieved_occupancy_pct", "registers", "instructions", "top_stall",
                                          "top_stall_ratio"]].reset_index(drop=True)


def wide_gate_up_trials(names: tuple[str, ...] = WIDE_GU_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """gate_up's rows of the wide section (`wide_trials`) per session: over all C columns (`path_wide*`, `gemm_wide`)
    and per block (`*_blk*`), against the committed packed path, the separate delta and the plain GEMM."""
    t = wide_trials(names, path)
    return t[t.op == "gate_up"].reset_index(drop=True)


def wide_gate_up_counters(names: tuple[str, ...] = WIDE_GU_NCU_RUNS, path: str | Path | None = None) -> pd.DataFrame:
    """ncu's counters of gate_up's shrink and GEMM at M = 8192, both presets: the wide build per block (`wide_blk`),
    over all columns (`wide_both`) and the committed packed path (`packed_slot_w1s`); one profiled launch each."""
    c = fold_counters_of(names, path)
    return c[c.op.str.endswith("gate_up")][["preset", "op", "arm", "duration_us", "dram_pct_peak", "tensor_pipe_pct",
                                             "achieved_occupancy_pct", "registers", "top_stall",
                                             "dram_bytes_over_floor"]].reset_index(drop=True)


def packed_tile_layer(runs: tuple[tuple[str, str], ...] = TILE_LAYER, path: str | Path | None = None) -> pd.DataFrame:
    """The layer with the packed GEMM's tile per shape over the layer without it, per session (TILE_LAYER), preset
    and M: value, lo, hi (paired, bootstrap 95 %)."""
    t = layer_tables(tuple(n for n, _ in runs), path)
    return pd.concat([t[(t.session == n) & (t.figure == f)] for n, f in runs], ignore_index=True)


def expand_trials(names: tuple[str, ...] = EXPAND_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The expand section's ratios per session (`section_ratios`): the GEMM alone over the committed loop's
    (`gemm_*_over_loop`) and over the plain GEMM (`_over_base`), disabled over the plain GEMM (`off_*_over_base`),
    the path over the separate delta (`path_*_over_separate`) and per slot over the dense build (`_over_dense`)."""
    return section_ratios(names, "expand", ("_over_loop", "_over_base", "_over_separate", "_over_dense"), path)


# ncu's source view (SourceCounters: warp stall samples per SASS instruction) of the packed GEMM per slot at M = 8192,
# qwen3-30b-a3b gate_up then down, one profiled launch each (7218fc1's tree; `ncu --page source --print-source sass`).
SOURCE_VIEW = "exp_src"
SOURCE_VIEW_OPS = ("gate_up", "down")
# exp_src2 (33d68fb): the same two launches (`loop`), then the same GEMMs with the first step loaded before the K loop
# (`early`); ncu's default clock control (exp_src ran without it): compare samples within the file only.
SOURCE_VIEW2 = "exp_src2"
SOURCE_VIEW2_OPS = ("gate_up/loop", "down/loop", "gate_up/early", "down/early")


def packed_source_view(name: str = SOURCE_VIEW, path: str | Path | None = None,
                       ops: tuple[str, ...] = SOURCE_VIEW_OPS) -> pd.DataFrame:
    """Where the packed GEMM's warps were sampled, per op and region of its SASS: the K loop (the instructions
    executed most), the expand (executed more often than once per tile but less than the K loop: its steps), the rest
    of each tile (executed once per tile and warp: set-up, epilogue, stores) and the out-of-line retries of the
    barrier waits (executed 0 times in the counts, sampled while a wait spins). Per region: samples, their share, and
    the share of those on TMA waits (`SYNCS.PHASECHK` and the branch that retries it)."""
    import csv
    import gzip
    d = Path(path) if path is not None else KERNELS_DIR
    text = gzip.open(d / f"{name}_source_sass.csv.gz", "rt").read().splitlines()
    blocks, cur = [], None
    for ln in text:
        if ln.startswith('"Kernel Name"'):
            cur = []
            blocks.append(cur)
        elif cur is not None:
            cur.append(ln)
    rows = []
    if len(blocks) != len(ops):
        raise ValueError(f"{name}: the source view holds {len(blocks)} launches, {len(ops)} names given: {ops}")
    for op, b in zip(ops, blocks):
        recs = list(csv.reader(b))
        hdr, data = recs[0], recs[1:]
        iS, iE = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
        ins = [(r[1].strip(), int(r[iS] or 0), int(r[iE] or 0)) for r in data]
        loop = max(e for _, _, e in ins)
        tile = int(pd.Series([e for _, _, e in ins if 0 < e < loop]).mode().iloc[0])
        total = sum(smp for _, smp, _ in ins)
        regions: dict = {}
        for k, (src, smp, e) in enumerate(ins):
            reg = ("K loop" if e == loop else "expand" if tile < e < loop else "rest of the tile" if e > 0
                   else "wait retries")
            wait = "PHASECHK" in src or ("BRA" in src and k and "PHASECHK" in ins[k - 1][0])
            a = regions.setdefault(reg, [0, 0])
            a[0] += smp
            a[1] += smp if wait else 0
        for reg, (smp, wt) in regions.items():
            rows.append(dict(op=op, region=reg, samples=smp, share=smp / total, on_tma_waits=wt / max(smp, 1)))
    return pd.DataFrame(rows)


def committed_layer(runs: tuple[tuple[str, str], ...] = COMMITTED_LAYER,
                    path: str | Path | None = None) -> pd.DataFrame:
    """LoRA's share of the layer (%, paired, bootstrap 95 %) at the committed table per session, preset and M: every
    adapter active (`all`) and every adapter disabled with every kernel launched (`none`), beside the separate
    deltas (`separate`)."""
    t = layer_tables(tuple(n for n, _ in runs), path)
    arm = dict(runs)
    rows = []
    for (name, preset, M), g in t.groupby(["session", "preset", "M"], sort=False):
        fig = g.set_index("figure")
        row = dict(session=name, preset=preset, M=M, arm=arm[name])
        for out, col in (("all", f"{arm[name]}_all_share_pct"), ("none", f"{arm[name]}_none_share_pct"),
                         ("separate", "separate_all_share_pct")):
            row.update({out: fig.value[col], f"{out}_lo": fig.lo[col], f"{out}_hi": fig.hi[col]})
        rows.append(row)
    return pd.DataFrame(rows)


def layer_tables(names: tuple[str, ...] = LAYER_TABLE_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The layer section's figures per session (`section_ratios`): LoRA's share of the layer per arm (`*_share_pct`),
    the committed table over the previous one (`picked_all_over_prev`) and the candidate over the committed one
    (`cand_all_over_picked`)."""
    return section_ratios(names, "layer", ("_share_pct", "_over_prev", "_over_picked"), path)


def packed_table(run: BaseRun | None = None) -> pd.DataFrame:
    """Per (preset, op, M): the base GEMM (µs), the packed build over the separate delta with its LoRA alignment
    (one dot over every slot, `packed`; one per slot on the ordered alignment, `packed_slot`, its extra alignment
    time included), every adapter disabled over the base (both kernels, `packed_off`; the GEMM alone,
    `gemm_packed_off`), paired ratios with bootstrap 95 %; LoRA's added time in % of the base GEMM per path."""
    k = (run or load_fold_run(PACKED_SESSIONS[-1])).section("packed")
    cols = ["preset", "op", "M", "base_us", "separate_us", "packed_us", "packed_slot_us", "lora_align_us"]
    for nm in ("packed_over_separate", "packed_slot_over_separate", "packed_off_over_base",
               "gemm_packed_off_over_base", "separate_added_pct", "packed_added_pct", "packed_slot_added_pct"):
        cols += _ci(nm)
    return k.reindex(columns=cols + ["stable"]).reset_index(drop=True)


def packed_layer(run: BaseRun | None = None) -> pd.DataFrame:
    """Per (preset, M): one MoE layer without LoRA (µs) and LoRA's share of it (%, paired, bootstrap 95 %) with the
    separate deltas, with both GEMMs packed at every size, with every adapter disabled on that path, with only the
    down GEMM packed, and as the committed table picks (`picked_all`; `picked_none`: every adapter disabled)."""
    k = (run or load_fold_run(PACKED_SESSIONS[-1])).section("layer")
    cols = ["preset", "M", "base_us"]
    for nm in ("separate_all", "packed_all", "packed_none", "packed_down", "picked_all", "picked_none"):
        cols += _ci(f"{nm}_share_pct")
    cols += _ci("packed_down_over_separate") + _ci("picked_over_separate") + ["stable"]
    return k.reindex(columns=cols).reset_index(drop=True)


def packed_sessions(names: tuple[str, ...] = PACKED_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The packed build's headlines per (figure, preset, op, M) in each session and between them
    (stats.between_sessions): packed and packed_slot over separate, the disabled GEMM over the base, and LoRA's
    share of the layer with the separate deltas and as the committed table picks (over PACKED_FIGURE_SESSIONS)."""
    figs = {}
    for name in names:
        run = load_fold_run(name, path)
        t = packed_table(run)
        lay = packed_layer(run) if "layer" in set(run.rows["section"]) else None  # fold_s16: the packed section only
        _gather(figs, name, (("packed_over_separate", t), ("packed_slot_over_separate", t),
                             ("gemm_packed_off_over_base", t)),
                () if lay is None else (("separate_all_share_pct", lay), ("picked_all_share_pct", lay),
                                        ("picked_none_share_pct", lay), ("picked_over_separate", lay)),
                PACKED_FIGURE_SESSIONS, names)
    return _session_rows(figs)


def packed_choice(sessions: pd.DataFrame | None = None) -> dict:
    """Per op: the token buckets where the build the layer takes there (one dot per slot at
    configs.PACKED_PER_SLOT_TOKENS, else one dot over every slot) beat the separate delta on both presets in every
    session (`wins`: every interval below 1) and where it lost on some preset (`loses`: an interval at or above 1)."""
    from . import plan_views as configs
    s = sessions if sessions is not None else packed_sessions()
    out = {}
    for op in ("gate_up", "down"):
        wins, loses = set(), set()
        for M, g in s[s.op == op].groupby("M"):
            b = configs.token_bucket(int(M))
            fig = "packed_slot_over_separate" if b in configs.PACKED_PER_SLOT_TOKENS else "packed_over_separate"
            r = g[g.figure == fig]
            if len(r) and (r.hi < 1).all() and r.preset.nunique() == 2:
                wins.add(b)
            if (r.lo >= 1).any():
                loses.add(b)
        out[op] = dict(wins=wins, loses=loses)
    return out


def packed_check(names: tuple[str, ...] = PACKED_CHECK_RUNS, path: str | Path | None = None,
                 op: str = "random_packed") -> pd.DataFrame:
    """The packed build's GPU differentials: per run, its random cases, failures and worst error (where it finished
    them) and its presets' points and failures (fold_s12c's and fold_s13c's logs: the 1000 random cases did not fit
    their calls; fold_s14c ran them alone)."""
    rows = []
    for name in names:
        if not tidy.has("kernels_fold", name, path):
            continue
        rnd, pre = fold_check(name, path)
        r = rnd[rnd.op == op]
        rows.append(dict(run=name, cases=int(r.cases.sum()), failures=int(r.failures.sum()),
                         worst=float(r.worst.max()), preset_points=len(pre),
                         preset_failures=int((~pre.ok.astype(bool)).sum()) if len(pre) else 0))
    return pd.DataFrame(rows)


def wide_check(names: tuple[str, ...] = WIDE_CHECK_RUNS, path: str | Path | None = None) -> pd.DataFrame:
    """The wide build's GPU differential (`packed_check` of its random cases)."""
    return packed_check(names, path, op="random_wide")


def packed_counters(run: BaseRun | None = None, base: BaseRun | None = None, M: int = 8192) -> pd.DataFrame:
    """The packed build's shrink and GEMM under ncu at M (`packed`, `packed_slot`) beside the plain GEMM at the same
    tile (NCU_NOW_RUN's `table` arm: today's tables) and the rows build (`folded_rows`): one profiled launch each."""
    run = run or load_fold_run(PACKED_SESSIONS[0])
    t = fold_counters(run, base or load_base_run(NCU_NOW_RUN), M)  # the plain GEMM at today's tables
    return t[t.arm.isin(["plain", "folded_rows", "packed", "packed_slot"])].reset_index(drop=True)


def gemm_share(run: BaseRun | None = None) -> pd.DataFrame:
    """Per (preset, M): LoRA's share of the layer's two GEMMs, (gate_up delta + down delta) over
    (gate_up + down base GEMM), for the separate deltas and the folded path (medians of the paired
    repetitions; the GEMMs only: router, alignment, SiLU and the top-k sum are not in it)."""
    t = fold_table(run)
    g = t.groupby(["preset", "M"], sort=False)[["base_us", "delta_separate_us", "delta_folded_us"]].sum()
    g["separate_share"] = g.delta_separate_us / g.base_us
    g["folded_share"] = g.delta_folded_us / g.base_us
    return g.reset_index()


def fold_counters(run: BaseRun | None = None, base: BaseRun | None = None, M: int = 8192) -> pd.DataFrame:
    """The folded path's kernels under ncu at M (shrink and GEMM per build: `folded` TMA expand, `folded_ptr`
    pointer expand, `folded_rows` ordered alignment + per-row shrink; both presets and GEMMs) beside the
    plain GEMM at the same tile (the canonical base run's `table` arm): registers, achieved occupancy,
    tensor pipe, DRAM, instructions, top stall. Counters of one profiled launch each, never a timing."""
    run, base = run or load_fold_run(FOLD_NCU_RUN), base or load_base_run()
    cols = ["preset", "op", "arm", "kernel", "duration_us", "registers", "achieved_occupancy_pct", "tensor_pipe_pct",
            "dram_pct_peak", "dram_bytes_over_floor", "instructions", "top_stall"]
    f = run.ncu[run.ncu.M == M].reindex(columns=cols)
    b = base.ncu[(base.ncu.M == M) & (base.ncu.arm == "table") & base.ncu.op.str.startswith("base_")]
    b = b.reindex(columns=cols)
    b["op"], b["arm"] = "plain_" + b.op.str[len("base_"):], "plain"
    return pd.concat([b, f]).sort_values(["preset", "op", "arm"]).reset_index(drop=True)


# ------------------------------------------------------------------------------------------------
# Counters per kernel (Nsight Compute, one profiled launch each: counters, never a live timing)
# ------------------------------------------------------------------------------------------------
def load_counters(name: str = NCU_NOW_RUN, path: str | Path | None = None) -> pd.DataFrame:
    """One ncu session's parsed counters (`<name>_kernels_base_ncu.csv`), with each launch's DRAM bytes per
    second over the canonical run's measured device-to-device copy (`of_copy`: the share of the bandwidth a
    copy reaches, the ceiling a streaming kernel can approach)."""
    if not tidy.has("kernels_base", name, path, ncu=True):
        raise FileNotFoundError(f"no counters of {name!r} in {tidy._dir(path) / 'kernels_base_ncu.csv'}: "
                                "studies/kernels/record_base.py --ncu-run under ncu writes them")
    c = tidy.rows("kernels_base", name, path, ncu=True)
    copy_gbps = schemas.read_json(KERNELS_DIR / "kernels.meta.json")["copy_gbps"]
    c["dram_gbps"] = (c.dram_read_bytes + c.dram_write_bytes) / (c.duration_us * 1e3)
    c["of_copy"] = c.dram_gbps / copy_gbps
    return c


def kernel_counters(ncu: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per kernel as the layer runs it (the base GEMM with the table's tile, the LoRA delta: decode kernel
    or aligned kernel) and representative M: DRAM throughput (% of peak, and of copy bandwidth), bytes moved
    over the byte floor, achieved occupancy, L2 hit rate and the top stall reason."""
    c = load_counters() if ncu is None else ncu
    c = c[c.arm.isin(["table", "decode"])].copy()
    c["kernel"] = c.kernel.where(c.arm != "decode", "lora_decode_kernel")
    c["path"] = c.op.str.split("_").str[0].map({"base": "base GEMM", "lora": "LoRA delta"})
    c["gemm"] = c.op.str.split("_", n=1).str[1]
    cols = ["preset", "path", "gemm", "M", "kernel", "tile", "duration_us", "dram_pct_peak", "of_copy",
            "dram_bytes_over_floor", "achieved_occupancy_pct", "l2_hit_pct", "registers", "top_stall"]
    return c.reindex(columns=cols).sort_values(["preset", "path", "gemm", "M"]).reset_index(drop=True)


def counter_sessions(a: str = BASE_RUN, b: str = NCU_RUN, path: str | Path | None = None) -> pd.DataFrame:
    """The launches both ncu sessions counted (same preset, op, M and build: the tile string; the LoRA deltas, which
    have none, by arm), side by side: duration, DRAM % of peak and bytes over floor in each. `arm` is a's name of the
    launch. Counters of one launch are exact for that launch; the spread between sessions is what a reader should
    take as their precision."""
    def build(name):
        t = tidy.rows("kernels_base", name, path, ncu=True)
        t["build"] = t.tile.fillna("").astype(str).where(t.tile.fillna("").astype(str) != "", "lora:" + t.arm)
        return t.drop_duplicates(["preset", "op", "M", "build"])

    x, y = build(a), build(b)
    key = ["preset", "op", "M", "arm"]
    m = x.merge(y.drop(columns="arm"), on=["preset", "op", "M", "build"], suffixes=(f"_{a}", f"_{b}"))
    keep = key + [f"{v}_{s}" for v in ("duration_us", "dram_pct_peak", "dram_bytes_over_floor") for s in (a, b)]
    m = m[keep].copy()
    m["duration_ratio"] = m[f"duration_us_{b}"] / m[f"duration_us_{a}"]
    return m.reset_index(drop=True)


H200_SMS = 132


def fold_disabled_cost(run: BaseRun | None = None, sms: int = H200_SMS) -> pd.DataFrame:
    """The folded GEMM with every adapter disabled (the layer's build, `gemm_rows_off`) against the plain GEMM,
    per (preset, op, M >= 1024), with the time it adds per tile an SM runs: extra / (tiles / SMs). Tiles are
    the expected busy blocks (each expert's pair count Binomial(M, top_k / E), ceil-divided by BLOCK_M) times
    the N tiles of the table's BLOCK_N; an estimate from the routing's statistics, not a count of the run.
    A constant per tile is what a latency chain in the epilogue would add (studies/kernels/README.md)."""
    import numpy as np
    from scipy.stats import binom

    from lora_moe_lab.config import get_shape
    from lora_moe_lab.kernels import configs, tiles

    run = run or load_fold_run()
    k = run.rows[run.rows["section"] == "kernels"]
    out = []
    for _, r in k[k["M"] >= 1024].iterrows():
        sh = get_shape(r["preset"])
        entry = tiles.lookup(sh.num_experts, sh.hidden, sh.intermediate, configs.token_bucket(int(r["M"])),
                             gpu="NVIDIA H200")
        tile = entry[r["op"]]
        n_cols = 2 * sh.intermediate if r["op"] == "gate_up" else sh.hidden
        n = np.arange(int(r["M"]) + 1)
        blocks = sh.num_experts * float((binom.pmf(n, int(r["M"]), sh.top_k / sh.num_experts)
                                         * np.ceil(n / entry["block_m"])).sum())
        n_tiles = blocks * -(-n_cols // tile["block_n"])
        extra = r["gemm_rows_off_us"] - r["base_us"]
        out.append(dict(preset=r["preset"], op=r["op"], M=int(r["M"]), block_n=tile["block_n"],
                        num_warps=tile["num_warps"], base_us=r["base_us"], disabled_us=r["gemm_rows_off_us"],
                        ratio=r["gemm_rows_off_over_base"], ratio_lo=r["gemm_rows_off_over_base_lo"],
                        ratio_hi=r["gemm_rows_off_over_base_hi"], tiles=n_tiles, tiles_per_sm=n_tiles / sms,
                        extra_us=extra, extra_us_per_tile_per_sm=extra / (n_tiles / sms)))
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------------
# Persistent builds of the base GEMM and the down delta's pipelined expand (the twelfth session)
# ------------------------------------------------------------------------------------------------
# studies/kernels/record_base.py --sections persist, in rounds: each round's arms against the tables its sessions ran
# with
# (round 2 with the tables round 1 adopted), the tables taking what qualified in every session of a round. Round 1:
# two device sessions (603effa). Round 2: persist_s3 and persist_s4 (one device session, two runs; adopted from
# them, ae11ba7) and persist_s5 (a fresh machine, against the tables before that adoption: prev_tables).
# round 3 (b58590e, two fresh machines): look-ahead, half-N and half-height arms, also at M = 1 and 16; persist_s6
# (5d0beeb, a third machine) timed the same tables before the half arms and the small M; the docs read it beside them
PERSIST_ROUNDS = (("persist_s1", "persist_s2"), ("persist_s3", "persist_s4", "persist_s5"),
                  ("persist_s7", "persist_s8"))
PERSIST_SESSIONS = PERSIST_ROUNDS[0]
STAGES_SESSIONS = ("stages_s1", "stages_s2", "stages_s3")  # record_expand.py --sections sweep --candidates
# stages (stages_s3 also times M = 64 and 128, and the down tile over 8 warps)


def persist_choices(sessions) -> dict:
    """(preset, op, M) -> the persist row of the arm to adopt, from one or more sessions' persist rows (lists of
    dicts): an arm qualifies where every session has it free of drift with the upper bound of its paired ratio
    against the table's tile below 0.99; of those, the arm whose worst session ratio is least."""
    def key(q):
        return q["preset"], q["op"], int(float(q["M"]))

    per = []
    for rows in sessions:
        d = {}
        for q in rows:
            if q.get("section") == "persist" and q.get("arm") not in (None, "", "table"):
                d[key(q) + (q["arm"],)] = q
        per.append(d)
    picks = {}
    for k in per[0]:
        qs = [d.get(k) for d in per]
        if all(q is not None and str(q["stable"]) == "True" and float(q["over_table_hi"]) < 0.99 for q in qs):
            worst = max(qs, key=lambda q: float(q["over_table"]))
            if k[:3] not in picks or float(worst["over_table"]) < float(picks[k[:3]]["over_table"]):
                picks[k[:3]] = dict(worst, sessions=len(qs))
    return picks


def persist_sessions(names=PERSIST_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """Per (preset, op, M, arm): the paired ratio arm / table's tile in each session (`r_<name>`, `lo_`, `hi_`,
    `stable_`), and `adopted`: the arm the tables took (persist_choices over every session)."""
    runs = [load_base_run(n, path) for n in names]
    picks = persist_choices([r.rows.to_dict("records") for r in runs])
    out = None
    for r in runs:
        p = r.section("persist")
        p = p[p.arm != "table"][["preset", "op", "M", "arm", "tile", "over_table", "over_table_lo", "over_table_hi",
                                 "stable", "time_us"]].rename(columns={
            "over_table": f"r_{r.name}", "over_table_lo": f"lo_{r.name}", "over_table_hi": f"hi_{r.name}",
            "stable": f"stable_{r.name}", "time_us": f"us_{r.name}", "tile": f"tile_{r.name}"})
        out = p if out is None else out.merge(p, on=["preset", "op", "M", "arm"], how="outer")
    out["adopted"] = [picks.get((x.preset, x.op, int(x.M)), {}).get("arm") == x.arm for x in out.itertuples()]
    return out.reset_index(drop=True)


def stages_sessions(names=STAGES_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The down delta per (preset, M) in each session that has it: the hand-pipelined build (`pf2`, the table
    before) against Triton's pipelined expand of 3 stages (`xs3`, the table after), sweep medians of graph
    replays (not paired: the sweep's method) and their fractions of the measured copy bandwidth."""
    rows = []
    for n in names:
        if not tidy.has("kernels_expand", n, path):
            continue
        s = tidy.rows("kernels_expand", n, path)
        s = s[(s.section == "sweep") & (s.op == "down")]
        for (pre, M), g in s.groupby(["preset", "M"]):
            tile = g.config.str.contains("/bn128/") & g.config.str.contains("/w4/")  # stages_s3 adds an 8-warp xs3
            old, new = g[tile & g.config.str.contains("/pf2")], g[tile & g.config.str.endswith("/xs3")]
            if old.empty or new.empty:
                continue
            o, w = old.iloc[0], new.iloc[0]
            rows.append(dict(session=n, preset=pre, M=int(M), pf2_config=o.config, pf2_us=o.time_us,
                             pf2_of_copy=o.bw_frac, xs3_us=w.time_us, xs3_of_copy=w.bw_frac,
                             xs3_over_pf2=w.time_us / o.time_us, xs3_regs=w.regs, xs3_shared=w.shared))
    return pd.DataFrame(rows)
