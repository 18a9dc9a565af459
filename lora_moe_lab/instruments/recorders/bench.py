"""Benchmark sweeps and their CLI: every combination of presets, layers, tokens, guards, active
fractions, ranks and modes, timed with `instruments.recorders.timing` and appended as tidy CSV rows (one
per finished measurement, flushed at once) with the metadata of `provenance`.

    python -m lora_moe_lab.instruments.recorders.bench sweep --preset tiny --tokens 16 64 --guards sync cpu_flag \
        --active 0 0.5 --mode eager --reps 5 --out build/tiny.csv
    python -m lora_moe_lab.instruments.recorders.bench sweep ... --out build/tiny.csv --resume  # finish a sweep
    python -m lora_moe_lab.instruments.recorders.bench lost build/tiny.csv        # time lost per sync
    python -m lora_moe_lab.instruments.recorders.bench meta                       # what a row's metadata is

(`lora-moe-bench` is the same CLI.) The guard choices are the registry's (`model.guards`).

`--skew` (model/moe.py: SERVING_SKEW) biases the router towards a few hot experts; it is a key
column. CSVs written before it existed load with skew 0 (their routing was uniform); resuming
one of them asks for a new file.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ... import runtime
from ...config import PRESETS, check_dtype, get_shape
from ...model.graphs import GraphForward
from ...model.guards import count_guard_syncs, guard_names
from ...model.lab import LabCache, split_tokens
from ...model.moe import check_skew
from ...provenance import META_KEYS, metadata, normalize_meta
from .cli import (CPU_NOTE, DTYPES, HelpFormatter, device as device_arg, dtype as dtype_arg, fraction,
                  measured_on_cpu, nonneg_int, pos_float, pos_int, progress as cli_progress, seed as seed_arg)
from .timing import _check_counts, time_device

MODES = ("eager", "graph")

META_COLUMNS = list(META_KEYS)
KEY_COLUMNS = ["preset", "layers", "tokens", "guard", "active", "rank", "mode", "dtype", "backend", "requests",
               "skew"]
RESULT_COLUMNS = ["warmup", "reps", "median_us", "p10_us", "p90_us", "mean_us", "wall_median_us", "timer",
                  "syncs_per_forward", "error"]
# the settings of a run that are not in the key: a resume must have the same ones (tables.check_resumable),
# else rows of two seeds (or devices, warm-ups, repetitions) would sit in one table under one key
SETTING_COLUMNS = ["seed", "device"]
RESUME_SETTINGS = ["seed", "device", "warmup", "reps"]
COLUMNS = META_COLUMNS + KEY_COLUMNS + RESULT_COLUMNS + SETTING_COLUMNS


# ----------------------------------------------------------------------------------------------
# Sweeps
# ----------------------------------------------------------------------------------------------
@dataclass
class SweepSpec:
    """The grid: every combination of the list fields (itertools.product), in this loop order:
    preset, layers, rank, skew (a model is built once for each), then tokens, active, guard, mode."""

    presets: list[str] = field(default_factory=lambda: ["tiny"])
    layers: list[int | None] = field(default_factory=lambda: [None])  # None: the preset's own count
    tokens: list[int] = field(default_factory=lambda: [16, 128])
    guards: list[str] = field(default_factory=lambda: list(guard_names()))
    active: list[float] = field(default_factory=lambda: [0.0, 0.5])
    ranks: list[int] = field(default_factory=lambda: [16])
    modes: list[str] = field(default_factory=lambda: ["eager"])
    dtype: str = "auto"  # bfloat16 on a GPU, float32 on CPU
    backend: str = "auto"  # triton on a GPU, torch on CPU
    device: str = "auto"
    requests: int = 8  # requests per batch (fewer when there are fewer tokens)
    warmup: int = 3
    reps: int = 10
    seed: int = 0
    skews: list[float] = field(default_factory=lambda: [0.0])  # router skew (model/moe.py); 0: uniform

    def resolved(self) -> "SweepSpec":
        """Validate every field and fill in the 'auto' choices; raises ValueError with a clear message."""
        dev = runtime.resolve_device(self.device)
        backend = runtime.resolve_backend(self.backend, dev)
        dtype = runtime.resolve_dtype(self.dtype, dev)
        check_dtype(dtype, dev, backend)
        for p in self.presets:
            if p not in PRESETS:
                raise ValueError(f"unknown preset {p!r}; choose from {sorted(PRESETS)}")
        for name in ("presets", "layers", "tokens", "guards", "active", "ranks", "modes", "skews"):
            if not list(getattr(self, name)):
                raise ValueError(f"{name} is empty: give at least one value")
        for L in self.layers:
            if L is not None and (not isinstance(L, int) or L <= 0):
                raise ValueError(f"layers must be positive ints, got {L!r}")
        for m in self.tokens:
            if not isinstance(m, int) or isinstance(m, bool) or m <= 0:
                raise ValueError(f"tokens must be positive ints, got {m!r}")
        for g in self.guards:
            if g not in guard_names():
                raise ValueError(f"unknown guard {g!r}; choose from {list(guard_names())}")
        for a in self.active:
            if not (isinstance(a, (int, float)) and 0.0 <= a <= 1.0):
                raise ValueError(f"active fractions must be in [0, 1], got {a!r}")
        for r in self.ranks:
            if not isinstance(r, int) or r <= 0:
                raise ValueError(f"ranks must be positive ints, got {r!r}")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r}; choose from {list(MODES)}")
        if "graph" in self.modes and dev.type != "cuda":
            raise ValueError("mode 'graph' (CUDA-graph replay) needs a CUDA GPU; use --mode eager on CPU")
        if not isinstance(self.requests, int) or self.requests <= 0:
            raise ValueError(f"requests must be a positive int, got {self.requests!r}")
        skews = [check_skew(s) for s in self.skews]  # ValueError naming skew
        _check_counts(self.warmup, self.reps)
        return SweepSpec(list(self.presets), list(self.layers), list(self.tokens),
                         list(self.guards), [float(a) for a in self.active], list(self.ranks), list(self.modes),
                         dtype, backend, str(dev), self.requests, self.warmup, self.reps, self.seed, skews)

    def grid(self) -> list[dict]:
        """The parameter rows, in run order (resolve first)."""
        rows = []
        for preset, layers, rank, skew, tokens, active, guard, mode in itertools.product(
                self.presets, self.layers, self.ranks, self.skews, self.tokens, self.active, self.guards, self.modes):
            asked, layers = layers, get_shape(preset).num_layers if layers is None else layers
            rows.append(dict(preset=preset, layers=layers, layers_asked=asked, tokens=tokens, guard=guard,
                             active=active, rank=rank, mode=mode, dtype=self.dtype, backend=self.backend,
                             requests=min(self.requests, tokens), skew=skew))
        return rows


def _norm(col: str, v) -> str:
    if col in ("layers", "tokens", "rank", "requests"):
        return str(int(float(v)))
    if col in ("active", "skew"):
        return f"{float(v):.6g}"
    return str(v)


def row_key(row: dict) -> tuple:
    """The parameter key of a row (what --resume compares), normalised so CSV strings match."""
    return tuple(_norm(c, row[c]) for c in KEY_COLUMNS)


def read_done(path: Path, spec: "SweepSpec | None" = None) -> set[tuple]:
    """Keys of the rows already measured without error in an existing sweep CSV. With a (resolved)
    `spec`, the table is checked for a resume (tables.check_resumable): its header, its tail (a cut
    last row is dropped, atomically, and measured again) and its settings (seed, device, warmup, reps
    must be the spec's; else SettingsMismatchError naming the file, row and setting)."""
    from . import tables

    if not path.exists() or path.stat().st_size == 0:
        return set()
    header = tables.read_header(path)
    if header != COLUMNS:
        try:
            tables.check_header(path, COLUMNS, header)
        except tables.HeaderMismatchError as e:
            raise tables.HeaderMismatchError(path, f"not this harness's schema ({e.args[0].split(': ', 1)[1]}); "
                                                   "write to a new file") from None
    settings = {} if spec is None else {"seed": spec.seed, "device": spec.device, "warmup": spec.warmup,
                                        "reps": spec.reps}
    df = tables.check_resumable(path, COLUMNS, settings, meta_path=_meta_path(path))
    if df is None:
        return set()
    return {row_key(row) for row in df.to_dict("records") if not row.get("error")}


def measure(lab, p: dict, *, warmup: int, reps: int, seed: int = 0) -> dict:
    """One sweep row's results: timing of the forward and the guard syncs of one forward."""
    R = p["requests"]
    n_active = round(p["active"] * R)
    adapters = ["bench" if i < n_active else None for i in range(R)]
    batch, tensors = lab.make_batch(adapters=adapters, token_counts=split_tokens(p["tokens"], R))
    x = lab.random_input(p["tokens"], seed=seed)
    guard = p["guard"]

    def fwd():
        return lab.model(x, batch, tensors, guard=guard)

    with torch.no_grad():
        if p["mode"] == "graph":
            g = GraphForward(fwd, warmup=warmup)
            fn = g.replay
        else:
            g, fn = None, fwd
        with count_guard_syncs() as c:  # one untimed forward: how many syncs the guard made
            fn()
        runtime.synchronize()
        # the lab's own device decides the clock: a CPU lab on a GPU machine is timed by the wall clock
        t = time_device(fn, warmup=warmup, reps=reps, cuda=lab.device.type == "cuda")
        del g
    return dict(warmup=warmup, reps=t.reps, median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us,
                mean_us=t.mean_us, wall_median_us=t.wall_median_us, timer=t.timer, syncs_per_forward=c.count,
                error="")


def _meta_path(out: Path) -> Path:
    return out.with_name(out.stem + ".meta.json")


def run_sweep(spec: SweepSpec, out: str | os.PathLike, *, resume: bool = False, overwrite: bool = False,
              progress: bool = True, on_row: Callable[[dict, int], None] | None = None,
              build: Callable | None = None, max_seconds: float | None = None):
    """Run the grid, appending each finished row to `out` at once (flushed), and return the whole
    CSV as a DataFrame. With resume=True rows whose key is already in `out` (without error) are
    skipped. A row that raises is written with its error message and the sweep goes on; rows with
    an error are measured again on resume. `on_row(row, i)` runs after each row is written.
    `max_seconds` stops starting new rows after that much time (the rows so far are kept). Another process
    writing `out` is refused (tables.OutputLockedError naming its pid); a resume verifies the table's seal first.
    """
    from . import tables

    spec = spec.resolved()
    out = Path(out)
    with tables.holding(out):  # one writer per output: a second is refused with this one's pid
        return _run_sweep(spec, out, resume, overwrite, progress, on_row, build, max_seconds)


def _run_sweep(spec, out: Path, resume, overwrite, progress, on_row, build, max_seconds):
    import pandas as pd

    from . import tables

    if out.exists() and out.stat().st_size > 0 and not (resume or overwrite):
        raise FileExistsError(f"{out} exists: pass resume=True (--resume) to continue it or overwrite=True")
    if overwrite and out.exists():
        out.unlink()
    done = read_done(out, spec) if resume else set()
    meta = metadata()
    grid = spec.grid()
    todo = [p for p in grid if row_key(p) not in done]
    replaced = []
    if resume and out.exists() and out.stat().st_size > 0:
        # rows with an error whose key is measured again: dropped from the table (atomically), so that
        # every key is one row; their messages stay in this session's metadata
        planned = {row_key(p) for p in todo}
        old = tables.scan(out)
        ie, keep = COLUMNS.index("error"), []
        for r in old.rows:
            d = dict(zip(COLUMNS, r))
            again = bool(r[ie]) and row_key(d) in planned
            keep.append(not again)
            if again:
                replaced.append(dict({c: d[c] for c in KEY_COLUMNS}, error=r[ie]))
        tables.keep_rows(out, COLUMNS, keep, why="rows with an error")
    out.parent.mkdir(parents=True, exist_ok=True)
    mp = _meta_path(out)
    old_meta = tables.read_meta(mp) if (resume and out.exists()) else {}
    sessions = old_meta.get("sessions", [])
    sessions.append(dict(meta, spec=asdict(spec), rows_planned=len(grid), rows_skipped=len(grid) - len(todo),
                         **({"replaced_errors": replaced} if replaced else {})))
    new_meta = {"columns": COLUMNS, "key": KEY_COLUMNS, "settings": RESUME_SETTINGS, "sessions": sessions}
    if "files" in old_meta:
        new_meta["files"] = old_meta["files"]
    tables.write_json_atomic(mp, new_meta)
    if out.exists() and out.stat().st_size > 0:
        tables.seal(out, mp)  # the table as it is now (a resume may have dropped rows)
    labs = LabCache(build)
    t_start = time.perf_counter()
    bar = cli_progress(len(grid), progress, initial=len(grid) - len(todo))
    try:
        if True:  # the file is created at the first row (tables.append_rows): no empty table on an early failure
            for i, p in enumerate(todo):
                if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
                    print(f"time budget of {max_seconds:.0f} s spent: stopping with {len(todo) - i} rows left "
                          "(run again with --resume)", file=sys.stderr)
                    break
                bar.set_description(f"{p['preset']} M={p['tokens']} {p['guard']} a={p['active']:g} {p['mode']}")
                try:
                    # the preset's count is sized to the card (model/sizing.py): the row records what was built
                    lab = labs.get(adapter=("bench", p["rank"]), preset=p["preset"], num_layers=p.get("layers_asked",
                                                                                                   p["layers"]),
                                   max_loras=4, max_rank=p["rank"], dtype=spec.dtype, device=spec.device,
                                   backend=spec.backend, seed=spec.seed,
                                   **({"skew": p["skew"]} if p["skew"] else {}))  # a `build` without skew works at 0
                    p = dict(p, layers=lab.shape.num_layers)
                    res = measure(lab, p, warmup=spec.warmup, reps=spec.reps, seed=spec.seed)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except Exception as e:  # noqa: BLE001 - a failed row is recorded, the sweep goes on
                    msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
                    res = dict(warmup=spec.warmup, reps=spec.reps, median_us="", p10_us="", p90_us="", mean_us="",
                               wall_median_us="", timer="", syncs_per_forward="", error=msg)
                    if runtime.has_cuda():
                        labs.free()  # e.g. out of memory: start the next row from a clean allocator
                # the rest of the metadata goes to .meta.json
                row = dict({k: meta[k] for k in META_KEYS}, **{k: p[k] for k in KEY_COLUMNS}, **res,
                           seed=spec.seed, device=spec.device)
                if runtime.resolve_device(spec.device).type != "cuda":
                    row["gpu"] = "cpu"  # a CPU lab on a GPU machine: its rows are CPU rows (readers skip them)
                tables.append_rows(out, [row], COLUMNS, meta_path=mp)  # one write + fsync, then the seal
                bar.update(1)
                if res["median_us"] != "":
                    bar.set_postfix_str(f"{res['median_us'] / 1e3:.3f} ms")
                if on_row is not None:
                    on_row(row, i)
    finally:
        bar.close()
        labs.free()
    if not out.exists():
        return pd.DataFrame(columns=COLUMNS)
    return pd.read_csv(out)


# ----------------------------------------------------------------------------------------------
# Analyses on a sweep DataFrame
# ----------------------------------------------------------------------------------------------
def load_sweep(path: str | os.PathLike):
    """A sweep CSV as a DataFrame; its .meta.json (when present) in df.attrs['meta']."""
    import pandas as pd

    path = Path(path)
    df = pd.read_csv(path).rename(columns={"git_commit": "commit", "date_utc": "date"})  # older schema
    if "preset" in df.columns and "skew" not in df.columns:  # recorded before `skew`: the uniform router
        df["skew"] = 0.0
    mp = _meta_path(path)
    if mp.exists():
        m = json.loads(mp.read_text())
        if isinstance(m.get("sessions"), dict):  # a long table's metadata: one entry per session name
            m["sessions"] = {k: normalize_meta(v) for k, v in m["sessions"].items()}
        elif "sessions" in m:
            m["sessions"] = [normalize_meta(s) for s in m["sessions"]]
        df.attrs["meta"] = normalize_meta(m)
    return df


def normalize_sweep(df, meta: dict | None = None):
    """A recorded timing table in this module's row schema. The side-by-side script
    (studies/guards/record.py) writes one row per (M, active, variant) where variant is a guard
    or 'graph' (a replay of the cpu_flag capture); this renames and derives the key columns. Rows
    already in the sweep schema pass through unchanged."""
    import pandas as pd

    if "variant" not in df.columns:
        return df
    params = (meta or df.attrs.get("meta") or {}).get("params", {})
    d = df.rename(columns={"M": "tokens"}).copy()
    graph = d["variant"] == "graph"
    d["mode"] = ["graph" if g else "eager" for g in graph]
    d["guard"] = d["variant"].where(~graph, "cpu_flag")
    d["rank"] = params.get("rank", 16)
    d["requests"] = params.get("requests", 8)
    d["dtype"], d["backend"], d["timer"], d["error"] = "bfloat16", "triton", "cuda_events", ""
    d["warmup"] = params.get("warmup", 3)
    d["skew"] = params.get("skew", 0.0)  # side-by-side tables predate skew: uniform routing
    return pd.DataFrame({c: d[c] if c in d.columns else None for c in COLUMNS + ["variant"]})


def load_recorded_sweeps(folder):  # -> pandas.DataFrame | None
    """Every recorded sweep CSV in `folder` (both schemas), GPU rows only; None when there is none."""
    import pandas as pd

    frames = [normalize_sweep(load_sweep(p)) for p in sorted(Path(folder).glob("*.csv"))]
    frames = [f for f in frames if {"median_us", "gpu"} <= set(f.columns)]  # timing tables only
    if not frames:
        return None
    d = pd.concat(frames, ignore_index=True)
    d = d[d["gpu"].astype(str) != "cpu"]  # CPU rows say nothing about GPU pipelines
    return d.reset_index(drop=True) if len(d) else None


def clean(df):
    """Rows measured without error, one per parameter key (the latest)."""
    d = df
    if "error" in d.columns:
        d = d[d["error"].isna() | (d["error"].astype(str) == "")]
    d = d[d["median_us"].notna()]
    keys = [c for c in KEY_COLUMNS if c in d.columns]
    return d.drop_duplicates(subset=keys, keep="last").reset_index(drop=True)


def time_lost_per_sync(df, baseline: str = "cpu_flag"):
    """Pair each `sync` row with the `baseline` row of the same parameters:
    lost_us = t_sync - t_baseline, us_per_sync = lost_us / syncs of the sync row, ratio = t_sync / t_baseline."""
    d = clean(df)
    keys = [c for c in KEY_COLUMNS if c != "guard" and c in d.columns]
    if "gpu" in d.columns:
        keys = ["gpu"] + keys
    s = d[d["guard"] == "sync"][keys + ["median_us", "syncs_per_forward"]]
    b = d[d["guard"] == baseline][keys + ["median_us"]]
    m = s.merge(b, on=keys, suffixes=("_sync", "_base"))
    m = m.rename(columns={"median_us_sync": "t_sync_us", "median_us_base": f"t_{baseline}_us",
                          "syncs_per_forward": "syncs"})
    m["lost_us"] = m["t_sync_us"] - m[f"t_{baseline}_us"]
    m["us_per_sync"] = m["lost_us"] / m["syncs"].where(m["syncs"] > 0)
    m["ratio"] = m["t_sync_us"] / m[f"t_{baseline}_us"]
    return m


def lost_table(path):
    """Time lost per sync from any timing CSV this lab writes: a guards recording (one row per
    repetition: paired differences with their 95 % interval), a sweep CSV, or the older side-by-side
    table. Anything else is a ValueError that says what the file is missing."""
    from ..analysers.recordings import SAMPLE_COLUMNS, load_guards
    from . import tables

    import pandas as pd

    tables.check_tail(path)  # CutRowError naming the file and row: a cut number would change the ratio
    cols = set(pd.read_csv(path, nrows=0).columns)
    kind = "guards" if set(SAMPLE_COLUMNS) <= cols else ("bench_sweep" if set(COLUMNS) - {"seed", "device"} <= cols
                                                          else None)
    if kind is not None:
        try:
            from ..analysers import schemas
        except ImportError:  # pandera missing: the tail check above stands alone
            schemas = None
        if schemas is not None:
            schemas.read_csv(path, kind)  # RecordingError naming the file and the first bad row
    if set(SAMPLE_COLUMNS) <= cols:
        return load_guards(path).paired("sync", "cpu_flag")
    df = normalize_sweep(load_sweep(path))
    need = {"guard", "median_us", "syncs_per_forward"}
    if not need <= set(df.columns):
        raise ValueError(f"{path} is not a timing table of guards (it has no {sorted(need - set(df.columns))} "
                         "columns): `lost` reads guards recordings (data/guards), sweep CSVs and side-by-side tables")
    return time_lost_per_sync(df)


def summary_table(df):
    """Compact table: M, preset, layers, rank, guard, active, mode, median ms, syncs, sync/cpu_flag
    ratio and us lost per sync (on the sync rows)."""
    d = clean(df).copy()
    lost = time_lost_per_sync(d)
    keys = [c for c in KEY_COLUMNS if c != "guard" and c in d.columns]
    d = d.merge(lost[keys + ["ratio", "us_per_sync"]], on=keys, how="left")
    d.loc[d["guard"] != "sync", ["ratio", "us_per_sync"]] = float("nan")
    d["median_ms"] = d["median_us"] / 1e3
    skew = ["skew"] if "skew" in d.columns else []
    cols = ["tokens", "preset", "layers", "rank", *skew, "guard", "active", "mode", "median_ms", "syncs_per_forward",
            "ratio", "us_per_sync"]
    order = ["preset", "layers", "rank", *skew, "tokens", "mode", "active", "guard"]
    return d[cols].sort_values(order).reset_index(drop=True)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def _preset(s: str) -> str:
    if s not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {s!r}; choose from {', '.join(sorted(PRESETS))}")
    return s


def _skew(s: str) -> float:
    try:
        return check_skew(float(s))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if "skew" in str(e) else f"skew must be a number, got {s!r}")


EXAMPLES = """examples: (the first two run on a CPU in a few seconds; `lora-moe-bench` is the same CLI)
  python -m lora_moe_lab.instruments.recorders.bench sweep --preset tiny --layers 2 --tokens 16 64 \\
      --guards sync cpu_flag --active 0 --reps 5 --backend torch --out build/tiny.csv
  python -m lora_moe_lab.instruments.recorders.bench lost build/tiny.csv
  python -m lora_moe_lab.instruments.recorders.bench sweep --preset qwen3-30b-a3b --layers 48 --tokens 16 4096 \\
      --active 0 --mode eager graph --out build/h200.csv          # on a GPU
  python -m lora_moe_lab.instruments.recorders.bench lost build/h200.csv
  python -m lora_moe_lab.instruments.recorders.bench meta
The first sweep times 4 rows (2 token counts x 2 guards, no adapter active), appends them to build/tiny.csv
(run it again with --overwrite or --resume) and prints per row the median forward, syncs_per_forward (2 for
`sync`: one per layer; 0 for `cpu_flag`), the ratio sync / cpu_flag and us_per_sync; `lost` prints the time
lost per sync from the CSV. On a CPU the sweep runs the torch ops inline under the wall clock: its us_per_sync
is no GPU bubble, only noise around the host's own cost (the summary says so)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lora_moe_lab.instruments.recorders.bench",
                                formatter_class=HelpFormatter,
                                description="Benchmark the LoRA-MoE mini model: sweeps to tidy CSV.", epilog=EXAMPLES)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="run a grid of forwards and append one CSV row per measurement",
                       formatter_class=HelpFormatter, epilog=EXAMPLES,
                       description="Every combination of the list options (itertools.product). Device-event "
                                   "timing on a GPU, wall clock on CPU. Rows are appended as they finish.")
    s.add_argument("--preset", nargs="+", type=_preset, default=["tiny"], help="model shape presets")
    s.add_argument("--layers", nargs="+", type=pos_int, default=None,
                   help="MoE layers per forward (None: the preset's own count)")
    s.add_argument("--tokens", "-M", nargs="+", type=pos_int, default=[16, 128], help="tokens per forward (M)")
    s.add_argument("--guards", nargs="+", choices=guard_names(), default=list(guard_names()),
                   help="guard strategies (the registry in model/guards.py)")
    s.add_argument("--active", nargs="+", type=fraction, default=[0.0, 0.5],
                   help="fraction of requests that use an adapter")
    s.add_argument("--rank", nargs="+", type=pos_int, default=[16], help="LoRA rank of the adapter (and pool max)")
    s.add_argument("--skew", nargs="+", type=_skew, default=[0.0],
                   help="router skew towards a few hot experts (0: uniform; 1.0: about a fifth of the "
                        "experts carry 90 %% of the assignments, model/moe.py: SERVING_SKEW)")
    s.add_argument("--mode", nargs="+", choices=MODES, default=["eager"], help="eager launches or CUDA-graph replay")
    s.add_argument("--requests", type=pos_int, default=8, help="requests per batch (fewer when fewer tokens)")
    s.add_argument("--dtype", default="auto", type=dtype_arg,
                   help=f"{'/'.join(DTYPES)} (auto: bf16 on GPU, fp32 on CPU)")
    s.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"],
                   help="kernels (auto: triton on GPU, torch on CPU)")
    s.add_argument("--device", default="auto", type=device_arg, help="cpu, cuda, cuda:N or auto")
    s.add_argument("--warmup", type=nonneg_int, default=3, help="untimed calls before timing")
    s.add_argument("--reps", type=pos_int, default=10, help="timed repetitions per row")
    s.add_argument("--seed", type=seed_arg, default=0, help="seed of the weights and inputs (a column of the table)")
    s.add_argument("--out", required=True, help="CSV file to append rows to (a .meta.json is written beside it)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="skip rows whose parameters are already in --out (its seed, device, warmup and reps must be "
                        "this run's; a cut last row is dropped and measured again)")
    g.add_argument("--overwrite", action="store_true", help="start --out afresh")
    s.add_argument("--max-minutes", type=pos_float, default=None, help="stop starting new rows after this long")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    lost = sub.add_parser("lost", help="time lost per sync from a sweep CSV (sync vs cpu_flag rows)",
                          formatter_class=HelpFormatter, epilog=EXAMPLES,
                          description="Time lost per sync (sync - cpu_flag, per sync) from a guards recording, a "
                                      "sweep CSV or a side-by-side table.")
    lost.add_argument("csv", help="a timing CSV: a guards recording, a sweep's --out, a side-by-side table")
    sub.add_parser("meta", help="print the metadata a row records, as JSON", formatter_class=HelpFormatter,
                   epilog=EXAMPLES, description="The metadata every row and .meta.json records (provenance.metadata).")
    p.sweep_parser = s  # errors found after parsing are reported with the sweep sub-command's usage
    return p


def cpu_summary_note(df) -> str:
    """CPU_NOTE when every row was measured on a CPU, else ''."""
    return CPU_NOTE if measured_on_cpu(df) else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.cmd == "meta":
        print(json.dumps(metadata(), indent=1))
        return 0
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.3f}".format):
        if a.cmd == "lost":
            if not Path(a.csv).exists():
                parser.error(f"no such file: {a.csv}")
            try:
                print(lost_table(a.csv).to_string(index=False))
            except ValueError as e:
                parser.error(str(e))
            note = cpu_summary_note(pd.read_csv(a.csv))
            if note:
                print(note)
            return 0
        spec = SweepSpec(presets=a.preset, layers=a.layers or [None], tokens=a.tokens, guards=a.guards,
                         active=a.active, ranks=a.rank, modes=a.mode, dtype=a.dtype, backend=a.backend,
                         device=a.device, requests=a.requests, warmup=a.warmup, reps=a.reps, seed=a.seed,
                         skews=a.skew)
        sp = parser.sweep_parser
        try:
            spec.resolved()
        except ValueError as e:
            sp.error(str(e))
        if Path(a.out).exists() and Path(a.out).stat().st_size > 0 and not (a.resume or a.overwrite):
            sp.error(f"{a.out} exists: pass --resume to continue it, --overwrite to start afresh, "
                         "or choose another --out")
        try:
            df = run_sweep(spec, a.out, resume=a.resume, overwrite=a.overwrite, progress=not a.no_progress,
                           max_seconds=None if a.max_minutes is None else 60 * a.max_minutes)
        except ValueError as e:  # e.g. a CSV of another schema
            sp.error(str(e))
        print(summary_table(df).to_string(index=False))
        note = cpu_summary_note(clean(df))
        if note:
            print(note)
        failed = (df["error"].notna() & df["error"].astype(str).str.strip().ne("")) if "error" in df else df.index < 0
        if failed.any():
            first = df.loc[failed, "error"].iloc[0]
            print(f"{int(failed.sum())} of {len(df)} rows failed (their errors are in {a.out}'s error column; "
                  f"the first: {first}); --resume measures them again", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
