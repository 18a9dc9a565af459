"""Declared schemas of every recording kind, checked whenever a recording is read, and the seals in its metadata.

Nothing the workbench reads may silently change a figure: a damaged or foreign file is refused with a
`RecordingError` that names the file, the first bad row (1-based data row; "header" for the columns; "meta"
for the metadata) and what is wrong.

    KINDS["guards"]                      # a Kind: its pandera schema, unique key, where its seal lives
    read_csv(path, "guards")             # read + check: a cut last line, the seal (rows, sha256), the schema
    validate(df, "guards", path)         # the schema alone, on a frame already read
    seal(path)  -> {"rows", "sha256"}    # what a file holds now
    write_seal(path, meta_path=None)     # store it in the file's metadata (atomically: temp file + os.replace)
    read_json(path), read_trace(path)    # JSON / a sealed profiler trace, errors naming the file
    FILE_KINDS                           # the kinds that are not tables (traces, the catalog): sealed by size+hash

Why pandera: a schema is declared once per kind (columns, dtypes, ranges, the set a status is drawn from,
the unique key) and reused by every reader, and a failed check reports its failure cases row by row
(`SchemaErrors.failure_cases`, with lazy=True all of them), so the first bad row can be named. pydantic
would check the JSON metadata only: it has no notion of a DataFrame's columns or of a check over a column.

The seal. A writer that finishes a CSV (or `scripts/seal_recordings.py`, for the files already in data/)
stores `{"rows": <data rows>, "sha256": <hex of the file's bytes>}` for it in its metadata, ALWAYS as

    meta["files"][<csv file name>] = {"rows": n, "sha256": hex}

one rule for every layout (a file with its own `<stem>.meta.json`, a session folder's `meta.json` describing
several CSVs, a tidy table's `<section>.meta.json` shared with its `_ncu` table). A meta that has top-level
`rows`/`sha256` (and no "files") is read as the seal of its one CSV. Which metadata belongs to a CSV
(`meta_path`): its kind says (`Kind.meta`): "sibling" `<name>.meta.json` (x.csv, and x.summary.csv,
x.signature.csv, x.syncs.csv -> x.meta.json), "session" the folder's `meta.json`, "section" `<section>.meta.json` with a
trailing `_ncu`, or the graphs' `_capture`/`_replay`/`_switches`, dropped. A file under data/ must be sealed;
a caller's own file elsewhere may have no metadata yet (its schema is still checked). Refused by name, anywhere:
a seal that disagrees (rows or hash: a cut, an appended or an edited recording), metadata that seals other files
but not this one ("sealed for another file": another session's meta.json), and a partial seal (an entry that is
not an object, or lacks rows or sha256). Files that are not tables (FILE_KINDS: the profiler traces, the catalog)
are sealed the same way with {"bytes", "sha256"}. The seal is checked before the schema, so a damaged file is
reported as damaged, not as whatever row the damage made invalid.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import pandas as pd

try:  # pandera >= 0.20: the pandas API lives in pandera.pandas (the top-level names are deprecated there)
    import pandera.pandas as pa
except ImportError:  # pragma: no cover - older pandera
    import pandera as pa
from pandera.errors import SchemaError, SchemaErrors

__all__ = ["RecordingError", "Kind", "KINDS", "FILE_KINDS", "declare_column", "seal_of", "validate",
           "read_csv", "seal", "write_seal", "read_json",
           "read_trace", "meta_path", "kind_of"]


class RecordingError(ValueError):
    """A recording that cannot be read as it claims to be: the message names the file, the row
    (1-based data row, "header" or "meta") and what is wrong."""

    def __init__(self, path, row, what: str):
        self.path, self.row, self.what = Path(path) if path is not None else None, row, what
        where = f"row {row}" if isinstance(row, (int, np.integer)) else str(row)
        super().__init__(f"{path}: {where}: {what}")


# ----------------------------------------------------------------------------------------------
# Declarations
@dataclass(frozen=True)
class Kind:
    name: str
    schema: "pa.DataFrameSchema"
    unique: tuple = ()  # the columns that name a row (no two rows may share them)
    meta: str = "sibling"  # where its seal lives: sibling | session | section (see the module docstring)
    what: str = ""
    # rows exempt from the unique key: ((column, (value, ...)), ...): a row whose column holds one of the values
    # (a correctness check that runs one tile twice, a decode tile timed as a candidate and as the table's pick)
    unique_except: tuple = ()

    @property
    def files(self) -> tuple:
        """The files in data/ of this kind (globs relative to data/): data/recording_kinds.json."""
        from ...provenance import DATA

        return tuple(json.loads((DATA / "recording_kinds.json").read_text()).get(self.name, ()))

    def __repr__(self):
        return f"Kind({self.name!r}: {len(self.schema.columns)} columns, key {list(self.unique)})"


def _num(*checks, nullable: bool = True, required: bool = True, dtype=float) -> "pa.Column":
    """A numeric column (ints and floats both pass: `dtype` is what it coerces to for the check only)."""
    return pa.Column(dtype, checks=list(checks), nullable=nullable, required=required, coerce=True)


def _int(*checks, nullable: bool = False, required: bool = True) -> "pa.Column":
    integral = pa.Check(lambda s: (s - s.round()).abs() < 1e-9, error="an integer")
    return pa.Column(float, checks=list(checks) + [integral], nullable=nullable, required=required, coerce=True)


def _str(*checks, nullable: bool = False, required: bool = True) -> "pa.Column":
    # no dtype: pandas 2 reads text as object, pandas 3 as its str dtype; both are text
    return pa.Column(None, checks=list(checks), nullable=nullable, required=required)


def _bool(nullable: bool = False, required: bool = True) -> "pa.Column":
    return pa.Column(None, checks=[pa.Check.isin([True, False, "True", "False", 1, 0, 1.0, 0.0])],
                     nullable=nullable, required=required)


POS = pa.Check.gt(0)  # a time, a size, a rate: > 0
NONNEG = pa.Check.ge(0)
FRACTION = pa.Check.in_range(0, 1)


def _schema(name: str, columns: dict, unique=()) -> "pa.DataFrameSchema":
    # strict=False: a file may carry more columns than the declared ones (provenance columns, a later
    # recorder's additions); the declared ones must be there, with their types and ranges
    # the unique key is checked by validate (`_key_for`: it depends on which optional columns a file has)
    return pa.DataFrameSchema(columns, strict=False, name=name)


# Columns any kind may carry, declared once: a table that gains one (another issue adds `gpu` to its rows) is
# checked and keyed by it with no change here. `gpu`: which card a row was measured on (rows of two cards are
# not duplicates of each other); `session`: which device session (likewise).
COMMON = {"gpu": lambda: _str(nullable=True, required=False), "session": lambda: _str(nullable=True, required=False)}
PARTITION = ("session", "gpu")  # where a file has these columns, they join its unique key (`_key_for`)


def _kind(name, columns, unique=(), meta="sibling", what="", unique_except=()) -> Kind:
    columns = {**{c: make() for c, make in COMMON.items() if c not in columns}, **columns}
    return Kind(name, _schema(name, columns, unique), tuple(unique), meta, what, tuple(unique_except))


def declare_column(kind: str, column: str, col: "pa.Column") -> Kind:
    """Add a declared column to a kind (another recorder's new column): KINDS[kind] is replaced by a Kind whose
    schema also checks `column`. Returns it."""
    k = kind_of(kind)
    KINDS[k.name] = Kind(k.name, k.schema.add_columns({column: col}), k.unique, k.meta, k.what, k.unique_except)
    return KINDS[k.name]


def _at_most(x: float, unit: str, why: str) -> "pa.Check":
    """A plausibility bound: a value past `x` is another unit or a damaged row (the error says which)."""
    return pa.Check.le(x, error=f"at most {x:g} {unit} ({why})")


_GUARD_KEYS = ["preset", "layers", "tokens", "active"]
_GUARDS_COLS = dict(preset=_str(), layers=_int(POS), tokens=_int(POS), active=_num(FRACTION, nullable=False),
                    variant=_str(), guard=_str(), mode=_str(), rep=_int(NONNEG),
                    us=_num(POS, _at_most(1e7, "µs", "10 s per forward: a time in ms or ns written as µs?"),
                            nullable=False),
                    syncs_per_forward=_int(NONNEG))

# prefill rows (instruments/recorders/prefill.py COLUMNS): the production sessions' per-repetition rows, the TP runs'
_PREFILL_KEY = ["preset", "layers", "tp", "requests", "input_len", "chunk", "guard_sites", "adapters", "guard"]
_PREFILL_COLS = dict(preset=_str(), layers=_int(POS), tp=_int(POS), requests=_int(POS), input_len=_int(POS),
                     chunk=_int(POS), guard_sites=_num(NONNEG, nullable=False), adapters=_str(), guard=_str(),
                     rep=_int(NONNEG), order=_int(NONNEG), prefill_ms=_num(POS, nullable=False),
                     input_tok_per_s=_num(POS, nullable=False), ttft_mean_ms=_num(POS), ttft_p50_ms=_num(POS),
                     ttft_p99_ms=_num(POS), forwards=_int(POS), forward_median_ms=_num(POS, nullable=False),
                     syncs_per_forward=_num(NONNEG), gpu_idle_ms=_num(NONNEG), gpu_idle_after_sync_ms=_num(NONNEG),
                     gpu_busy_ms=_num(NONNEG), gpu_span_ms=_num(NONNEG), timer=_str())
_PREFILL_OPT = dict(host_us_per_layer=_num(NONNEG, required=False), host_us_per_forward=_num(NONNEG, required=False),
                    overlap_ms=_num(NONNEG, required=False), t_unix=_num(POS, required=False),
                    input_tok_per_s_net=_num(POS, required=False), other_batch_ms=_num(NONNEG, required=False),
                    first_blocked_ms=_num(NONNEG, required=False), later_blocked_median_us=_num(NONNEG, required=False),
                    later_blocked_mean_us=_num(NONNEG, required=False), host_blocked_ms=_num(NONNEG, required=False),
                    first_share=_num(FRACTION, required=False))
_SUMMARY_COLS = dict(preset=_str(), layers=_int(POS), tp=_int(POS), requests=_int(POS), input_len=_int(POS),
                     chunk=_int(POS), guard_sites=_num(NONNEG, nullable=False), adapters=_str(), guard=_str(),
                     reps=_int(POS), input_tok_per_s=_num(POS, nullable=False), input_tok_per_s_lo=_num(POS),
                     input_tok_per_s_hi=_num(POS), prefill_ms=_num(POS, nullable=False),
                     forward_median_ms=_num(POS, nullable=False), syncs_per_forward=_num(NONNEG),
                     gpu_idle_ms=_num(NONNEG), fix_throughput_gain_pct=_num(), fix_ttft_change_pct=_num(),
                     warmup_dropped=_int(NONNEG, required=False), stable=_bool(required=False),
                     first_share=_num(FRACTION, required=False), host_blocked_ms=_num(NONNEG, required=False))

_KERNEL_EXEMPT = (("section", ("check", "decode_tile")),)

PCT_ = pa.Check.in_range(0, 100)  # a percentage of a peak
_REGIMES, _LORA_MODES = ["prefill", "decode"], ["eager", "graph"]
_LORA_CELL = ["regime", "shape", "tokens", "ranks", "mix", "mode"]

KINDS: dict[str, Kind] = {k.name: k for k in [
    _kind("guards", dict(_GUARDS_COLS, session=_str(required=False), warmup_drift=_bool(required=False),
                         status=_str(pa.Check.isin(["ok", "unstable", "unchecked"]), required=False),
                         position=_int(NONNEG, required=False)),
          unique=_GUARD_KEYS + ["variant", "rep"],
          what="one row per repetition and variant (studies/guards/record.py)"),
    _kind("graph_capture", dict(model=_str(), tokens_per_request=_int(POS), sizes=_str(), strategy=_str(),
                                graphs=_int(NONNEG), capture_s=_num(NONNEG, nullable=False),
                                pool_mib=_num(NONNEG, nullable=False)),
          unique=["model", "tokens_per_request", "sizes", "strategy"], meta="section",
          what="graphs captured per strategy (studies/graphs/record.py)"),
    _kind("graph_replay", dict(model=_str(), tokens=_int(POS), requests=_int(POS), tokens_per_request=_int(POS),
                               active=_int(NONNEG), variant=_str(), rows=_int(NONNEG, nullable=True), rep=_int(NONNEG),
                               us=_num(POS, nullable=False)),
          unique=["model", "tokens", "requests", "tokens_per_request", "active", "variant", "rep"], meta="section",
          what="one row per repetition of one step (studies/graphs/record.py)"),
    _kind("graph_switches", dict(model=_str(), strategy=_str(), switch=_int(NONNEG), active=_int(NONNEG),
                                 graph_size=_int(POS), rows=_int(NONNEG), bit_exact_vs_same_graph_eager=_bool(),
                                 rel_err_vs_eager=_num(NONNEG, nullable=False)),
          unique=["model", "strategy", "graph_size", "switch"], meta="section",
          what="replay after adapter switches vs eager"),
    # the kernel tables' keys: the smallest column sets unique in every committed file of the kind (removing any
    # one column makes some committed file non-unique); exempt: the `check` rows (a candidate list that holds one
    # tile twice is checked twice, the same row) and `decode_tile` (the table's tile timed as a candidate too)
    _kind("kernel_run", dict(section=_str(), preset=_str(nullable=True, required=False),
                             op=_str(nullable=True, required=False),
                             M=_int(POS, nullable=True, required=False), time_us=_num(POS, required=False),
                             bw_frac=_num(NONNEG, required=False), rel_err=_num(NONNEG, required=False),
                             base=_num(POS, required=False), lora_share=_num(required=False)),
          unique=["section", "preset", "M", "op", "config", "lora_variant"], unique_except=_KERNEL_EXEMPT,
          what="one run of studies/kernels/record_expand.py / record_fused.py (a wide table of sections)"),
    _kind("kernel_tidy", dict(session=_str(), commit=_str(nullable=True), gpu=_str(nullable=True),
                              M=_int(POS, nullable=True, required=False), time_us=_num(POS, required=False),
                              duration_us=_num(POS, required=False)),
          unique=["section", "preset", "op", "M", "tile", "arm", "kernel", "config", "occurrence"],
          unique_except=_KERNEL_EXEMPT, meta="section",
          what="a kernels tidy table (studies/kernels/tidy.py): every session's rows"),
    # four tiles are listed twice in the first resources recording (the early arm at M=8192 of two builds that
    # resolve to one tile)
    _kind("kernel_resources", dict(session=_str(), kernel=_str(), preset=_str(), op=_str(), M=_int(POS), arm=_str(),
                                   tile=_str(), num_warps=_int(POS), regs=_int(NONNEG), stack=_int(NONNEG),
                                   shared=_int(NONNEG), programs_per_sm=_int(NONNEG, nullable=True)),
          unique=["preset", "op", "M", "arm", "tile"], unique_except=(("arm", ("early",)),), meta="section",
          what="compiled kernels' registers, stack, shared memory (studies/kernels/resources.py)"),
    _kind("kernel_recording", dict(section=_str(), preset=_str(nullable=True), op=_str(nullable=True, required=False),
                                   M=_int(POS, nullable=True, required=False), time_us=_num(POS, required=False),
                                   rel_err=_num(NONNEG, required=False)),
          unique=["section", "preset", "op", "dtype", "M", "config"], unique_except=_KERNEL_EXEMPT,
          what="the first kernels recording (studies/kernels/record.py: kernels.csv, harness.Recorder)"),
    _kind("kernel_peers", dict(engine=_str(), op=_str(), preset=_str(), M=_int(POS), time_us=_num(POS, nullable=False)),
          unique=["engine", "op", "preset", "M"], what="peer engines' kernel times carried from their sources"),
    _kind("backends", dict(preset=_str(), layers=_int(POS), M=_int(POS), dtype=_str(), rank=_int(POS),
                           torch_us=_num(POS), triton_us=_num(POS), speedup=_num(POS),
                           rel_err=_num(NONNEG, nullable=False), ok=_bool()),
          unique=["preset", "M"], what="Triton vs torch backend per preset and size (studies/backends/record.py)"),
    _kind("clocks", dict(t_unix=_num(POS, nullable=False), sm_mhz=_num(NONNEG), mem_mhz=_num(NONNEG),
                         power_w=_num(NONNEG), temp_c=_num(), throttle=_str(nullable=True)),
          meta="session",  # samples: two samples may carry one stamp and one reading (no key); the seal guards them
          what="nvidia-smi samples every 100 ms of a session (instruments/recorders/clocks.ClockLog)"),
    _kind("replay_reproduction", dict(trace=_str(), forward=_int(NONNEG), host_calls=_num(NONNEG),
                                      kernels=_num(NONNEG), syncs=_num(NONNEG), traced_ms=_num(POS, nullable=False),
                                      replayed_ms=_num(POS, nullable=False), err_pct=_num(), replay_s=_num(NONNEG)),
          # no key: one trace name is in two sessions' folders and the table does not say which (the seal guards it)
          what="each profiled forward replayed against its trace (studies/replay/record.py)"),
    _kind("replay_vs_simulator", dict(model=_str(), config=_str(), guard=_str(), mode=_str(), layers=_int(POS),
                                      quantity=_str(), replay_ms=_num(), simulator_ms=_num(),
                                      sim_vs_replay_pct=_num()),
          unique=["model", "config", "guard", "mode", "layers", "quantity"],
          what="the replay against the analytic simulator (studies/replay/record.py)"),
    _kind("replay_validation", dict(model=_str(), config=_str(), source=_str(), target=_str(),
                                    predicted_ms=_num(POS), measured_ms=_num(POS, nullable=False),
                                    measured_lo=_num(POS),
                                    measured_hi=_num(POS), err_pct=_num(), passed=_bool(nullable=True)),
          unique=["model", "config", "source", "target"],
          what="a guard's forward predicted from another guard's profiled forward (studies/replay/record.py)"),
    _kind("simulator_validation", dict(fold=_str(), preset=_str(), layers=_int(POS), tokens=_int(POS), guard=_str(),
                                       mode=_str(), active=_num(FRACTION, nullable=False),
                                       median_us=_num(POS, nullable=False),
                                       lo95_us=_num(POS), hi95_us=_num(POS), predicted_us=_num(POS),
                                       error_pct=_num(), passes=_bool(nullable=True)),
          unique=["fold", "preset", "layers", "tokens", "guard", "mode", "active"],
          what="the simulator's held-out points (lora_moe_lab/sim/calibration.py)"),
    _kind("simulator_vs_production", dict(tokens=_int(POS), mode=_str(), metric=_str(), predicted=_num(),
                                          production=_num(), ratio=_num()),
          unique=["tokens", "mode", "metric"], what="the simulator against production's figures (sim/calibration.py)"),
    _kind("probe", dict(session=_str(nullable=True), host_us_per_layer=_num(NONNEG, nullable=False), lead_us=_num(),
                        predicted_gain_pct=_num(), measured_gain_pct=_num(), measured_gain_pct_lo=_num(),
                        measured_gain_pct_hi=_num(), reps=_int(NONNEG), preset=_str(), layers=_int(POS)),
          unique=["session", "host_us_per_layer"], what="the gain probe's points (instruments/recorders/probe.py)"),
    _kind("probe_points", dict(session=_str(), host_us_per_layer=_num(NONNEG, nullable=False), lead_us=_num(),
                               measured_gain_pct=_num(), measured_gain_pct_lo=_num(), measured_gain_pct_hi=_num()),
          unique=["session", "host_us_per_layer"], what="every probe session's points (studies/probe/read.py)"),
    _kind("probe_validation", dict(session=_str(), host=_str(), lead_us=_num(POS, nullable=False),
                                   predicted_gain_pct=_num(),
                                   measured_gain_pct=_num(), error_pp=_num(), within_goal=_bool(nullable=True)),
          unique=["session", "host", "relation", "left_out"],
          what="the probe's leave-one-out checks (studies/probe/read.py): by session, by GPU model"),
    # an eager launch's host time, part by part (studies/launch_cost/record.py); host_us is empty only where the
    # direct launcher call failed and `error` says why (studies/launch_cost/read.py holds each row to that)
    _kind("launch_cost", dict(path=_str(), step=_str(), M=_int(NONNEG),
                              part=_str(pa.Check.isin(["full", "no_triton", "no_checks", "binder", "launcher"])),
                              host_us=_num(POS, _at_most(1e6, "µs", "a second per call: a time in ns written as µs?")),
                              launches=_int(pa.Check.ge(1), nullable=True, required=False),
                              error=_str(nullable=True, required=False)),
          unique=["path", "step", "M", "part"], what="where an eager LoRA launch's host time goes, one GPU per file "
                                                      "(studies/launch_cost/record.py)"),
    _kind("tp_prediction", dict(task=_str(), metric=_str(), sessions=_int(POS), estimate=_num(), lo=_num(), hi=_num()),
          unique=["task", "metric"], what="the TP=4 prediction from the emulated sessions (studies/tp_emulation)"),
    _kind("tp_validation", dict(point=_str(), guard_sites=_str(), guard=_str(), emulated=_num(POS),
                                measured=_num(POS, nullable=False), err_pct=_num(), passed=_bool(nullable=True)),
          unique=["point", "guard"], what="TP=2 emulated against measured (studies/tp_emulation/record.py)"),
    _kind("traces_summary", dict(file=_str(), guard=_str(), mode=_str(), M=_int(POS), n_forwards=_int(NONNEG),
                                 gpu_span_ns=_num(NONNEG), busy_ns=_num(NONNEG), idle_ns=_num(NONNEG),
                                 n_syncs=_num(NONNEG)),
          unique=["file"], what="one row per committed profiler trace (studies/traces)"),
    _kind("prefill", dict(_PREFILL_COLS, **_PREFILL_OPT), unique=_PREFILL_KEY + ["rep"],
          what="prefill rows of instruments/recorders/prefill.py (one row per guard and repetition)"),
    _kind("prefill_summary", _SUMMARY_COLS, unique=_PREFILL_KEY,
          what="a prefill summary (prefill.summarize): one row per guard"),
    _kind("production_task", dict(_PREFILL_COLS, **_PREFILL_OPT, session=_str(), task=_str()),
          unique=_PREFILL_KEY + ["rep", "session", "task"], meta="session",
          what="a signature session's task rows (studies/production/record.py)"),
    _kind("production_summary", dict(_SUMMARY_COLS, session=_str(required=False), task=_str(required=False)),
          unique=_PREFILL_KEY, meta="session", what="a signature session's task summary"),
    _kind("production_signature", dict(forward=_int(POS), n_syncs=_int(NONNEG),
                                       host_blocked_ms=_num(NONNEG, nullable=False), first_share=_num(FRACTION),
                                       idle_after_ms=_num(NONNEG), guard=_str(), session=_str(), task=_str()),
          unique=["session", "task", "guard", "adapters", "forward"], meta="session",
          what="per profiled forward (instruments/analysers/signature.per_forward)"),
    _kind("production_syncs", dict(forward=_int(POS), device=_int(NONNEG), sync_index=_int(NONNEG),
                                   start_ns=_num(POS, nullable=False), end_ns=_num(POS, nullable=False),
                                   host_blocked_us=_num(NONNEG, nullable=False), idle_after_us=_num(NONNEG),
                                   guard=_str(), session=_str(), task=_str()),
          unique=["session", "task", "guard", "adapters", "forward", "device", "sync_index"], meta="session",
          what="per sync of the profiled forwards (signature.per_sync)"),
    _kind("bench_sweep", dict(gpu=_str(), torch=_str(), triton=_str(nullable=True), cuda=_str(nullable=True),
                              python=_str(), commit=_str(nullable=True), date=_str(),
                              preset=_str(), layers=_int(POS), tokens=_int(POS), guard=_str(),
                              active=_num(FRACTION, nullable=False), rank=_int(POS), mode=_str(), dtype=_str(),
                              backend=_str(), requests=_int(POS), skew=_num(NONNEG, nullable=False),
                              warmup=_int(NONNEG), reps=_int(NONNEG), median_us=_num(POS), p10_us=_num(POS),
                              p90_us=_num(POS), mean_us=_num(POS), wall_median_us=_num(POS), timer=_str(nullable=True),
                              syncs_per_forward=_num(NONNEG), error=_str(nullable=True),
                              seed=_int(NONNEG, required=False), device=_str(nullable=True, required=False)),
          # the key (bench.py KEY_COLUMNS), with the settings (SETTING_COLUMNS) where the file has them
          unique=["preset", "layers", "tokens", "guard", "active", "rank", "mode", "dtype", "backend", "requests",
                  "skew", "seed", "device"],
          what="a sweep of instruments/recorders/bench.py (COLUMNS; one row per point)"),
    _kind("audit_priced", dict(session=_str(), model=_str(), tokens=_int(POS), layers=_int(POS), experts=_int(POS),
                               rewrite=_str(), syncs_before=_num(NONNEG, nullable=False),
                               syncs_after=_num(NONNEG, nullable=False), predicted_saving_us=_num(),
                               measured_saving_us=_num(), measured_lo_us=_num(), measured_hi_us=_num(),
                               eager_us=_num(POS, nullable=False),
                               hoisted_us=_num(POS, nullable=False), reps=_int(NONNEG, nullable=True)),
          unique=["session", "model"], what="the audit corpus's priced rewrites, a row per session and model "
                                            "(studies/audit_corpus/record.py)"),
    _kind("audit_sites", dict(session=_str(), model=_str(), site=_str(), function=_str(), kind=_str(),
                              count=_num(NONNEG, nullable=False), torch_count=_num(NONNEG)),
          unique=["session", "model", "site", "kind"], meta="audit",
          what="the audit corpus's sync sites, a row per session, model, site and kind"),
    _kind("hidden_syncs", dict(session=_str(), pattern=_str(), kind=_str(), occurrences=_num(NONNEG, nullable=False),
                               n=_int(NONNEG), status=_str(pa.Check.isin(["ok", "unstable"])), method=_str(),
                               # NaN where a point is unstable
                               original_ms=_num(POS), rewrite_ms=_num(POS), diff_us=_num(), diff_lo_us=_num(),
                               diff_hi_us=_num(), per_occ_us=_num(), per_occ_lo_us=_num(), per_occ_hi_us=_num()),
          unique=["session", "pattern"], what="the hidden-sync patterns timed paired (studies/hidden_syncs/record.py)"),
    # LoRA's cost end to end (studies/lora_tax/): NaN figures where a cell is unstable or ran out of memory (status)
    _kind("lora_tax", dict(session=_str(), regime=_str(pa.Check.isin(_REGIMES)), shape=_str(), tokens=_int(POS),
                           ranks=_str(), mix=_str(), mode=_str(pa.Check.isin(_LORA_MODES)),
                           status=_str(pa.Check.isin(["ok", "unstable", "oom", "error"])), n=_int(NONNEG),
                           off_ms=_num(POS), on_ms=_num(POS), ratio=_num(POS), lo=_num(POS), hi=_num(POS),
                           t_lora_floor_ms=_num(NONNEG, nullable=False), floor_ratio=_num(FRACTION), interval=_str()),
          unique=_LORA_CELL + ["session"], what="LoRA-on / LoRA-off throughput, a row per cell and session "
                                               "(studies/lora_tax/record.py)"),
    _kind("lora_tax_reps", dict(session=_str(), regime=_str(pa.Check.isin(_REGIMES)), shape=_str(), tokens=_int(POS),
                                pool_max_rank=_int(POS), mode=_str(pa.Check.isin(_LORA_MODES)), arm=_str(),
                                rep=_int(NONNEG), ms=_num(POS, nullable=False), kept=_bool()),
          unique=["session", "regime", "shape", "tokens", "pool_max_rank", "mode", "arm", "rep"],
          what="every timed call of the lora_tax cells (studies/lora_tax/record.py)"),
    _kind("lora_tax_summary", dict(regime=_str(pa.Check.isin(_REGIMES)), shape=_str(), tokens=_int(POS), ranks=_str(),
                                   mix=_str(), mode=_str(pa.Check.isin(_LORA_MODES)), ratio=_num(POS), lo=_num(POS),
                                   hi=_num(POS), floor_ratio=_num(FRACTION), sessions=_int(NONNEG)),
          unique=_LORA_CELL, what="the lora_tax cells over their sessions (studies/lora_tax/read.py)"),
    _kind("lora_tax_base_floor", dict(preset=_str(), op=_str(pa.Check.isin(["gate_up", "down"])), M=_int(POS),
                                      bound=_str(pa.Check.isin(["bytes", "flops"])), floor_us=_num(POS, nullable=False),
                                      table_us=_num(POS, nullable=False), of_floor=_num(POS, nullable=False),
                                      sessions=_int(POS)),
          unique=["preset", "op", "M"], what="each base MoE GEMM as a fraction of its floor "
                                             "(studies/lora_tax/base_floor.py)"),
    _kind("lora_tax_base_layer", dict(session=_str(), preset=_str(), M=_int(POS),
                                      part=_str(pa.Check.isin(["router", "SiLU and mul", "top-k sum"])),
                                      us=_num(NONNEG, nullable=False), floor_us=_num(POS, nullable=False),
                                      busy_us=_num(POS, nullable=False)),
          unique=["session", "preset", "M", "part"], what="the base layer's non-GEMM parts against their floors, per "
                                                          "parts session (studies/lora_tax/base_layer.py)"),
    _kind("lora_tax_host", dict(shape=_str(), tokens=_int(POS), arm=_str(), layers=_int(POS), reps=_int(POS),
                                inner=_int(POS), warmup=_int(NONNEG), off_us_per_layer=_num(POS, nullable=False),
                                on_us_per_layer=_num(POS, nullable=False), added_us_per_layer=_num(nullable=False),
                                ratio=_num(POS), lo=_num(POS), hi=_num(POS), interval=_str(),
                                launches_off=_num(NONNEG), launches_on=_num(NONNEG), device=_str()),
          unique=["shape", "tokens", "arm", "device"], what="LoRA's host cost per layer, stubbed kernels "
                                                            "(studies/lora_tax/host.py)"),
    _kind("lora_tax_ncu", dict(kernel=_str(), preset=_str(), M=_int(POS), op=_str(), arm=_str(), tile=_str(),
                               ranks=_str(), byte_floor=_num(POS), byte_floor_padded=_num(POS),
                               duration_us=_num(POS, nullable=False), dram_read_bytes=_num(NONNEG),
                               dram_write_bytes=_num(NONNEG), dram_pct_peak=_num(PCT_), tensor_pipe_pct=_num(PCT_),
                               sm_pct_peak=_num(PCT_), achieved_occupancy_pct=_num(PCT_), l2_hit_pct=_num(PCT_),
                               registers=_int(NONNEG, nullable=True), top_stall=_str(nullable=True)),
          unique=["kernel", "preset", "M", "op", "arm", "tile", "ranks"],
          what="Nsight Compute's counters of the LoRA kernels, own rank against padded (studies/lora_tax)"),
    _kind("own_rank", dict(session=_str(), regime=_str(pa.Check.isin(_REGIMES)), shape=_str(), tokens=_int(POS),
                           pool_max_rank=_int(POS), mode=_str(pa.Check.isin(_LORA_MODES)), ranks=_str(), mix=_str(),
                           setting=_str(), n=_int(NONNEG), own_ms=_num(POS, nullable=False),
                           padded_ms=_num(POS, nullable=False), speedup=_num(POS),
                           lo=_num(POS), hi=_num(POS), wins=_bool(), ratio_own=_num(POS), ratio_padded=_num(POS)),
          unique=["session", "regime", "shape", "tokens", "pool_max_rank", "mode", "ranks", "mix"],
          what="each adapter read at its own rank against the pool's padded rank (studies/lora_tax)"),
    _kind("lora_tax_superseded", dict(session=_str(), cells=_str(), why=_str()), unique=["session", "cells"],
          what="sessions' lora_tax cells recorded on a path the library no longer runs (studies/lora_tax/read.py)"),
]}


@dataclass(frozen=True)
class FileKind:
    """A kind of recording that is not a table (a profiler trace, the catalog): sealed by its size and hash in its
    metadata (`file_meta_path`), its content checked by its reader (read_trace, provenance.catalog_entries)."""
    name: str
    what: str = ""

    @property
    def files(self) -> tuple:
        return Kind.files.fget(self)


FILE_KINDS: dict[str, FileKind] = {k.name: k for k in [
    FileKind("trace", "a profiler trace (chrome-trace JSON, gzip'd): sealed in its <name>.meta.json, else in its "
                      "folder's meta.json"),
    FileKind("catalog", "data/catalog.json: logical name -> recording (lora_moe_lab.provenance.catalog); sealed in "
                        "catalog.meta.json"),
]}


def file_meta_path(path) -> Path:
    """Where a non-table file's seal lives: <name>.meta.json beside it where that exists (x.json.gz, x.json ->
    x.meta.json), else its folder's meta.json for a trace (one for a folder of traces), <name>.meta.json else."""
    p = Path(path)
    own = p.parent / (re.sub(r"(\.json)?(\.gz)?$", "", p.name) + ".meta.json")
    return p.parent / "meta.json" if not own.is_file() and p.name.endswith(".json.gz") else own


def kind_of(kind) -> Kind:
    if isinstance(kind, Kind):
        return kind
    try:
        return KINDS[kind]
    except KeyError:
        raise KeyError(f"no recording kind {kind!r}; the kinds are {', '.join(KINDS)}") from None


# ----------------------------------------------------------------------------------------------
# Validation
def _first_failure(err: SchemaErrors | SchemaError, df: pd.DataFrame) -> tuple:
    """(row, what) of the first failure: a missing column or a frame-wide failure -> "header"."""
    fc = getattr(err, "failure_cases", None)
    if fc is None or not len(fc):
        return "header", str(err).splitlines()[0]
    fc = fc.copy()
    pos = {ix: i for i, ix in enumerate(df.index)}
    fc["_pos"] = [pos.get(ix, -1) if ix is not None and not (isinstance(ix, float) and np.isnan(ix)) else -1
                  for ix in fc["index"]]
    head = fc[fc["_pos"] < 0]
    # the columns first (a missing column makes every row's failure meaningless), then the first row
    structural = head[head["check"].astype(str).str.contains("column_in_dataframe|column_in_schema")]
    if len(structural):
        r = structural.iloc[0]
        return "header", f"missing column {r['failure_case']!r}" if "column_in_dataframe" in str(r["check"]) \
            else f"{r['check']}: {r['failure_case']}"
    rows = fc[fc["_pos"] >= 0].sort_values("_pos", kind="stable")
    if len(rows):
        r = rows.iloc[0]
        col = r["column"]
        val = df.iloc[int(r["_pos"])].get(col) if isinstance(col, str) and col in df.columns else r["failure_case"]
        val = val.item() if isinstance(val, np.generic) else val  # -5.0, not np.float64(-5.0)
        check = str(r["check"])
        if check.startswith("coerce_dtype") or check.startswith("dtype"):
            what = f"column {col!r}: {val!r} is not a number"
        elif "not_nullable" in check:
            what = f"column {col!r}: empty (NaN) where a value is required"
        else:
            what = f"column {col!r}: {val!r} fails {check}"
        return int(r["_pos"]) + 1, what
    r = head.iloc[0]
    col, check = r["column"], str(r["check"])
    if check.startswith("dtype") and isinstance(col, str) and col in df:  # a column read as text
        bad = pd.to_numeric(df[col], errors="coerce").isna() & df[col].notna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            return i + 1, f"column {col!r}: {df[col].iloc[i]!r} is not a number"
    return "header", f"column {col!r}: {check}: {r['failure_case']}"


def _unique_failure(df: pd.DataFrame, unique, exempt=()) -> tuple | None:
    cols = [c for c in unique if c in df.columns]
    if not cols or len(cols) != len(unique) or not len(df):
        return None
    dup = df.duplicated(cols, keep="first").to_numpy().copy()
    for col, values in exempt:  # rows the key does not hold (Kind.unique_except)
        if col in df.columns:
            dup &= ~df[col].isin(list(values)).to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        row = {c: df[c].iloc[i] for c in cols}  # column by column: a row across int and float columns is all float
        key = {c: v.item() if isinstance(v, np.generic) else v for c, v in row.items()}
        return i + 1, f"duplicate key {key} (unique {cols}): a row written twice?"
    return None


def validate(df: pd.DataFrame, kind, path) -> pd.DataFrame:
    """`df` checked against the kind's schema; the frame is returned as read (the check coerces a copy).
    RecordingError naming `path`, the first bad row and what is wrong."""
    k = kind_of(kind)
    if not len(df.columns):
        raise RecordingError(path, "header", f"no columns: not a {k.name} recording")
    missing = [c for c, col in k.schema.columns.items() if col.required and c not in df.columns]
    if missing:
        raise RecordingError(path, "header", f"missing column(s) {missing}: not a {k.name} recording "
                                             f"({k.what or 'see schemas.KINDS'})")
    if not len(df):
        raise RecordingError(path, 1, f"no data rows: an empty {k.name} recording")
    d = df.reset_index(drop=True)
    try:
        k.schema.validate(d, lazy=True, inplace=False)
    except (SchemaErrors, SchemaError) as e:
        row, what = _first_failure(e, d)
        u = _unique_failure(d, _key_for(k, d), k.unique_except)  # a duplicated row before the first bad one
        if u is not None and (row == "header" or u[0] < row):
            row, what = u
        raise RecordingError(path, row, what) from None
    u = _unique_failure(df.reset_index(drop=True), _key_for(k, df), k.unique_except)
    if u is not None:
        raise RecordingError(path, *u)
    return df


def _key_for(k: Kind, df: pd.DataFrame) -> list:
    """The unique key this file can be held to: the declared key, with `session` and `gpu` (PARTITION) added where
    the file has them and the key lacks them (a file of several sessions or cards), and without the optional
    columns it lacks."""
    key = [c for c in k.unique if c in df.columns]
    if key:
        key = [c for c in PARTITION if c in df.columns and c not in key] + key
    return key


# ----------------------------------------------------------------------------------------------
# Seals
def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rows(data: bytes) -> int:
    """Data rows of a CSV's bytes (its records, quoted newlines counted once; the header not counted)."""
    import csv

    n = sum(1 for _ in csv.reader(io.StringIO(data.decode("utf-8", errors="replace"))))
    return max(n - 1, 0)


def seal(path) -> dict:
    """A CSV: {"rows": data rows, "sha256": hex of the file's bytes}; any other file (a trace, a JSON table):
    {"bytes": its size, "sha256": hex}."""
    data = Path(path).read_bytes()
    if Path(path).name.endswith(".csv"):
        return {"rows": _rows(data), "sha256": _hash(data)}
    return {"bytes": len(data), "sha256": _hash(data)}


_SECTION_SUFFIX = re.compile(r"_(ncu|capture|replay|switches)$")


def meta_path(csv_path, kind=None) -> Path:
    """The metadata file a CSV's seal lives in (it may not exist yet): see the module docstring."""
    p = Path(csv_path)
    k = kind_of(kind) if kind is not None else None
    base = re.sub(r"(\.summary|\.signature|\.syncs)?\.csv$", "", p.name)
    if (k is not None and k.meta == "session") or (k is None and (p.parent / "meta.json").is_file()):
        return p.parent / "meta.json"
    if k is not None and k.meta == "audit":
        return p.parent / "priced.meta.json"
    cands = [p.parent / f"{base}.meta.json"]
    if k is None or k.meta == "section":
        cands.append(p.parent / f"{_SECTION_SUFFIX.sub('', base)}.meta.json")
    for c in cands:
        if c.is_file():
            return c
    return cands[-1] if k is not None and k.meta == "section" else cands[0]


def _seal_keys(name: str) -> tuple:
    """What a complete seal holds: a CSV's data rows and hash; any other file's size and hash."""
    return ("rows", "sha256") if name.endswith(".csv") else ("bytes", "sha256")


def _seal_in(meta: dict, name: str) -> dict | None:
    """The seal of `name` in `meta` (None where it holds none for it); see `seal_of` for the strict read."""
    if not isinstance(meta, dict):
        return None
    files = meta.get("files")
    if isinstance(files, dict) and isinstance(files.get(name), dict):
        return files[name]
    if "files" not in meta and ("rows" in meta or "sha256" in meta):
        return meta
    return None


def seal_of(path, mp, meta) -> dict:
    """The complete seal of the file `path` in its metadata `meta` (read from `mp`). RecordingError naming the file:
    "sealed for another file" (the metadata seals other files, not this one: another recording's, another session's),
    "partly sealed" (an entry that is not an object, or lacks rows/bytes or sha256), "unsealed" (no seal at all)."""
    p, mp = Path(path), Path(mp)
    keys = _seal_keys(p.name)
    if not isinstance(meta, dict):
        raise RecordingError(p, "meta", f"partly sealed: {mp.name} is a {type(meta).__name__}, not an object")
    files = meta.get("files")
    if files is not None:
        if not isinstance(files, dict):
            raise RecordingError(p, "meta", f"partly sealed: {mp.name}'s \"files\" is a {type(files).__name__}, "
                                            "not an object of seals")
        if p.name not in files:
            raise RecordingError(p, "meta", f"sealed for another file: {mp.name} seals "
                                            f"{', '.join(sorted(files)[:4]) or 'nothing'}, not {p.name} (the "
                                            "metadata of another recording or session?)")
        s = files[p.name]
    elif any(k in meta for k in ("rows", "bytes", "sha256")):
        s = meta  # a meta of one file, sealed at its top level
    else:
        raise RecordingError(p, "meta", f"unsealed: {mp.name} holds no seal for {p.name}; seal it "
                                        "(scripts/seal_recordings.py) or record it again")
    if not isinstance(s, dict):
        raise RecordingError(p, "meta", f"partly sealed: its seal in {mp.name} is a {type(s).__name__}, not "
                                        f"{{{', '.join(keys)}}}")
    missing = [k for k in keys if k not in s]
    if missing:
        raise RecordingError(p, "meta", f"partly sealed: its seal in {mp.name} lacks {', '.join(missing)}")
    if not (isinstance(s["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", s["sha256"])):
        raise RecordingError(p, "meta", f"partly sealed: its seal in {mp.name} has sha256 {s['sha256']!r}, not 64 "
                                        "hex digits")
    n = s[keys[0]]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise RecordingError(p, "meta", f"partly sealed: its seal in {mp.name} has {keys[0]} {n!r}, not a count")
    return s


def write_seal(csv_path, meta_path_: str | os.PathLike | None = None, kind=None) -> dict:
    """Store seal(csv_path) under meta["files"][<file name>] in its metadata (`meta_path_`, else
    meta_path(csv_path, kind)), written atomically (a temp file in the same folder + os.replace); a meta
    that does not exist yet is created holding the seal alone. Returns the seal."""
    p = Path(csv_path)
    mp = Path(meta_path_) if meta_path_ is not None else meta_path(p, kind)
    meta = read_json(mp) if mp.is_file() else {}
    if not isinstance(meta, dict):
        raise RecordingError(mp, "meta", f"metadata is a {type(meta).__name__}, not an object: cannot hold a seal")
    s = seal(p)
    files = meta.get("files")
    if not isinstance(files, dict):
        files = {}
    files[p.name] = s
    meta["files"] = files
    text = json.dumps(meta, indent=1) + "\n"
    fd, tmp = tempfile.mkstemp(dir=mp.parent, prefix=f".{mp.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, mp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return s


# ----------------------------------------------------------------------------------------------
# Reading
def read_json(path):
    """A JSON file; a file that is not JSON -> RecordingError naming it (row "meta", the line and column)."""
    p = Path(path)
    try:
        text = p.read_text()
    except UnicodeDecodeError as e:
        raise RecordingError(p, "meta", f"not UTF-8 text: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordingError(p, "meta", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def read_trace(path, *, sealed: bool | None = None, **json_kw) -> dict:
    """A profiler trace (gzip'd JSON when it starts with gzip's magic, else JSON), checked against its seal
    (file_meta_path; refused unsealed under data/ or with `sealed=True`) and its format: an object with a
    `traceEvents` list (a bare list is that list). Cut, invalid or foreign -> RecordingError naming the file.
    `json_kw` go to json.loads (parse_float)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no trace at {p}")
    raw = p.read_bytes()
    check_seal(p, raw, meta=file_meta_path(p), sealed=bool(sealed) or (sealed is None and _in_data(p)))
    try:
        text = gzip.decompress(raw).decode("utf-8") if raw[:2] == b"\x1f\x8b" else raw.decode("utf-8")
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise RecordingError(p, "trace", f"damaged or cut compressed file: {type(e).__name__}: {e}") from None
    try:
        doc = json.loads(text, **json_kw)
    except json.JSONDecodeError as e:
        cut = " (cut: the text ends before the JSON does)" if e.pos >= len(text.rstrip()) else ""
        raise RecordingError(p, "trace", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}{cut}") from None
    if isinstance(doc, list):  # the JSON-array flavour of the format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        have = sorted(doc)[:6] if isinstance(doc, dict) else type(doc).__name__
        raise RecordingError(p, "trace", f"not a chrome trace: no traceEvents list (it has {have})")
    return doc


def check_seal(path, data: bytes, kind=None, *, sealed: bool = True, meta: str | os.PathLike | None = None) -> None:
    """The file's bytes against its seal (in `meta`, else meta_path(path, kind)). A file with no metadata is refused
    as unsealed unless `sealed` is False (a caller's own file, outside data/); a seal for another file, a partial seal
    or one that disagrees (rows, size or hash: cut, appended, edited) is always refused."""
    p = Path(path)
    mp = Path(meta) if meta is not None else meta_path(p, kind)
    if not mp.is_file():
        if sealed:
            raise RecordingError(p, "meta", f"unsealed: no metadata {mp.name} beside it holds its seal; seal it "
                                            "(scripts/seal_recordings.py) or record it again")
        return
    m = read_json(mp)
    if not sealed and isinstance(m, dict) and "files" not in m and not any(k in m for k in ("rows", "bytes",
                                                                                             "sha256")):
        return  # metadata written before seals, of a caller's own file
    s = seal_of(p, mp, m)
    if "rows" in s:
        rows = _rows(data)
        if int(s["rows"]) != rows:
            # the row: the first one missing (a cut) or the first one added (an append)
            raise RecordingError(p, min(rows, int(s["rows"])) + 1,
                                 f"{rows} data rows, but its seal in {mp.name} says {s['rows']}: "
                                 f"{'cut' if rows < int(s['rows']) else 'rows appended'} since it was sealed")
    elif int(s["bytes"]) != len(data):
        raise RecordingError(p, "meta", f"{len(data)} bytes, but its seal in {mp.name} says {s['bytes']}: "
                                        f"{'cut' if len(data) < int(s['bytes']) else 'grown'} since it was sealed")
    if s["sha256"] != _hash(data):
        raise RecordingError(p, "meta", f"content hash differs from its seal in {mp.name} "
                                        f"(sha256 {s['sha256'][:12]}...): the file changed since it was sealed")


def read_csv(path, kind, *, sealed: bool | None = None, **read_kw) -> pd.DataFrame:
    """A recording of kind `kind`: the file must end with a newline (else its last line was cut in the
    write), agree with its seal, and pass the kind's schema. A file under data/ (or any, with `sealed=True`) is
    refused unsealed; a caller's own file elsewhere may have no seal yet, but a seal for another file, a partial
    one or one that disagrees is refused everywhere. `read_kw` go to
    pandas.read_csv (a reader that reads text keeps its dtype=str; the schema check then coerces a copy)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no recording at {p}")
    data = p.read_bytes()
    if not data.strip():
        raise RecordingError(p, "header", "empty file: no header, no rows")
    if not data.endswith(b"\n"):
        raise RecordingError(p, max(_rows(data), 1), "the last line has no newline: the write was cut")
    check_seal(p, data, kind, sealed=bool(sealed) or (sealed is None and _in_data(p)))
    k = kind_of(kind)
    key = (_hash(data), k.name, id(k.schema), repr(sorted(read_kw.items())))
    if key in _CHECKED:  # these bytes already parsed and passed this schema: the check is a function of them
        return _CHECKED[key].copy()
    try:
        df = pd.read_csv(io.BytesIO(data), **read_kw)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        m = re.search(r"line (\d+)", str(e))
        raise RecordingError(p, int(m.group(1)) - 1 if m else "header", f"not a CSV: {e}") from None
    validate(_as_read(df, read_kw), kind, p)
    if len(_CHECKED) >= 256:
        _CHECKED.pop(next(iter(_CHECKED)))
    _CHECKED[key] = df.copy()
    return df


# (content hash, kind, schema, read options) -> the frame that passed: the same bytes read again in one process (the
# renderers read a session's files once per block) skip the parse and the schema check, never the seal check
_CHECKED: dict[tuple, pd.DataFrame] = {}


def _in_data(p: Path) -> bool:
    """Is `p` one of the repository's recordings (under data/)? Those are always held to their seal."""
    from ...provenance import DATA

    try:
        return Path(p).resolve().is_relative_to(Path(DATA).resolve())
    except OSError:
        return False


def _as_read(df: pd.DataFrame, read_kw: dict) -> pd.DataFrame:
    """A text-read frame (dtype=str, keep_default_na=False) with its empty cells as NaN, for the schema."""
    if read_kw.get("dtype") is str or read_kw.get("keep_default_na") is False:
        return df.replace({"": np.nan})
    return df

