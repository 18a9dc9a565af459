"""Launch-config tables of the Triton kernels: tile sizes keyed on static shapes only (M rounded
up to a power of two, N, K, experts, slots), so the choice never reads device data and a warm-up
over the powers of two compiles every binary a CUDA-graph capture could need. Which LoRA path the
MoE layer runs, with which options, is the plan's (kernels/plan.py, from kernels/tile_tables/lora_plan_*.json).

Under the interpreter (no GPU) one small config is used everywhere: the interpreter runs each
program sequentially on numpy, so big tiles only cost CPU time.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from .. import runtime
from . import tiles
from .common import cdiv
from .table_checks import TILE, TableError, check_fields


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
    # table only beside a persistent grid (studies/kernels/record_base.py persist); record_fold.py caps the folded GEMM
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


RULES_FILE = tiles.TABLE_DIR / "rules.json"


def _bounded(items: list, key: str, f, entry: str) -> list:
    """The bounds of a rule's steps: numbers > 0 that rise, the last one null (any)."""
    bounds = [s[key] if isinstance(s, dict) else s[0] for s in items]
    inner = bounds[:-1]
    if (not bounds or bounds[-1] is not None or any(not isinstance(b, int) or isinstance(b, bool) or b <= 0
                                                     for b in inner) or inner != sorted(set(inner))):
        raise TableError(f, entry, f"the steps' bounds must be ints > 0 that rise, the last one null (any): got "
                                   f"{bounds}")
    return [float("inf") if b is None else b for b in bounds]


@functools.lru_cache(maxsize=1)
def rules() -> dict:
    """tile_tables/rules.json, read and checked once per process: the BLOCK_M steps ((at most this many pairs per
    group, BLOCK_M), ...) of the base GEMM's and the per-adapter alignments, and the base GEMM's rule tiles
    ((up to this BLOCK_M, GemmConfig), ...)."""
    f = RULES_FILE
    raw = json.loads(f.read_text())
    if set(raw) != {"about", "moe_block_m", "lora_block_m", "rule_gemm"}:
        raise TableError(f, "", f"holds about, moe_block_m, lora_block_m and rule_gemm, got {sorted(raw)}")
    out = {}
    for key in ("moe_block_m", "lora_block_m"):
        e = raw[key]
        if not (isinstance(e, dict) and set(e) == {"steps", "why"} and isinstance(e["steps"], list)
                and all(isinstance(s, list) and len(s) == 2 for s in e["steps"])):
            raise TableError(f, key, f"must hold steps [[at most this many pairs, BLOCK_M], ...] and why, got {e!r}")
        bms = [s[1] for s in e["steps"]]
        if any(bm not in (16, 32, 64, 128) for bm in bms):
            raise TableError(f, key, f"BLOCK_M must be 16, 32, 64 or 128, got {bms}")
        out[key] = tuple(zip(_bounded(e["steps"], 0, f, key), bms))
    e = raw["rule_gemm"]
    if not (isinstance(e, dict) and set(e) == {"tiles", "why"} and isinstance(e["tiles"], list)
            and all(isinstance(t, dict) and "max_block_m" in t for t in e["tiles"])):
        raise TableError(f, "rule_gemm", f"must hold tiles [{{max_block_m, tile fields}}, ...] and why, got {e!r}")
    for i, t in enumerate(e["tiles"]):
        check_fields({k: v for k, v in t.items() if k != "max_block_m"}, TILE, f, f"rule_gemm tile {i}", "tile")
    out["rule_gemm"] = tuple(zip(_bounded(e["tiles"], "max_block_m", f, "rule_gemm"),
                                 (GemmConfig(**{k: v for k, v in t.items() if k != "max_block_m"})
                                  for t in e["tiles"])))
    return out


def _step_pick(avg: float, steps) -> int:
    return next(bm for limit, bm in steps if avg <= limit)


def rule_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """BLOCK_M by rule (any GPU, any shape): about the mean number of pairs per expert (rules.json)."""
    return _step_pick(token_bucket(num_tokens) * top_k / num_experts, rules()["moe_block_m"])


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
    return _step_pick(token_bucket(num_tokens) * top_k / (num_experts * num_slots), rules()["lora_block_m"])


def gemm_config(num_tokens: int, block_m: int, N: int, K: int, num_experts: int | None = None) -> GemmConfig:
    """The base GEMM's tile: the tuned table's for this GPU, GEMM shape (N, K) and token bucket when
    its BLOCK_M is the alignment's, else `rule_gemm_config`."""
    if runtime.interpreter():
        return _INTERP_GEMM
    tile = tiles.gemm_tile(num_experts, N, K, token_bucket(num_tokens), block_m)
    return GemmConfig(**tile) if tile else rule_gemm_config(block_m)


def base_gemm_source(device_name: str | None, props=None) -> tuple[str, str]:
    """(source, why) of the base GEMM's tiles on the GPU `device_name` (None: no GPU): the GPU whose tile tables it
    reads (its own name where it has some), or "rule" (`rule_block_m`, `rule_gemm_config`). A GPU without tables
    takes the choice of tile_tables/gpus.json's `base_gemm` entry, else the closest recorded GPU's of its
    architecture (kernels/gpus.py); props: its `gpus.DeviceProps` (None: the driver's, else gpus.json's)."""
    if device_name is None:
        return "rule", "no GPU: the interpreter's one small tile" if runtime.interpreter() else "no GPU"
    return tiles.source(device_name, props)


def rule_gemm_config(block_m: int) -> GemmConfig:
    """The tile by rule (any GPU, any shape), by BLOCK_M only (rules.json)."""
    return next(cfg for limit, cfg in rules()["rule_gemm"] if block_m <= limit)


_NUM_SMS_GUESS = 132  # H100/H200; only used to size split_n, a static function of the shape


def lora_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel (values from the H200 sweeps of studies/kernels/record.py and
    record_expand.py; the recordings: studies/kernels/README.md)."""
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
        # (M=8192: 232.9 -> 216.3 us, tp4 124.2 -> 115.7) and 15 % at 32 (M=2048: 101.2 -> 87.4 us,
        # tp4 62.0 -> 57.2), and lost 8-11 % at 64 (M=4096, both recordings).
        return LoRAKernelConfig(block_n=64, block_k=64, split_n=split, num_warps=4, num_stages=3,
                                max_regs=128 if avg >= 128 or avg <= 32 else 0)
    # bm16/32: (64, 128) beat (128, 64) at M = 16..1024 except qwen3 M=1024 (-5%) in the H200 sweep
    # of data/kernels (persistent grid: 4 programs/SM fit with these tiles, 3 with the other).
    # The expand loop pipelined by hand (prefetch) pays where the groups fill the blocks: at 16 pairs
    # per group (M=1024 at 4 slots of 128 experts, top-8) prefetch 2 at 3 programs/SM beat the
    # 4 programs/SM without it, 77.1 -> 71.0 us (tp4 50.3 -> 47.3); with BLOCK_M 32 (M=2048) prefetch 1
    # 115.6 -> 99.1 us (tp4 73.4 -> 66.8). At 8 pairs and fewer, and with BLOCK_M 64, it lost.
    if block_m == 32:
        return LoRAKernelConfig(block_n=block_n, block_k=128, split_n=split, num_warps=4, num_stages=3, prefetch=1)
    # BLOCK_M 16: Triton's pipeliner on the expand loop replaced the hand prefetch (H200, three sessions): 3 stages
    # at 8 pairs per group and fewer (128 registers, still 4 programs/SM), qwen3 M=256/512 54.2 -> 51.2 and
    # 57.9 -> 55.0 us (0.94-0.95x in all three; tp4 0.99x); 4 stages at 16 pairs (168 registers, 3 programs/SM as
    # prefetch 2 had), M=1024 71.6 -> 67.1 us (0.93-0.94x; tp4 0.97-0.99x). M=64/128: timed in one session.
    return LoRAKernelConfig(block_n=block_n, block_k=128, split_n=split, num_warps=4, num_stages=3,
                            expand_stages=4 if avg > 8 else 3)


def lora_down_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                     N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel for the down delta (P=1, routed weights): its N (hidden) is wide
    and each work item's time goes to the read-add-write of `out`, so a wider BLOCK_N keeps more of
    those bytes in flight per iteration; BLOCK_K 32 with 4 stages at small M, 64 above (H200 sweep: 277 -> 235 us
    at M=8192 qwen3-30b-a3b, 77 -> 60 us at M=1024; the recordings: studies/kernels/README.md).

    Programs per SM decide the bytes in flight, and registers decide the programs per SM (65536 per
    SM: 128 per thread for 4 programs of 4 warps). Measured on the H200: at 8 pairs per
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
        # (0.93-0.94x in three sessions, tp4 0.90x); M=64 and 128 0.83-0.92x (one session).
        prefetch, stages = 0, 3
    elif block_m == 64 or (block_m == 16 and avg > 8):
        # Triton's pipeliner on the expand loop (3 stages) instead of the hand prefetch: the next `out` tiles
        # stream into shared memory (36 -> 64 KB a program, still 2 programs/SM at BLOCK_M 64), 2-3 tiles in
        # flight a program instead of one in registers. H200, two sessions: M=8192
        # 231.2 -> 208.1 us, 77 -> 85 % of the copy bandwidth (tp4 205.5 -> 182.6, 75 -> 84 %); M=1024 58.1 ->
        # 50.8 (tp4 49.0 -> 41.5). At 8 pairs per group (M=512) the register cap of 128 stays faster.
        prefetch, max_regs, stages = 0, 0, 3
    # BLOCK_N 64 where it beat the table paired in two device sessions (qwen3 M = 4096, 0.972 [0.961, 0.981] and
    # 0.968 [0.965, 0.980]; at TP=4's K = 192 0.998 and 0.994, elsewhere 1.07-1.18x): ncu has the average SM busy
    # 96 % of the span against 93 % (more, shorter expand steps even out the programs' ends).
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


_DECODE_PROGRAMS = 2 * _NUM_SMS_GUESS  # about two programs per SM


def decode_config(num_pairs: int, P: int, N: int, K: int, R: int) -> DecodeConfig:
    """Decode tile: BLOCK_N 64; split N until about two programs per SM exist. With very few
    programs and a long K (gate_up at one token), BLOCK_K 512 over 8 warps puts more of each
    program's A bytes in flight per loop trip (H200: 12.0 -> 9.2 us, tp4 12.3 -> 8.6 us; slower from
    M=8 on, where enough programs exist)."""
    if runtime.interpreter():
        return _INTERP_DECODE
    block_n = 64
    split = max(1, min(cdiv(N, block_n), cdiv(_DECODE_PROGRAMS, max(1, num_pairs * P))))
    if num_pairs * P <= 16 and K >= 1024:
        return DecodeConfig(block_n=32, block_k=512, split_n=split, num_warps=8, num_stages=1)
    return DecodeConfig(block_n=block_n, block_k=256 if block_r(R) <= 32 else 128, split_n=split, num_warps=4,
                        num_stages=1)
