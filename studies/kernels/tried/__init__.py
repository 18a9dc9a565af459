"""Kernel builds the lab tried and the layer's plan takes nowhere (lora_moe_lab/kernels/plan.py and its
tile_tables/lora_plan_*.json): kept runnable, with their tests, for the recordings that measured them.

- fused_moe_lora_epilogue.py: the base GEMM with the LoRA delta added in its epilogue (`moe_gemm_lora`); it lost
  to the separate deltas where the base GEMM is compute-bound (the shrink recomputed per N tile).
- fused_moe_lora_folded.py: the rows build of the folded path (`moe_gemm_lora_folded`: a shrink kernel, then the
  base GEMM with one expand dot per LoRA row in its K loop); it lost to the separate deltas everywhere once the
  base GEMM took sub-blocks, and to the packed build (lora_moe_lab/kernels/fused_moe_lora_packed.py).

- fused_moe_switches.py: the base GEMM with every compile-time switch the studies tried (`moe_gemm_switches`): the
  folded build's expand (`Folded`: LORA, BLOCK_R, FOLD_DESC) and the packed expand's options no plan table sets
  (`unroll`, `prefetch`, `u_ptr`, `early`); packed_switches.py: the packed shrink with its cache hints (`x_keep`)
  and the packed GEMM with those expand options (`moe_gemm_lora_packed_switches`). Study-owned copies of the
  library's kernels from before those switches left them; with none set they compute what the library does.

The kernel code they share with the default path stays in the package: the input checks
(`fused_moe_lora_packed.check_lora_gemm_inputs`), the pairs' LoRA rows (`fused_moe_lora_packed.lora_rows`). The
recordings: studies/kernels/README.md."""
