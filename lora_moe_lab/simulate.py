"""A host/device queue model of one forward: why a per-layer `.item()` drains the GPU pipeline.

The host issues ops one after another; each costs host time (PyTorch dispatch + the launch call).
An issued op waits in the stream's queue and the device runs the queue in order: an op starts when
it has been issued AND the previous op has ended. While the host stays ahead, the device never
waits for it and host launch costs are hidden. A sync op (`.item()` -> `cudaStreamSynchronize`)
blocks the host until the device has drained everything issued so far; then the queue is empty,
and the device idles until the host has issued the next op. That idle gap, once per guard, per
layer, is the whole lesson.

    ops    = forward_ops("qwen3-30b-a3b", 128, "sync", layers=48, active=0.5, params=CostModel())
    result = simulate(ops, timeline=True)  # forward_us, syncs, device idle, stall after syncs
    result.timeline                        # lane/start_ns/end_ns/name/category rows
    result.tables()                        # the same as trace.TraceTables: trace.forward_metrics,
                                           # idle_gaps and plots.timeline read it like a recording
    forward_us("qwen3-30b-a3b", 128, "sync", layers=48)   # fast path (no records), for fitting

    fit(sweep_df, traces=[...])  -> FitResult (cost model fitted to a bench.py CSV and/or traces)
    validate(sweep_df, params)   -> per-guard error table (target +-15 %)
    extrapolate(params)          -> TP=4 ranks, 48 layers, 128 x 2048 tokens in prefill chunks
    compare_production(extrap)   -> beside 260 syncs, 100 ms stall, +14.4 % throughput, -12.6 % TTFT
    scale_model_report(sweep_df) -> all of the above in one dict

Units: microseconds in parameters and results, integer nanoseconds in the timeline. The cost model is deliberately small (a fixed device time per kernel plus flops and bytes
terms, one host cost per launch, one sync overhead, one graph-launch cost) so that its parameters
can be fitted from a benchmark sweep (`fit`), checked against it (`validate`) and then pushed to
shapes no single GPU runs (`extrapolate`: TP=4, chunked prefill of a 128 x 2048 batch).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .config import MoEShape, get_shape

GUARDS = ("sync", "cpu_flag", "launch_always")
# One row per host segment or device op; `op` joins a launch (host) to its kernel (gpu); issue_ns is
# when a device op entered the queue (NaN on host rows).
TIMELINE_COLUMNS = ["lane", "start_ns", "end_ns", "name", "category", "layer", "op", "issue_ns"]

# Production figures this lab is about (DESIGN.md): Qwen3-30B-A3B, TP=4, 48 MoE layers, batch 128,
# input length 2048, guard removed.
PRODUCTION = {
    "syncs_per_forward": 260.0,
    "stall_ms_per_forward": 100.0,
    "input_throughput_gain_pct": 14.4,
    "ttft_change_pct": -12.6,
}
PRODUCTION["stall_us_per_sync"] = 1000.0 * PRODUCTION["stall_ms_per_forward"] / PRODUCTION["syncs_per_forward"]


# --------------------------------------------------------------------------------------------
# Ops and the queue engine
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One step of the host program.

    kind: "kernel"     host spends host_us issuing it, then it runs device_us on the device;
          "sync"       host blocks until the device has drained, then spends host_us (wake-up,
                       copy-out); no device work;
          "collective" a device op every rank must reach: it starts wait_us after this rank could
                       start it (the slowest rank's skew), then runs device_us; the NCCL kernel
                       occupies the device while it waits, as it spins on the other ranks;
          "host"       host-only work (graph launch, Python bookkeeping): host_us, no device op.
    """

    name: str
    kind: str = "kernel"
    host_us: float = 0.0
    device_us: float = 0.0
    wait_us: float = 0.0
    layer: int = -1
    category: str = ""

    def __post_init__(self):
        if self.kind not in ("kernel", "sync", "collective", "host"):
            raise ValueError(f"op {self.name!r}: unknown kind {self.kind!r}")
        for f in ("host_us", "device_us", "wait_us"):
            v = getattr(self, f)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"op {self.name!r}: {f} must be finite and >= 0, got {v!r}")


@dataclass
class SimResult:
    forward_us: float  # end of the last device op or of the host program, whichever is later
    host_end_us: float
    device_end_us: float
    device_busy_us: float
    device_idle_us: float  # forward_us - busy: the device had nothing to run
    sync_stall_us: float  # the part of idle that directly follows a sync (queue drained)
    host_blocked_us: float  # host time spent waiting inside syncs
    syncs: int
    device_ops: int  # ops that ran on the device (an op may stand for several kernel launches)
    timeline: pd.DataFrame | None = None

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "timeline"}
        return d

    def tables(self, **labels):
        """The timeline as trace.TraceTables (see `to_trace_tables`): trace.forward_metrics,
        idle_gaps, layer_breakdown and plots.timeline read it like a recorded trace."""
        if self.timeline is None:
            raise ValueError("this SimResult has no timeline: simulate it with timeline=True")
        return to_trace_tables(self.timeline, labels=labels)


def simulate(ops: Sequence[Op], *, timeline: bool = False) -> SimResult:
    """Run the queue model over `ops` (host starts at t=0 with an idle device and an empty queue)."""
    h = 0.0  # host clock
    dfree = 0.0  # when the device finishes the last op issued so far
    busy = stall = blocked = 0.0
    syncs = device_ops = 0
    after_sync = False
    rows: list[tuple] = []
    ns = 1000.0
    for i, op in enumerate(ops):
        cat = op.category
        if op.kind == "sync":
            wait_from = h
            h = max(h, dfree)
            blocked += h - wait_from
            h_end = h + op.host_us
            syncs += 1
            after_sync = True
            if timeline:
                rows.append(("host", wait_from, h_end, op.name, cat or "sync", op.layer, i, np.nan))
            h = h_end
            continue
        h_end = h + op.host_us
        if timeline and op.host_us > 0:
            hc = (cat or "host") if op.kind == "host" else "launch"  # the host side of a kernel is its launch
            rows.append(("host", h, h_end, op.name, hc, op.layer, i, np.nan))
        h = h_end
        if op.kind == "host":
            continue
        device_ops += 1
        start = max(h, dfree)
        if after_sync:
            stall += start - dfree
            after_sync = False
        dur = op.device_us + (op.wait_us if op.kind == "collective" else 0.0)
        end = start + dur
        busy += dur
        if timeline:
            rows.append(("gpu", start, end, op.name, cat or op.kind, op.layer, i, h))
        dfree = end
    fwd = max(h, dfree)
    tl = None
    if timeline:
        tl = pd.DataFrame(rows, columns=TIMELINE_COLUMNS)
        for c in ("start_ns", "end_ns"):
            tl[c] = np.round(tl[c].to_numpy(dtype=float) * ns).astype("int64")
        tl["issue_ns"] = pd.array(np.round(tl["issue_ns"].to_numpy(dtype=float) * ns), dtype="Int64")
    return SimResult(fwd, h, dfree, busy, fwd - busy, stall, blocked, syncs, device_ops, tl)


_RUNTIME_NAME = {"launch": "cudaLaunchKernel", "sync": "cudaStreamSynchronize", "graph_launch": "cudaGraphLaunch"}


def to_trace_tables(timeline: pd.DataFrame, forward_name: str = "forward", launch_call_ns: int = 2000,
                    labels: dict | None = None):
    """A simulated timeline as `trace.TraceTables` (one forward), so the trace analyses
    (`trace.forward_metrics`, `idle_gaps`, `layer_breakdown`, `queue_depth`) and the plots built
    on them read a simulated forward exactly as a recorded one. Host launch segments become
    `cudaLaunchKernel` runtime calls (correlated with their kernel), syncs `cudaStreamSynchronize`,
    the graph launch `cudaGraphLaunch`; each layer's host span becomes a `moe_layer_{i}` range.
    A launch segment of the model is PyTorch dispatch followed by the CUDA call: only its last
    `launch_call_ns` become the `cudaLaunchKernel` call, as in a profiler trace (the trace's gap
    categories look at when that call began)."""
    from . import trace

    tl = timeline
    host = tl[tl["lane"] == "host"]
    gpu = tl[tl["lane"] == "gpu"]
    end = int(tl["end_ns"].max()) if len(tl) else 0
    rt_rows, launch_of = [], {}
    graph = host[host["category"] == "graph_launch"]
    for r in host.itertuples():
        name = _RUNTIME_NAME.get(r.category)
        if name is None:
            continue  # host work that calls no CUDA API
        s, e = int(r.start_ns), int(r.end_ns)
        if r.category == "launch":
            s = max(s, e - int(launch_call_ns))
        rt_rows.append(dict(name=name, cat="cuda_runtime", pid=1, tid=1, start_ns=s, end_ns=e, dur_ns=e - s,
                            correlation=int(r.op), external_id=None, is_sync=name == "cudaStreamSynchronize",
                            forward=0))
        launch_of[int(r.op)] = (name, s, e)
    g0 = ("cudaGraphLaunch", int(graph.iloc[0]["start_ns"]), int(graph.iloc[0]["end_ns"])) if len(graph) else None
    k_rows = []
    for r in gpu.itertuples():
        ln = launch_of.get(int(r.op)) or g0
        if ln is None:  # issued with no host cost: a zero-length launch at its issue time
            t = int(r.issue_ns) if not pd.isna(r.issue_ns) else int(r.start_ns)
            ln = ("cudaLaunchKernel", t, t)
        k_rows.append(dict(name=r.name, kind="memcpy" if r.category == "memcpy" else "kernel", device=0, stream=7,
                           start_ns=int(r.start_ns), end_ns=int(r.end_ns), dur_ns=int(r.end_ns - r.start_ns),
                           correlation=int(r.op), external_id=None, launch_name=ln[0], launch_start_ns=ln[1],
                           launch_end_ns=ln[2], launch_tid=1, forward=0))
    ann = [dict(name=forward_name, pid=1, tid=1, start_ns=0, end_ns=end, dur_ns=end, external_id=None, forward=0)]
    hl = host[host["layer"] >= 0]
    if len(hl):
        spans = hl.groupby("layer")["start_ns"].min().sort_index()
        starts = spans.to_numpy(dtype=np.int64)
        ends = np.append(starts[1:], int(host["end_ns"].max()))
        for layer, s, e in zip(spans.index, starts, ends):
            ann.append(dict(name=f"moe_layer_{int(layer)}", pid=1, tid=1, start_ns=int(s), end_ns=int(e),
                            dur_ns=int(e - s), external_id=None, forward=0))
    kernels = trace._frame(k_rows, trace._KCOLS)
    runtime = trace._frame(rt_rows, trace._RCOLS)
    sync_rows = [dict(name=r["name"], source="runtime", kind=None, pid=1, tid=1, stream=None, start_ns=r["start_ns"],
                      end_ns=r["end_ns"], dur_ns=r["dur_ns"], correlation=r["correlation"], forward=0)
                 for r in rt_rows if r["is_sync"]]
    memcpys = kernels[kernels["kind"] == "memcpy"].copy()
    memcpys["direction"] = None
    return trace.TraceTables(
        kernels=kernels, runtime=runtime, syncs=trace._frame(sync_rows, trace._SCOLS), memcpys=memcpys,
        annotations=trace._frame(ann, trace._ACOLS), gpu_annotations=trace._frame([], trace._ACOLS),
        cpu_ops=trace._frame([], trace._ACOLS),
        forwards=pd.DataFrame([dict(forward=0, name=forward_name, start_ns=0, end_ns=end, dur_ns=end)],
                              columns=["forward", "name", "start_ns", "end_ns", "dur_ns"]),
        doc={"labels": {"source": "simulate", **(labels or {})}}, path=None)


# --------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostModel:
    """Parameters of the queue model (defaults: order-of-magnitude H200 + PyTorch eager guesses;
    `fit` replaces them with values fitted from recorded data)."""

    launch_us: float = 5.0  # host cost to issue one eager kernel (dispatch + cudaLaunchKernel)
    sync_us: float = 15.0  # host cost of a sync beyond the wait: D2H copy, wake-up, Python
    graph_launch_us: float = 25.0  # host cost of one cudaGraphLaunch of a whole forward
    kernel_us: float = 2.0  # fixed device time of one kernel (launch latency, tail, tiny grids)
    tflops: float = 300.0  # effective device math rate of the GEMM-like ops, TFLOP/s
    tbps: float = 2.5  # effective device memory rate, TB/s
    # the collective is never measured on one GPU: assumed, not fitted (NCCL all-reduce over NVLink
    # between 4 H200/H100-class GPUs reaches a bus bandwidth of a few hundred GB/s on large buffers)
    coll_us: float = 20.0  # fixed device time of one all-reduce
    coll_gbps: float = 350.0  # all-reduce bus bandwidth, GB/s
    skew_us: float = 0.0  # how much later the slowest other rank reaches each collective
    host_layer_us: float = 0.0  # extra host work per layer that launches nothing (serving-engine Python)
    triton_extra_us: float = 0.0  # extra host cost of a Triton launch over a PyTorch op's (Python launcher)

    def with_(self, **kw) -> "CostModel":
        return replace(self, **kw)

    def device_us(self, flops: float, bytes_: float, launches: int = 1) -> float:
        return launches * self.kernel_us + flops / (self.tflops * 1e6) + bytes_ / (self.tbps * 1e6)

    def collective_us(self, bytes_: float, ranks: int) -> float:
        # ring all-reduce moves 2 (n-1)/n of the buffer over the bus
        return self.coll_us + 2.0 * (ranks - 1) / ranks * bytes_ / (self.coll_gbps * 1e3)

    def as_dict(self) -> dict:
        return asdict(self)


def _experts_touched(pairs: float, num_experts: int) -> float:
    """Expected number of distinct experts hit by `pairs` uniformly routed (token, k) pairs."""
    if pairs <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - 1.0 / num_experts) ** pairs)


# Kernel launches per op group of one layer of the mini model on the Triton backend, counted from
# a recorded H200 trace (data/traces/*_eager_M16.json.gz, 26 GPU ops per layer with LoRA): the
# RMSNorm and the alignment are Triton kernels (1 and 3 launches + a fill), the router is an fp32
# copy + GEMM + split-K reduce, softmax/top-k/renormalise/cast ~6, the old guard one reduction and
# its device-to-host copy. The fitted launch cost absorbs a small miscount.
DEFAULT_LAUNCHES = {
    "lora_any": 2, "rmsnorm": 1, "router_gemm": 3, "softmax_topk": 6, "align": 4, "gate_up_gemm": 1,
    "lora_align": 4, "lora_gate_up": 1, "silu_mul": 2, "down_gemm": 1, "lora_down": 1,
    "topk_sum": 1, "residual_add": 1,
}


# Ops launched by the Triton backend's Python launchers (one launch each).
TRITON_OPS = frozenset({"gate_up_gemm", "down_gemm", "lora_gate_up", "lora_down"})


def layer_spec(shape: MoEShape, tokens: int, guard: str, *, active: float = 0.0, rank: int = 16,
               graph: bool = False, dtype_bytes: int = 2, tp: int = 1, collective: bool = False,
               syncs_per_layer: int = 1, launches: dict | None = None) -> list[tuple]:
    """The work of one MoE layer of the mini model, in host program order, independent of the cost
    model: (name, kind, category, launches, flops, bytes) per op (bytes of the all-reduce buffer
    for a collective).

    guard: "sync" checks the device (`.any().item()`: a reduction kernel, then a sync that drains
    the queue) and skips the LoRA kernels when nothing is active; "cpu_flag" reads the host flag
    (no sync) and skips them the same way; "launch_always" always launches them and their programs
    exit early on the GPU when no adapter is enabled (zero work: only the fixed kernel time). In
    graph mode every strategy records the LoRA kernels and nothing syncs.
    """
    if guard not in GUARDS:
        raise ValueError(f"unknown guard {guard!r}; choose one of {list(GUARDS)}")
    if not 0.0 <= active <= 1.0:
        raise ValueError(f"active must be in [0, 1], got {active!r}")
    if not isinstance(tokens, (int, np.integer)) or tokens <= 0:
        raise ValueError(f"tokens must be a positive int, got {tokens!r}")
    n = dict(DEFAULT_LAUNCHES, **(launches or {}))
    M, K, I, E, k, r, db = int(tokens), shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, rank, dtype_bytes
    Ma = round(active * M)  # tokens whose request uses an adapter (one adapter slot in use)
    et = _experts_touched(M * k, E)
    eta = _experts_touched(Ma * k, E)
    spec: list[tuple] = []

    def kern(name, flops=0.0, bytes_=0.0, cat="kernel"):
        spec.append((name, "kernel", cat, n.get(name, 1), float(flops), float(bytes_)))

    spec.append(("host_layer", "host", "host", 0, 0.0, 0.0))
    # The guard runs first in each layer (moe.MiniMoEModel.forward), before the norm and router.
    if graph:
        lora = True
    elif guard == "sync":
        for _ in range(syncs_per_layer):
            kern("lora_any", 0, M * 16)
            spec.append(("lora_any.item", "sync", "sync", 0, 0.0, 0.0))
        lora = Ma > 0
    elif guard == "cpu_flag":
        lora = Ma > 0
    else:
        lora = True
    kern("rmsnorm", 0, 4 * M * K * db)
    kern("router_gemm", 2 * M * K * E, (M * K + K * E + M * E) * 4)
    kern("softmax_topk", 0, M * E * 8 + M * k * 16)
    kern("align", 0, M * k * 60 + E * 16)
    kern("gate_up_gemm", 2 * M * k * K * 2 * I, (et * 2 * I * K + M * K + M * k * 2 * I) * db)
    if lora:
        kern("lora_align", 0, M * k * 60 + E * 16, "lora")
        # fused shrink + expand: x @ A (r columns) then @ B into the (M, top_k, 2I) intermediate
        kern("lora_gate_up", 2 * Ma * k * 2 * (K * r + r * I),
             (eta * 2 * (r * K + I * r) + Ma * K + 2 * Ma * k * 2 * I) * db, "lora")
    kern("silu_mul", 0, M * k * 3 * I * db)
    kern("down_gemm", 2 * M * k * I * K, (et * K * I + M * k * (I + K)) * db)
    if lora:
        kern("lora_down", 2 * Ma * k * (I * r + r * K), (eta * (r * I + K * r) + Ma * k * I + 2 * Ma * k * K) * db, "lora")
    kern("topk_sum", 0, (M * k * K + M * K) * db)
    if collective:
        spec.append(("all_reduce", "collective", "collective", 1, 0.0, float(M * K * db)))
    kern("residual_add", 0, 3 * M * K * db)
    return spec


def _costs(spec: list[tuple], params: CostModel, graph: bool, tp: int) -> list[tuple]:
    """(name, kind, category, n, host_us, device_us, wait_us) per op group of a layer spec: n
    identical kernel launches, each costing host_us to issue and device_us to run."""
    out = []
    for name, kind, cat, nl, flops, bytes_ in spec:
        if kind == "host":
            out.append((name, kind, cat, 1, 0.0 if graph else params.host_layer_us, 0.0, 0.0))
        elif kind == "sync":
            out.append((name, kind, cat, 1, params.sync_us, 0.0, 0.0))
        elif kind == "collective":
            out.append((name, kind, cat, 1, 0.0 if graph else params.launch_us, params.collective_us(bytes_, tp),
                        params.skew_us))
        else:
            h = 0.0 if graph else params.launch_us + (params.triton_extra_us if name in TRITON_OPS else 0.0)
            out.append((name, kind, cat, nl, h, params.device_us(flops, bytes_, nl) / nl, 0.0))
    return out


def layer_ops(shape: MoEShape, tokens: int, guard: str, *, params: CostModel = CostModel(), layer: int = 0,
              graph: bool = False, tp: int = 1, **kw) -> list[Op]:
    """The ops of one MoE layer with host and device costs from `params` (see `layer_spec`); an op
    group of n launches becomes n kernels that share its work evenly."""
    spec = layer_spec(shape, tokens, guard, graph=graph, tp=tp, **kw)
    ops = []
    for name, kind, cat, n, h, d, w in _costs(spec, params, graph, tp):
        if kind == "host" and h == 0.0:
            continue
        ops += [Op(name, kind, h, d, w, layer=layer, category=cat)] * n
    return ops


def forward_ops(shape: MoEShape | str, tokens: int, guard: str, *, layers: int | None = None,
                mode: str = "eager", params: CostModel = CostModel(), **kw) -> list[Op]:
    """All layers of one forward. mode="graph": one host graph launch, then every layer's kernels."""
    shape, L, graph = _check_forward(shape, layers, mode)
    ops: list[Op] = []
    if graph:
        ops.append(Op("cudaGraphLaunch", "host", params.graph_launch_us, category="graph_launch"))
    for layer in range(L):
        ops += layer_ops(shape, tokens, guard, graph=graph, params=params, layer=layer, **kw)
    return ops


def _check_forward(shape, layers, mode):
    if mode not in ("eager", "graph"):
        raise ValueError(f"unknown mode {mode!r}; choose 'eager' or 'graph'")
    shape = get_shape(shape)
    L = shape.num_layers if layers is None else layers
    if not isinstance(L, (int, np.integer)) or L <= 0:
        raise ValueError(f"layers must be a positive int, got {layers!r}")
    return shape, int(L), mode == "graph"


_KIND = {"kernel": 0, "sync": 1, "collective": 2, "host": 3}


def _fast_forward_us(costs: list[tuple], L: int, host0: float) -> tuple[float, int]:
    """forward_us and syncs of L identical layers: the recurrence of `simulate` without records.

    A run of n identical launches (host c, device d each) from host time h and device-free time
    f ends the device at max(f + n d, h + c + n d, h + n c + d): the end of the last kernel is
    max over j of (j-th issue + remaining j..n work), linear in j, so one of its ends wins."""
    h, dfree, syncs = host0, 0.0, 0
    seq = [(_KIND[k], n, hu, du + wu) for _, k, _, n, hu, du, wu in costs]
    for _ in range(L):
        for kind, n, c, d in seq:
            if kind == 1:
                h = (h if h > dfree else dfree) + c
                syncs += 1
            elif kind == 3:
                h += c
            elif n == 1:
                h += c
                dfree = (h if h > dfree else dfree) + d
            else:
                dfree = max(dfree + n * d, h + c + n * d, h + n * c + d)
                h += n * c
    return (h if h > dfree else dfree), syncs


def simulate_forward(shape: MoEShape | str, tokens: int, guard: str, *, timeline: bool = False,
                     layers: int | None = None, mode: str = "eager", params: CostModel = CostModel(),
                     **kw) -> SimResult:
    """One forward of the mini model through the queue model (see `forward_ops` for arguments)."""
    return simulate(forward_ops(shape, tokens, guard, layers=layers, mode=mode, params=params, **kw),
                    timeline=timeline)


def forward_us(shape: MoEShape | str, tokens: int, guard: str, *, layers: int | None = None, mode: str = "eager",
               params: CostModel = CostModel(), tp: int = 1, **kw) -> float:
    """Only the forward time (fast path for fitting: no Op objects, no timeline)."""
    shape, L, graph = _check_forward(shape, layers, mode)
    spec = layer_spec(shape, tokens, guard, graph=graph, tp=tp, **kw)
    return _fast_forward_us(_costs(spec, params, graph, tp), L, params.graph_launch_us if graph else 0.0)[0]


# --------------------------------------------------------------------------------------------
# Predict / fit / validate against a benchmark sweep (bench.py's CSV schema)
# --------------------------------------------------------------------------------------------
_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4, "float64": 8}


def _row_kwargs(row) -> dict:
    g = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    return dict(shape=g("preset"), tokens=int(g("tokens")), guard=g("guard"), layers=int(g("layers")),
                mode=g("mode", "eager") or "eager", active=float(g("active", 0.0)), rank=int(g("rank", 16)),
                dtype_bytes=_DTYPE_BYTES.get(str(g("dtype", "bfloat16")), 2))


def _clean_sweep(df: pd.DataFrame) -> pd.DataFrame:
    need = {"preset", "layers", "tokens", "guard", "median_us"}
    miss = need - set(df.columns)
    if miss:
        raise ValueError(f"sweep table lacks columns {sorted(miss)}")
    d = df
    if "error" in d.columns:
        d = d[d["error"].isna() | (d["error"].astype(str) == "")]
    d = d[np.isfinite(d["median_us"].astype(float)) & (d["median_us"].astype(float) > 0)]
    return d.reset_index(drop=True)


def predict(df: pd.DataFrame, params: CostModel = CostModel()) -> pd.DataFrame:
    """Each sweep row with the model's forward time, syncs and idle time beside the measurement."""
    d = _clean_sweep(df).copy()
    out = [simulate_forward(params=params, **_row_kwargs(r)) for r in d.to_dict("records")]
    d["predicted_us"] = [o.forward_us for o in out]
    d["predicted_syncs"] = [o.syncs for o in out]
    d["predicted_idle_us"] = [o.device_idle_us for o in out]
    d["error_pct"] = 100.0 * (d["predicted_us"] - d["median_us"].astype(float)) / d["median_us"].astype(float)
    return d


def trace_rows(traces: Iterable) -> pd.DataFrame:
    """Sweep-like rows from recorded traces (paths or TraceTables with the labels that
    scripts/gpu_traces.py stores: preset, num_layers, guard, mode, M, adapters, max_rank, dtype),
    one per trace: median over its forwards of (end of the last GPU op - start of the forward on the
    host), the quantity bench.py times with CUDA events. Also the measured kernels per forward
    beside the model's count (`model_kernels`), a check of DEFAULT_LAUNCHES."""
    from . import trace as T

    rows = []
    for tr in traces:
        t = T.load_trace(tr)
        lab = t.labels
        need = {"preset", "num_layers", "guard", "mode", "M"}
        if not need <= set(lab):
            raise ValueError(f"trace {t.path or '<in memory>'} lacks labels {sorted(need - set(lab))}")
        m = T.forward_metrics(t)
        if not len(m):
            continue
        end = np.maximum(m["gpu_end_ns"].astype("float").fillna(0).to_numpy(), m["host_end_ns"].to_numpy(float))
        dur_us = (end - m["host_start_ns"].to_numpy(float)) / 1e3
        ads = lab.get("adapters") or []
        active = (sum(a is not None for a in ads) / len(ads)) if ads else float(lab.get("active", 0.0))
        row = dict(preset=lab["preset"], layers=int(lab["num_layers"]), tokens=int(lab["M"]), guard=lab["guard"],
                   active=active, rank=int(lab.get("max_rank", 16)), mode=lab["mode"],
                   dtype=str(lab.get("dtype", "bfloat16")), median_us=float(np.median(dur_us)),
                   kernels_per_forward=float(m["n_kernels"].median()), syncs_per_forward=float(m["n_syncs"].median()),
                   source=str(t.path or "trace"), error=None)
        kw = _row_kwargs(row)
        row["model_kernels"] = simulate_forward(**{k: v for k, v in kw.items() if k != "shape"},
                                                shape=kw["shape"]).device_ops
        rows.append(row)
    return pd.DataFrame(rows)


FIT_PARAMS = ("launch_us", "sync_us", "graph_launch_us", "kernel_us", "tflops", "tbps")
# For recorded GPU data: the Python launchers of the Triton kernels cost the host far more than a
# PyTorch op (notebook 02 on the H200: ~90 us to issue a LoRA launch vs ~13 us for an empty Triton
# kernel), so their extra host cost is fitted too rather than assumed 0.
FIT_PARAMS_RECORDED = FIT_PARAMS + ("triton_extra_us",)


def _nelder_mead(f, x0: np.ndarray, *, step: float = 0.3, iters: int = 400, tol: float = 1e-10) -> np.ndarray:
    """Plain Nelder-Mead (no scipy in the base install)."""
    n = len(x0)
    simplex = [x0.copy()] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + tol):
            break
        c = np.mean(simplex[:-1], axis=0)
        xr = c + (c - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (simplex[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex[1:]]
                vals = [vals[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(vals))]


@dataclass
class FitResult:
    params: CostModel
    rms_log_error: float  # root mean square of log(predicted / measured) over the fitted rows
    rows: int
    fitted: tuple[str, ...]
    sources: list[str] = field(default_factory=list)


def _trace_init(init: CostModel, kernels: pd.DataFrame | None, runtime: pd.DataFrame | None) -> tuple[CostModel, list[str]]:
    """Starting values from trace tables (columns name, start_ns, end_ns): median launch-call
    duration, median sync-call duration, a low percentile of kernel durations as the device floor."""
    kw, src = {}, []

    def durs(t, pat):
        m = t["name"].astype(str).str.contains(pat, case=False, regex=True)
        return (t.loc[m, "end_ns"] - t.loc[m, "start_ns"]).astype(float) / 1000.0

    if runtime is not None and len(runtime):
        m = runtime["name"].astype(str).str.contains(r"LaunchKernel|cuLaunch", case=False, regex=True)
        st = np.sort(runtime.loc[m, "start_ns"].to_numpy(dtype=np.int64))
        gaps = np.diff(st) / 1000.0
        gaps = gaps[(gaps > 0) & (gaps < 100.0)]  # launch to launch inside a busy host stretch
        if len(gaps):  # host cost of one launch = dispatch + the call: the spacing of launch calls
            kw["launch_us"] = float(np.median(gaps))
            src.append("trace:launch")
        d = durs(runtime, r"GraphLaunch")
        if len(d):
            kw["graph_launch_us"] = float(d.median())
            src.append("trace:graph_launch")
    if kernels is not None and len(kernels):
        d = (kernels["end_ns"] - kernels["start_ns"]).astype(float) / 1000.0
        if len(d):
            kw["kernel_us"] = max(float(np.percentile(d, 10)), 0.5)
            src.append("trace:kernel_floor")
    return init.with_(**kw), src


def fit(sweep: pd.DataFrame | None = None, *, traces: Iterable | None = None, kernels: pd.DataFrame | None = None,
        runtime: pd.DataFrame | None = None, init: CostModel = CostModel(),
        params: Sequence[str] = FIT_PARAMS, iters: int = 400) -> FitResult:
    """Fit the cost model to recorded data.

    Trace tables (kernels/runtime calls with name, start_ns, end_ns) give starting values; `traces`
    (recorded trace files or TraceTables with labels) give both starting values and rows
    (`trace_rows`); the sweep (bench.py CSV: preset, layers, tokens, guard, active, rank, mode,
    median_us) and the trace rows are then matched by
    minimising the squared log-ratio of simulated to measured forward time over the chosen
    parameters (Nelder-Mead in log space: all parameters stay positive). Without a sweep only the
    trace starting values are returned.
    """
    if traces is not None:
        from . import trace as T

        tabs = [T.load_trace(t) for t in traces]
        ks = [t.kernels for t in tabs] + ([kernels] if kernels is not None else [])
        rs = [t.runtime for t in tabs] + ([runtime] if runtime is not None else [])
        kernels = pd.concat(ks, ignore_index=True) if ks else None
        runtime = pd.concat(rs, ignore_index=True) if rs else None
        tr = trace_rows(tabs)
        sweep = tr if sweep is None else pd.concat([sweep, tr], ignore_index=True)
    start, src = _trace_init(init, kernels, runtime)
    if sweep is None or not len(sweep):
        return FitResult(start, float("nan"), 0, (), src)
    d = _clean_sweep(sweep)
    if not len(d):
        raise ValueError("the sweep has no usable rows (all errored or non-positive)")
    names = tuple(params)
    bad = [p for p in names if p not in {f.name for f in fields(CostModel)}]
    if bad:
        raise ValueError(f"unknown cost-model parameters {bad}")
    rows = [_row_kwargs(r) for r in d.to_dict("records")]
    specs = []
    for r in rows:  # the work of each row does not depend on the parameters: build it once
        shape, L, graph = _check_forward(r["shape"], r["layers"], r["mode"])
        kw = {k: v for k, v in r.items() if k not in ("shape", "tokens", "guard", "layers", "mode")}
        specs.append((layer_spec(shape, r["tokens"], r["guard"], graph=graph, **kw), L, graph))
    meas = np.log(d["median_us"].astype(float).to_numpy())
    # graph rows carry no information on eager/sync costs and vice versa; drop parameters no row
    # can see so they do not wander.
    modes = {r["mode"] for r in rows}
    guards = {r["guard"] for r in rows}
    names = tuple(p for p in names if not (p == "graph_launch_us" and "graph" not in modes)
                  and not (p == "sync_us" and not ({"sync"} & guards and "eager" in modes))
                  and not (p == "launch_us" and "eager" not in modes))
    # Log-space search: a parameter whose start is 0 (e.g. triton_extra_us) starts at 1 us instead.
    start = start.with_(**{p: 1.0 for p in names if getattr(start, p) <= 0})
    x0 = np.log([getattr(start, p) for p in names])

    def model(x):
        return start.with_(**{p: float(v) for p, v in zip(names, np.exp(x))})

    def loss(x):
        if np.any(np.abs(x - x0) > math.log(1e3)):  # stay within 1000x of the start: no runaway values
            return 1e30
        pm = model(x)
        pred = np.log([_fast_forward_us(_costs(s, pm, g, 1), L, pm.graph_launch_us if g else 0.0)[0]
                       for s, L, g in specs])
        return float(np.mean((pred - meas) ** 2))

    x = x0
    for _ in range(3):  # restarts: Nelder-Mead stalls on the max() kinks of the queue model
        x = _nelder_mead(loss, x, iters=iters)
    pm = model(x)
    return FitResult(pm, math.sqrt(loss(x)), len(rows), names, src + ["sweep"])


def validate(sweep: pd.DataFrame, params: CostModel, *, target_pct: float = 15.0) -> pd.DataFrame:
    """Predicted vs measured, per guard (and mode): n, mean/max absolute % error, share of rows
    within `target_pct`, and whether every row is within it."""
    p = predict(sweep, params)
    p["abs_err_pct"] = p["error_pct"].abs()
    keys = ["guard"] + (["mode"] if "mode" in p.columns else [])
    g = p.groupby(keys, sort=True)
    t = pd.DataFrame({
        "n": g.size(),
        "mean_abs_err_pct": g["abs_err_pct"].mean(),
        "max_abs_err_pct": g["abs_err_pct"].max(),
        "within_target_frac": g["abs_err_pct"].apply(lambda s: float((s <= target_pct).mean())),
    }).reset_index()
    t["target_pct"] = target_pct
    t["ok"] = t["max_abs_err_pct"] <= target_pct
    return t


# --------------------------------------------------------------------------------------------
# Extrapolation to production and what-ifs
# --------------------------------------------------------------------------------------------
def extrapolate(params: CostModel = CostModel(), *, preset: str = "qwen3-30b-a3b-tp4", layers: int = 48,
                batch: int = 128, input_len: int = 2048, chunks: Iterable[int] = (8192, 16384),
                guards: Iterable[str] = GUARDS, active: float = 0.5, rank: int = 16, tp: int = 4,
                collective: bool = True, syncs_per_layer: int = 1, modes: Iterable[str] = ("eager",)) -> pd.DataFrame:
    """Predicted prefill of `batch` x `input_len` tokens in chunks of `chunk` tokens, per guard.

    One forward = one chunk through `layers` layers with TP-rank shapes and one all-reduce per
    layer. stall_ms_per_forward is the forward time lost to syncs (forward time minus the cpu_flag
    forward time with the same chunk). The model covers the MoE blocks only (no attention, no
    sampling): absolute times are below a serving engine's, the sync cost is not.
    """
    shape = get_shape(preset)
    total = batch * input_len
    rows = []
    for chunk in chunks:
        n_fwd = math.ceil(total / chunk)
        for mode in modes:
            for guard in guards:
                r = simulate_forward(shape, chunk, guard, layers=layers, mode=mode, params=params, active=active,
                                     rank=rank, tp=tp, collective=collective, syncs_per_layer=syncs_per_layer)
                rows.append(dict(preset=preset, layers=layers, tokens=chunk, chunks_per_batch=n_fwd, mode=mode,
                                 guard=guard, active=active, syncs_per_layer=syncs_per_layer,
                                 forward_ms=r.forward_us / 1e3, syncs_per_forward=r.syncs,
                                 device_idle_ms=r.device_idle_us / 1e3, sync_stall_ms=r.sync_stall_us / 1e3,
                                 prefill_ms=n_fwd * r.forward_us / 1e3,
                                 input_tok_per_s=total / (n_fwd * r.forward_us * 1e-6)))
    df = pd.DataFrame(rows)
    ref = df[df["guard"] == "cpu_flag"].set_index(["tokens", "mode"])["forward_ms"]
    base = df.set_index(["tokens", "mode"]).index.map(lambda k: ref.get(k, np.nan))
    df["stall_ms_per_forward"] = df["forward_ms"].to_numpy() - np.asarray(base, dtype=float)
    syn = df[df["guard"] == "sync"].set_index(["tokens", "mode"])["forward_ms"]
    sbase = np.asarray(df.set_index(["tokens", "mode"]).index.map(lambda k: syn.get(k, np.nan)), dtype=float)
    df["throughput_gain_vs_sync_pct"] = 100.0 * (sbase / df["forward_ms"] - 1.0)
    df["ttft_change_vs_sync_pct"] = 100.0 * (df["forward_ms"] / sbase - 1.0)
    return df


def compare_production(extrap: pd.DataFrame, *, fix: str = "cpu_flag") -> pd.DataFrame:
    """Predicted (sync guard vs the fix) beside the production figures, one row per metric and chunk."""
    rows = []
    for (tokens, mode), g in extrap.groupby(["tokens", "mode"], sort=True):
        s = g[g["guard"] == "sync"]
        f = g[g["guard"] == fix]
        if not len(s) or not len(f):
            continue
        s, f = s.iloc[0], f.iloc[0]
        pred = {
            "syncs_per_forward": float(s["syncs_per_forward"]),
            "stall_ms_per_forward": float(s["forward_ms"] - f["forward_ms"]),
            "input_throughput_gain_pct": 100.0 * (s["forward_ms"] / f["forward_ms"] - 1.0),
            "ttft_change_pct": 100.0 * (f["forward_ms"] / s["forward_ms"] - 1.0),
        }
        pred["stall_us_per_sync"] = (1000.0 * pred["stall_ms_per_forward"] / pred["syncs_per_forward"]
                                     if pred["syncs_per_forward"] else np.nan)
        for m, v in pred.items():
            rows.append(dict(tokens=tokens, mode=mode, metric=m, predicted=v, production=PRODUCTION[m],
                             ratio=v / PRODUCTION[m] if PRODUCTION[m] else np.nan))
    return pd.DataFrame(rows)


def sync_us_to_match(params: CostModel = CostModel(), *, target_us_per_sync: float = PRODUCTION["stall_us_per_sync"],
                     preset: str = "qwen3-30b-a3b-tp4", tokens: int = 16384, layers: int = 48, tp: int = 4,
                     collective: bool = True, active: float = 0.5, **kw) -> float:
    """The host time between a sync and the next launch (`sync_us`) at which one sync costs
    `target_us_per_sync` of forward time (default: production's 100 ms / 260 syncs), by bisection.
    It answers "how much host work after each sync would explain production's stall?"."""
    args = dict(layers=layers, tp=tp, collective=collective, active=active, **kw)

    def per_sync(s: float) -> float:
        p = params.with_(sync_us=s)
        ts = forward_us(preset, tokens, "sync", params=p, **args)
        tc = forward_us(preset, tokens, "cpu_flag", params=p, **args)
        return (ts - tc) / (layers * kw.get("syncs_per_layer", 1))

    lo, hi = 0.0, 1.0
    if per_sync(lo) >= target_us_per_sync:
        return 0.0
    while per_sync(hi) < target_us_per_sync:
        hi *= 2.0
        if hi > 1e7:
            raise ValueError("no sync overhead below 10 s reaches the target")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if per_sync(mid) < target_us_per_sync else (lo, mid)
    return 0.5 * (lo + hi)


def what_if(params: CostModel = CostModel(), *, vary: str = "launch_us", values: Iterable[float] = (),
            preset: str = "qwen3-30b-a3b-tp4", layers: int = 48, tokens: int = 16384,
            guards: Iterable[str] = GUARDS, mode: str = "eager", **kw) -> pd.DataFrame:
    """Forward time per guard while one knob moves: a cost-model field (launch_us, sync_us,
    host_layer_us, ...) or "tokens" (per-layer work)."""
    rows = []
    for v in values:
        p, t = params, tokens
        if vary == "tokens":
            t = int(v)
        elif vary in {f.name for f in fields(CostModel)}:
            p = params.with_(**{vary: float(v)})
        else:
            raise ValueError(f"cannot vary {vary!r}: use 'tokens' or a CostModel field")
        for g in guards:
            r = simulate_forward(preset, t, g, layers=layers, mode=mode, params=p, **kw)
            rows.append(dict(vary=vary, value=float(v), guard=g, tokens=t, forward_ms=r.forward_us / 1e3,
                             syncs=r.syncs, device_idle_ms=r.device_idle_us / 1e3))
    return pd.DataFrame(rows)


def scale_model_report(sweep: pd.DataFrame | None = None, *, traces: Iterable | None = None,
                       init: CostModel = CostModel(), chunks: Iterable[int] = (8192, 16384),
                       target_pct: float = 15.0, **extrap_kw) -> dict:
    """Everything notebook 05 shows, from recorded data in one call: the fit, predictions beside
    measurements, the per-guard validation table, the production-shape extrapolation, its
    comparison with the production figures, and the sync overhead that would explain production's
    stall per sync."""
    f = fit(sweep, traces=traces, init=init)
    rows = sweep
    if traces is not None:
        tr = trace_rows(traces)
        rows = tr if rows is None else pd.concat([rows, tr], ignore_index=True)
    ex = extrapolate(f.params, chunks=chunks, **extrap_kw)
    return dict(fit=f, params=pd.Series(f.params.as_dict(), name="value"),
                predictions=predict(rows, f.params) if rows is not None else None,
                validation=validate(rows, f.params, target_pct=target_pct) if rows is not None else None,
                extrapolation=ex, comparison=compare_production(ex),
                sync_us_to_match=sync_us_to_match(f.params, tokens=max(chunks)))
