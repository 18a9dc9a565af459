"""The canonical GPU recordings and the ONE loader each is read through: the guards (below), the
graph strategies (`load_graph_strategies`) and the kernel runs (`load_kernel_run`). Each loader takes
the path(s) it is handed; without one it asks the catalog (data/catalog.json: `provenance.catalog`)
and names no file itself.

    rec = load_guards()                 # catalog "guards": every session's file (+ .meta.json)
    rec.label                           # "s1: H200 · commit 1a2b3c4 · 2026-12-01; s2: ..." for captions
    rec.sessions                        # ["s1", "s2"]
    rec.warmup()                        # per session and point: repetitions kept, dropped as drift, status
    rec.summary()                       # per point and variant: median, its 95 % interval, n kept
    rec.paired("sync", "cpu_flag")      # per point: sync/cpu_flag and the time lost per sync, each
                                        # with its paired bootstrap 95 % interval; two sessions pooled
    rec.paired(..., by_session=True)    # the same per session (the between-session spread)

The recording holds every repetition (one row per sample), not only a median: the repetitions were
interleaved (each repetition runs every variant back to back in a rotating order, each from an
idle GPU), so the difference of two variants within one repetition is a paired measurement.

Warm-up (studies/guards/record.py records it; `warmup_check` is the rule): every arm's
repetitions are checked with `stats.drop_warmup`; the largest leading drift over the arms is
dropped from all of them, so the pairs stay pairs (`warmup_drift` marks those rows; they stay in
the file). A point where any arm never settles has `status` "unstable": its figures are NaN, not
averaged. A file recorded before the check (the archived one, catalog "guards.archived", read only when named)
reads as "unchecked":
every repetition, as recorded; `load_guards(path, check_warmup=True)` applies the check to it.

Intervals (the methods are named in every table, `METHOD_*`):
- a median: the order-statistic interval (stats.median_ci, distribution-free; n >= 6);
- sync/cpu_flag (ratio of the medians) and the lost time (median of the paired differences): the
  percentile bootstrap of the kept pairs (stats.bootstrap_paired; n >= 10; below that the
  order-statistic interval of the differences, and the `method` column says so);
- two sessions: stats.between_sessions: the mean of the two estimates with the union of the two
  intervals, `agree` False where they do not overlap: the reader gets the wider, honest range.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ...provenance import catalog, label as _label, normalize_meta
from . import schemas, stats
from .schemas import RecordingError  # noqa: F401  (what a damaged or foreign recording raises)
from .stats import METHOD_BOOT, METHOD_MEDIAN, MIN_PAIRED_REPS, OK, UNSTABLE, WarmupCheck, warmup_check  # noqa: F401

# The recorder's layout (studies/guards/record.py): <gpu>_guards_<session>.csv, one file per device session.
# The canonical files are the catalog's "guards"; its "guards.archived" (recorded before the warm-up check) is
# read only when asked for by name.
SESSION_GLOB = "*_guards_s*.csv"
KEYS = ["preset", "layers", "tokens", "active"]
SAMPLE_COLUMNS = KEYS + ["variant", "guard", "mode", "rep", "us", "syncs_per_forward"]  # every file has these
CHECK_COLUMNS = ["session", "warmup_drift", "status", "position"]  # written since the warm-up check
UNCHECKED = "unchecked"
METHOD_SESSIONS = ("between sessions (stats.between_sessions): the mean of the sessions' estimates with the union "
                   "of their 95 % intervals; flagged where the intervals do not overlap")
METHOD_WARMUP = ("stats.drop_warmup on every arm's repetitions in time order; the largest leading drift over the "
                 "arms is dropped from all arms (pairs stay pairs); an arm that never settles makes the point "
                 "unstable (not averaged)")
METHOD_DIFF_MEDIAN = "order-statistic 95 % interval of the median paired difference (n < 10: no bootstrap)"


def median_ci(x, conf: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi): stats.median_ci, lenient for old callers: no sample -> NaNs; too few for
    this confidence -> an unbounded interval (-inf, inf) instead of an error, never a false one."""
    a = np.asarray(x, dtype=float).ravel()
    if not len(a):
        return (math.nan, math.nan, math.nan)
    try:
        return stats.median_ci(a, conf)
    except stats.TooFewRepetitions:
        return (float(np.median(a)), -math.inf, math.inf)


# ----------------------------------------------------------------------------------------------
# The warm-up rule lives in stats (warmup_check, WarmupCheck); re-exported here for the recorder.
def mark_warmup(samples: pd.DataFrame, *, min_keep: int = MIN_PAIRED_REPS) -> pd.DataFrame:
    """The samples with `warmup_drift` and `status` set by `warmup_check`, per session and point
    (a file recorded before the check, or a synthetic one). Nothing is removed."""
    df = samples.copy()
    if "session" not in df:
        df["session"] = ""
    df["warmup_drift"], df["status"] = False, OK
    for _, g in df.groupby(["session"] + KEYS, sort=False):
        wide = g.pivot_table(index="rep", columns="variant", values="us", aggfunc="first").sort_index()
        c = warmup_check({v: wide[v].to_numpy() for v in wide.columns}, min_keep=min_keep)
        df.loc[g.index, "status"] = c.status
        df.loc[g.index, "warmup_drift"] = g["rep"].isin(wide.index[:c.dropped]).to_numpy()
    return df


# ----------------------------------------------------------------------------------------------
def combine_sessions(figs: Sequence[tuple[float, float, float]]) -> dict:
    """Several sessions' (estimate, lo, hi) of one figure -> what the reader sees (stats.between_sessions)."""
    return stats.between_sessions(*figs)


def _pair_figures(a: np.ndarray, b: np.ndarray) -> dict:
    """One session's paired figures of one point: medians with their order-statistic intervals,
    the ratio of the medians and the median paired difference with their bootstrap intervals."""
    n = len(a)
    out = {}
    for k, x in (("t_variant", a), ("t_baseline", b)):
        out[f"{k}_us"], out[f"{k}_lo95_us"], out[f"{k}_hi95_us"] = median_ci(x)
    if n >= MIN_PAIRED_REPS:
        out["lost_us"], out["lost_lo95_us"], out["lost_hi95_us"] = stats.bootstrap_paired(a, b, "median_diff")
        out["ratio"], out["ratio_lo95"], out["ratio_hi95"] = stats.bootstrap_paired(a, b, "ratio_of_medians")
        out["method"] = METHOD_BOOT
    else:  # an old or synthetic file with fewer repetitions: the difference's order-statistic interval
        out["lost_us"], out["lost_lo95_us"], out["lost_hi95_us"] = median_ci(a - b)
        r, rlo, rhi = median_ci(a / b)
        out["ratio"], out["ratio_lo95"], out["ratio_hi95"] = float(np.median(a) / np.median(b)), rlo, rhi
        out["method"] = METHOD_DIFF_MEDIAN
    return out


_PAIR_FIGS = ("t_variant_us", "t_baseline_us", "ratio", "lost_us")
_NAN_PAIR = {**{f: math.nan for f in ("t_variant_us", "t_variant_lo95_us", "t_variant_hi95_us", "t_baseline_us",
                                      "t_baseline_lo95_us", "t_baseline_hi95_us", "lost_us", "lost_lo95_us",
                                      "lost_hi95_us", "ratio", "ratio_lo95", "ratio_hi95")}, "method": ""}


def _lohi(fig: str) -> tuple[str, str]:
    if fig.endswith("_us"):
        return fig[:-3] + "_lo95_us", fig[:-3] + "_hi95_us"
    return fig + "_lo95", fig + "_hi95"


@dataclass
class Recording:
    samples: pd.DataFrame  # one row per repetition (SAMPLE_COLUMNS, and CHECK_COLUMNS since the warm-up check)
    meta: dict = field(default_factory=dict)  # one session's metadata; several: {"sessions": {label: meta}, ...}
    path: Path | None = None  # the file; several sessions: their folder
    paths: list = field(default_factory=list)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        s = self.samples
        if not {"session", "warmup_drift", "status"} <= set(s.columns):
            s = s.copy()
            if "session" not in s:
                s["session"] = self.meta.get("session") or (self.path.stem if self.path else "")
            if "warmup_drift" not in s:
                s["warmup_drift"] = False
            if "status" not in s:
                s["status"] = UNCHECKED
            self.samples = s
        self.samples["session"] = self.samples["session"].fillna("").astype(str)
        self.samples["warmup_drift"] = self.samples["warmup_drift"].astype(bool)
        if not self.paths and self.path is not None:
            self.paths = [self.path]

    @property
    def sessions(self) -> list[str]:
        return sorted(self.samples["session"].unique())

    @property
    def session_meta(self) -> dict:
        """label -> that session's metadata."""
        if "sessions" in self.meta:
            return self.meta["sessions"]
        return {s: self.meta for s in self.sessions}

    @property
    def label(self) -> str:
        if len(self.sessions) <= 1:
            return _label(self.meta)
        return "; ".join(f"{s}: {_label(m)}" for s, m in self.session_meta.items())

    @property
    def checked(self) -> bool:
        """Was the warm-up check applied (False: an archived file, read as recorded)?"""
        return not (self.samples["status"] == UNCHECKED).all()

    def warmup(self) -> pd.DataFrame:
        """Per session and point: repetitions recorded, dropped as warm-up drift, kept, the status
        (ok / unstable / unchecked) and a note, in the words the README uses."""
        rows = []
        for key, g in self.samples.groupby(["session"] + KEYS, sort=True):
            reps = g["rep"].nunique()
            dropped = g.loc[g["warmup_drift"], "rep"].nunique()
            status = g["status"].iloc[0]
            note = {UNSTABLE: f"unstable over {reps} repetitions: not averaged",
                    UNCHECKED: f"{reps} repetitions, recorded before the warm-up check"}.get(
                status, f"dropped the first {dropped} of {reps} repetitions as warm-up drift" if dropped
                else f"no warm-up drift in {reps} repetitions")
            if status != UNCHECKED and reps >= MIN_PAIRED_REPS:  # the rule's own words (which arm drifted)
                wide = g.pivot_table(index="rep", columns="variant", values="us", aggfunc="first").sort_index()
                c = warmup_check({v: wide[v].to_numpy() for v in wide.columns})
                if c.status == status and c.dropped == dropped:
                    note = c.note
            rows.append(dict(zip(["session"] + KEYS, key), reps=reps, dropped=dropped,
                             kept=0 if status == UNSTABLE else reps - dropped, status=status, note=note))
        return pd.DataFrame(rows)

    def kept(self) -> pd.DataFrame:
        """The repetitions the figures use: warm-up drift dropped, unstable points left out."""
        s = self.samples
        return s[~s["warmup_drift"] & (s["status"] != UNSTABLE)]

    # -- per variant ------------------------------------------------------------------------------
    def summary(self, by_session: bool = False) -> pd.DataFrame:
        """Per point and variant: median_us, lo95_us, hi95_us (order-statistic interval of the
        median of the kept repetitions), n kept, n_dropped, syncs_per_forward, status. Two sessions
        (by_session False): the pooled median with the union of the intervals (`agree`, `sessions`);
        an unstable point has NaN figures."""
        key = ("summary", by_session)
        if key in self._cache:
            return self._cache[key].copy()
        cols = KEYS + ["variant", "guard", "mode"]
        rows = []
        for k, g in self.samples.groupby(["session"] + cols, sort=True):
            status = g["status"].iloc[0]
            kept = g[~g["warmup_drift"]]
            med, lo, hi = (math.nan,) * 3 if status == UNSTABLE else median_ci(kept["us"])
            rows.append(dict(zip(["session"] + cols, k), median_us=med, lo95_us=lo, hi95_us=hi,
                             n=0 if status == UNSTABLE else len(kept), n_dropped=int(g["warmup_drift"].sum()),
                             syncs_per_forward=int(g["syncs_per_forward"].iloc[0]), status=status,
                             method=METHOD_MEDIAN))
        per = pd.DataFrame(rows)
        out = per if by_session else self._pool(per, cols, [("median_us", "lo95_us", "hi95_us")])
        self._cache[key] = out
        return out.copy()

    # -- paired -----------------------------------------------------------------------------------
    def paired(self, variant: str = "sync", baseline: str = "cpu_flag", by_session: bool = False) -> pd.DataFrame:
        """Per point: the medians of `variant` and `baseline` (t_variant_us, t_baseline_us, with
        their order-statistic intervals), their ratio and the median paired difference variant -
        baseline (lost_us), each with its paired bootstrap 95 % interval over the kept repetitions,
        the same per sync of `variant` (us_per_sync), n kept, n_dropped, status, method. Two
        sessions (by_session False): each figure pooled by `combine_sessions` (the wider interval),
        `agree` / `agree_ratio` False where the sessions' intervals do not overlap, `spread_*` the
        distance between the sessions' estimates. Unstable points: NaN figures, status 'unstable'."""
        key = ("paired", variant, baseline, by_session)
        if key in self._cache:
            return self._cache[key].copy()
        s = self.samples
        for v in (variant, baseline):
            if v not in set(s["variant"]):
                raise ValueError(f"no variant {v!r} in this recording; it has {sorted(s['variant'].unique())}")
        a = s[s["variant"] == variant][["session"] + KEYS
                                       + ["rep", "us", "syncs_per_forward", "warmup_drift", "status"]]
        b = s[s["variant"] == baseline][["session"] + KEYS + ["rep", "us", "warmup_drift"]].rename(
            columns={"us": "us_base", "warmup_drift": "drift_base"})
        j = a.merge(b, on=["session"] + KEYS + ["rep"], how="inner")
        rows = []
        for k, g in j.groupby(["session"] + KEYS, sort=True):
            status = g["status"].iloc[0]
            keep = g[~(g["warmup_drift"] | g["drift_base"])]
            n_sync = int(g["syncs_per_forward"].iloc[0])
            figs = (dict(_NAN_PAIR) if status == UNSTABLE
                    else _pair_figures(keep["us"].to_numpy(), keep["us_base"].to_numpy()))
            per = (lambda v: v / n_sync) if n_sync else (lambda v: math.nan)
            rows.append(dict(zip(["session"] + KEYS, k), variant=variant, baseline=baseline,
                             n=0 if status == UNSTABLE else len(keep), n_dropped=len(g) - len(keep), **figs,
                             syncs=n_sync, us_per_sync=per(figs["lost_us"]), us_per_sync_lo95=per(figs["lost_lo95_us"]),
                             us_per_sync_hi95=per(figs["lost_hi95_us"]), status=status))
        per = pd.DataFrame(rows)
        if by_session:
            out = per
        else:
            trip = [(f, *_lohi(f)) for f in _PAIR_FIGS] + [("us_per_sync", "us_per_sync_lo95", "us_per_sync_hi95")]
            out = self._pool(per, KEYS + ["variant", "baseline"], trip, keep=("syncs",))
            out = out.rename(columns={"agree_us_per_sync": "agree"})
        self._cache[key] = out
        return out.copy()

    def _pool(self, per: pd.DataFrame, cols: list[str], trip: list[tuple[str, str, str]],
              keep: tuple = ("syncs_per_forward",)) -> pd.DataFrame:
        """One row per point from the sessions' rows: every figure (est, lo, hi) by combine_sessions
        over the sessions whose point is usable (not unstable)."""
        rows = []
        for k, g in per.groupby(cols, sort=True):
            ok = g[g["status"] != UNSTABLE]
            row = dict(zip(cols, k))
            for c in keep:
                row[c] = g[c].iloc[0]
            row.update(n=int(ok["n"].min()) if len(ok) else 0, n_dropped=int(g["n_dropped"].sum()),
                       sessions=len(ok), session="+".join(ok["session"]) if len(ok) else "",
                       status=(UNSTABLE if ok.empty else UNCHECKED if (ok["status"] == UNCHECKED).any() else OK))
            row["stable"] = row["status"] != UNSTABLE
            if "method" in g:
                row["method"] = "; ".join(dict.fromkeys(m for m in ok["method"] if m))
            agree = True
            for e, lo, hi in trip:
                c = combine_sessions(list(zip(ok[e], ok[lo], ok[hi])))
                row[e], row[lo], row[hi] = c["estimate"], c["lo"], c["hi"]
                short = e[:-3] if e.endswith("_us") else e
                row[f"agree_{short}"], row[f"spread_{short}"] = c["agree"], c["spread"]
                agree &= c["agree"]
            row["agree_all"] = agree
            unst = g.loc[g["status"] == UNSTABLE, "session"].tolist()
            row["note"] = ("" if not unst else
                           f"unstable in {', '.join(unst)}: " + ("not averaged" if ok.empty else
                                                                 f"the figure rests on {row['session']} alone"))
            rows.append(row)
        return pd.DataFrame(rows)

    def as_sweep(self) -> pd.DataFrame:
        """The summary in the benchmark-sweep row schema (instruments/recorders/bench.py), for the simulator fit
        and the widgets: one row per point and variant, with the interval as p10/p90's successors.
        Unstable points are left out (nothing to fit on)."""
        d = self.summary()
        d = d[d["status"] != UNSTABLE].reset_index(drop=True)
        m = next(iter(self.session_meta.values()), {}) if "sessions" in self.meta else self.meta
        return pd.DataFrame(dict(
            gpu=m.get("gpu", ""), commit=self.meta.get("commit", ""), date=self.meta.get("date", ""),
            preset=d["preset"], layers=d["layers"], tokens=d["tokens"], guard=d["guard"], active=d["active"],
            rank=m.get("params", {}).get("rank", 16), mode=d["mode"], dtype="bfloat16", backend="triton",
            requests=m.get("params", {}).get("requests", 8), reps=d["n"], median_us=d["median_us"],
            lo95_us=d["lo95_us"], hi95_us=d["hi95_us"], syncs_per_forward=d["syncs_per_forward"], error=""))


def _read_one(path: Path, check_warmup: bool) -> tuple[pd.DataFrame, dict]:
    if not path.exists():
        raise FileNotFoundError(f"no recording at {path}: studies/guards/record.py writes it on a GPU")
    df = schemas.read_csv(path, "guards")  # the schema, the seal, an unterminated last line: RecordingError
    mp = path.with_name(path.stem + ".meta.json")
    meta = normalize_meta(schemas.read_json(mp)) if mp.exists() else {}
    if "session" not in df:
        df["session"] = meta.get("session") or meta.get("params", {}).get("session") or path.stem
    df["session"] = df["session"].astype(str)
    if check_warmup and "warmup_drift" not in df:
        df = mark_warmup(df)
    return df, meta


def session_files(folder: str | Path | None = None) -> list[Path]:
    """The session files of a folder (`*_guards_s*.csv`), in order; no folder: the catalog's "guards" (an entry
    that matches nothing is a FileNotFoundError naming it, never a switch to another recording)."""
    if folder is None:
        return catalog("guards")
    return sorted(Path(folder).glob(SESSION_GLOB))


def _canonical_guards() -> list[Path]:
    """The catalogued sessions (the archived recording is read only when asked for: catalog "guards.archived")."""
    return session_files()


def guards_dir() -> Path:
    """The folder of the canonical guards files (the catalog's sessions, else the archived recording)."""
    return _canonical_guards()[0].parent


def load_guards(path: str | Path | Sequence[str | Path] | None = None, *, check_warmup: bool = False) -> Recording:
    """The canonical guards recording, or another written by studies/guards/record.py.

    path None: the catalog's "guards" (a catalog entry that matches nothing is an error). A folder: its session files
    (`*_guards_s*.csv`) together, one
    session each; with none, its one `*_guards.csv` (the archived recording). A file: that file.
    A list of files: those, as sessions. check_warmup: apply the warm-up check to a file
    recorded without it (the rows are marked, none removed)."""
    if path is None:
        files = _canonical_guards()
    elif not isinstance(path, (str, Path)):
        files = [Path(p) for p in path]
    else:
        p = Path(path)
        if p.is_dir():
            files = session_files(p) or sorted(p.glob("*_guards.csv"))
            if len(files) != 1 and not session_files(p):
                raise FileNotFoundError(f"no recording in {p}: studies/guards/record.py writes "
                                        f"{p}/<gpu>_guards_<session>.csv on a GPU" if not files else
                                        f"{p} holds {len(files)} recordings without a session: pass one file")
        else:
            files = [p]
    if not files:
        raise FileNotFoundError("no recording given: studies/guards/record.py writes one on a GPU")
    read = [_read_one(f, check_warmup) for f in files]
    if len(read) == 1:
        df, meta = read[0]
        return Recording(df, meta, files[0], files)
    labels = [df["session"].iloc[0] for df, _ in read]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two files of the same session {labels}: each session needs its own label (--session)")
    _same_unit(read, files)
    metas = {lab: m for lab, (_, m) in zip(labels, read)}
    join = lambda k: " + ".join(dict.fromkeys(str(m.get(k, "")) for m in metas.values()))  # noqa: E731
    meta = dict(gpu=join("gpu"), commit=join("commit"), date=join("date"), sessions=metas,
                params=next(iter(metas.values())).get("params", {}))
    parents = {f.parent for f in files}
    return Recording(pd.concat([df for df, _ in read], ignore_index=True), meta,
                     parents.pop() if len(parents) == 1 else files[0], files)

UNIT_FACTOR = 20.0  # sessions of one GPU and code differ by percent, not by this factor: a factor is another unit


def _same_unit(read: list, files: list) -> None:
    """Sessions pooled must be in one unit: a session whose median time over the points it shares with the others
    is UNIT_FACTOR times theirs (or 1/UNIT_FACTOR) was written in ms or ns as µs -> RecordingError naming its file."""
    med = [df.groupby(KEYS + ["variant"])["us"].median() for df, _ in read]
    for i, m in enumerate(med):
        others = [o for j, o in enumerate(med) if j != i]
        ref = pd.concat(others, axis=1).median(axis=1)
        common = m.index.intersection(ref.index)
        if not len(common):
            continue
        factor = float(np.median(m[common].to_numpy() / ref[common].to_numpy()))
        if not 1 / UNIT_FACTOR < factor < UNIT_FACTOR:
            raise RecordingError(files[i], "header", f"column 'us': {factor:.3g}x the other sessions' times at the "
                                                     f"same {len(common)} points: another unit (ms or ns as µs)?")


# ----------------------------------------------------------------------------------------------
# The graph-strategies recording (studies/graphs/record.py -> strategies_*; catalog "graphs.strategies")
STRATEGY_KEYS = ["model", "tokens", "requests", "tokens_per_request", "active"]


@dataclass
class GraphStrategiesRecording:
    capture: pd.DataFrame  # one row per (model, graph group, strategy): graphs, capture_s, pool_mib
    samples: pd.DataFrame  # one row per repetition of one whole step (pick + upload + replay)
    switches: pd.DataFrame  # replay after adapter switches vs eager
    meta: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return _label(self.meta)

    def summary(self) -> pd.DataFrame:
        """Per point and variant: median_us with its 95 % interval, and the paired per-repetition
        ratio to one_graph (median and interval)."""
        s = self.samples
        base = s[s["variant"] == "one_graph"][STRATEGY_KEYS + ["rep", "us"]].rename(columns={"us": "us_base"})
        j = s.merge(base, on=STRATEGY_KEYS + ["rep"], how="inner")
        rows = []
        for key, g in j.groupby(STRATEGY_KEYS + ["variant"], sort=True):
            med, lo, hi = median_ci(g["us"])
            r, rlo, rhi = median_ci(g["us"] / g["us_base"])
            rows.append(dict(zip(STRATEGY_KEYS + ["variant"], key), median_us=med, lo95_us=lo, hi95_us=hi, n=len(g),
                             vs_one_graph=r, vs_lo95=rlo, vs_hi95=rhi))
        return pd.DataFrame(rows)

    def table(self, model: str = "moe") -> pd.DataFrame:
        """The trade-offs in one table: per strategy, graphs captured, capture seconds, graph pool
        memory (all sizes of the model), and the median step time relative to one_graph at
        decode (1 and 64 tokens) and every recorded prefill size, with no adapter and with one."""
        cap = self.capture[self.capture["model"] == model].groupby("strategy", sort=False)[
            ["graphs", "capture_s", "pool_mib"]].sum()
        summ = self.summary()
        summ = summ[summ["model"] == model]
        prefill = sorted(int(t) for t in summ["tokens"].unique() if t > 64)  # every prefill size: none hidden
        out = cap.reset_index()
        for tokens, active in [(t, a) for t in (1, 64, *prefill) for a in (0, 1)]:
            col = f"M={tokens}, {active} active"
            sel = summ[(summ["tokens"] == tokens) & (summ["active"] == active)].set_index("variant")
            out[col] = [sel["vs_one_graph"].get(v, math.nan) for v in out["strategy"]]
        return out


def load_graph_strategies(path: str | Path | None = None) -> GraphStrategiesRecording:
    """The recording in folder `path` (strategies_{capture,replay,switches}.csv + strategies.meta.json);
    none: the catalog's "graphs.strategies"."""
    d = Path(path) if path is not None else catalog("graphs.strategies")
    files = {n: d / f"strategies_{n}.csv" for n in ("capture", "replay", "switches")}
    for f in files.values():
        if not f.exists():
            raise FileNotFoundError(f"no recording at {f}: studies/graphs/record.py writes it on a GPU")
    mp = d / "strategies.meta.json"
    meta = normalize_meta(schemas.read_json(mp)) if mp.exists() else {}
    frames = [_renamed_strategies(schemas.read_csv(f, f"graph_{n}")) for n, f in files.items()]
    return GraphStrategiesRecording(*frames, meta)


def _renamed_strategies(df: pd.DataFrame) -> pd.DataFrame:
    """Strategy names as they are now (model/graph_strategies.py: RENAMED): the recording of
    2026-11-30 calls `one_graph` by its old name `launch_always`, also the name of a guard."""
    from ...model.graph_strategies import RENAMED

    for col in ("strategy", "variant"):
        if col in df:
            df[col] = df[col].replace(RENAMED)
    return df


# ----------------------------------------------------------------------------------------------
# The kernel runs of studies/kernels/record_expand.py (<run>_kernels_expand.csv + .meta.json): tiles, bandwidth,
# LoRA's share. The canonical runs are the catalog's "kernel_run.*" entries (data/kernels/README.md says which figure
# reads which); a run named here is looked up in the folder handed, else the catalog's "kernels.folder".
EXPAND_SUFFIX = "_kernels_expand"


def run_name(path: str | Path) -> str:
    """A kernel run's name from its file: <run>_kernels_<section>.csv -> <run>."""
    return re.sub(r"_kernels_\w+$", "", Path(path).name.removesuffix(".csv"))


@dataclass
class KernelRun:
    rows: pd.DataFrame  # one row per (section, preset, M, op, config); sections: check, sweep, floor, layer_paired, ...
    meta: dict
    name: str

    @property
    def label(self) -> str:
        return _label(self.meta)

    def section(self, name: str) -> pd.DataFrame:
        s = self.rows[self.rows["section"] == name].copy()
        if s.empty:
            raise ValueError(f"{self.name} has no section {name!r}; it has {sorted(self.rows['section'].unique())}")
        if "M" in s:
            s["M"] = s["M"].astype(int)
        return s

    def share_floor(self) -> pd.DataFrame:
        """Per (preset, M) where the run has both the layer (paired) and the two deltas' bytes: LoRA's
        share of the base layer with all adapters active (median and 10-90 % of the paired rounds) and
        its byte floor: the bytes both deltas must move (each used adapter-expert's A and B once, x
        once, the output read and written) at the run's copy bandwidth, over the base layer's time."""
        lay = self.section("layer_paired").set_index(["preset", "M"])
        sw = self.section("sweep")
        nbytes = sw[sw["table"].astype(bool)].groupby(["preset", "M"])["bytes"].sum()
        out = lay.join(nbytes.rename("lora_bytes"), how="inner").reset_index()
        out["floor_us"] = out["lora_bytes"] / (self.meta["copy_gbps"] * 1e3)  # bytes / (GB/s) -> us
        out["floor_share"] = out["floor_us"] / out["base"]
        return out[["preset", "M", "base", "lora_all_active", "lora_share", "lora_share_p10", "lora_share_p90",
                    "lora_bytes", "floor_us", "floor_share"]]


def load_kernel_run(name: str | None = None, path: str | Path | None = None) -> KernelRun:
    """One run of studies/kernels/record_expand.py: `name`_kernels_expand.csv and its .meta.json in folder `path`
    (none: the catalog's "kernels.folder"); `path` a file: that file. Neither: the catalog's "kernel_run.canonical"."""
    if path is not None and Path(path).is_file():
        f = Path(path)
    elif name is None and path is None:
        f = catalog("kernel_run.canonical")
    else:
        d = Path(path) if path is not None else catalog("kernels.folder")
        f = d / f"{name or run_name(catalog('kernel_run.canonical'))}{EXPAND_SUFFIX}.csv"
    if not f.exists():
        raise FileNotFoundError(f"no recording at {f}: studies/kernels/record_expand.py writes it on a GPU")
    mp = f.with_name(f.name.removesuffix(".csv") + ".meta.json")
    meta = normalize_meta(schemas.read_json(mp)) if mp.exists() else {}
    return KernelRun(schemas.read_csv(f, "kernel_run"), meta, run_name(f))
