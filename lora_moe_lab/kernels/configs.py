"""Launch-config tables of the Triton kernels: tile sizes keyed on static shapes only (M rounded
up to a power of two, N, K, experts, slots), so the choice never reads device data and a warm-up
over the powers of two compiles every binary a CUDA-graph capture could need.

Under the interpreter (no GPU) one small config is used everywhere: the interpreter runs each
program sequentially on numpy, so big tiles only cost CPU time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import runtime
from . import tiles
from .common import cdiv, pow2


@dataclass(frozen=True)
class GemmConfig:
    """Base grouped GEMM tile: BLOCK_M comes from the alignment (see `moe_block_m`)."""

    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    w_desc: bool = False  # weight tiles through a TMA descriptor (kernels/fused_moe.py), where w allows it
    even: bool = True  # predicate-free loads where K, N are tile multiples; False only to measure the masked loads
    max_regs: int = 0  # register cap per thread (maxnreg, common.reg_cap); 0 = the compiler's choice. In a tile
    # table only beside a persistent grid (record_kernels_base persist); record_kernels_fold caps the folded GEMM
    persistent: int = 0  # programs per SM of a persistent grid looping over the tiles; 0 = one program per tile
    flatten: bool = False  # persistent only: Triton pipelines the tile loop and the K loop as one loop
    early_loads: bool = False  # the epilogue's gathers (routed weights, LoRA rows) issued before the K loop
    # plain GEMM only: the rows of the kernel's tile when fewer than the alignment's BLOCK_M (a divisor of it, so the
    # alignment's blocks split into sub-blocks of one expert each: no second alignment); 0 = the alignment's BLOCK_M
    sub_m: int = 0

    def __post_init__(self):
        if self.persistent < 0:
            raise ValueError(f"GemmConfig.persistent is programs per SM (>= 0, 0 = a program per tile), "
                             f"got {self.persistent}")
        if self.flatten and not self.persistent:
            raise ValueError("GemmConfig.flatten flattens the persistent grid's tile loop: set persistent >= 1 too")
        if self.sub_m and (self.sub_m < 16 or self.sub_m & (self.sub_m - 1)):
            raise ValueError(f"GemmConfig.sub_m is the kernel's BLOCK_M, a power of two >= 16 (0 = the alignment's), "
                             f"got {self.sub_m}")


@dataclass(frozen=True)
class LoRAKernelConfig:
    """Fused LoRA tile: BLOCK_M comes from the alignment (see `lora_block_m`); split_n programs share
    the N columns of one block (more work items at small M)."""

    block_n: int
    block_k: int
    split_n: int = 1
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4  # persistent grid: programs = min(work items bound, SMs * this)
    # expand loop pipelined by hand (kernels/fused_moe_lora.py): 1 = tile j+1's loads are issued before
    # tile j's store; 2 = also the first tile's loads before the shrink. 0 = off.
    prefetch: int = 0
    max_regs: int = 0  # register cap per thread passed to ptxas (maxnreg); 0 = the compiler's choice
    # prefetch 0 only: Triton's loop pipeliner on the expand loop with this many stages (the `out` tiles
    # stream into shared memory ahead of their add); 0 = off
    expand_stages: int = 0

    def __post_init__(self):
        if self.expand_stages and self.prefetch:
            raise ValueError(f"LoRAKernelConfig: expand_stages={self.expand_stages} pipelines the expand loop by "
                             f"Triton, prefetch={self.prefetch} by hand; set one of them to 0")


@dataclass(frozen=True)
class DecodeConfig:
    """Decode-path LoRA tile (kernels/lora_decode.py): one program per (pair, slice, N share);
    split_n is a run-time argument of the kernel, so changing it compiles nothing new."""

    block_n: int
    block_k: int
    split_n: int = 1
    num_warps: int = 8
    num_stages: int = 1


_INTERP_GEMM = GemmConfig(block_n=32, block_k=32, group_m=4, num_warps=4, num_stages=1)
_INTERP_LORA = LoRAKernelConfig(block_n=32, block_k=32, split_n=1, num_warps=4, num_stages=1)
_INTERP_DECODE = DecodeConfig(block_n=16, block_k=32, split_n=2, num_warps=4, num_stages=1)


def token_bucket(num_tokens: int) -> int:
    """Configs are keyed on M rounded up to a power of two (capped at 16384), so that `warmup` over
    the powers of two covers every M."""
    b = 1
    while b < num_tokens and b < 16384:
        b *= 2
    return b


# BLOCK_M by the mean number of (token, k) pairs a group will hold: (upper bound, BLOCK_M) steps.
# Blocks about as tall as the groups waste few padded rows; taller ones reuse each weight tile more.
_MOE_BM_STEPS = ((16, 16), (48, 32), (192, 64), (float("inf"), 128))
# LoRA: BLOCK_M 32 (25-48 pairs per group) dropped after data/archive/kernels/expand_run6_* (git history): at 32 pairs
# per group (M=2048, 4 adapters, 128 experts, top-8) both deltas together took 184.4 us with BLOCK_M 32
# and 171.9 with 64 (tp4 138.4 -> 130.7); at 16 pairs BLOCK_M 16 stays (32 was -2.5 % / +2 %).
_LORA_BM_STEPS = ((24, 16), (float("inf"), 64))


def _step_pick(avg: float, steps) -> int:
    return next(bm for limit, bm in steps if avg <= limit)


def rule_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """BLOCK_M by rule (any GPU, any shape): about the mean number of pairs per expert."""
    return _step_pick(token_bucket(num_tokens) * top_k / num_experts, _MOE_BM_STEPS)


def moe_block_m(num_tokens: int, top_k: int, num_experts: int, hidden: int | None = None,
                intermediate: int | None = None) -> int:
    """BLOCK_M for the base GEMM's alignment (shared by gate_up and down): the tuned tile table's
    (kernels/tiles.py) where one exists for this GPU and layer shape (hidden, intermediate given),
    else `rule_block_m`."""
    if runtime.interpreter():
        return 16
    entry = tiles.lookup(num_experts, hidden, intermediate, token_bucket(num_tokens))
    return entry["block_m"] if entry else rule_block_m(num_tokens, top_k, num_experts)


def lora_block_m(num_tokens: int, top_k: int, num_experts: int, num_slots: int) -> int:
    """BLOCK_M for the per-adapter alignment: mean pairs per (slot, expert) if the tokens spread
    over all slots."""
    if runtime.interpreter():
        return 16
    return _step_pick(token_bucket(num_tokens) * top_k / (num_experts * num_slots), _LORA_BM_STEPS)


def gemm_config(num_tokens: int, block_m: int, N: int, K: int, num_experts: int | None = None) -> GemmConfig:
    """The base GEMM's tile: the tuned table's for this GPU, GEMM shape (N, K) and token bucket when
    its BLOCK_M is the alignment's, else `rule_gemm_config`."""
    if runtime.interpreter():
        return _INTERP_GEMM
    tile = tiles.gemm_tile(num_experts, N, K, token_bucket(num_tokens), block_m)
    return GemmConfig(**tile) if tile else rule_gemm_config(block_m)


def rule_gemm_config(block_m: int) -> GemmConfig:
    """The tile by rule (any GPU, any shape), by BLOCK_M only."""
    if block_m <= 16:
        return GemmConfig(block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)
    if block_m <= 32:
        return GemmConfig(block_n=64, block_k=128, group_m=4, num_warps=4, num_stages=4)
    if block_m <= 64:
        return GemmConfig(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
    return GemmConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)


_NUM_SMS_GUESS = 132  # H100/H200; only used to size split_n, a static function of the shape


def lora_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel (values from the H200 sweep of studies/kernels/record.py)."""
    if runtime.interpreter():
        return _INTERP_LORA
    # Rough count of busy blocks, from shapes only: at most one per pair, and about one per
    # (slot, expert) group while the groups are smaller than a block.
    busy = max(1, min(token_bucket(num_tokens) * top_k, num_experts * num_slots))
    block_n = 64
    n_tiles = cdiv(N, block_n)
    # Split N until about two work items per SM exist; past a few dozen blocks, keep >= 256
    # columns per item (the shrink is recomputed per item).
    split = max(1, min(n_tiles, (2 * _NUM_SMS_GUESS + busy - 1) // busy))
    if busy >= 64:
        split = max(1, min(split, N // 256))
    avg = token_bucket(num_tokens) * top_k / (num_experts * num_slots)  # pairs per (adapter, expert) group
    if block_m >= 64:
        # 162 registers: 3 programs/SM. Capped at 128 (4 fit) it gained 7 % at 128+ pairs per group
        # (M=8192: 232.9 -> 216.3 us, tp4 124.2 -> 115.7; expand_run2) and 15 % at 32 (M=2048: 101.2 ->
        # 87.4 us, tp4 62.0 -> 57.2; expand_run6), and lost 8-11 % at 64 (M=4096, both runs).
        return LoRAKernelConfig(block_n=64, block_k=64, split_n=split, num_warps=4, num_stages=3,
                                max_regs=128 if avg >= 128 or avg <= 32 else 0)
    # bm16/32: (64, 128) beat (128, 64) at M = 16..1024 except qwen3 M=1024 (-5%) in the H200 sweep
    # of data/kernels (persistent grid: 4 programs/SM fit with these tiles, 3 with the other).
    # The expand loop pipelined by hand (prefetch) pays where the groups fill the blocks: at 16 pairs
    # per group (M=1024 at 4 slots of 128 experts, top-8) prefetch 2 at 3 programs/SM beat the
    # 4 programs/SM without it, 77.1 -> 71.0 us (tp4 50.3 -> 47.3); with BLOCK_M 32 (M=2048) prefetch 1
    # 115.6 -> 99.1 us (tp4 73.4 -> 66.8). At 8 pairs and fewer, and with BLOCK_M 64, it lost
    # (data/kernels/expand_run2_*).
    if block_m == 32:
        return LoRAKernelConfig(block_n=block_n, block_k=128, split_n=split, num_warps=4, num_stages=3, prefetch=1)
    # BLOCK_M 16: Triton's pipeliner on the expand loop replaced the hand prefetch (H200, data/kernels/stages_s1_*,
    # s2, s3): 3 stages at 8 pairs per group and fewer (128 registers, still 4 programs/SM), qwen3 M=256/512 54.2 ->
    # 51.2 and 57.9 -> 55.0 us (0.94-0.95x in all three sessions; tp4 0.99x); 4 stages at 16 pairs (168 registers,
    # 3 programs/SM as prefetch 2 had), M=1024 71.6 -> 67.1 us (0.93-0.94x; tp4 0.97-0.99x). M=64/128: stages_s3 only.
    return LoRAKernelConfig(block_n=block_n, block_k=128, split_n=split, num_warps=4, num_stages=3,
                            expand_stages=4 if avg > 8 else 3)


def lora_down_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                     N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel for the down delta (P=1, routed weights): its N (hidden) is wide
    and each work item's time goes to the read-add-write of `out`, so a wider BLOCK_N keeps more of
    those bytes in flight per iteration; BLOCK_K 32 with 4 stages at small M, 64 above (H200 sweep,
    data/archive/kernels/decode_run1_* (git history): 277 -> 235 us at M=8192 qwen3-30b-a3b, 77 -> 60 us at M=1024).

    Programs per SM decide the bytes in flight, and registers decide the programs per SM (65536 per
    SM: 128 per thread for 4 programs of 4 warps). data/kernels/expand_run2_* (H200): at 8 pairs per
    group (M=512) the BLOCK_K 64 tile needs 139 registers, 3 programs/SM; capped at 128 (maxnreg) 4 fit
    and the delta drops 54.0 -> 38.2 us (tp4 45.5 -> 32.8). At 16 pairs prefetch 2 with a cap of 168:
    60.4 -> 58.0 (tp4 51.2 -> 48.8). With BLOCK_M 64 (M >= 4096) the tile holds 233-240 registers
    (2 programs/SM) and a cap spills: prefetch 2 alone, 236.3 -> 230.7 us at M=8192. At small M,
    prefetch 2 (125 registers) 36.9 -> 35.1 us at M=256. Triton's pipelined expand (`expand_stages`) has since
    replaced the hand prefetch at every M but 512 (below)."""
    base = lora_config(num_tokens, top_k, num_experts, num_slots, block_m, N, K)
    if runtime.interpreter():
        return base
    small = token_bucket(num_tokens) <= 256
    avg = token_bucket(num_tokens) * top_k / (num_experts * num_slots)
    prefetch, max_regs, stages = 2, 0, 0
    if block_m == 32:
        prefetch = 0
    elif block_m == 16 and not small:
        prefetch, max_regs = (0, 128) if avg <= 8 else (2, 168)
    if small:
        # 3 stages on the expand loop instead of prefetch 2 (128 registers, 4 programs/SM): M=256 35.1 -> 32.9 us
        # (0.93-0.94x in stages_s1/s2/s3, tp4 0.90x); M=64 and 128 0.83-0.92x (stages_s3 only).
        prefetch, stages = 0, 3
    elif block_m == 64 or (block_m == 16 and avg > 8):
        # Triton's pipeliner on the expand loop (3 stages) instead of the hand prefetch: the next `out` tiles
        # stream into shared memory (36 -> 64 KB a program, still 2 programs/SM at BLOCK_M 64), 2-3 tiles in
        # flight a program instead of one in registers. H200, data/kernels/stages_s1_*, stages_s2_*: M=8192
        # 231.2 -> 208.1 us, 77 -> 85 % of the copy bandwidth (tp4 205.5 -> 182.6, 75 -> 84 %); M=1024 58.1 ->
        # 50.8 (tp4 49.0 -> 41.5). At 8 pairs per group (M=512) the register cap of 128 stays faster.
        prefetch, max_regs, stages = 0, 0, 3
    # BLOCK_N 64 where it beat the table paired in two device sessions (down_s3, down_s4: qwen3 M = 4096, 0.972 [0.961,
    # 0.981] and 0.968 [0.965, 0.980]; at TP=4's K = 192 0.998 and 0.994, elsewhere 1.07-1.18x): ncu (down_s3) has
    # the average SM busy 96 % of the span against 93 % (more, shorter expand steps even out the programs' ends).
    narrow = block_m == 64 and token_bucket(num_tokens) == 4096 and K >= 512
    return LoRAKernelConfig(block_n=64 if narrow else 128, block_k=32 if small else 64,
                            split_n=max(1, min(base.split_n, cdiv(N, 128))), num_warps=4,
                            num_stages=4 if small else 3, programs_per_sm=4, prefetch=prefetch, max_regs=max_regs,
                            expand_stages=stages)


def block_r(rank: int) -> int:
    """BLOCK_R: next power of two >= max(rank, 16)."""
    r = 16
    while r < rank:
        r *= 2
    return r


# The decode path (no alignment) is taken for M * top_k <= this many pairs: per pair it reads its
# adapter-expert's weights once, with no reuse between pairs of one (adapter, expert). H200,
# data/archive/kernels/decode_run3_* (git history): the whole LoRA path of a layer (both deltas) is 0.69-0.84x today's
# (alignment + aligned deltas) up to M=32 at top-8 (256 pairs), 0.97-1.05x at 512 pairs.
DECODE_MAX_PAIRS = 256
_DECODE_PROGRAMS = 2 * _NUM_SMS_GUESS  # about two programs per SM


def decode_config(num_pairs: int, P: int, N: int, K: int, R: int) -> DecodeConfig:
    """Decode tile: BLOCK_N 64; split N until about two programs per SM exist. With very few
    programs and a long K (gate_up at one token), BLOCK_K 512 over 8 warps puts more of each
    program's A bytes in flight per loop trip (decode_run3: 12.0 -> 9.2 us, tp4 12.3 -> 8.6 us;
    slower from M=8 on, where enough programs exist)."""
    if runtime.interpreter():
        return _INTERP_DECODE
    block_n = 64
    split = max(1, min(cdiv(N, block_n), cdiv(_DECODE_PROGRAMS, max(1, num_pairs * P))))
    if num_pairs * P <= 16 and K >= 1024:
        return DecodeConfig(block_n=32, block_k=512, split_n=split, num_warps=8, num_stages=1)
    return DecodeConfig(block_n=block_n, block_k=256 if block_r(R) <= 32 else 128, split_n=split, num_warps=4,
                        num_stages=1)


def use_decode_path(num_tokens: int, top_k: int) -> bool:
    """The MoE layer's choice, from static shapes only (capture-safe)."""
    return num_tokens * top_k <= DECODE_MAX_PAIRS


# The fused LoRA epilogue (kernels/fused_moe_lora_epilogue.py: the base GEMM adds the delta before its
# store) is used for these (op, token bucket) pairs only; everywhere else the base GEMM and the
# separate delta run. Filled from the H200 recording of studies/kernels/record_fused.py.
FUSED_LORA_TOKENS: dict = {"gate_up": frozenset(), "down": frozenset()}
# The folded LoRA path (a shrink kernel, then the base GEMM with the expand as extra K iterations; FOLD_BUILD below
# says which build) for these (op, token bucket) pairs; it takes precedence over the epilogue; elsewhere the layer
# runs the separate deltas. From fold_s12 (H200, packed build, the GEMM with its shrink over the separate delta with
# its LoRA alignment, 20 paired rounds, bootstrap 95 %): the down GEMM wins at every M >= 128 on both presets
# (0.78-0.96x), loses at M = 16 (1.05 / 1.15x); gate_up wins at M = 128 and 1024 (0.94-0.995x) and loses at
# M >= 4096 (1.02-1.28x: its separate delta is a small share of a long GEMM, and the shrink reads x once more) and
# at M <= 16. fold_s14 (a second fresh machine) agrees, with qwen3 gate_up at M = 128 a tie (0.998 [0.996, 1.000]);
# so does fold_s16 (a third), qwen3 gate_up M = 128 a tie again (1.000), kept in the table as no loss.
# Buckets 256, 512 and 2048 were not timed on their own and follow their neighbours; the layer as committed is
# 0.938-0.991x the separate deltas at M = 256-16384 on both presets (fold_s14, layer section). The rows build lost to
# the separate deltas everywhere once the base GEMM took sub-blocks (fold_s10, fold_s11).
FOLDED_LORA_TOKENS: dict = {"gate_up": frozenset({128, 256, 512, 1024}),
                            "down": frozenset({128, 256, 512, 1024, 2048, 4096, 8192, 16384})}
# Per GEMM shape (op, N, K): token buckets where the layer folds that GEMM beside FOLDED_LORA_TOKENS's per-op ones.
# qwen3-30b-a3b's gate_up (N = 1536, K = 2048) at M >= 8192, with the shrink in one-slot windows (PACKED_SHRINK_TOKENS):
# 0.925-0.978x the separate delta (win_s3) where its TP=4 shape (N = 384) only ties (0.993-1.008x), so a per-op
# table could not take it (docs/kernels.md, "The packed shrink in slot windows"). At M = 4096 with gate_up's wide build
# per block (WIDE_GATE_UP_TOKENS): 0.922x the separate delta in wg_s2 and wg_s3 (medians), 0.929 [0.922, 0.932] in
# wg_s4 (paired 95 %); the packed path there only tied it (1.01-1.03x). Not its TP=4 shape (N = 384): at M >= 8192
# the same wide build's path is 0.964-0.980x the separate delta alone (wg_s4, wg_s5), but the layer folding it lost,
# 1.014 [1.012, 1.016] and 1.016 [1.013, 1.022]x the layer without (lay_s5, M = 8192 and 16384; disabled 1.004 and
# 1.013x); at 2048 and 4096 the path itself loses (1.05-1.06x, wg_s5).
FOLDED_LORA_SHAPE_TOKENS: dict = {("gate_up", 1536, 2048): frozenset({4096, 8192, 16384})}
# The folded path's build where the layer takes it: the layer's alignment ordered by LoRA row inside each
# expert (`moe_align(order_by=)`), so a tile spans few LoRA rows, and the per-row shrink (one K loop of R
# columns per row present, 167 registers against the side-by-side shrink's 255). data/kernels/fold_s2 (H200,
# M = 8192): the folded GEMM 804 against 914 us on the pair-order alignment (qwen3 gate_up, ncu).
FOLDED_ORDER_BY_ROW = True
# Which folded build the layer runs where FOLDED_LORA_TOKENS folds: "packed" (kernels/fused_moe_lora_packed.py: the
# shrink writes each pair's result in its slot's columns, the GEMM keeps the plain table's tile and adds TMA-fed K
# iterations) or "rows" (fused_moe_lora_folded.py).
FOLD_BUILD = "packed"
# The packed build's token buckets where the layer orders its alignment by LoRA row and the GEMM runs one expand dot
# per slot of a block; elsewhere one dot over every slot on the plain alignment. fold_s12 (H200, the down GEMM with
# its shrink over the separate delta with its LoRA alignment, paired 95 %): per slot 0.929 / 0.805 at M = 8192 and
# 0.889 / 0.776 at 16384 (qwen3 / TP=4) against 0.935 / 0.855 and 0.957 / 0.862 for one dot; at M <= 1024 the
# ordered alignment's extra launch costs more than the skipped slots save (per slot 1.061 / 1.019 at 1024, one dot
# 0.928 / 0.847).
# exp_s3 (this lab's expand section): at M = 4096 the down GEMM per slot with two slots per expand dot
# (PACKED_EXPAND_TOKENS) beats one dot over every slot on the plain alignment, 0.966-0.986x (both presets, its ordered
# alignment's time in); the layer with it at 4096: 0.990x [0.985, 0.993] at TP=4, 1.002x [0.992, 1.005] for qwen3
# (exp_s3; docs/kernels.md, "The expand's waits").
PACKED_PER_SLOT_TOKENS = frozenset({4096, 8192, 16384})
# The packed shrink's options (`lora_shrink_packed`'s keywords) per token bucket where the layer packs an op;
# elsewhere the one-dot shrink ({}). At M >= 8192: one slot per dot, both slices from one x tile, 64-row programs
# under a register cap of 128 (W1S): the gate_up shrink in 0.60-0.75x the one-dot shrink's time (win_s3); for down
# it moves nothing end to end (0.80-0.92x the separate delta either way), so one table serves both ops.
W1S = dict(slot_window=1, both_slices=True, row_ptrs=True, sub_m=64, max_regs=128)
PACKED_SHRINK_TOKENS: dict = {8192: W1S, 16384: W1S}


# The packed GEMM's expand options (`moe_gemm_lora_packed(expand=)`) per token bucket; elsewhere its defaults. Two slots
# (64 columns) per expand dot: the packed GEMM alone in 0.89-1.00x the one-slot loop's time at M = 1024-4096, about
# 1.0x at M >= 8192 (exp_s2, exp_s3, exp_s5); taken at 4096, the one bucket that runs per slot and gains from it.
PACKED_EXPAND_TOKENS: dict = {4096: dict(depth=64)}


# The packed GEMM's tile per GEMM shape (op, N, K) and token bucket: GemmConfig fields replaced in the plain GEMM's
# table tile (the expand option `tile`); elsewhere the packed GEMM runs the plain GEMM's tile as it is. A program per
# tile at the TP=4 down GEMM (N = 2048, K = 192) of M = 1024, where the plain table runs a flattened persistent grid
# (3 programs per SM) that the expand's loop unflattens: the packed GEMM alone 0.842-0.853x the persistent build's
# time, with every adapter disabled 1.09-1.10x the plain GEMM (persistent: 1.21-1.23x; exp_s7, exp_s8), the layer
# 0.976-0.986x the layer without it (exp_s7-exp_s9). At M >= 4096 it lost (1.01-1.07x; docs/kernels.md, "Loads before
# the K loop, and a program per tile").
PACKED_TILE_SHAPE_TOKENS: dict = {("down", 2048, 192): {1024: dict(persistent=0, flatten=False)}}


# The down GEMM's wide build (`moe_gemm_lora_wide`: u and B_packed as columns past K of the GEMM's own x and w, walked
# by the plain GEMM's K loop when any adapter is live) per token bucket, where the layer folds down with the packed
# build; elsewhere `moe_gemm_lora_packed`. wide_s1, wide_s2 (H200, two machines, the down path end to end over the
# committed packed path, paired 95 %, the means): 0.89-0.90x (qwen3) and 0.86-0.90x (TP=4) at M = 4096-16384, with the
# committed W1S shrink on the ordered alignment 0.85-0.87x at M >= 8192; 0.91 / 0.99x at M = 1024; with every adapter
# disabled its GEMM is 0.96-1.02x the plain GEMM (the packed path's: 1.01-1.31x). The layer with it over the layer
# without: 0.959-0.979x (qwen3, M >= 1024), 0.950-0.966x (TP=4, M >= 4096), 0.996-1.011x (TP=4, M = 1024; lay_s1,
# lay_s2). M = 128 and 256 (wide_s3, wide_s5: two machines): 0.986 / 0.993 and 0.958 / 0.962x the packed path at
# qwen3, 0.973 / 0.975 and 0.921 / 0.937x at TP=4, with every adapter disabled 1.01-1.02x (qwen3) and 1.05-1.06x
# (TP=4) the plain GEMM where the packed path pays 1.02-1.05x and 1.09-1.11x; the layer with it, over the layer
# without (lay_s5): 0.995 [0.991, 1.000] (qwen3) and 0.980 [0.976, 0.983] (TP=4) at M = 256, a tie at 128 (1.002
# both). M = 512 stays packed: qwen3 gains
# (0.966 / 0.972x) but TP=4 loses (1.017 / 1.035x), and the table is per token bucket. Bucket 2048 was not timed on
# its own.
WIDE_DOWN_TOKENS = frozenset({128, 256, 1024, 2048, 4096, 8192, 16384})


# gate_up's wide build per block (`moe_gemm_lora_wide(gather=True, per_block=True)`: each pair's u past K in its
# token's row, and each tile walks only its block's slots' columns of its own slice) per token bucket, where the layer
# folds gate_up with the packed build, with the W1S shrink on the alignment ordered by LoRA row; elsewhere
# `moe_gemm_lora_packed`. wg_s2-wg_s4 (H200, three machines, the qwen3 gate_up path end to end, paired 95 %, the
# union): 0.895-0.949x the committed packed path at M = 4096-16384, 0.90-0.93x the separate delta (wg_s4;
# docs/kernels.md, "gate_up's wide build, per block"). The layer folds gate_up at TP=4 only below 2048
# (FOLDED_LORA_TOKENS), so there it changes nothing (at M >= 8192 the fold with this build lost in the layer: lay_s5).
# The layer's input x must be the first K columns of a wider buffer (the norm writes it there: `MoELayer.norm`); a
# layer handed a plain x copies it.
WIDE_GATE_UP_TOKENS = frozenset({4096, 8192, 16384})
# Its shrink: W1S, its programs taking the ordered alignment's blocks slot by slot (`slot_order`, one more launch of
# a single program, `align.slot_major_order`): x's rows, read once per expert of a token, stay in L2 while one slot's
# blocks run. The shrink alone at qwen3's gate_up (H200, CUDA graphs, ord_s2, ord_s3): 0.85-0.92x W1S in block order
# with the order given, 0.89-0.97x with its kernel, under random and per-request adapter mappings alike; ncu (ord_n1,
# ord_n2, M = 8192): 123-126 -> 111-113 us, DRAM bytes 2.06 -> 1.73x the floor, L2 hit 36 -> 45 %. The layer over
# the same tables with W1S in block order (lay_s7, lay_s8): 0.992x at M = 4096 and 0.992-0.994x at 16384 in both
# sessions, 0.998x (a tie) at 8192; with nothing live the order kernel returns at once (disabled 1.000-1.002x).
WIDE_GATE_UP_SHRINK = dict(W1S, slot_order=True)


def use_wide_gate_up(num_tokens: int, block_m: int, N: int, K: int, num_experts: int) -> bool:
    """Whether the layer's folded gate_up GEMM takes the wide build per block at this token count (static shapes):
    the bucket is in WIDE_GATE_UP_TOKENS and the GEMM's tile steps evenly over K (its row pointers jump to each
    pair's tail between two K steps)."""
    return (FOLD_BUILD == "packed" and token_bucket(num_tokens) in WIDE_GATE_UP_TOKENS
            and K % gemm_config(num_tokens, block_m, N, K, num_experts).block_k == 0)


# The down GEMM's wide build in a window of two slots' columns (`moe_gemm_lora_wide(window=)`, `Tail.win`): each
# tile walks 2 * BLOCK_R columns from its block's first live slot (u written shifted there by the shrink), where the
# 4 slots' C = 128 columns cost the GEMM a third more K steps at TP=4 (K = 192). It holds where every block of the
# ordered alignment spans at most two slots: with 4 adapters and uniform routing, from M = 16384 (a slot's pairs per
# expert, about 256, outnumber a block's 128 rows). Elsewhere the shrink finds a block that spills and the launch
# walks all C, which costs a little more than the build without the window (the tail's reset, the shifted stores).
# Measured (H200, CUDA graphs, 20 paired rounds, bootstrap 95 %): the path over the layer's (dwin_s1) at M = 16384
# 0.965 [0.960, 0.971] (qwen3) and 0.909 [0.906, 0.912] (TP=4), the window held in every set; at 8192 it never held
# (0.999 and 1.031x). The layer over the tables without it (lay_s9): 0.992 [0.988, 0.997] and 0.978 [0.976, 0.980] at
# 16384; at 8192 a tie (qwen3) and 1.014 [1.012, 1.016] (TP=4). So 16384 only.
WIDE_DOWN_WINDOW_TOKENS: frozenset = frozenset({16384})


def wide_down_window(num_tokens: int, block_m: int, N: int, K: int, num_experts: int, C: int, slots: int) -> int:
    """The columns each tile of the layer's wide down GEMM walks at this token count (static shapes): two slots'
    columns, 2 * br (br = C over the slots rounded up to a power of two), where the bucket is in
    WIDE_DOWN_WINDOW_TOKENS, the tile reads w through TMA and steps evenly over K and the window, and the window is
    narrower than all C columns; else 0 (all C)."""
    br = C // pow2(slots)
    if FOLD_BUILD != "packed" or token_bucket(num_tokens) not in WIDE_DOWN_WINDOW_TOKENS or 2 * br >= C:
        return 0
    cfg = gemm_config(num_tokens, block_m, N, K, num_experts)
    return 2 * br if cfg.w_desc and K % cfg.block_k == 0 and (2 * br) % cfg.block_k == 0 else 0


def use_wide_down(num_tokens: int) -> bool:
    """Whether the layer's folded down GEMM takes the wide build at this token count (static shapes: capture-safe)."""
    return FOLD_BUILD == "packed" and token_bucket(num_tokens) in WIDE_DOWN_TOKENS


def packed_expand(num_tokens: int, op: str | None = None, N: int | None = None, K: int | None = None) -> dict:
    """The packed GEMM's expand options at this token count, with its tile (`tile`) where PACKED_TILE_SHAPE_TOKENS
    names the GEMM shape (op, N, K) and bucket (a copy; static shapes only: capture-safe)."""
    b = token_bucket(num_tokens)
    opts = dict(PACKED_EXPAND_TOKENS.get(b, {}))
    tile = PACKED_TILE_SHAPE_TOKENS.get((op, N, K), {}).get(b)
    if tile:
        opts["tile"] = dict(tile)
    return opts


def packed_shrink(num_tokens: int) -> dict:
    """The packed shrink's options at this token count (a copy; static shapes only: capture-safe)."""
    return dict(PACKED_SHRINK_TOKENS.get(token_bucket(num_tokens), {}))


def folded_order_by_row(num_tokens: int) -> bool:
    """Where an op folds: whether the layer orders its alignment by LoRA row (the rows build's per-row shrink, the
    packed build's expand per slot); from static shapes only (capture-safe). FOLDED_ORDER_BY_ROW off: never."""
    if not FOLDED_ORDER_BY_ROW:
        return False
    return FOLD_BUILD == "rows" or token_bucket(num_tokens) in PACKED_PER_SLOT_TOKENS


def _bucket_in(table: dict, op: str, num_tokens: int) -> bool:
    if op not in table:
        raise ValueError(f"op must be one of {sorted(table)}, got {op!r}")
    return token_bucket(num_tokens) in table[op]


def use_folded_lora(op: str, num_tokens: int, top_k: int, num_experts: int, N: int, K: int) -> bool:
    """Whether the MoE layer runs `op` ("gate_up" or "down") as the folded LoRA GEMM (shrink kernel +
    base GEMM with the expand in its K loop); from static shapes only (capture-safe): FOLDED_LORA_TOKENS per op, then
    FOLDED_LORA_SHAPE_TOKENS per GEMM shape (op, N, K)."""
    return (_bucket_in(FOLDED_LORA_TOKENS, op, num_tokens)
            or token_bucket(num_tokens) in FOLDED_LORA_SHAPE_TOKENS.get((op, N, K), frozenset()))


def use_fused_lora(op: str, num_tokens: int, top_k: int, num_experts: int, N: int, K: int) -> bool:
    """Whether the MoE layer runs `op` ("gate_up" or "down") as one GEMM with the LoRA delta inside,
    folded or in its epilogue; from static shapes only (capture-safe)."""
    return (use_folded_lora(op, num_tokens, top_k, num_experts, N, K)
            or _bucket_in(FUSED_LORA_TOKENS, op, num_tokens))
