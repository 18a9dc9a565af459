"""Profiler traces at nanosecond precision, split as HTA splits them: parse (chrome / kineto traces
into tidy tables), analysis (what the tables say), export (traces written back, trimmed, for Perfetto).
Recording a trace is instruments.recorders.profiling.profile_forwards.

    T.load_trace("t.json.gz")    # parse: TraceTables (GPU ops, runtime calls, syncs, annotations, forwards)
    T.forward_metrics(tables)    # per forward: GPU busy / idle, idle split by cause, syncs
    T.idle_gaps(tables)          # every GPU idle gap with its category
    T.layer_breakdown(tables)    # the same per `moe_layer_{i}` annotation
    T.queue_depth(tables)        # kernels launched but not finished, over time
    T.export_perfetto(tables, "small.json.gz", forwards=2)   # opens in ui.perfetto.dev
"""
from .analysis import *  # noqa: F401,F403
from .analysis import __all__ as _analysis_all
from .export import *  # noqa: F401,F403
from .export import __all__ as _export_all
from .parse import *  # noqa: F401,F403
from .parse import __all__ as _parse_all

__all__ = [*_parse_all, *_analysis_all, *_export_all]
