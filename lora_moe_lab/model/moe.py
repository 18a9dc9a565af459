"""The MoE layer and a mini model of N such layers (an `nn.Module`: weights are registered, so
`.to()` and `state_dict()` work). The one-call set-up `build_lab` lives in `model/lab.py`.

One MoE layer: router (softmax, top-k, renormalise) -> alignment -> base gate_up grouped GEMM ->
LoRA gate_up delta (hooks) -> SiLU-and-mul -> base down GEMM (x routed weight) -> LoRA down delta
(hooks, x routed weight) -> sum over top-k (+ the residual, given one). The base steps around the GEMMs are
backend ops: on the Triton backend the router is one kernel (a GEMM in the model dtype with fp32 accumulation,
softmax/top-k/renormalise in its epilogue), SiLU-and-mul one, and the top-k sum with the residual add one
(kernels/router.py, activation.py, moe_sum.py). The LoRA work only runs through hooks that the guard
hands out: an empty list when the guard decided no adapter is active. Which LoRA path each op takes
(its delta separate, or inside the base GEMM) is the kernel plan's (kernels/plan.py), asked once per
op per layer; the layer has two hook points, after gate_up and after down.

SKEWED ROUTING. A random router spreads tokens evenly over the experts; real serving traffic hits
a few hot experts. `skew` adds a fixed per-expert bias to the router logits,
bias_e = -skew * log(1 + rank_e), ranks a seeded permutation of the experts (a Zipf-like
popularity). skew = 0 adds nothing (bit-identical to the uniform router); SERVING_SKEW makes
about a fifth of the experts carry 90 % of the assignments (`expert_share`).
"""
from __future__ import annotations

import math
import numbers

import torch
from torch.profiler import record_function

from .. import runtime
from ..config import MoEShape
from ..kernels import paths
from ..kernels.plan import OPS, LoRADims, LoRAPlan, plan
from ..ops import Backend, get_backend
from . import init
from .guards import Guard, get_guard
from .lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo

# Measured with qwen3-30b-a3b's router (128 experts, top-8) on random inputs, mean of 3 layers:
# with skew 1.0, 18-22 % of the experts carry 90 % of the (token, expert) assignments at 16 to
# 1024 tokens (54-88 % without skew); the experts touched at all are 27 / 45 / 67 / 91 % at
# 16 / 64 / 256 / 1024 tokens (64 / 98 / 100 / 100 % without). On the GPU every expert that gets
# a token has its whole w13 and w2 read from HBM, so a memory-bound decode step reads fewer
# weight bytes with skew, and the LoRA blocks get fewer and fuller.
SERVING_SKEW = 1.0


def check_skew(skew) -> float:
    """skew as a float; ValueError naming it when it is not a finite number >= 0."""
    ok = isinstance(skew, numbers.Real) and not isinstance(skew, bool)
    if not ok or not math.isfinite(skew) or skew < 0:
        raise ValueError(f"skew must be a finite number >= 0 (0: uniform routing), got {skew!r}")
    return float(skew)


def skew_bias(num_experts: int, skew: float, seed: int) -> torch.Tensor:
    """(E,) fp32 router-logit bias -skew * log(1 + rank_e), ranks a permutation seeded by `seed`
    (drawn on the CPU: the same on every device and every tensor-parallel rank)."""
    rank = torch.randperm(num_experts, generator=torch.Generator().manual_seed(seed))
    return -check_skew(skew) * torch.log1p(rank.float())


def expert_share(topk_ids: torch.Tensor, num_experts: int, coverage: float | None = None) -> float:
    """Share of the experts that receive any token of a batch's routing (M, top_k); with `coverage`
    (e.g. 0.9) the smallest share of experts that together get that fraction of the assignments.
    Analysis only: it reads device values on the host (a sync), so keep it out of timed regions."""
    counts = torch.bincount(topk_ids.reshape(-1).long().cpu(), minlength=num_experts)
    if coverage is None:
        return float((counts > 0).sum()) / num_experts
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage!r}")
    top = counts.sort(descending=True).values.cumsum(0) / counts.sum()
    return (int((top < coverage - 1e-12).sum()) + 1) / num_experts


def _tail_columns(x, c):
    from ..kernels.fused_moe import tail_columns  # the kernels import Triton: only when used
    return tail_columns(x, c)


def base_gemm(backend: Backend, x, w, align, top_k, out, routed_weights=None):
    """The op's base GEMM: gate_up gathers x's rows (routed_weights None); down reads the pairs' rows in order and
    scales each by its routed weight."""
    if routed_weights is None:
        return backend.moe_gemm(x, w, align, top_k, out, gather=True)
    return backend.moe_gemm(x, w, align, top_k, out, routed_weights=routed_weights, gather=False)


class BareLayer:
    """The lead of a batch without LoRA hooks: the base GEMMs on the base alignment, no buffers of their own. It
    answers what `LoRAHook` answers the layer (`MoELayer.lead`)."""

    def __init__(self, backend: Backend, plan: tuple[LoRAPlan, LoRAPlan]):
        self.backend, self.plan = backend, plan

    block_m = property(lambda self: self.plan[0].block_m)

    def align_order(self):
        return None

    def input_buffer(self, op, rows, width, like):
        return None

    def gate_up_input(self, x):
        return x

    def gemm(self, op, x, w, align, top_k, out, routed_weights=None):
        return base_gemm(self.backend, x, w, align, top_k, out, routed_weights)


class LoRAHook:
    """The LoRA work of one layer for one batch, at the layer's two hook points (as SGLang's LoRAHooks):
    `after_gate_up` and `after_down`. Where each op's delta runs is the plan's (kernels/plan.py, asked once per op
    for the batch: `plans`), and how is the path's (kernels/paths/, one module per path): at the hook point
    ("decode", "separate"), or inside the base GEMM ("packed", "wide": `gemm` replaces the layer's base GEMM of that
    op, and the op's hook point has nothing left to do)."""

    def __init__(self, info: LoRAInfo, backend: Backend, num_experts: int):
        self.info, self.backend, self.E = info, backend, num_experts
        self.align = None  # the batch's state a path's `prepare` sets: its alignment, or the routing itself
        self.topk_ids = None
        self.plan: tuple[LoRAPlan, LoRAPlan] | None = None  # (gate_up, down) of this batch: `plans`
        self._plans: dict = {}

    @property
    def dims(self) -> LoRADims:
        """The static LoRA shapes the plan reads: weight slots, padded rank, this batch's LoRA rows."""
        w = self.info.weights
        return LoRADims(slots=w.down_a.shape[0], rank=w.down_a.shape[2], rows=self.info.lora_ids.shape[0])

    def plans(self, M: int, shape: MoEShape, device, *, first: bool = True,
              alone: bool = True) -> tuple[LoRAPlan, LoRAPlan]:
        """(gate_up, down): this hook's plan per op at M tokens, asked once per op and kept for the hook's batch.
        first: the layer's first hook (the only one whose delta may run inside the base GEMM); alone: the layer's
        only hook (the wide builds need it). Static shapes only: capture-safe."""
        key = (M, first, alone)
        if key not in self._plans:
            kw = dict(lora=self.dims, backend=self.backend.name, first=first, alone=alone)
            self._plans[key] = tuple(plan(op, M, shape, device, **kw) for op in OPS)
        self.plan = self._plans[key]
        return self.plan

    # --- what the layer asks its first hook (`MoELayer.lead`): the alignment, the buffers and each op's GEMM -----
    @property
    def block_m(self) -> int:
        return self.plan[0].block_m

    def align_order(self):
        """The rows' LoRA rows where an in-GEMM delta wants the base alignment ordered by them inside each expert
        (same blocks and padding: a tile then spans few LoRA rows), else None."""
        return self.info.token_lora_mapping if any(p.order_by_row for p in self.plan) else None

    def input_buffer(self, op: str, rows: int, width: int, like):
        """Where the layer writes op's input (rows, width): the first `width` columns of a wider buffer where the
        op's delta reads columns past them in the same rows (the wide build), else None (write it anywhere)."""
        C = self.plan[OPS.index(op)].columns
        return like.new_empty(rows, width + C)[:, :width] if C else None

    def gate_up_input(self, x):
        """x, or a copy into `input_buffer`'s wider rows where gate_up's wide build reads past K and x has no
        such columns (the layer's norm writes them there: no copy)."""
        C = self.plan[0].columns
        if not C or _tail_columns(x, C):
            return x
        xw = self.input_buffer("gate_up", x.shape[0], x.shape[1], x)
        xw.copy_(x)
        return xw

    def gemm(self, op: str, x, w, align, top_k, out, routed_weights=None):
        """Op's base GEMM, with this hook's delta inside where the plan puts it there (an in-GEMM path's `gemm`)."""
        p = self.plan[OPS.index(op)]
        if p.in_gemm:
            return paths.get(p.path).gemm(self, p, x, w, align, top_k, out, routed_weights)
        return base_gemm(self.backend, x, w, align, top_k, out, routed_weights)

    def prepare(self, topk_ids: torch.Tensor) -> None:
        """This batch's state for the deltas that run at the hook points (the first such op's path sets it: an
        alignment per adapter, or the routing itself on the decode path)."""
        if self.plan is None:
            raise RuntimeError("LoRAHook.prepare: ask the plan first (`plans`, or the layer's forward)")
        p = next(p for p in self.plan if not p.in_gemm)
        paths.get(p.path).prepare(self, p, topk_ids)

    def ranks(self):
        """The batch's rank per row where the host said to read them (`LoRAInfo.read_own_ranks`), else None."""
        return self.info.lora_ranks if self.info.read_own_ranks else None

    def after_gate_up(self, x, inter, topk_ids, top_k):
        """Hook point 1, after the gate_up GEMM: the gate_up delta into `inter` where it runs at the hook point (and
        the batch's state, where either op's does; a hook whose deltas both ran inside the GEMMs needs none)."""
        p13, p2 = self.plan
        if not (p13.in_gemm and p2.in_gemm):
            self.prepare(topk_ids)
        if not p13.in_gemm:
            paths.get(p13.path).after_gate_up(self, p13, x, inter, topk_ids, top_k)

    def after_down(self, act, out, top_k, topk_w):
        """Hook point 2, after the down GEMM: the down delta (x routed weight) into `out` where it runs at the hook
        point."""
        p2 = self.plan[1]
        if not p2.in_gemm:
            paths.get(p2.path).after_down(self, p2, act, out, top_k, topk_w)


class MoELayer(torch.nn.Module):
    """One MoE block with its pre-norm weight. Steps, in order (model/spec.py names them for the
    simulator): rmsnorm, router, align, gate_up GEMM, LoRA gate_up, SiLU-and-mul, down GEMM,
    LoRA down, top-k sum (with the residual add, where the caller passes the residual)."""

    def __init__(self, shape: MoEShape, dtype, device, gen: torch.Generator, eps: float = 1e-6, *,
                 tp_rank: int = 0, tp_size: int = 1, skew: float = 0.0, skew_seed: int = 0):
        super().__init__()
        # Under tensor parallelism `shape` is one rank's (intermediate = full / tp_size): the full
        # weights are drawn from `gen` exactly as for one process, then this rank keeps its slice.
        K, I, E = shape.hidden, shape.intermediate, shape.num_experts
        If, lo = I * tp_size, I * tp_rank  # full intermediate, this rank's first column
        self.shape, self.top_k, self.eps = shape, shape.top_k, eps

        def randn(*size, std):
            return init.randn(gen, device, *size, std=std)

        # The router weight lives in the model dtype, as an engine's does: the Triton router reads x and it as
        # they are (no fp32 copy of x) and accumulates in fp32 on the tensor cores; in bf16 every product is exact
        # in fp32, so only the accumulation order differs from the old fp32 router (kernels/router.py). The torch
        # backend upcasts both. Router and norm are replicated on every rank.
        self.router_w = init.frozen(randn(E, K, std=K ** -0.5).to(dtype))
        w13 = randn(E, 2 * If, K, std=K ** -0.5)  # gate rows first, then up
        if tp_size > 1:  # this rank's gate rows and the matching up rows
            w13 = torch.cat([w13[:, lo:lo + I], w13[:, If + lo:If + lo + I]], dim=1)
        self.w13 = init.frozen(w13.to(dtype))
        del w13  # free the full tensor before the next one is drawn
        self.w2 = init.frozen(randn(E, K, If, std=If ** -0.5)[:, :, lo:lo + I].to(dtype).contiguous())
        self.norm_w = init.frozen((1 + randn(K, std=0.1).to(dtype).float()).to(dtype))
        # The skew bias lives on the device from the start (a buffer: `.to()` moves it), so routing
        # never copies it at run time. Not in state_dict: it is derived from (skew, skew_seed).
        # Drawn from its own generator: the weights above are the same with or without skew.
        self.skew = check_skew(skew)
        bias = skew_bias(E, self.skew, skew_seed).to(device) if self.skew > 0 else None
        self.register_buffer("router_bias", bias, persistent=False)

    def route(self, x, backend: Backend | None = None):
        """(topk_w fp32 (M, top_k), topk_ids int32 (M, top_k)): the backend's router (None: the 'auto' one of x's
        device, as the model's default), logits accumulated in fp32, plus the skew bias where there is one."""
        backend = get_backend("auto", x.device) if backend is None else backend
        return backend.route(x, self.router_w, self.top_k, self.router_bias)

    def lead(self, M: int, hooks: list[LoRAHook], backend: Backend):
        """The layer's lead for M tokens: its first hook, or a `BareLayer` without hooks. Every hook asks its plan
        per op once for the batch (kernels/plan.py, `LoRAHook.plans`); only the first may run its delta inside the
        base GEMM, so the lead decides the alignment, the buffers and each op's GEMM. Static shapes decide:
        capture-safe."""
        device = self.w13.device
        for i, h in enumerate(hooks):
            h.plans(M, self.shape, device, first=i == 0, alone=len(hooks) == 1)
        if hooks:
            return hooks[0]
        return BareLayer(backend, tuple(plan(op, M, self.shape, device, backend=backend.name) for op in OPS))

    def norm(self, h, hooks: list[LoRAHook], backend: Backend):
        """The layer's pre-norm of h, written where the layer reads it (the lead's `input_buffer`: the first K
        columns of a wider buffer when gate_up takes the wide build), so the layer needs no copy of x."""
        lead = self.lead(h.shape[0], hooks, backend)
        return backend.rmsnorm(h, self.norm_w, self.eps, out=lead.input_buffer("gate_up", *h.shape, h))

    def forward(self, x, hooks: list[LoRAHook], backend: Backend, routing_log: list | None = None,
                before_down=None, residual=None):
        """The layer's output (M, K); with `residual` (M, K), residual + that output, added in the top-k sum's own
        pass (`backend.moe_sum`: one kernel instead of a sum and an add, rounded once). `before_down()`, when
        given, runs between SiLU-and-mul and the down GEMM (the decoder puts guard sites there). Where gate_up
        takes the wide build, x should be the first K columns of a wider buffer (`norm` writes it so); a plain x
        is copied into one. The LoRA work enters at the two hook points and, where the plan puts a delta inside
        a base GEMM, through the lead's `gemm(op)`."""
        M, K = x.shape
        k, E, I = self.top_k, self.shape.num_experts, self.shape.intermediate
        topk_w, topk_ids = self.route(x, backend)
        if routing_log is not None:
            routing_log.append((topk_w, topk_ids))
        lead = self.lead(M, hooks, backend)
        align = backend.align(topk_ids, E, lead.block_m, order_by=lead.align_order())
        x = lead.gate_up_input(x)
        inter = x.new_empty(M * k, 2 * I)
        lead.gemm("gate_up", x, self.w13, align, k, inter)
        for h in hooks:  # hook point 1
            h.after_gate_up(x, inter, topk_ids, k)
        act = backend.silu_and_mul(inter, out=lead.input_buffer("down", M * k, I, x))
        if before_down is not None:
            before_down()
        out = x.new_empty(M * k, K)
        lead.gemm("down", act, self.w2, align, k, out, topk_w)
        for h in hooks:  # hook point 2
            h.after_down(act, out, k, topk_w)
        return backend.moe_sum(out, k, residual)


def hold_weights(layers, pool: AdapterPool | None, backend: Backend) -> None:
    """Each MoE layer's w13 and w2 stored as the LoRA paths store them (a path's `hold`, kernels/paths/: the wide
    path moves them into the pool's wide builds on the Triton backend, so its weights exist once, not beside a copy;
    a 48-layer qwen3 model's weights are 54 GiB, and a copy with a rank-64 pool's columns did not fit in an H200). The
    base GEMM reads the view [..., :K] (rows K + C apart; kernels/fused_moe.py takes the stride). Called when a pool
    is attached (the models' `pool` setter): graphs captured before are stale."""
    if pool is None:
        return
    for layer, lw in zip(layers, pool.layers):
        for op, name in (("gate_up", "w13"), ("down", "w2")):
            w = getattr(layer, name)
            for path in paths.PATHS.values():
                w = path.hold(lw, op, w, backend.name)
            if w.data_ptr() != getattr(layer, name).data_ptr():
                setattr(layer, name, init.frozen(w))


class PoolHolder:
    """The models' `pool`: attaching one (at build, or swapping it later) holds the MoE layers' weights in its wide
    layouts (`hold_weights`). The subclass lists its MoE layers (`moe_layers`)."""

    @property
    def pool(self) -> AdapterPool | None:
        return self.__dict__.get("_pool")

    @pool.setter
    def pool(self, pool: AdapterPool | None) -> None:
        self.__dict__["_pool"] = pool
        if "layers" in self._modules:  # the constructor attaches its pool again once the layers exist
            hold_weights(self.moe_layers(), pool, self.backend)


class MiniMoEModel(PoolHolder, torch.nn.Module):
    """N MoE layers with RMSNorm and a residual: enough to reproduce N guards per forward."""

    def __init__(self, shape: MoEShape, pool: AdapterPool, dtype, device, backend="auto", seed: int = 0,
                 skew: float = 0.0):
        super().__init__()
        self.shape, self.pool = shape, pool  # the pool holds the adapters; it is not a module
        self.backend_name = backend
        device = torch.device(device)
        self.layers = torch.nn.ModuleList(
            MoELayer(shape, dtype, device, torch.Generator(device=device).manual_seed(seed * 100003 + i),
                     skew=skew, skew_seed=seed * 100003 + i)  # each layer its own hot experts
            for i in range(shape.num_layers))
        self.pool = pool
        self.routing_log: list | None = None

    def moe_layers(self) -> list[MoELayer]:
        return list(self.layers)

    # device, dtype and backend follow the weights (so `.to()` keeps them right)
    @property
    def device(self) -> torch.device:
        return self.layers[0].w13.device

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].w13.dtype

    @property
    def backend(self) -> Backend:
        return get_backend(self.backend_name, self.device)

    def lora_info(self, layer: int, batch: LoRABatchInfo, tensors: LoRABatchTensors) -> LoRAInfo:
        # Under capture the rank must cover any adapter a later replay may see: the pool's max.
        rank = self.pool.max_rank if runtime.in_capture_mode() else self.pool.max_loaded_rank()
        # host ints: some adapter this batch uses sits below the padding
        own = any(e and 0 < r < self.pool.max_rank for r, e in zip(batch.lora_ranks, batch.adapter_enabled))
        return LoRAInfo(self.pool.layers[layer], tensors, rank, has_active_lora=batch.has_active_lora,
                        debug_check=self.debug_check, read_own_ranks=own)

    debug_check = False

    def _check(self, x, batch, tensors):
        K = self.shape.hidden
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != K:
            raise ValueError(f"x must be (num_tokens, hidden={K}), got {getattr(x, 'shape', type(x))}")
        if x.dtype != self.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the model runs in {self.dtype}")
        if x.device.type != self.device.type:
            raise ValueError(f"x is on {x.device} but the model is on {self.device}")
        if batch.num_tokens != x.shape[0]:
            raise ValueError(f"the batch has {batch.num_tokens} tokens but x has {x.shape[0]} rows")
        if tensors.token_lora_mapping.shape[0] != x.shape[0]:
            raise ValueError("device batch tensors were built for another batch size")
        # the batch's pool and slot generations against this model's pool: host ints, no sync; skipped under
        # CUDA-graph capture (AdapterPool.check_batch says why)
        self.pool.check_batch(batch, tensors)

    def forward(self, x, batch: LoRABatchInfo, tensors: LoRABatchTensors, guard: str | Guard = "cpu_flag"):
        g = get_guard(guard)
        self._check(x, batch, tensors)
        backend = self.backend
        with record_function("forward"):
            h = x
            for i, layer in enumerate(self.layers):
                with record_function(f"moe_layer_{i}"):
                    info = self.lora_info(i, batch, tensors)
                    with record_function(f"lora_guard_{g.name}"):
                        launch = g.should_launch(info)
                    hooks = [LoRAHook(info, backend, self.shape.num_experts)] if launch else []
                    h = layer(layer.norm(h, hooks, backend), hooks, backend, self.routing_log, residual=h)
        return h
