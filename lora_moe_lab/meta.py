"""Metadata stamped on recorded traces and checks: GPU, torch, triton, git commit, date.

One source of truth: `bench.metadata()` (the sweep CSV schema); this is the same dict with the
short key names the trace/check sidecar files use (`commit`, `date`) and optional run parameters.
"""
from __future__ import annotations


def metadata(params: dict | None = None) -> dict:
    from .bench import metadata as bench_metadata

    m = bench_metadata()
    out = dict(gpu=m["gpu"], torch=m["torch"], triton=m["triton"], cuda=m["cuda"], python=m["python"],
               commit=m["git_commit"], date=m["date_utc"])
    if params:
        out["params"] = params
    return out
