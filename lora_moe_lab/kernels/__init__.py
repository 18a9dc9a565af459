"""Triton kernels, one op per file, each `@triton.jit` kernel beside its launcher: alignment
(align), base grouped GEMM (fused_moe), fused MoE-LoRA delta (fused_moe_lora), RMSNorm (rmsnorm),
the decode-path LoRA delta without alignment (lora_decode), an empty kernel (empty); shared input checks (common) and launch-config tables (configs)."""
