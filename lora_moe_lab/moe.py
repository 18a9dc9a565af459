"""The MoE layer, a mini model of N such layers, and `build_lab`, the one-call set-up.

One MoE layer: router (softmax, top-k, renormalise) -> alignment -> base gate_up grouped GEMM ->
LoRA gate_up delta (hooks) -> SiLU-and-mul -> base down GEMM (x routed weight) -> LoRA down delta
(hooks, x routed weight) -> sum over top-k. The LoRA work only runs through hooks that the guard
hands out: an empty list when the guard decided no adapter is active.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import record_function

from . import runtime, torch_ops
from .config import LoRAConfig, MoEShape, check_dtype, get_shape
from .guards import Guard, get_guard
from .kernels.align import moe_align
from .norm import rmsnorm_torch, rmsnorm_triton
from .lora import AdapterPool, LayerLoRAWeights, LoRABatchInfo, LoRABatchTensors, LoRAInfo


def get_backend(name: str, device: torch.device):
    """'torch', 'triton', or 'auto' (Triton on a GPU; the torch backend on CPU, where Triton
    would run under the slow interpreter)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return torch_ops
    if name == "triton":
        from . import triton_ops
        return triton_ops
    raise ValueError(f"unknown backend {name!r}; choose 'torch', 'triton' or 'auto'")


class LoRAHook:
    """The LoRA work of one layer for one batch: per-adapter alignment, gate_up and down deltas."""

    def __init__(self, info: LoRAInfo, backend, num_experts: int):
        self.info, self.backend, self.E = info, backend, num_experts
        self.align = None

    def prepare(self, topk_ids: torch.Tensor) -> None:
        S = self.info.lora_ids.shape[0]
        bm = self.backend.lora_block_m(topk_ids.shape[0], topk_ids.shape[1], self.E, S)
        self.align = moe_align(topk_ids, self.E, bm, self.info.token_lora_mapping, S)

    def gate_up(self, x, inter, top_k):
        w = self.info.weights
        self.backend.lora_delta(x, w.gate_up_a, w.gate_up_b, self.align, self.info.lora_ids,
                                self.info.adapter_enabled, top_k, inter, gather=True)

    def down(self, act, out, top_k, topk_w):
        w = self.info.weights
        self.backend.lora_delta(act, w.down_a[None], w.down_b[None], self.align, self.info.lora_ids,
                                self.info.adapter_enabled, top_k, out, routed_weights=topk_w, gather=False)


class MoELayer(torch.nn.Module):
    def __init__(self, shape: MoEShape, dtype, device, gen: torch.Generator, eps: float = 1e-6):
        super().__init__()
        K, I, E = shape.hidden, shape.intermediate, shape.num_experts
        self.shape, self.top_k, self.eps = shape, shape.top_k, eps

        def randn(*size, std):
            return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).mul_(std).to(dtype)

        # The router runs in fp32 so every dtype picks the same experts; keeping its weight in fp32
        # saves an upcast launch per layer.
        self.router_w = randn(E, K, std=K ** -0.5).float()
        self.w13 = randn(E, 2 * I, K, std=K ** -0.5)  # gate rows first, then up
        self.w2 = randn(E, K, I, std=I ** -0.5)
        self.norm_w = (1 + randn(K, std=0.1).float()).to(dtype)

    def route(self, x):
        # Router in fp32 so that every dtype picks the same experts for the same input.
        probs = torch.softmax(x.float() @ self.router_w.T, dim=-1)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        return w / w.sum(-1, keepdim=True), ids.to(torch.int32)

    def forward(self, x, hooks: list[LoRAHook], backend, routing_log: list | None = None):
        M, K = x.shape
        k, E, I = self.top_k, self.shape.num_experts, self.shape.intermediate
        topk_w, topk_ids = self.route(x)
        if routing_log is not None:
            routing_log.append((topk_w, topk_ids))
        align = moe_align(topk_ids, E, backend.block_m(M, k, E))
        inter = backend.moe_gemm(x, self.w13, align, k, x.new_empty(M * k, 2 * I), gather=True)
        for h in hooks:
            h.prepare(topk_ids)
            h.gate_up(x, inter, k)
        act = torch_ops.silu_and_mul(inter)
        out = backend.moe_gemm(act, self.w2, align, k, x.new_empty(M * k, K), routed_weights=topk_w, gather=False)
        for h in hooks:
            h.down(act, out, k, topk_w)
        return out.view(M, k, K).sum(1)




class MiniMoEModel(torch.nn.Module):
    """N MoE layers with RMSNorm and a residual: enough to reproduce N guards per forward."""

    def __init__(self, shape: MoEShape, pool: AdapterPool, dtype, device, backend="auto", seed: int = 0):
        super().__init__()
        self.shape, self.pool, self.dtype, self.device = shape, pool, dtype, torch.device(device)
        self.backend_name = backend
        self.backend = get_backend(backend, self.device)
        self.rmsnorm = rmsnorm_triton if self.backend is not torch_ops else rmsnorm_torch
        self.layers = []
        for i in range(shape.num_layers):
            gen = torch.Generator(device=self.device).manual_seed(seed * 100003 + i)
            self.layers.append(MoELayer(shape, dtype, self.device, gen))
        self.routing_log: list | None = None

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
        with record_function("forward"):
            h = x
            for i, layer in enumerate(self.layers):
                with record_function(f"moe_layer_{i}"):
                    info = self.lora_info(i, batch, tensors)
                    with record_function(f"lora_guard_{g.name}"):
                        launch = g.should_launch(info)
                    hooks = [LoRAHook(info, self.backend, self.shape.num_experts)] if launch else []
                    h = h + layer(self.rmsnorm(h, layer.norm_w, layer.eps), hooks, self.backend, self.routing_log)
        return h


@dataclass
class Lab:
    shape: MoEShape
    model: MiniMoEModel
    pool: AdapterPool
    device: torch.device
    dtype: torch.dtype

    def make_batch(self, adapters: list, token_counts: list[int], out: LoRABatchTensors | None = None):
        batch = LoRABatchInfo.build(self.pool, adapters, token_counts)
        return batch, LoRABatchTensors.from_batch(batch, self.device, out=out)

    def random_input(self, num_tokens: int, seed: int = 0) -> torch.Tensor:
        if not isinstance(num_tokens, int) or num_tokens <= 0:
            raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randn(num_tokens, self.shape.hidden, generator=gen, device=self.device).to(self.dtype)


def build_lab(preset: str | MoEShape = "tiny", num_layers: int | None = None, max_loras: int = 4,
              max_rank: int = 16, dtype: str | torch.dtype = "float32", device: str = "auto",
              backend: str = "auto", seed: int = 0) -> Lab:
    """Model + adapter pool with seeded random weights (nothing is downloaded)."""
    dev = runtime.resolve_device(device)
    shape = get_shape(preset, **({} if num_layers is None else {"num_layers": num_layers}))
    be = "triton" if (backend == "auto" and dev.type == "cuda") else ("torch" if backend == "auto" else backend)
    dt = check_dtype(dtype, dev, be)
    pool = AdapterPool(shape, LoRAConfig(max_loras, max_rank), dtype=dt, device=dev)
    model = MiniMoEModel(shape, pool, dt, dev, backend=backend, seed=seed)
    return Lab(shape, model, pool, dev, dt)
