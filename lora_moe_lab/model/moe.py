"""The MoE layer and a mini model of N such layers (an `nn.Module`: weights are registered, so
`.to()` and `state_dict()` work). The one-call set-up `build_lab` lives in `model/lab.py`.

One MoE layer: router (softmax, top-k, renormalise) -> alignment -> base gate_up grouped GEMM ->
LoRA gate_up delta (hooks) -> SiLU-and-mul -> base down GEMM (x routed weight) -> LoRA down delta
(hooks, x routed weight) -> sum over top-k. The LoRA work only runs through hooks that the guard
hands out: an empty list when the guard decided no adapter is active.

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


class LoRAHook:
    """The LoRA work of one layer for one batch: gate_up and down deltas, either over a per-adapter
    alignment or, at decode sizes (`backend.use_decode_path`, static shapes only), straight from
    topk_ids and the per-token row mapping with no alignment kernels at all."""

    def __init__(self, info: LoRAInfo, backend: Backend, num_experts: int):
        self.info, self.backend, self.E = info, backend, num_experts
        self.align = None
        self.topk_ids = None  # set instead of `align` on the decode path

    def fuses(self, op: str, M: int, top_k: int, N: int, K: int) -> bool:
        """Whether `op` runs inside the base GEMM, folded or in its epilogue (`backend.use_fused_lora`)."""
        return self.backend.use_fused_lora(op, M, top_k, self.E, N, K)

    def _folds(self, op, M, top_k, N, K) -> bool:
        return self.backend.use_folded_lora(op, M, top_k, self.E, N, K)

    def fold_order(self, M: int, top_k: int, hidden: int, inter: int):
        """The per-token LoRA row to order the layer's alignment by (`moe_align(order_by=)`), when this hook
        folds an op and the backend takes the per-row build; else None (static shapes decide: capture-safe)."""
        folds = self._folds("gate_up", M, top_k, 2 * inter, hidden) or self._folds("down", M, top_k, hidden, inter)
        return self.info.token_lora_mapping if folds and self.backend.folded_order_by_row(M) else None

    def _gemm(self, op, M, w, top_k):
        """The backend's base GEMM with the delta inside for `op`: folded into its K loop or in its epilogue."""
        b = self.backend
        if not self._folds(op, M, top_k, w.shape[1], w.shape[2]):
            return b.moe_gemm_lora
        per_row = b.folded_order_by_row(M)  # the layer then ordered its alignment by LoRA row (fold_order)
        if b.fold_build() == "packed":  # one expand dot per slot of a block where the alignment is ordered
            bp = self.info.weights.packed_b(op)
            return lambda *a, **kw: b.moe_gemm_lora_packed(*a, b_packed=bp, per_slot=per_row,
                                                           shrink=b.packed_shrink(M),
                                                           expand=b.packed_expand(M, op, w.shape[1], w.shape[2]),
                                                           **kw)
        return lambda *a, **kw: b.moe_gemm_lora_folded(*a, shrink_per_row=per_row, **kw)

    def gemm_gate_up(self, x, w13, align, top_k, out, wide: bool = False):
        """The base gate_up GEMM with this hook's delta inside (no alignment of its own); wide: x is the first K
        columns of a wider buffer (`gate_up_columns`), and the GEMM takes the wide build per block."""
        i, w = self.info, self.info.weights
        if wide:
            ww = w.wide_w("gate_up", w13)
            return self.backend.moe_gemm_lora_wide(x, ww[..., :w13.shape[2]], align, top_k, out, w.gate_up_a,
                                                   i.token_lora_mapping, i.lora_ids, i.adapter_enabled, gather=True,
                                                   shrink=self.backend.wide_gate_up_shrink(x.shape[0]),
                                                   per_block=True)
        return self._gemm("gate_up", x.shape[0], w13, top_k)(x, w13, align, top_k, out, w.gate_up_a, w.gate_up_b,
                                                      i.token_lora_mapping, i.lora_ids, i.adapter_enabled, gather=True)

    def gate_up_columns(self, M: int, top_k: int, hidden: int, inter: int) -> int:
        """The columns past K the layer's input x carries when this hook's gate_up GEMM takes the wide build
        (`backend.use_wide_gate_up`, where gate_up folds): top_k tails of C; 0 otherwise."""
        bm = self.backend.block_m(M, top_k, self.E, hidden, inter)
        if not (self._folds("gate_up", M, top_k, 2 * inter, hidden)
                and self.backend.use_wide_gate_up(M, bm, 2 * inter, hidden, self.E)):
            return 0
        from ..kernels.fused_moe_lora_packed import x_wide_columns  # the kernels import Triton: only when used
        return x_wide_columns(self.info.weights.gate_up_a, top_k, True)

    def wide_columns(self, M: int, top_k: int, hidden: int, inter: int) -> int:
        """The adapters' columns C past K the layer's down input carries when this hook's down GEMM takes the wide
        build (`backend.use_wide_down`, where down folds; static shapes decide: capture-safe); 0 otherwise."""
        if not (self._folds("down", M, top_k, hidden, inter) and self.backend.use_wide_down(M)):
            return 0
        from ..kernels.fused_moe_lora_packed import wide_columns  # the kernels import Triton: only when used
        return wide_columns(self.info.weights.down_a[None])

    def gemm_down(self, act, w2, align, top_k, out, topk_w, wide: bool = False):
        """The base down GEMM with this hook's delta inside; wide: act is the first I columns of the layer's wider
        buffer (`wide_columns`), and the GEMM takes the wide build."""
        i, w = self.info, self.info.weights
        M = act.shape[0] // top_k
        if wide:
            ww = w.wide_w("down", w2)
            E, N, K = w2.shape
            C = ww.shape[2] - K
            win = self.backend.wide_down_window(M, align.block_m, N, K, E, C, w.down_a.shape[0])
            return self.backend.moe_gemm_lora_wide(act, ww[..., :K], align, top_k, out, w.down_a[None],
                                                   i.token_lora_mapping, i.lora_ids, i.adapter_enabled,
                                                   routed_weights=topk_w, shrink=self.backend.packed_shrink(M),
                                                   window=win)
        gemm = self._gemm("down", M, w2, top_k)
        return gemm(act, w2, align, top_k, out, w.down_a[None], w.down_b[None], i.token_lora_mapping, i.lora_ids,
                    i.adapter_enabled, routed_weights=topk_w, gather=False)

    def prepare(self, topk_ids: torch.Tensor) -> None:
        M, k = topk_ids.shape
        if self.backend.use_decode_path(M, k):
            self.align, self.topk_ids = None, topk_ids
            return
        S = self.info.lora_ids.shape[0]
        bm = self.backend.lora_block_m(M, k, self.E, S)
        self.align = self.backend.align(topk_ids, self.E, bm, self.info.token_lora_mapping, S)
        self.topk_ids = None

    def _delta(self, x, a, b, out, top_k, **kw):
        i = self.info
        if self.topk_ids is not None:
            self.backend.lora_delta_decode(x, a, b, self.topk_ids, i.token_lora_mapping, i.lora_ids,
                                           i.adapter_enabled, out, **kw)
        else:
            if kw.get("routed_weights") is not None:  # the down delta: its own tile table, if the backend has one
                M, E, L = out.shape[0] // top_k, self.E, i.lora_ids.shape[0]
                cfg = self.backend.lora_down_config(M, top_k, E, L, self.align.block_m, out.shape[1], x.shape[1])
                kw = dict(kw, config=cfg) if cfg is not None else kw
            self.backend.lora_delta(x, a, b, self.align, i.lora_ids, i.adapter_enabled, top_k, out, **kw)

    def gate_up(self, x, inter, top_k):
        w = self.info.weights
        self._delta(x, w.gate_up_a, w.gate_up_b, inter, top_k, gather=True)

    def down(self, act, out, top_k, topk_w):
        w = self.info.weights
        self._delta(act, w.down_a[None], w.down_b[None], out, top_k, routed_weights=topk_w, gather=False)


class MoELayer(torch.nn.Module):
    """One MoE block with its pre-norm weight. Steps, in order (model/spec.py names them for the
    simulator): rmsnorm, router, align, gate_up GEMM, LoRA gate_up, SiLU-and-mul, down GEMM,
    LoRA down, top-k sum."""

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

        # The router runs in fp32 so every dtype picks the same experts; keeping its weight in fp32
        # saves an upcast launch per layer. Router and norm are replicated on every rank.
        self.router_w = init.frozen(randn(E, K, std=K ** -0.5).to(dtype).float())
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

    def route(self, x):
        # Router in fp32 so that every dtype picks the same experts for the same input.
        logits = x.float() @ self.router_w.T
        if self.router_bias is not None:  # skew 0 adds nothing: the uniform router, bit for bit
            logits = logits + self.router_bias
        probs = torch.softmax(logits, dim=-1)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        return w / w.sum(-1, keepdim=True), ids.to(torch.int32)

    def input_columns(self, M: int, hooks: list[LoRAHook]) -> int:
        """The columns past K this layer's gate_up reads in its input's rows for this batch (the wide build's u:
        `LoRAHook.gate_up_columns`); 0 when it reads none. Static shapes decide: capture-safe."""
        if len(hooks) != 1:
            return 0
        return hooks[0].gate_up_columns(M, self.top_k, self.shape.hidden, self.shape.intermediate)

    def norm(self, h, hooks: list[LoRAHook], backend: Backend):
        """The layer's pre-norm of h, written where the layer reads it: the first K columns of a wider buffer when
        gate_up takes the wide build (`input_columns`), so the layer needs no copy of x."""
        C = self.input_columns(h.shape[0], hooks)
        out = h.new_empty(h.shape[0], h.shape[1] + C)[:, :h.shape[1]] if C else None
        return backend.rmsnorm(h, self.norm_w, self.eps, out=out)

    def forward(self, x, hooks: list[LoRAHook], backend: Backend, routing_log: list | None = None,
                before_down=None):
        """`before_down()`, when given, runs between SiLU-and-mul and the down GEMM (the decoder
        puts guard sites there). Where gate_up takes the wide build, x should be the first K columns of a wider
        buffer (`norm` writes it so); a plain x is copied into one."""
        M, K = x.shape
        k, E, I = self.top_k, self.shape.num_experts, self.shape.intermediate
        topk_w, topk_ids = self.route(x)
        if routing_log is not None:
            routing_log.append((topk_w, topk_ids))
        # Where the first hook folds an op into the base GEMM, the alignment is ordered by LoRA row inside
        # each expert (same blocks and padding): a tile then spans few LoRA rows.
        order = hooks[0].fold_order(M, k, K, I) if hooks else None
        align = backend.align(topk_ids, E, backend.block_m(M, k, E, K, I), order_by=order)
        # The first hook's delta may run inside the base GEMM's epilogue (static shapes decide per op);
        # the others, and any op not fused, run as separate kernels after the GEMM.
        f13 = bool(hooks) and hooks[0].fuses("gate_up", M, k, 2 * I, K)
        f2 = bool(hooks) and hooks[0].fuses("down", M, k, K, I)
        inter = x.new_empty(M * k, 2 * I)
        CX = self.input_columns(M, hooks) if f13 else 0
        if CX and not _tail_columns(x, CX):  # gate_up's wide build reads each pair's u past K in x's rows
            xw = x.new_empty(M, K + CX)
            xw[:, :K] = x
            x = xw[:, :K]
        if f13:
            hooks[0].gemm_gate_up(x, self.w13, align, k, inter, wide=CX > 0)
        else:
            backend.moe_gemm(x, self.w13, align, k, inter, gather=True)
        for i, h in enumerate(hooks):
            if i or not (f13 and f2):  # a fully fused hook needs no LoRA alignment
                h.prepare(topk_ids)
            if i or not f13:
                h.gate_up(x, inter, k)
        # The down GEMM's wide build reads its adapters' columns from past I in the same rows: act is then the first
        # I columns of a wider buffer, written in place (no copy)
        C = hooks[0].wide_columns(M, k, K, I) if f2 and len(hooks) == 1 else 0
        act = backend.silu_and_mul(inter, out=x.new_empty(M * k, I + C)[:, :I] if C else None)
        if before_down is not None:
            before_down()
        out = x.new_empty(M * k, K)
        if f2:
            hooks[0].gemm_down(act, self.w2, align, k, out, topk_w, wide=C > 0)
        else:
            backend.moe_gemm(act, self.w2, align, k, out, routed_weights=topk_w, gather=False)
        for i, h in enumerate(hooks):
            if i or not f2:
                h.down(act, out, k, topk_w)
        return out.view(M, k, K).sum(1)


class MiniMoEModel(torch.nn.Module):
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
        self.routing_log: list | None = None

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
        return LoRAInfo(self.pool.layers[layer], tensors, rank, has_active_lora=batch.has_active_lora,
                        debug_check=self.debug_check)

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
                    h = h + layer(layer.norm(h, hooks, backend), hooks, backend, self.routing_log)
        return h
