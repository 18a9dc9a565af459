"""The audit's graph-break view (`audit(..., graph_breaks=True)`): for each sync site, whether it breaks a
`torch.compile(fullgraph=True)` graph, and how many of the forward's graph breaks come from syncs.

The same `.item()` that makes the host wait is, to torch.compile, a value Python needs before the graph
can go on (with `capture_scalar_outputs=False`, the default), and a data-dependent shape (`nonzero`,
`x[mask]`) is an operator whose output size the tracer cannot know: each ends the graph there, and
`fullgraph=True` refuses to compile at the first. `torch._dynamo.explain` traces the forward once, with a
backend that compiles nothing, and lists each break with the user stack that led to it; a sync site
breaks the graph when it is a frame of some break's stack. Dynamo's own graph-break count can differ
from the reasons it lists (a frame it gives up on is run eagerly, its later syncs unseen): both are
reported. Costly (a trace per graph: tens of seconds for a small model on a CPU), so off by default.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from . import syncs

__all__ = ["GraphBreaks", "explain_breaks"]


@dataclasses.dataclass
class GraphBreaks:
    """What torch._dynamo.explain saw over one call: dynamo's break count, each listed break as (its
    first reason line, the sites of its user stack, innermost last), and an error if explain failed."""

    count: int = 0
    graphs: int = 0
    breaks: list = dataclasses.field(default_factory=list)  # (reason, [site, ...])
    error: str = ""

    def at(self, site: str) -> list[str]:
        """The reasons of the breaks whose stack passes through `site`."""
        return [r for r, stack in self.breaks if site in stack]

    def from_syncs(self, sites) -> int:
        """How many listed breaks pass through one of the sync `sites`."""
        sites = set(sites)
        return sum(bool(sites.intersection(stack)) for _, stack in self.breaks)

    @property
    def complete(self) -> bool:
        """Dynamo listed every break it counted: a site on no listed stack then breaks nothing."""
        return not self.error and len(self.breaks) >= self.count

    def table(self, rep) -> pd.DataFrame:
        """One row per sync site of the report: its kinds, syncs per call, whether it breaks the graph
        (True; False; None where dynamo counted breaks it did not list, so a site on no listed stack is
        not known to be free: it may have run in a frame dynamo gave up on)."""
        rows = []
        unknown = f"unknown: dynamo counted {self.count} break(s) and listed {len(self.breaks)}"
        for site, n in sorted(rep.sites.items(), key=lambda kv: -kv[1]):
            reasons = self.at(site)
            brk = True if reasons else (False if self.complete else None)
            rows.append(dict(site=site, kinds=", ".join(sorted({e.kind for e in rep.events if e.site == site})),
                             count_per_call=n, breaks_graph=brk,
                             reason=reasons[0] if reasons else ("" if brk is False else unknown)))
        return pd.DataFrame(rows, columns=["site", "kinds", "count_per_call", "breaks_graph", "reason"])

    def summary(self, rep) -> str:
        if self.error:
            return f"graph breaks: torch._dynamo.explain failed ({self.error})"
        t = self.table(rep)
        return (f"graph breaks (torch.compile, fullgraph=True refuses at the first): dynamo counted {self.count} "
                f"in {self.graphs} graph(s) and listed {len(self.breaks)}, {self.from_syncs(rep.sites)} of them "
                f"at a sync site; {int((t['breaks_graph'] == True).sum())} of {len(t)} sync site(s) break the "  # noqa: E712
                f"graph{'' if self.complete else ', the others unknown (rep.graph_break_table())'}")


def explain_breaks(fn, args, kw, rel) -> GraphBreaks:
    """torch._dynamo.explain over one call of fn; `rel(filename)` names a frame's file as the audit's
    sites do. Dynamo's caches are reset before and after (the forward is traced afresh, and leaves
    nothing compiled behind)."""
    import torch._dynamo as dynamo

    out = GraphBreaks()
    dynamo.reset()
    try:
        e = dynamo.explain(fn)(*args, **kw)
    except Exception as err:  # noqa: BLE001 - the view is optional: its failure is reported, the audit stands
        out.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        return out
    finally:
        dynamo.reset()
    out.count, out.graphs = int(e.graph_break_count), int(e.graph_count)
    for r in e.break_reasons:
        stack = [f"{rel(fs.filename)}:{fs.lineno}" for fs in r.user_stack]
        out.breaks.append((str(r.reason).splitlines()[0].strip(), stack))
    return out


syncs.tool_file(__file__)
