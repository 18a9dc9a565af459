"""Triton kernels, one op per file, each `@triton.jit` kernel beside its launcher: alignment
(align), base grouped GEMM (fused_moe), fused MoE-LoRA delta (fused_moe_lora), the decode-path
LoRA delta without alignment (lora_decode), the base GEMM with the LoRA delta in its epilogue (an
experiment: fused_moe_lora_epilogue), RMSNorm (rmsnorm), empty kernels (empty); shared input
checks (common) and launch-config tables (configs)."""
