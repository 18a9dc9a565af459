"""A decoder shaped like Qwen3-30B-A3B: N layers of (pre-norm attention + residual, pre-norm MoE
with LoRA on the experts + residual), with random seeded weights; optionally tensor-parallel.

    lab = build_decoder_lab("tiny", guard_sites=260 / 48)
    lab.pool.load("a", rank=8)
    batch, tensors = lab.make_batch(["a", None], [3, 5])
    y = lab.model(lab.random_input(8), batch, tensors, guard="sync")   # (8, hidden)

GUARD SITES. In production every LoRA-wrapped call site asked the device "is any adapter
active?" on its own: 260 `.item()` host-device syncs per forward over 48 layers (~5.42 a
layer). `guard_sites` (>= 1, default 1) sets how many guard decisions each layer makes; layer i
gets floor((i+1)*s) - floor(i*s) of them, so the forward makes floor(N*s) in total. A layer's
sites are dealt in turn to its four LoRA call points, in the order the host reaches them:

    qkv_proj     after the input norm, before the qkv GEMM (the first site: it decides the layer)
    o_proj       after attention, before the o_proj GEMM
    moe_gate_up  after the post-attention norm, before the router and the gate_up GEMM
    moe_down     after SiLU-and-mul, before the down GEMM (and its LoRA delta)

so 5 sites are two before qkv and one at each other point; 6 add a second before o_proj
(model/spec.py: GUARD_SITE_POINTS names the step each point precedes, for the simulator).
Each site is one `get_guard(g).should_launch(info)`: for `sync` a device reduction plus
`.item()`, a host-device sync point (the host stops issuing work until the GPU has drained its
queue); for `cpu_flag` a Python bool; for `launch_always` nothing. Every site of a layer
gets the same answer (they all ask about the same batch). Only the MoE experts carry LoRA here,
so the attention sites only reproduce where production synced; the answer gates the MoE hooks.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from fractions import Fraction

import torch
from torch.profiler import record_function

from .. import runtime
from ..config import LoRAConfig, check_dtype, check_int, get_shape
from ..ops import Backend, get_backend
from .attention import Attention, positions, rope_cos_sin
from .guards import Guard, get_guard
from .lab import Lab, check_finite_flag, finite_check, size_build
from .lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo
from . import init
from .moe import LoRAHook, MiniMoEModel, MoELayer, PoolHolder, check_skew
from .sizing import FIT_TOKENS
from .spec import GUARD_SITE_POINTS
from .tp import TPGroup, single, tp_shape

SITE_POINTS = tuple(GUARD_SITE_POINTS)


def sites_per_layer(guard_sites: float, num_layers: int) -> list[int]:
    """Integer guard sites per layer whose running total tracks guard_sites * layers."""
    ok = isinstance(guard_sites, numbers.Real) and not isinstance(guard_sites, bool)  # True would pass as 1
    if not ok or not math.isfinite(guard_sites):
        raise ValueError(f"guard_sites must be a finite number >= 1 (guard decisions per layer), got {guard_sites!r}")
    s = Fraction(guard_sites).limit_denominator(10_000)  # 260/48 -> 65/12 exactly: no float floor error
    if s < 1:
        raise ValueError(f"guard_sites must be >= 1 (every layer decides its MoE LoRA launch), got {guard_sites!r}")
    return [int((i + 1) * s) - int(i * s) for i in range(num_layers)]


class GuardSites:
    """The guard decisions of one layer for one batch, asked at the call points in order."""

    def __init__(self, guard: Guard, info: LoRAInfo, n: int, host_us_per_point: float = 0.0):
        self.guard, self.info, self.host_us = guard, info, host_us_per_point
        # site j sits at SITE_POINTS[j % 4]
        self.count = {p: len(range(j, n, len(SITE_POINTS))) for j, p in enumerate(SITE_POINTS)}
        self.answers: list[bool] = []

    def ask(self, point: str) -> bool | None:
        runtime.host_spin(self.host_us)  # an engine's own host work at this call point (default 0)
        first = len(self.answers)
        for _ in range(self.count[point]):
            with record_function(f"lora_guard_{self.guard.name}"):
                self.answers.append(self.guard.should_launch(self.info))  # `sync`: a host-device sync
        return self.answers[first] if len(self.answers) > first else None

    def check(self, layer: int) -> None:
        if len(set(self.answers)) > 1:  # host bools: free
            raise RuntimeError(f"layer {layer}: guard sites disagree ({self.answers})")


class DecoderLayer(torch.nn.Module):
    def __init__(self, shape, dtype, device, gen, tp: TPGroup, eps: float = 1e-6, skew: float = 0.0,
                 skew_seed: int = 0):
        super().__init__()
        kw = dict(tp_rank=tp.rank, tp_size=tp.size)
        self.eps = eps
        self.attn = Attention(shape, dtype, device, gen, eps, **kw)  # draws its weights first
        self.norm_w = init.frozen((1 + torch.randn(shape.hidden, generator=gen, device=device).mul_(0.1)).to(dtype))
        # its norm_w is the post-attention norm
        self.moe = MoELayer(shape, dtype, device, gen, eps, **kw, skew=skew, skew_seed=skew_seed)

    def forward(self, h, token_counts, rope, sites: GuardSites, backend: Backend, tp: TPGroup,
                routing_log=None):
        xn = backend.rmsnorm(h, self.norm_w, self.eps)
        launch = sites.ask("qkv_proj")  # the first site: decides this layer's MoE LoRA work
        hooks = [LoRAHook(sites.info, backend, self.moe.shape.num_experts)] if launch else []
        a = self.attn(xn, token_counts, rope, backend, before_o_proj=lambda: sites.ask("o_proj"))
        h = h + tp.all_reduce(a)  # sums the ranks' partial o_proj outputs
        xn = self.moe.norm(h, hooks, backend)  # where gate_up takes the wide build: into a wider buffer
        sites.ask("moe_gate_up")
        # One process: the residual add runs in the top-k sum's pass (one kernel on the Triton backend). Under TP the
        # ranks' partial expert outputs are summed first and the residual waits for the all-reduce (added on one rank
        # before it, the residual stream would be rounded at every step of a bf16 all-reduce).
        res = h if tp.size == 1 else None
        m = self.moe(xn, hooks, backend, routing_log, before_down=lambda: sites.ask("moe_down"), residual=res)
        return m if res is not None else h + tp.all_reduce(m)


class DecoderModel(PoolHolder, torch.nn.Module):
    """N decoder layers; called exactly like MiniMoEModel: model(x, batch, tensors, guard)."""

    def __init__(self, shape, pool: AdapterPool, dtype, device, backend="auto", seed: int = 0,
                 guard_sites: float = 1.0, tp: TPGroup | None = None, skew: float = 0.0):
        super().__init__()
        device = torch.device(device)
        self.shape, self.pool, self.backend_name = shape, pool, backend
        self.tp = tp or single(device)
        self.site_counts = sites_per_layer(guard_sites, shape.num_layers)
        # one generator per layer, seeded as MiniMoEModel does: every rank draws the same full
        # weights layer by layer and keeps its slice (a rank never holds the whole model)
        self.layers = torch.nn.ModuleList(
            DecoderLayer(shape, dtype, device, torch.Generator(device=device).manual_seed(seed * 100003 + i), self.tp,
                         skew=skew, skew_seed=seed * 100003 + i)
            for i in range(shape.num_layers))
        self.pool = pool  # again, now that the layers exist: their weights held wide (moe.py: PoolHolder)
        self.routing_log: list | None = None
        # An engine's host work per layer (Python, scheduling, metadata), spread over the layer's
        # four call points; 0 = this lab's lean host. instruments/recorders/prefill.py: EngineCosts sets it.
        self.host_us_per_layer = 0.0

    def moe_layers(self) -> list:
        return [layer.moe for layer in self.layers]

    @property
    def device(self) -> torch.device:
        return self.layers[0].moe.w13.device

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].moe.w13.dtype

    @property
    def backend(self) -> Backend:
        return get_backend(self.backend_name, self.device)

    # the same LoRAInfo and input checks as the MoE-only model
    debug_check = False
    lora_info = MiniMoEModel.lora_info
    _check = MiniMoEModel._check

    def forward(self, x, batch: LoRABatchInfo, tensors: LoRABatchTensors, guard: str | Guard = "cpu_flag", *,
                check_finite: bool = False):
        """The decoder's output (M, hidden). check_finite=True: each layer's output is checked for NaN/inf as it
        is made (one sync a layer; model/lab.py: finite_check), the first a NonFiniteOutputError; off, no sync."""
        if check_finite_flag(check_finite):
            with finite_check(self, x):
                return self.forward(x, batch, tensors, guard)
        g = get_guard(guard)
        self._check(x, batch, tensors)
        backend = self.backend
        with record_function("forward"):
            rope = rope_cos_sin(positions(tensors.seg_indptr, x.shape[0]), self.shape.head_dim, self.shape.rope_theta)
            h = x
            for i, layer in enumerate(self.layers):
                with record_function(f"decoder_layer_{i}"):
                    sites = GuardSites(g, self.lora_info(i, batch, tensors), self.site_counts[i],
                                       self.host_us_per_layer / len(SITE_POINTS))
                    h = layer(h, batch.token_counts, rope, sites, backend, self.tp, self.routing_log)
                    sites.check(i)
        return h


def build_decoder_lab(preset="tiny", num_layers: int | None = None, max_loras: int = 4, max_rank: int = 16,
                      dtype="auto", device: str = "auto", backend: str = "auto", seed: int = 0,
                      guard_sites: float = 1.0, tp: TPGroup | None = None, skew: float = 0.0,
                      fit_tokens: int = FIT_TOKENS) -> Lab:
    """Decoder + adapter pool with seeded random weights. With `tp` (model/tp.py: init_tp) this
    rank's slice of the same weights; `lab.shape` is then the rank's shape. `skew`, `num_layers` and
    `fit_tokens` (the build sized to the card): as build_lab. Under TP every rank takes the fewest layers any
    rank's card holds, so the group runs one model."""
    skew = check_skew(skew)
    check_int("seed", seed)
    shape = tp_shape(get_shape(preset), 1 if tp is None else tp.size)  # named error when heads or I do not split
    dev = tp.device if tp is not None and device == "auto" else runtime.resolve_device(device)
    dt = check_dtype(runtime.resolve_dtype(dtype, dev), dev, runtime.resolve_backend(backend, dev))
    lora = LoRAConfig(max_loras, max_rank)
    plan = size_build(shape, num_layers, lora, dt, dev, backend, decoder=True, tokens=fit_tokens)
    if tp is not None and tp.size > 1:  # one layer count for the whole group
        n = tp.all_reduce_min(plan.num_layers)
        plan = dataclasses.replace(plan, num_layers=n)
    shape = shape.with_(num_layers=plan.num_layers)
    sites_per_layer(guard_sites, shape.num_layers)  # reject a bad guard_sites before any allocation
    rank, size = (0, 1) if tp is None else (tp.rank, tp.size)
    pool = AdapterPool(shape, lora, dtype=dt, device=dev, tp_rank=rank, tp_size=size)
    model = DecoderModel(shape, pool, dt, dev, backend=backend, seed=seed, guard_sites=guard_sites, tp=tp,
                         skew=skew)
    return Lab(shape, model, pool, dev, dt, plan)
