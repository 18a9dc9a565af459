"""Live guard timings for the notebooks, never from a profiled run.

    samples = time_guards(lab, [16, 4096], reps=15, warmup=3)   # one row per repetition
    Recording(samples).paired("sync", "cpu_flag")               # the same analysis as data/guards/

The profiler adds host work to every launch (it records each runtime call), so at a host-bound size
a profiled forward measures the profiler, not the guard. Here every repetition runs each guard once
(and, on a GPU, a CUDA-graph replay of the same forward) back to back in a rotating order, each from
an idle device (`instruments.recorders.timing.time_interleaved`): the difference of two variants within one
repetition is a paired measurement, as in the canonical recording (studies/guards/record.py).
The rows have the recording's schema (`recordings.SAMPLE_COLUMNS`), so `Recording(samples)` gives
medians, intervals and paired differences through the one function that reads the recording.
"""
from __future__ import annotations

import pandas as pd

from .. import runtime
from ..config import check_int, check_real
from ..instruments.analysers.recordings import SAMPLE_COLUMNS
from ..instruments.recorders.timing import time_interleaved
from ..model.guards import count_guard_syncs, guard_names
from ..model.lab import split_tokens


def batch_adapters(requests: int, active: float, adapter: str | None) -> list:
    """The first round(active * requests) requests use `adapter`, the rest none (as the recording)."""
    check_int("requests", requests, 1)
    active = check_real("active", active, 0.0, 1.0)  # a bool is refused: True would pass as every request
    n = round(active * requests)
    if n and adapter is None:
        raise ValueError(f"active={active} needs an adapter name (load one into lab.pool first)")
    return [adapter if i < n else None for i in range(requests)]


def time_guards(lab, tokens: list[int], *, reps: int, warmup: int = 3, active: float = 0.0, requests: int = 8,
                adapter: str | None = None, guards=None, graph: bool | None = None, preset: str = "") -> pd.DataFrame:
    """Interleaved, unprofiled timings of every guard (and a graph replay of the `cpu_flag` forward
    when `graph`, default: on a GPU) at each token count; one row per (tokens, variant, repetition).
    On a CPU the timer is the wall clock: there is no device queue to drain, so a sync costs nothing
    there and the rows say nothing about a GPU bubble (column `timer`)."""
    from ..model.graphs import CapturedForward

    cuda = runtime.has_cuda() and lab.device.type == "cuda"
    graph = cuda if graph is None else graph
    if graph and not cuda:
        raise RuntimeError("a graph replay needs a CUDA GPU; pass graph=False on a CPU")
    guards = list(guard_names() if guards is None else guards)
    rows = []
    for M in tokens:
        R = min(requests, M)
        adapters, counts = batch_adapters(R, active, adapter), split_tokens(M, R)
        batch, tensors = lab.make_batch(adapters, counts)
        x = lab.random_input(M)
        fns = {g: (lambda g=g: lab.model(x, batch, tensors, guard=g)) for g in guards}
        cap = None
        if graph:
            cap = CapturedForward(lab, counts, guard="cpu_flag")
            cap.load_batch(x, adapters)
            fns["graph"] = cap.graph.replay
        syncs = {}
        for name, fn in fns.items():  # warm-up (Triton compiles here), counting the guard's syncs
            with count_guard_syncs() as c:
                for _ in range(max(warmup, 1)):
                    fn()
            syncs[name] = c.count // max(warmup, 1)
        runtime.synchronize()
        timed = time_interleaved(fns, reps=reps, cuda=cuda)
        for name, t in timed.items():
            for r, us in enumerate(t.samples_us):
                rows.append(dict(preset=preset, layers=len(lab.model.layers), tokens=M, active=float(active),
                                 variant=name, guard="cpu_flag" if name == "graph" else name,
                                 mode="graph" if name == "graph" else "eager", rep=r, us=us,
                                 syncs_per_forward=syncs[name], timer=t.timer))
        del cap
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS + ["timer"])


def as_recording(samples: pd.DataFrame, **params):
    """The samples as a `recordings.Recording` with this machine's metadata (GPU, commit, date:
    its `label`). GPU timings with at least twice the rule's repetitions (the rule keeps >= 10 after
    dropping a drift, stats.MIN_PAIRED_REPS) go through the recording's warm-up rule where this
    checkout has it (`recordings.mark_warmup`): a point that never settles gets NaN figures, not
    averaged. Fewer: every repetition is used (the warm-up calls before them are the only warm-up).
    CPU wall-clock timings are the host's noise by nature and are kept as they are."""
    from ..instruments.analysers import recordings as R
    from ..instruments.analysers.stats import MIN_PAIRED_REPS
    from ..provenance import metadata

    mark = getattr(R, "mark_warmup", None)  # the warm-up rule (instruments/analysers/stats.py: drop_warmup)
    n = int(samples.groupby(["tokens", "variant"])["rep"].nunique().min()) if len(samples) else 0
    gpu = len(samples) and (samples["timer"] == "cuda_events").all()
    s = mark(samples) if mark is not None and n >= 2 * MIN_PAIRED_REPS and gpu else samples
    return R.Recording(s.reset_index(drop=True), metadata(params=params or None))
