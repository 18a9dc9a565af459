"""Kernel builds the lab tried and the layer's plan takes nowhere (lora_moe_lab/kernels/plan.py and its
tile_tables/lora_plan_*.json): kept runnable, with their tests, for the recordings that measured them.

- fused_moe_lora_epilogue.py: the base GEMM with the LoRA delta added in its epilogue (`moe_gemm_lora`); it lost
  to the separate deltas where the base GEMM is compute-bound (the shrink recomputed per N tile).
- fused_moe_lora_folded.py: the rows build of the folded path (`moe_gemm_lora_folded`: a shrink kernel, then the
  base GEMM with one expand dot per LoRA row in its K loop); it lost to the separate deltas everywhere once the
  base GEMM took sub-blocks, and to the packed build (lora_moe_lab/kernels/fused_moe_lora_packed.py).

The kernel code they share with the default path stays in the package: the base GEMM's folded expand
(`fused_moe.Folded`), the input checks (`fused_moe_lora_packed.check_lora_gemm_inputs`). The recordings:
studies/kernels/README.md."""
