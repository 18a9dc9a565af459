"""Chunked prefill, as a serving engine runs it: R requests of L input tokens, prefilled in
chunks of C tokens (C a multiple of L: each chunk holds C // L whole requests), one forward per
chunk, per guard. What it measures per prefill:

    input throughput   R * L tokens / time from the prefill's start to the last chunk's end
    TTFT per request   time from the prefill's start until the chunk holding its last token ends
                       (every request arrives at the start: the production batch of 128 x 2048)
    syncs per forward  the `sync` guard's `.item()` calls (model.guards.count_guard_syncs) / chunks
    GPU idle/forward   one profiled forward per guard (instruments.recorders.profiling), GPU only, NaN on CPU

    lab = build_decoder_lab("tiny", num_layers=2); lab.pool.load("a0", rank=8)
    drv = PrefillDriver(lab, make_plan(8, 16, 32), request_adapters(8, "mix", ["a0"]))
    drv.run("cpu_flag")  -> dict(prefill_ms, input_tok_per_s, ttft_*_ms, syncs_per_forward, ...)

Why the host must never sync here: with `cpu_flag` the host issues chunk after chunk while the GPU
is still busy with earlier ones, so the GPU queue never drains. The per-chunk batch metadata is
built from Python lists (LoRABatchTensors.from_batch: one pinned, non-blocking copy) and the
per-chunk clock is CUDA events that are only read after the whole prefill.
tests/instruments/recorders/test_prefill.py runs a whole prefill inside `checked_region()` to prove it.

CLI (one CSV row per guard x adapter mode x repetition, a .meta.json beside it, a summary table):

    python -m lora_moe_lab.instruments.recorders.prefill --preset tiny --layers 2 --requests 8 --input-len 16 \
        --chunk 32 --adapters none mix --reps 5 --out build/prefill.csv
    torchrun --nproc-per-node 2 -m lora_moe_lab.instruments.recorders.prefill --tp-auto ...   # rank 0 writes
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ... import runtime
from ...config import PRESETS
from ...model.guards import count_guard_syncs, guard_names
from ...provenance import metadata
from ..analysers import signature, stats
from . import tables
from .cli import (CPU_NOTE, DTYPES, HelpFormatter, device as device_arg, dtype as dtype_arg,
                  guard_sites as guard_sites_arg, nonneg_float, nonneg_int, pos_float, pos_int,
                  progress as cli_progress, seed as seed_arg)
from .timing import rotated

ADAPTER_MODES = ("none", "mix")
HOST_SIGNATURE = ("first_blocked_ms", "later_blocked_median_us", "later_blocked_mean_us", "host_blocked_ms",
                  "first_share")
NO_IDLE = dict(gpu_idle_ms=math.nan, gpu_idle_after_sync_ms=math.nan, gpu_busy_ms=math.nan, gpu_span_ms=math.nan)


class ChunkSizeError(ValueError):
    """The chunk size does not hold whole requests (C < 1, or C not a multiple of L)."""


class AdapterModeError(ValueError):
    """An adapter mode other than 'none' or 'mix'."""


class EngineCostError(ValueError):
    """An engine-cost parameter that is not a finite number in its range."""


# --- what a serving engine adds and this lab lacks (every knob off by default) ---------------
@dataclass(frozen=True)
class EngineCosts:
    """The host-side and scheduling costs of a real engine, each a parameter, all off by default.

    host_us_per_layer    the engine's own host work per layer (Python, metadata, hooks), spread
                         over the layer's four call points as a busy host (runtime.host_spin).
                         It eats the host's lead: production's host was ~116 us ahead of its GPU at
                         a typical sync, this lab's lean host over 1 ms.
    host_us_per_forward  per forward: scheduling, batch building, result processing.
    overlap_ms           GPU work of an earlier batch still queued when a forward starts (an
                         overlap scheduler issues batch N+1 while batch N runs). Issued as one
                         calibrated GPU spin kernel before the forward: the host is not blocked by it,
                         so the forward's first sync is (sgl-project/sglang#25531: ~70 ms).
                         It is GPU time of other work: `input_tok_per_s_net` leaves it out.
    """

    host_us_per_layer: float = 0.0
    host_us_per_forward: float = 0.0
    overlap_ms: float = 0.0

    LIMITS = {"host_us_per_layer": 100_000.0, "host_us_per_forward": 1_000_000.0, "overlap_ms": 10_000.0}

    def __post_init__(self):
        for name, hi in self.LIMITS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= hi:
                raise EngineCostError(f"{name} must be a finite number in [0, {hi:g}], got {v!r}")

    @property
    def off(self) -> bool:
        return not (self.host_us_per_layer or self.host_us_per_forward or self.overlap_ms)

    def as_key(self) -> dict:
        return {k: float(getattr(self, k)) for k in self.LIMITS}


# --- the plan: which requests each chunk holds -------------------------------------------------
@dataclass(frozen=True)
class PrefillPlan:
    requests: int  # R
    input_len: int  # L tokens per request
    chunk: int  # C tokens per forward (a multiple of L)

    @property
    def requests_per_chunk(self) -> int:
        return self.chunk // self.input_len

    @property
    def chunks(self) -> list[range]:
        """Request indices of each chunk (the last one may hold fewer requests)."""
        k = self.requests_per_chunk
        return [range(i, min(i + k, self.requests)) for i in range(0, self.requests, k)]

    @property
    def total_tokens(self) -> int:
        return self.requests * self.input_len


def make_plan(requests: int, input_len: int, chunk: int) -> PrefillPlan:
    for name, v in (("requests", requests), ("input_len", input_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ChunkSizeError(f"chunk must be a positive int of tokens, got {chunk!r}")
    if chunk % input_len:
        raise ChunkSizeError(f"chunk={chunk} is not a multiple of input_len={input_len}: a chunk must hold "
                             f"whole requests (try {max(1, chunk // input_len) * input_len})")
    return PrefillPlan(requests, input_len, chunk)


def request_adapters(requests: int, mode: str, names: Sequence[str], fraction: float = 0.5) -> list:
    """Adapter per request. 'none': LoRA is configured and adapters are loaded, no request uses one
    (the production case). 'mix': `fraction` of the requests, spread evenly, use the loaded
    adapters in turn."""
    if mode not in ADAPTER_MODES:
        raise AdapterModeError(f"unknown adapter mode {mode!r}; choose one of {list(ADAPTER_MODES)}")
    if mode == "none":
        return [None] * requests
    if not names:
        raise ValueError("adapter mode 'mix' needs at least one loaded adapter")
    n_use = round(fraction * requests)
    use = sorted({int(i * requests / n_use) for i in range(n_use)}) if n_use else []
    out = [None] * requests
    for j, i in enumerate(use):
        out[i] = names[j % len(names)]
    return out


# --- the per-chunk clock -------------------------------------------------------------------------
class _ChunkClock:
    """Marks after each chunk. GPU: CUDA events recorded on the stream (no host wait), read once
    after the prefill; the GPU stamps an event when it reaches it in its queue, i.e. when every
    kernel issued before it has finished, so mark c is when chunk c completed. The start event
    goes into an empty queue (the driver synchronizes first): its stamp is the prefill's start.
    CPU: torch runs each op before returning, so the wall clock is exact."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter()
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def read_ms(self) -> list[float]:
        """Milliseconds from the start to each mark (waits for the last mark on a GPU)."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [self.start.elapsed_time(e) for e in self.marks]
        return [(t - self.start) * 1e3 for t in self.marks]


# --- the driver --------------------------------------------------------------------------------
class PrefillDriver:
    """A chunked prefill of one plan over one lab (model/lab.py's Lab API). Under tensor
    parallelism every rank makes its own driver over its own lab; collectives inside the model
    keep the ranks in step."""

    def __init__(self, lab, plan: PrefillPlan, adapters: Sequence, *, group=None, seed: int = 0,
                 costs: EngineCosts | None = None):
        costs = costs or EngineCosts()
        if not isinstance(costs, EngineCosts):
            raise EngineCostError(f"costs must be an EngineCosts, got {type(costs).__name__}")
        if costs.host_us_per_layer and not hasattr(lab.model, "host_us_per_layer"):
            raise EngineCostError(f"host_us_per_layer needs the decoder (model/decoder.py); "
                                  f"{type(lab.model).__name__} has no per-layer host hook")
        if len(adapters) != plan.requests:
            raise ValueError(f"{len(adapters)} adapter entries for {plan.requests} requests")
        for name in {a for a in adapters if a is not None}:
            lab.pool.slot_of(name)  # KeyError: "unknown adapter 'x'; loaded adapters: [...]"
        self.lab, self.plan, self.adapters, self.group = lab, plan, list(adapters), group
        self.cuda = lab.device.type == "cuda"
        # One input of a full chunk, made once: every chunk reads its first rows (an engine would
        # embed token ids here; the cost of the forward does not depend on the values).
        self.x = lab.random_input(plan.requests_per_chunk * plan.input_len, seed=seed)
        self.chunk_of = [c for c, reqs in enumerate(plan.chunks) for _ in reqs]
        self.costs = costs
        self.spin = runtime.GpuSpin(self.cuda) if costs.overlap_ms else None

    def _forward(self, reqs: range, guard: str):
        L, c = self.plan.input_len, self.costs
        if self.spin is not None:
            self.spin(c.overlap_ms)  # the previous batch, still running on the GPU
        runtime.host_spin(c.host_us_per_forward)  # the engine's scheduler (default 0)
        if hasattr(self.lab.model, "host_us_per_layer"):
            self.lab.model.host_us_per_layer = c.host_us_per_layer
        # Host work of the engine per chunk: batch metadata from Python lists, no device read.
        batch, tensors = self.lab.make_batch([self.adapters[r] for r in reqs], [L] * len(reqs))
        return self.lab.model(self.x[:len(reqs) * L], batch, tensors, guard=guard)

    def issue(self, guard: str) -> _ChunkClock:
        """Issue the whole prefill and return its clock (unread). With `cpu_flag` or
        `launch_always` nothing in here waits for the GPU."""
        clock = _ChunkClock(self.cuda)
        for reqs in self.plan.chunks:
            self._forward(reqs, guard)
            clock.mark()
        return clock

    def barrier(self) -> None:
        """An idle device and (under TP) every rank at the same point before a timed prefill."""
        runtime.synchronize()
        if self.group is not None and getattr(self.group, "size", 1) > 1:
            t = torch.zeros(1, device=self.lab.device)
            self.group.all_reduce(t)
            runtime.synchronize()

    def warmup(self, guard: str) -> None:
        """Compile and autotune every kernel for the chunk shapes this plan uses (not timed)."""
        seen = set()
        for reqs in self.plan.chunks:
            if len(reqs) not in seen:
                seen.add(len(reqs))
                self._forward(reqs, guard)
        runtime.synchronize()

    def run(self, guard: str) -> dict:
        """One timed prefill from an idle device."""
        self.barrier()
        with count_guard_syncs() as syncs:
            clock = self.issue(guard)
            ends = clock.read_ms()
        ttft = np.array([ends[c] for c in self.chunk_of])
        n_fwd = len(ends)
        per_chunk = np.diff([0.0] + ends)
        other = n_fwd * self.costs.overlap_ms  # GPU time of the earlier batch (overlap_ms), not ours
        host = signature.from_sync_events(syncs.events, n_fwd)
        return dict(prefill_ms=ends[-1], input_tok_per_s=self.plan.total_tokens / (ends[-1] * 1e-3),
                    input_tok_per_s_net=self.plan.total_tokens / (max(ends[-1] - other, 1e-9) * 1e-3),
                    other_batch_ms=other,
                    ttft_mean_ms=float(ttft.mean()), ttft_p50_ms=float(np.percentile(ttft, 50)),
                    ttft_p99_ms=float(np.percentile(ttft, 99)), forwards=n_fwd,
                    forward_median_ms=float(np.median(per_chunk)), syncs_per_forward=syncs.count / n_fwd,
                    **{k: host[k] for k in HOST_SIGNATURE})

    def profile_steady(self, guard: str, forwards: int = 3, path=None, labels: dict | None = None):
        """Profile the first `forwards` chunks issued back to back, as in a timed prefill (GPU
        only). Forward 0 starts from an idle GPU; the later ones are the steady state that the
        per-sync signature (instruments.analysers.signature) and the GPU idle columns read. Returns
        (idle: dict of NO_IDLE's keys, medians over the steady forwards; per_forward; per_sync).
        For the picture only: a profiler slows the host, so the live host-blocked figures come
        from `run` (perf_counter around each `.item()`), never from here."""
        import pandas as pd

        if not self.cuda:
            return dict(NO_IDLE), pd.DataFrame(), pd.DataFrame()
        from ..analysers import trace as T
        from .profiling import profile_forwards

        chunks = self.plan.chunks[:max(2, forwards)]

        def body():
            for reqs in chunks:
                self._forward(reqs, guard)

        self.barrier()
        t = profile_forwards(body, n_warmup=1, n_active=1, sync_events=True)
        if path is not None:
            T.export_perfetto(t, path, drop_cats=("cpu_op", "python_function"), labels=labels)
        m = T.forward_metrics(t)
        m = m[m["forward"] >= 1]
        idle = dict(NO_IDLE) if not len(m) else dict(
            gpu_idle_ms=float(m["idle_ns"].median()) / 1e6,
            gpu_idle_after_sync_ms=float(m["idle_after_sync_ns"].median()) / 1e6,
            gpu_busy_ms=float(m["busy_ns"].median()) / 1e6, gpu_span_ms=float(m["gpu_span_ns"].median()) / 1e6)
        f, s = signature.per_forward(t), signature.per_sync(t)
        return idle, f[f["forward"] >= 1].reset_index(drop=True), s[s["forward"] >= 1].reset_index(drop=True)

    def profile(self, guard: str, path=None, labels: dict | None = None) -> dict:
        """One profiled forward of the first chunk, from an idle GPU (GPU only): GPU idle in it,
        by cause. With `path`, a trimmed trace (no aten cpu_op events) is written there."""
        if not self.cuda:
            return dict(NO_IDLE)
        from ..analysers import trace as T
        from .profiling import profile_forwards

        self.barrier()
        reqs = self.plan.chunks[0]
        t = profile_forwards(lambda: self._forward(reqs, guard), n_warmup=1, n_active=1)
        m = T.forward_metrics(t)
        if not len(m):
            return dict(NO_IDLE)
        r = m.iloc[0]
        if path is not None:
            T.export_perfetto(t, path, drop_cats=("cpu_op", "python_function"), labels=labels)
        return dict(gpu_idle_ms=r["idle_ns"] / 1e6, gpu_idle_after_sync_ms=r["idle_after_sync_ns"] / 1e6,
                    gpu_busy_ms=r["busy_ns"] / 1e6, gpu_span_ms=r["gpu_span_ns"] / 1e6)


# --- the measurement: interleaved repetitions --------------------------------------------------
COST_COLUMNS = list(EngineCosts.LIMITS)
KEY_COLUMNS = ["preset", "layers", "tp", "requests", "input_len", "chunk", "guard_sites", *COST_COLUMNS, "adapters",
               "guard"]
RESULT_COLUMNS = ["rep", "order", "t_unix", "prefill_ms", "input_tok_per_s", "input_tok_per_s_net", "other_batch_ms",
                  "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "forwards", "forward_median_ms", "syncs_per_forward",
                  *HOST_SIGNATURE, "gpu_idle_ms", "gpu_idle_after_sync_ms", "gpu_busy_ms", "gpu_span_ms", "timer"]
COLUMNS = KEY_COLUMNS + RESULT_COLUMNS
# what the CLI's table adds: every setting of a run that is not in the key, so that a resume can check it
# (tables.check_resumable) and rows of two seeds, dtypes or devices never sit in one table unseen
SETTING_COLUMNS = ["seed", "dtype", "device", "backend", "warmup_reps", "n_adapters", "rank", "max_loras", "profile"]
TABLE_COLUMNS = COLUMNS + SETTING_COLUMNS
CONFIG_COLUMNS = [c for c in KEY_COLUMNS if c not in ("adapters", "guard")]  # one prefill configuration


def measure(drivers: dict, guards: Sequence[str], reps: int, *, key: dict, profile: bool = True,
            trace_dir=None, deadline: float | None = None, progress: bool = True, on_row=None,
            signatures: dict | None = None, warmup_reps: int = 0, first_rep: int = 0) -> list[dict]:
    """Rows for every adapter mode (drivers: mode -> PrefillDriver) x guard x repetition.
    Repetition r runs every mode and every guard once, the guards in an order rotated by r, so
    slow drifts (clocks, temperature, the allocator) land on all guards alike. With `signatures`
    (a dict), the profiled steady forwards' per-forward and per-sync tables are appended to its
    lists "forwards" and "syncs", labelled with the key, mode and guard. `warmup_reps` whole
    prefills per guard run untimed first (the allocator and clocks settle; summarize still checks
    the timed ones for drift). `first_rep` > 0 continues a resumed table at that repetition (the
    rotation of the guards stays that of the repetition number)."""
    for g in guards:
        if g not in guard_names():
            raise ValueError(f"unknown guard {g!r}; choose from {list(guard_names())}")
    if not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be a positive int, got {reps!r}")
    guards = list(guards)
    idle, rows = {}, []
    for mode, d in drivers.items():
        for g in guards:
            d.warmup(g)
            path = None
            if profile and trace_dir is not None:
                path = Path(trace_dir) / (_tag(key, mode, g, d.costs) + ".json.gz")
            lab_key = {**key, **d.costs.as_key(), "adapters": mode, "guard": g}
            if profile:
                idle[mode, g], pf, ps = d.profile_steady(g, path=path, labels=lab_key)
                if signatures is not None:
                    for name, tab in (("forwards", pf), ("syncs", ps)):
                        if len(tab):
                            signatures.setdefault(name, []).append(tab.assign(**lab_key))
            else:
                idle[mode, g] = dict(NO_IDLE)
    if not isinstance(warmup_reps, int) or warmup_reps < 0:
        raise ValueError(f"warmup_reps must be an int >= 0, got {warmup_reps!r}")
    for _ in range(warmup_reps):
        for d in drivers.values():
            for g in guards:
                d.run(g)
    bar = cli_progress(max(reps - first_rep, 0) * len(drivers) * len(guards), progress, unit="prefill")
    group = next(iter(drivers.values())).group if drivers else None
    for r in range(first_rep, reps):
        if r > first_rep and deadline is not None and _any_rank(group, time.monotonic() > deadline):
            break
        for mode, d in drivers.items():
            for i, g in enumerate(rotated(guards, r)):
                t_unix = time.time()  # to join a clock/power log (nvidia-smi -lms) to this prefill
                res = d.run(g)
                row = {**key, **d.costs.as_key(), "adapters": mode, "guard": g, "rep": r, "order": i, "t_unix": t_unix,
                       **res,
                       **idle[mode, g],
                       "timer": "cuda_events" if d.cuda else "wall"}
                rows.append(row)
                if on_row is not None:
                    on_row(row)
                bar.update(1)
                bar.set_postfix_str(f"{mode}/{g} {res['prefill_ms']:.0f} ms")
    bar.close()
    return rows


def _any_rank(group, flag: bool) -> bool:
    """True on every rank when it is True on any: under TP all ranks must run the same number of
    repetitions, or one waits forever in a collective the other never joins. Between repetitions,
    so its host read (a sync) is outside every timed region."""
    if group is None or getattr(group, "size", 1) == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=group.device)
    group.all_reduce(t)
    return bool(t.item() > 0)


def _tag(key: dict, mode: str, guard: str, costs: "EngineCosts | None" = None) -> str:
    eng = "" if costs is None or costs.off else (f"_h{costs.host_us_per_layer:g}_f{costs.host_us_per_forward:g}"
                                                 f"_o{costs.overlap_ms:g}")
    return (f"{key['preset']}_L{key['layers']}_tp{key['tp']}_C{key['chunk']}_gs{key['guard_sites']:g}{eng}_"
            f"{mode}_{guard}_rank{key.get('tp_rank', 0)}")


# --- the summary: medians, intervals, change vs cpu_flag ---------------------------------------
def _with_defaults(df):
    """Rows of recordings made before a column existed: engine costs 0 (they were off), the host
    signature and the net throughput unknown (NaN, or equal to the raw one without overlap)."""
    df = df.copy()
    for c in COST_COLUMNS:
        if c not in df:
            df[c] = 0.0
    for c in HOST_SIGNATURE + ("other_batch_ms",):
        if c not in df:
            df[c] = 0.0 if c == "other_batch_ms" else math.nan
    if "input_tok_per_s_net" not in df:
        df["input_tok_per_s_net"] = df["input_tok_per_s"]
    return df


MEDIAN_COLS = ("input_tok_per_s", "input_tok_per_s_net", "ttft_mean_ms", "ttft_p99_ms", "prefill_ms",
               "forward_median_ms")
CHANGES = (("fix_throughput_gain_pct", "input_tok_per_s"), ("fix_throughput_gain_net_pct", "input_tok_per_s_net"),
           ("fix_ttft_change_pct", "ttft_mean_ms"))


def summarize(df, fix: str = "cpu_flag", ci: tuple[float, float] = (2.5, 97.5)):
    """One row per configuration and guard, over the repetitions kept after the warm-up check.

    Warm-up: each guard's prefill times, in repetition order, go through stats.drop_warmup; the
    longest leading drift of any guard is dropped from all of them (pairs stay pairs), and the
    row says how many (`warmup_dropped`) or that the timings never settled (`stable` False: its
    figures are NaN, never an average of drifting data).
    Intervals (`ci_method` names it): with >= 10 kept repetitions, the order-statistic 95 %
    interval of each median and a paired bootstrap (95 %) of each change; with fewer (older
    recordings of 5), the `ci` percentiles of the repetitions, which are a spread, not an interval.
    Changes are paired per repetition (the guards of one repetition ran back to back):
      fix_throughput_gain_pct      throughput of `fix` over this guard's, - 1 (production: +14.4 %)
      fix_throughput_gain_net_pct  the same without the earlier batch's GPU time (overlap_ms)
      fix_ttft_change_pct          mean TTFT of `fix` over this guard's, - 1 (production: -12.6 %)"""
    import pandas as pd

    df = _with_defaults(df)
    keys = [c for c in KEY_COLUMNS if c != "guard"]
    out = []
    for k, g in df.groupby(keys, sort=False, dropna=False):
        reps = sorted(g["rep"].unique())
        valid = len(reps) >= stats.MIN_PAIRED_REPS
        dropped, stable, note = 0, True, f"{len(reps)} repetitions: too few for a drift check"
        if valid:
            w = stats.warmup_check({gd: gg.sort_values("rep")["prefill_ms"].to_numpy()
                                    for gd, gg in g.groupby("guard")})
            dropped, stable, note = w.dropped, w.stable, w.note
        kept = g[g["rep"].isin(reps[dropped:])]
        n_kept = len(reps) - dropped
        use_stats = valid and n_kept >= stats.MIN_PAIRED_REPS
        method = (f"{stats.METHOD_MEDIAN}; changes: {stats.METHOD_BOOT}" if use_stats else
                  f"{ci[0]:g}-{ci[1]:g} percentiles of {n_kept} repetitions (a spread, not an interval)")
        fx = kept[kept["guard"] == fix].set_index("rep")
        for guard, gg in kept.groupby("guard", sort=False):
            gg = gg.set_index("rep")
            row = dict(zip(keys, k), guard=guard, reps=len(gg), warmup_dropped=dropped, stable=stable,
                       warmup_note=note, ci_method=method)
            for m in MEDIAN_COLS:
                x = gg[m].to_numpy(float)
                if use_stats:
                    row[m], row[m + "_lo"], row[m + "_hi"] = stats.median_ci(x)
                else:
                    row[m] = float(np.median(x))
                    row[m + "_lo"], row[m + "_hi"] = (float(np.percentile(x, q)) for q in ci)
            for m in ("syncs_per_forward", "other_batch_ms", *HOST_SIGNATURE):
                row[m] = float(gg[m].median())
            for m in ("gpu_idle_ms", "gpu_idle_after_sync_ms"):
                row[m] = float(gg[m].iloc[0])
            both = gg.index.intersection(fx.index)
            for name, m in CHANGES:
                f_, b_ = fx.loc[both, m].to_numpy(float), gg.loc[both, m].to_numpy(float)
                if not len(both):
                    row[name] = row[name + "_lo"] = row[name + "_hi"] = math.nan
                elif use_stats:
                    row[name], row[name + "_lo"], row[name + "_hi"] = stats.paired_change_pct(f_, b_)
                else:
                    ch = 100.0 * (f_ / b_ - 1.0)
                    row[name] = float(np.median(ch))
                    row[name + "_lo"], row[name + "_hi"] = (float(np.percentile(ch, q)) for q in ci)
                if not stable:
                    row[name] = row[name + "_lo"] = row[name + "_hi"] = math.nan
            out.append(row)
    return pd.DataFrame(out)


# --- production's host: engine work per layer, calibrated ---------------------------------------
def host_work_flags(site_counts) -> list[bool]:
    """Per guard sync of one forward, in order: does host work at a call point come right before
    it? The decoder asks each layer's sites point by point (model/decoder.py: GuardSites)."""
    from ...model.decoder import SITE_POINTS

    flags = []
    for n in site_counts:
        for j in range(len(SITE_POINTS)):
            c = len(range(j, n, len(SITE_POINTS)))
            flags += [True] + [False] * (c - 1) if c else []
    return flags


def calibrate_host_work(lab, plan: "PrefillPlan", names, target_later_us: float, group=None) -> dict:
    """One unprofiled `sync` prefill in the lab's own regime, and the engine host work per layer
    that brings the later syncs of its second forward (the steady state) to `target_later_us` of
    host time blocked on average (signature.host_cost_for_lead). Production's regime: ~116 us."""
    from ...model.decoder import SITE_POINTS
    from ...model.guards import guard_sync_events

    d = PrefillDriver(lab, plan, request_adapters(plan.requests, "none", names), group=group)
    d.warmup("sync")
    d.barrier()
    with guard_sync_events() as ev:
        d.run("sync")
    per = sum(lab.model.site_counts)
    fwd = [e.blocked_ns / 1e3 for e in ev[per:2 * per]]  # forward 1: the steady state
    h = signature.host_cost_for_lead(fwd, host_work_flags(lab.model.site_counts), target_later_us)
    return dict(host_us_per_point=h, host_us_per_layer=h * len(SITE_POINTS), target_later_us=target_later_us,
                measured_later_mean_us=float(np.mean(fwd[1:])), first_us=fwd[0])


# --- building the lab ----------------------------------------------------------------------------
def build(preset: str, layers: int | None, *, max_loras: int, max_rank: int, dtype: str, device: str,
          backend: str, seed: int, guard_sites: float, group=None):
    """The decoder lab (model/decoder.py: attention + MoE with LoRA, `guard_sites` guard decisions
    per layer), this rank's slice of it under TP."""
    from ...model.decoder import build_decoder_lab

    return build_decoder_lab(preset=preset, num_layers=layers, max_loras=max_loras, max_rank=max_rank, dtype=dtype,
                             device=device, backend=backend, seed=seed, guard_sites=guard_sites, tp=group)


def load_adapters(lab, n: int, rank: int) -> list[str]:
    names = [f"a{i}" for i in range(n)]
    for nm in names:
        if nm not in lab.pool.loaded():
            lab.pool.load(nm, rank=rank)
    return names


def init_group(tp_auto: bool):
    """The TP group of this process (model/tp.py) under torchrun, else None."""
    if not tp_auto:
        return None
    from ...model import tp
    return tp.init_tp()


# --- CLI -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lora_moe_lab.instruments.recorders.prefill",
                                formatter_class=HelpFormatter,
                                description="Chunked prefill per guard: input throughput, TTFT, syncs, host time "
                                            "blocked per sync and GPU idle per forward, interleaved repetitions, "
                                            "tidy CSV.",
                                epilog="examples:\n"
                                       "  python -m lora_moe_lab.instruments.recorders.prefill --preset tiny "
                                       "--layers 2 "
                                       "--requests 8 "
                                       "--input-len 16 --chunk 32 --out build/prefill.csv\n"
                                       "  python -m lora_moe_lab.instruments.recorders.prefill "
                                       "--preset qwen3-30b-a3b "
                                       "--guard-sites 5.4167 "
                                       "--guards sync cpu_flag --adapters none --host-us-per-layer 7500 "
                                       "--overlap-ms 70 "
                                       "--out build/prodlike.csv   # production's regime (GPU)")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--layers", type=pos_int, default=None, help="layers (None: the preset's)")
    p.add_argument("--requests", type=pos_int, default=128, help="requests R")
    p.add_argument("--input-len", type=pos_int, default=2048, help="input tokens per request L")
    p.add_argument("--chunk", type=pos_int, nargs="+", default=[16384], help="tokens per chunk C, multiples of L")
    p.add_argument("--guards", nargs="+", choices=guard_names(), default=list(guard_names()))
    p.add_argument("--adapters", nargs="+", choices=ADAPTER_MODES, default=list(ADAPTER_MODES))
    p.add_argument("--guard-sites", type=guard_sites_arg, nargs="+", default=[1.0],
                   help="guard decisions per layer (260 / 48 = 5.42 gives production's syncs per forward)")
    p.add_argument("--n-adapters", type=pos_int, default=2, help="adapters loaded")
    p.add_argument("--rank", type=pos_int, default=16, help="LoRA rank of the loaded adapters")
    p.add_argument("--max-loras", type=pos_int, default=4)
    p.add_argument("--reps", type=pos_int, default=12,
                   help="interleaved repetitions")
    p.add_argument("--warmup-reps", type=nonneg_int, default=1, help="untimed whole prefills per guard first")
    p.add_argument("--dtype", default="auto", type=dtype_arg, help="/".join(DTYPES))
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--device", default="auto", type=device_arg, help="cpu, cuda, cuda:N or auto")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--tp-auto", action="store_true", help="tensor parallelism from torchrun's environment")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled forward (GPU idle = NaN)")
    p.add_argument("--trace-dir", default=None, help="write each profiled forward's trimmed trace here")
    p.add_argument("--max-minutes", type=pos_float, default=None, help="start no repetition after this long")
    p.add_argument("--host-us-per-layer", type=nonneg_float, default=0.0,
                   help="an engine's host work per layer, us (EngineCosts; default 0: off)")
    p.add_argument("--host-us-per-forward", type=nonneg_float, default=0.0,
                   help="an engine's host work per forward, us")
    p.add_argument("--overlap-ms", type=nonneg_float, default=0.0,
                   help="GPU work of an earlier batch queued before each forward, ms")
    p.add_argument("--out", required=True, help="tidy CSV (rows appended; .meta.json, .summary.csv and, when "
                                                "profiled, .signature.csv / .syncs.csv beside)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue --out: configurations whose repetitions are all there are skipped, an unfinished "
                        "repetition (a killed run) is dropped and measured again; the settings must be this run's")
    g.add_argument("--overwrite", action="store_true", help="start --out afresh")
    p.add_argument("--no-progress", action="store_true")
    return p


def _config_tuple(d: dict) -> tuple:
    return tuple(tables._norm(d[c]) for c in CONFIG_COLUMNS)


def resume_plan(out: Path, configs: list[dict], settings: dict, adapters, guards, reps: int, *,
                writer: bool = True) -> dict:
    """Where a resumed table stands: config tuple -> the first repetition still to measure. A repetition
    counts when every adapter mode x guard of this run has its row; the rows of repetitions from the first
    incomplete one on are dropped (atomically, by the writer), so the summary's pairs stay whole. Refused
    (a TableError naming the file and row): another header, other settings, another set of guards or
    adapter modes for a configuration, duplicate keys."""
    if writer:
        df = tables.check_resumable(out, TABLE_COLUMNS, settings, key=KEY_COLUMNS + ["rep"])
    else:  # another TP rank: read only (the writer repairs); a cut last row is ignored as the writer drops it
        s = tables.scan(out)
        import pandas as pd
        df = pd.DataFrame(s.rows, columns=s.header, dtype=object) if s.exists else None
    if df is None or not len(df):
        return {}
    want = {(tables._norm(m), tables._norm(g)) for m in adapters for g in guards}
    wanted = {_config_tuple(c) for c in configs}
    recs = df.to_dict("records")
    by_cfg: dict = {}
    for i, r in enumerate(recs):
        by_cfg.setdefault(_config_tuple(r), []).append((i, r))
    plan, keep = {}, [True] * len(recs)
    for cfg, items in by_cfg.items():
        if cfg not in wanted:
            continue  # another configuration of this table: left as it is
        have = {(tables._norm(r["adapters"]), tables._norm(r["guard"])) for _, r in items}
        if not have <= want:
            i = next(i for i, r in items if (tables._norm(r["adapters"]), tables._norm(r["guard"])) not in want)
            raise tables.SettingsMismatchError(
                out, f"row {i + 1}: configuration {dict(zip(CONFIG_COLUMNS, cfg))} was measured with adapters/"
                     f"guards {sorted(have)}, this run asks {sorted(want)}: its repetitions would not pair; "
                     "pass the same --guards and --adapters, --overwrite or another --out")
        per_rep: dict = {}
        for _, r in items:
            per_rep.setdefault(int(float(r["rep"])), set()).add((tables._norm(r["adapters"]), tables._norm(r["guard"])))
        start = 0
        while per_rep.get(start) == want:
            start += 1
        for i, r in items:
            if int(float(r["rep"])) >= start:
                keep[i] = False
        plan[cfg] = start
    if writer:
        tables.keep_rows(out, TABLE_COLUMNS, keep, why="repetitions left unfinished by an interrupted run")
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    import os

    from ...config import check_dtype, get_shape

    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        for c in a.chunk:
            make_plan(a.requests, a.input_len, c)
        costs = EngineCosts(a.host_us_per_layer, a.host_us_per_forward, a.overlap_ms)
        dev = runtime.resolve_device(a.device)
        backend = runtime.resolve_backend(a.backend, dev)
        dtype = runtime.resolve_dtype(a.dtype, dev)
        check_dtype(dtype, dev, backend)
        layers = a.layers or get_shape(a.preset).num_layers
    except ValueError as e:  # ChunkSizeError, EngineCostError, a device or dtype this machine cannot run
        parser.error(str(e))
    settings = dict(seed=a.seed, dtype=dtype, device=str(dev), backend=backend, warmup_reps=a.warmup_reps,
                    n_adapters=a.n_adapters, rank=a.rank, max_loras=a.max_loras, profile=not a.no_profile)
    out = Path(a.out)
    meta_path = tables.sibling_meta(out)
    # every check of --out before any work: no model is built, no file is touched when the run is refused
    tp = int(os.environ.get("WORLD_SIZE", "1")) if a.tp_auto else 1
    writer = (int(os.environ.get("RANK", "0")) if a.tp_auto else 0) == 0
    configs = [dict(preset=a.preset, layers=layers, tp=tp, requests=a.requests, input_len=a.input_len, chunk=c,
                    guard_sites=gs, **costs.as_key()) for gs in a.guard_sites for c in a.chunk]
    plan: dict = {}
    try:
        if writer:
            tables.lock_output(out)  # one writer per --out: a second run is refused with this one's pid
        if out.exists() and out.stat().st_size > 0:
            tables.check_header(out, TABLE_COLUMNS)  # a file of another kind: refused even with --overwrite
            if a.resume:
                plan = resume_plan(out, configs, settings, a.adapters, a.guards, a.reps, writer=writer)
            elif not a.overwrite:
                parser.error(f"{out} exists: pass --resume to continue it, --overwrite to start afresh, "
                             "or choose another --out")
    except ValueError as e:  # tables.TableError: the file, the row or column, what is wrong
        parser.error(str(e))
    if writer and a.overwrite:
        for f in (out, *(out.with_suffix(x) for x in (".summary.csv", ".signature.csv", ".syncs.csv"))):
            if f.exists():
                f.unlink()
    t0 = time.monotonic()
    deadline = None if a.max_minutes is None else t0 + 60 * a.max_minutes
    group = init_group(a.tp_auto)
    rank, tp = (group.rank, group.size) if group is not None else (0, 1)
    writer = rank == 0
    params = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in vars(a).items()}
    params.update(tp=tp, ci=f"{stats.METHOD_MEDIAN}; changes: {stats.METHOD_BOOT} (with >= 10 kept "
                             "repetitions; else the 2.5/97.5 percentiles of the repetitions)")

    def write_meta():
        old = tables.read_meta(meta_path) if (a.resume and out.exists()) else {}
        m = metadata(params=params)
        m["sessions"] = [s_ for s_ in old.get("sessions", []) if isinstance(s_, dict)]
        m["sessions"].append(dict(date=m.get("date"), commit=m.get("commit"), params=params,
                                  resumed_at={"/".join(map(str, k)): v for k, v in plan.items()}))
        m["settings"] = settings
        if "files" in old:
            m["files"] = old["files"]
        tables.write_json_atomic(meta_path, m)
        if out.exists() and out.stat().st_size > 0:
            tables.seal(out, meta_path)

    if writer:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_meta()
    sigs: dict = {}

    def write(row):
        if writer:  # one whole row per write (+ fsync, + the seal); the file is created at the first row
            tables.append_rows(out, [row], TABLE_COLUMNS, meta_path=meta_path)

    for gs in a.guard_sites:
        starts = {c: plan.get(_config_tuple(dict(preset=a.preset, layers=layers, tp=tp, requests=a.requests,
                                                 input_len=a.input_len, chunk=c, guard_sites=gs, **costs.as_key())), 0)
                  for c in a.chunk}
        if all(v >= a.reps for v in starts.values()):
            continue  # every repetition of these configurations is in the table already: nothing to build
        lab = build(a.preset, a.layers, max_loras=a.max_loras, max_rank=a.rank, dtype=a.dtype, device=a.device,
                    backend=a.backend, seed=a.seed, guard_sites=gs, group=group)
        names = load_adapters(lab, a.n_adapters, a.rank)
        for c in a.chunk:
            if starts[c] >= a.reps:
                continue
            plan_c = make_plan(a.requests, a.input_len, c)
            drivers = {m: PrefillDriver(lab, plan_c, request_adapters(a.requests, m, names), group=group, seed=a.seed,
                                        costs=costs) for m in a.adapters}
            key = dict(preset=a.preset, layers=lab.shape.num_layers, tp=tp, requests=a.requests,
                       input_len=a.input_len, chunk=c, guard_sites=gs, tp_rank=rank, **settings)
            measure(drivers, a.guards, a.reps, key=key, profile=not a.no_profile, trace_dir=a.trace_dir,
                    deadline=deadline, progress=writer and not a.no_progress, on_row=write, signatures=sigs,
                    warmup_reps=a.warmup_reps, first_rep=starts[c])
            del drivers
        del lab
        if runtime.has_cuda():
            torch.cuda.empty_cache()
    if writer:
        write_meta()
        import pandas as pd

        df = pd.read_csv(out) if out.exists() else pd.DataFrame(columns=TABLE_COLUMNS)
        s = summarize(df)
        tables.write_csv_atomic(out.with_suffix(".summary.csv"), s)
        label = [c for c in KEY_COLUMNS if c != "tp_rank"]
        for name, suffix in (("forwards", ".signature.csv"), ("syncs", ".syncs.csv")):
            if sigs.get(name):
                new = pd.concat(sigs[name], ignore_index=True)
                f = out.with_suffix(suffix)
                if a.resume and f.exists():  # the earlier run's tables of the configurations not profiled again
                    old = pd.read_csv(f)
                    lab_cols = [c for c in label if c in old.columns and c in new.columns]
                    def keys(d):
                        return [tuple(r) for r in d[lab_cols].astype(str).map(tables._norm).to_numpy().tolist()]
                    seen = set(keys(new))
                    kept = [k not in seen for k in keys(old)]
                    new = pd.concat([old[kept], new], ignore_index=True)
                tables.write_csv_atomic(f, new)
        cols = ["tp", "chunk", "guard_sites", "adapters", "guard", "reps", "input_tok_per_s", "ttft_mean_ms",
                "syncs_per_forward", "gpu_idle_ms", "fix_throughput_gain_pct", "fix_throughput_gain_pct_lo",
                "fix_throughput_gain_pct_hi", "fix_ttft_change_pct"]
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format",
                               "{:.2f}".format):
            print(s[cols].to_string(index=False) if len(s) else "no rows measured")
        if not runtime.has_cuda():
            print(CPU_NOTE)
    if group is not None:
        group.destroy()
    return 0

if __name__ == "__main__":
    sys.exit(main())
