"""The LoRA paths: one module per path the plan can return, each the whole story of that path.

    none.py      no LoRA work: the base GEMMs alone (a batch without hooks, or an op the plan leaves bare)
    decode.py    the delta straight from topk_ids and each token's LoRA row, no alignment (kernels/lora_decode.py)
    separate.py  the base GEMM, then the delta as its own kernel over a per-adapter alignment
                 (kernels/fused_moe_lora.py); at decode sizes its rule hands over to decode
    packed.py    the packed shrink, then the base GEMM with the adapters' columns as extra K iterations
                 (kernels/fused_moe_lora_packed.py)
    wide.py      those columns in the GEMM's own x and w; where it cannot run, its rule hands over to packed

A path module subclasses `LoRAPath` and registers an instance (`register`). It owns:
- its rule: a table entry naming it (kernels/tile_tables/lora_plan_*.json) becomes the op's `LoRAPlan` (`rule`);
- its weights: the layout its kernels read, built from the adapter pool's stacks and rewritten in place by every
  load and unload (`weights`, through `LayerLoRAWeights.derived`: the pool never knows a kernel layout);
- its launches: at the layer's two hook points (`prepare`, `delta`), or inside the base GEMM (`gemm`, `in_gemm`);
- its warm-up (`warmup_jobs`: every build the plan can pick, compiled before any CUDA-graph capture);
- its exits: the codes its kernels exit with are the one table's (kernels/exits.py).

Every module in this package is imported with it, so adding a path is its module and its table entries. The
MoE layer (model/moe.py) sees the two hook points and, for an in-GEMM path, one `gemm(op)`."""
from __future__ import annotations

import importlib
import pkgutil

from .registry import PATHS, LoRAPath, Question, get, register  # noqa: F401

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "registry":
        importlib.import_module(f"{__name__}.{_m.name}")
