"""The cost model and the op sequence of a forward: the model's own step list (model/spec.py)
and the guard registry's description (model/guards.py) turned into host and device costs.

    ops = forward_ops("qwen3-30b-a3b", 128, "sync", layers=48, active=0.5, params=CostModel())
    simulate_forward(...)  -> SimResult     forward_us(...) -> float (fast path, for fitting)

The cost model is deliberately small (a fixed device time per kernel plus flops and bytes terms,
one host cost per launch, one sync overhead, one graph-launch cost) so that its parameters can be
fitted from a benchmark sweep (sim/fit.py) and pushed to shapes no single GPU runs
(sim/production.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from ..config import MoEShape, get_shape
from ..model.guards import get_guard
from ..model.spec import GUARD_CHECK_KERNEL, GUARD_CHECK_SYNC, MOE_LAYER_STEPS
from .engine import Op, SimResult, simulate

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


def _step_costs(M, Ma, K, I, E, k, r, db) -> dict:
    """(flops, bytes) of each step of model/spec.py:MOE_LAYER_STEPS for M tokens, Ma of them with
    an adapter (one adapter slot in use), rank r, db bytes per element."""
    et = _experts_touched(M * k, E)
    eta = _experts_touched(Ma * k, E)
    return {
        "rmsnorm": (0, 4 * M * K * db),
        "router_gemm": (2 * M * K * E, (M * K + K * E + M * E) * 4),
        "softmax_topk": (0, M * E * 8 + M * k * 16),
        "align": (0, M * k * 60 + E * 16),
        "gate_up_gemm": (2 * M * k * K * 2 * I, (et * 2 * I * K + M * K + M * k * 2 * I) * db),
        "lora_align": (0, M * k * 60 + E * 16),
        # fused shrink + expand: x @ A (r columns) then @ B into the (M, top_k, 2I) intermediate
        "lora_gate_up": (2 * Ma * k * 2 * (K * r + r * I),
                         (eta * 2 * (r * K + I * r) + Ma * K + 2 * Ma * k * 2 * I) * db),
        "silu_mul": (0, M * k * 3 * I * db),
        "down_gemm": (2 * M * k * I * K, (et * K * I + M * k * (I + K)) * db),
        "lora_down": (2 * Ma * k * (I * r + r * K), (eta * (r * I + K * r) + Ma * k * I + 2 * Ma * k * K) * db),
        "topk_sum": (0, (M * k * K + M * K) * db),
        "residual_add": (0, 3 * M * K * db),
    }


def layer_spec(shape: MoEShape, tokens: int, guard: str, *, active: float = 0.0, rank: int = 16,
               graph: bool = False, dtype_bytes: int = 2, tp: int = 1, collective: bool = False,
               syncs_per_layer: int = 1, launches: dict | None = None) -> list[tuple]:
    """The work of one MoE layer, in host program order, independent of the cost model:
    (name, kind, category, launches, flops, bytes) per op (bytes of the all-reduce buffer for a
    collective). The order is the model's own (model/spec.py: MOE_LAYER_STEPS); what the guard
    does comes from the registry (model/guards.py): a `device_check` guard issues a reduction and
    a sync at each of its `syncs_per_layer` sites, and `decide(any_active)` says whether the LoRA
    steps run. In graph mode every guard records the LoRA steps and nothing syncs.
    """
    g = get_guard(guard)  # ValueError names an unknown guard
    if not 0.0 <= active <= 1.0:
        raise ValueError(f"active must be in [0, 1], got {active!r}")
    if not isinstance(tokens, (int, np.integer)) or tokens <= 0:
        raise ValueError(f"tokens must be a positive int, got {tokens!r}")
    n = dict(DEFAULT_LAUNCHES, **(launches or {}))
    M, K, I, E, k, r, db = (int(tokens), shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, rank,
                            dtype_bytes)
    Ma = round(active * M)  # tokens whose request uses an adapter
    spec: list[tuple] = [("host_layer", "host", "host", 0, 0.0, 0.0)]

    def kern(name, flops=0.0, bytes_=0.0, cat="kernel"):
        spec.append((name, "kernel", cat, n.get(name, 1), float(flops), float(bytes_)))

    # The guard runs first in each layer (model/moe.py: MiniMoEModel.forward), before the norm.
    if graph:
        lora = True
    else:
        if g.device_check:
            for _ in range(syncs_per_layer):
                kern(GUARD_CHECK_KERNEL, 0, M * 16)
                spec.append((GUARD_CHECK_SYNC, "sync", "sync", 0, 0.0, 0.0))
        lora = g.decide(Ma > 0)
    costs = _step_costs(M, Ma, K, I, E, k, r, db)
    for step in MOE_LAYER_STEPS:
        if step.lora and not lora:
            continue
        if step.name == "residual_add" and collective:  # the all-reduce sums the ranks' MoE outputs first
            spec.append(("all_reduce", "collective", "collective", 1, 0.0, float(M * K * db)))
        kern(step.name, *costs[step.name], "lora" if step.lora else "kernel")
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


