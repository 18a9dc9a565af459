"""Record a torch profiler trace of any code and read it back (instruments.analysers.trace) at ns precision.

    tables = profile_forwards(lambda: model(x), n_warmup=2, n_active=3, path="t.json.gz")
    T.forward_metrics(tables)    # then any analysis of lora_moe_lab.instruments.analysers.trace
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from typing import Callable, Iterable

import torch

from ... import runtime
from ..analysers.trace import FORWARD_WRAPPER, TraceTables, export_perfetto, load_trace

__all__ = ["profile_forwards", "sync_events_config"]


def sync_events_config():
    """Ask for CUDA sync records (cudaStreamSynchronize etc. as `cuda_sync` events) where this
    torch offers them."""
    try:
        return torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except Exception:  # older/newer torch without the option
        return None


def profile_forwards(fn: Callable[[], object], n_warmup: int = 2, n_active: int = 3, path=None,
                     labels: dict | None = None, keep_forwards: int | None = None,
                     forward_name: str = "forward", record_shapes: bool = False,
                     with_stack: bool = False, sync_between: bool = True,
                     sync_events: bool = True, activities: Iterable | None = None) -> TraceTables:
    """Run `fn()` n_warmup + n_active times under torch.profiler and return the parsed trace.

    Warm-up calls run with the profiler in its warm-up state (not recorded). Each call is wrapped
    in a `profile_forward` range (used as the forward when `fn` emits no `forward` range of its
    own). With sync_between, the device is synchronized after each call, outside that range, so
    forwards do not overlap on the GPU (that sync is not counted in any forward). The chrome trace
    is written to `path` (.json or .json.gz; a temporary file when None), optionally trimmed to the
    first `keep_forwards` forwards, with `labels` stored in the trace under "labels"."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    if activities is None:
        activities = [ProfilerActivity.CPU]
        if runtime.has_cuda():
            activities.append(ProfilerActivity.CUDA)
    kw = {}
    cfg = sync_events_config() if (sync_events and runtime.has_cuda()) else None
    if cfg is not None:
        kw["experimental_config"] = cfg
    exported = {}
    tmpdir = tempfile.mkdtemp(prefix="lora_moe_lab_trace_")
    raw = os.path.join(tmpdir, "raw.json")

    def ready(p):
        p.export_chrome_trace(raw)
        exported["raw"] = raw

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*warmup.*")  # n_warmup=0 is allowed
        with profile(activities=list(activities), schedule=schedule(
                wait=0, warmup=n_warmup, active=n_active, repeat=1), on_trace_ready=ready,
                record_shapes=record_shapes, with_stack=with_stack, **kw) as prof:
            for _ in range(n_warmup + n_active):
                with record_function(FORWARD_WRAPPER):
                    fn()
                if sync_between:
                    runtime.synchronize()
                prof.step()
    if "raw" not in exported:  # pragma: no cover - a torch whose schedule did not fire
        prof.export_chrome_trace(raw)
    t = load_trace(raw, forward_name=forward_name)
    if path is None:
        path = os.path.join(tmpdir, "trace.json.gz")
    out = export_perfetto(t, path, forwards=keep_forwards, labels=labels)
    with contextlib.suppress(OSError):
        os.remove(raw)
        os.rmdir(tmpdir)  # only when empty (the trace was written elsewhere)
    return load_trace(out, forward_name=forward_name)
