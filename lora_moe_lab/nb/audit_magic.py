"""`%sync_audit`: the sync audit (instruments/recorders/audit.py) as an IPython magic.

    %load_ext lora_moe_lab.audit                 # (or lora_moe_lab.nb.audit_magic, the same magics)
    rep = %sync_audit model(x)                   # EXPR is the audited callable's body: 1 warm-up call,
                                                 # 1 audited call, on a GPU 1 profiled call
    %%sync_audit --focus transformers            # a cell: run once (no warm-up, not profiled);
    y = model(x)                                 # the report is also stored as `_sync_audit`

Options: `--focus PKG` (site each sync at its innermost frame in that package; `user`: your own lines),
`--warmup N` (plain calls first: 1 for a line, 0 for a cell), `--reps N` (audited calls), `--top N`
(rows of the table shown, default 20), `--no-plot`. A line's options come before EXPR.

What it shows: one line saying what the count is (on a CPU: the calls that WOULD sync on a GPU, CPU
times, nothing priced; on a GPU: counted on the GPU, beside torch's sync debug mode, with the GPU idle
after each and the replay's saving), the audit's table (one row per line of code and kind: count per
call, host time blocked, ...) as a DataFrame, and the timeline figure (audit_plots.timeline_figure).
It returns the AuditReport. An exception of EXPR or the cell propagates as itself (its own traceback);
a bad option is a UsageError naming it.
"""

from __future__ import annotations

import argparse
import importlib

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..instruments.recorders import syncs
from ..instruments.recorders.audit import FocusError, audit
from ..sim.sync_savings import estimate
from ..instruments.recorders.audit_watch import Sites

__all__ = ["AuditMagics", "load_ipython_extension", "split_options"]

CPU_LINE = "CPU count: the calls that would sync on a GPU; times are CPU times, nothing priced"
GPU_LINE = "GPU count: seen on the GPU, beside torch's sync debug mode; GPU idle and savings from one profiled call"
GPU_ONLY_COLS = ["gpu_idle_after_us", "saving_us", "estimate", "torch_count"]


def _count(name, lo):
    def parse(v):
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{v!r} is not an int") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"{n} is below {lo}")
        return n
    parse.__name__ = name
    return parse


def _focus(v):
    if v != "user":
        try:
            Sites(v)  # FocusError when no such package is installed
        except FocusError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return v


def split_options(line: str) -> tuple[str, str]:
    """'--focus transformers model(x)' -> ('--focus transformers', 'model(x)'): the leading `--` options
    (a value option takes the next word unless written --opt=value), then EXPR, left as written."""
    acts = AuditMagics.sync_audit.parser._option_string_actions
    rest, opts = line.lstrip(), []
    while rest.startswith("--"):
        word, _, after = rest.partition(" ")
        if word == "--":
            rest = after.lstrip()
            break
        opts.append(word)
        act = acts.get(word)
        if act is not None and act.nargs != 0 and after.strip():
            value, _, after = after.lstrip().partition(" ")
            opts.append(value)
        rest = after.lstrip()
    return " ".join(opts), rest


@magics_class
class AuditMagics(Magics):
    @magic_arguments()
    @argument("--focus", type=_focus, default=None, help="a package name (e.g. transformers) or 'user'")
    @argument("--warmup", type=_count("warmup", 0), default=None, help="plain calls first (line 1, cell 0)")
    @argument("--reps", type=_count("reps", 1), default=1, help="audited calls (default 1)")
    @argument("--top", type=_count("top", 1), default=20, help="rows of the table shown (default 20)")
    @argument("--no-plot", action="store_true", help="no timeline figure")
    @line_cell_magic
    def sync_audit(self, line, cell=None):
        """Audit the host-device syncs of EXPR (line) or of the cell; see the module's docstring."""
        __tracebackhide__ = True  # IPython leaves this frame out of a user error's traceback
        ip, ns = self.shell, self.shell.user_ns
        opts, expr = split_options(line) if cell is None else (line, "")
        a = parse_argstring(self.sync_audit, opts)
        if cell is None and not expr.strip():
            raise UsageError("%sync_audit needs an expression to audit, e.g. %sync_audit model(x)")
        src = expr.strip() if cell is None else ip.transform_cell(cell)
        code = compile(src, ip.compile.cache(src, ip.execution_count), "eval" if cell is None else "exec")

        def body():
            __tracebackhide__ = True
            return eval(code, ns)  # the user's own expression or cell: its errors are its own

        warmup = a.warmup if a.warmup is not None else (1 if cell is None else 0)
        rep = audit(body, warmup=warmup, reps=a.reps, focus=a.focus, profile=cell is None, estimator=estimate)
        show(rep, top=a.top, plot=not a.no_plot)
        if cell is not None:
            ns["_sync_audit"] = rep
        return rep


def show(rep, top: int = 20, plot: bool = True) -> None:
    """The magic's display of a report: what the count is, the table, the timeline."""
    kinds = ", ".join(f"{k} {v:g}" for k, v in rep.kinds.most_common()) or "none"
    print(f"sync audit: {rep.count:g} sync(s) per call ({kinds}), {rep.reps} call(s) audited on the "
          f"{rep.timed_on}. {CPU_LINE if rep.device == 'cpu' else GPU_LINE}")
    if rep.device == "cuda":
        print(f"torch's sync debug mode counted {rep.torch_count:g} per call")
    for n in rep.notes:
        print(f"note: {n}")
    if rep.cpu_only:
        print(f"left out: {len(rep.cpu_only) / rep.reps:g} CPU-only check(s) per call (rep.cpu_only)")
    t = rep.table()
    if rep.device == "cpu":
        t = t.drop(columns=GPU_ONLY_COLS)
    display(t.head(top))
    if len(t) > top:
        print(f"... {len(t) - top} more row(s): rep.table()")
    if plot and rep.events:
        from ..ui.audit_plots import timeline_figure

        display(timeline_figure(rep))


def load_ipython_extension(ip) -> None:
    importlib.import_module("lora_moe_lab.sim")  # registers the replay's saving estimate (used on a GPU)
    ip.register_magics(AuditMagics)


syncs.tool_file(__file__)  # the magic's frames are never a user's site
