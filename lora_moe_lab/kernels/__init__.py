"""Triton kernels, one op per file, each `@triton.jit` kernel beside its launcher: alignment (align), base grouped GEMM
(fused_moe), fused MoE-LoRA delta (fused_moe_lora), the LoRA path packed into the base GEMM (fused_moe_lora_packed),
the decode-path LoRA delta without alignment (lora_decode), RMSNorm (rmsnorm), the base layer's router with its
softmax/top-k epilogue (router), SiLU-and-mul (activation) and top-k sum with the residual (moe_sum), empty kernels
(empty); shared input checks (common), launch-config tables (configs, tiles), the layer's kernel plan (plan: which
LoRA path, from tile_tables/lora_plan_*.json) and the LoRA paths, one module each (paths/: rule, weights, launches,
warm-up). Builds the plan takes nowhere live in studies/kernels/tried/."""
