"""The sync audit's report: every sync event of the audited calls, and the table, summary and counts
read from them (instruments/recorders/audit.py fills it)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict

import pandas as pd

from .audit_watch import DEBUG_MODE_KINDS

__all__ = ["AuditReport", "SyncEventRecord", "NOT_ESTIMATED"]

NOT_ESTIMATED = "not estimated"


@dataclasses.dataclass
class SyncEventRecord:
    kind: str
    op: str
    site: str  # package-relative file:line of the innermost frame outside torch and the tooling
    function: str
    rep: int  # which audited call (0-based)
    t_ns: int  # perf_counter ns from the call's start
    blocked_ns: int  # perf_counter around the op
    called_from: str = ""  # the innermost frame of the user's own code
    code: str = ""  # the source line at `site`


_COLS = ["site", "function", "code", "called_from", "kind", "ops", "count_per_call", "host_blocked_us",
         "host_blocked_us_per_call", "timed_on", "gpu_idle_after_us", "saving_us", "estimate", "torch_count"]


@dataclasses.dataclass
class AuditReport:
    """What audit() saw. `events`: every sync of the detection calls; `cpu_only`: checks that only a
    CPU makes (not counted); `table()`: per line and kind, counts per call, host time blocked, GPU
    idle after and saving (both per call)."""

    device: str  # "cuda" | "cpu"
    reps: int
    events: list = dataclasses.field(default_factory=list)
    cpu_only: list = dataclasses.field(default_factory=list)
    call_ms: list = dataclasses.field(default_factory=list)  # wall time of each detection call
    torch_total: int = 0  # syncs torch's debug mode reported over the detection calls (GPU)
    mismatch: list = dataclasses.field(default_factory=list)  # predicted more than the debug mode saw
    focus: str | None = None
    gpu_idle_ns: dict = dataclasses.field(default_factory=dict)  # (site, kind) -> ns, one profiled call
    saving_ns: dict = dataclasses.field(default_factory=dict)  # (site, kind) -> ns or None
    total_saving_ns: float = math.nan
    estimate_note: str = ""
    notes: list = dataclasses.field(default_factory=list)
    trace: object = None  # TraceTables of the profiled call (CUDA)
    ranges: dict = dataclasses.field(default_factory=dict)  # (site, kind) -> [(start_ns, end_ns)] in it
    overhead_s: float = math.nan  # audit time beyond the forward's own calls
    graph_breaks: object = None  # audit_graph.GraphBreaks when audit(graph_breaks=True)

    @property
    def timed_on(self) -> str:
        return "GPU" if self.device == "cuda" else "CPU"

    @property
    def count(self) -> float:
        """Syncs per call (every kind)."""
        return len(self.events) / self.reps

    @property
    def debug_mode_count(self) -> float:
        """Syncs per call of the kinds torch's sync debug mode counts: on a GPU it equals what the
        debug mode reported (`torch_count`); on a CPU it is what it would report on a GPU."""
        return sum(e.kind in DEBUG_MODE_KINDS for e in self.events) / self.reps

    @property
    def torch_count(self) -> float:
        """Syncs per call torch's own debug mode reported (GPU; NaN on a CPU)."""
        return self.torch_total / self.reps if self.device == "cuda" else math.nan

    @property
    def sites(self) -> Counter:
        """site -> syncs per call (a site that syncs in only some calls gets a fraction)."""
        c = Counter(e.site for e in self.events)
        return Counter({k: v / self.reps for k, v in c.items()})

    @property
    def kinds(self) -> Counter:
        c = Counter(e.kind for e in self.events)
        return Counter({k: v / self.reps for k, v in c.items()})

    def table(self, cpu_only: bool = False) -> pd.DataFrame:
        """One row per (site, function, kind): count per call, host time blocked (median per
        occurrence and total per call, µs), GPU idle after (per call, µs; NaN on a CPU), the saving
        if removed (per call, µs; NaN with `estimate` = "not estimated ..." where there is none),
        `called_from` (the user's lines that led there). Sorted by saving, then GPU idle, then count.
        `cpu_only=True`: the table of the CPU-only checks instead."""
        g = defaultdict(list)
        for e in self.cpu_only if cpu_only else self.events:
            g[(e.site, e.function, e.kind)].append(e)
        rows = []
        for (site, fn, kind), evs in g.items():
            b = pd.Series([e.blocked_ns for e in evs], dtype=float) / 1e3
            sv = self.saving_ns.get((site, kind))
            rows.append(
                dict(
                    site=site,
                    function=fn,
                    code=evs[0].code,
                    called_from=", ".join(sorted({e.called_from for e in evs})),
                    kind=kind,
                    ops=", ".join(sorted({e.op for e in evs})),
                    count_per_call=len(evs) / self.reps,
                    host_blocked_us=float(b.median()),
                    host_blocked_us_per_call=float(b.sum()) / self.reps,
                    timed_on=self.timed_on,
                    gpu_idle_after_us=self.gpu_idle_ns.get((site, kind), math.nan) / 1e3,
                    saving_us=math.nan if sv is None else sv / 1e3,
                    estimate="replay" if sv is not None else self._why_not(kind),
                    torch_count=(
                        (len(evs) if kind in DEBUG_MODE_KINDS else 0) / self.reps
                        if self.device == "cuda"
                        else math.nan
                    ),
                )
            )
        df = pd.DataFrame(rows, columns=_COLS)
        if len(df):
            df = df.sort_values(
                ["saving_us", "gpu_idle_after_us", "count_per_call", "site"],
                ascending=[False, False, False, True],
                na_position="last",
                kind="stable",
            ).reset_index(drop=True)
        return df

    def _why_not(self, kind: str) -> str:
        if self.device != "cuda":
            return f"{NOT_ESTIMATED} (CPU: no device)"
        return (
            f"{NOT_ESTIMATED} ({self.estimate_note or 'no blocking runtime call of this site in the trace'})"
        )

    def summary(self, top: int = 10) -> str:
        t = self.table()
        head = (
            f"{self.count:g} host-device sync(s) per call on the {self.timed_on} "
            f"({len(t)} line/kind row(s), {self.reps} call(s) audited)"
        )
        if self.device == "cuda":
            head += f"; torch's sync debug mode counted {self.torch_count:g}"
        else:
            head += "; CPU count: the calls that would sync on a GPU, times are CPU times, nothing estimated"
        lines = [head]
        for r in t.head(top).itertuples():
            cost = (
                f"; per call, all of them: GPU idle after {r.gpu_idle_after_us:.1f} us, saving {r.saving_us:.1f} us"
                if self.device == "cuda"
                else ""
            )
            where = "" if r.called_from == r.site else f" <- {r.called_from}"
            lines.append(
                f"  {r.count_per_call:7g} x {r.kind:<11} {r.site} ({r.function}: {r.ops}){where}"
                f" blocked {r.host_blocked_us:.1f} us each [{r.timed_on}]{cost}"
            )
        if len(t) > top:
            lines.append(f"  ... {len(t) - top} more row(s)")
        if self.cpu_only:
            c = Counter(e.site for e in self.cpu_only)
            lines.append(
                f"left out: {len(self.cpu_only) / self.reps:g} CPU-only check(s) per call that a GPU does not make "
                f"({', '.join(f'{s} x{n / self.reps:g}' for s, n in c.most_common(3))})"
            )
        if self.device == "cuda" and math.isfinite(self.total_saving_ns):
            lines.append(
                f"removing every attributed sync saves {self.total_saving_ns / 1e3:.1f} us per call "
                "(replay of the profiled forward)"
            )
        if self.graph_breaks is not None:
            lines.append(self.graph_breaks.summary(self))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def graph_break_table(self) -> pd.DataFrame:
        """Per sync site: kinds, syncs per call, whether it breaks a torch.compile(fullgraph=True) graph
        and the first reason (needs audit(..., graph_breaks=True))."""
        if self.graph_breaks is None:
            raise ValueError("no graph-break view in this report: audit(..., graph_breaks=True)")
        return self.graph_breaks.table(self)

    def __repr__(self):
        return f"AuditReport(device={self.device!r}, syncs_per_call={self.count:g}, sites={dict(self.sites)})"
