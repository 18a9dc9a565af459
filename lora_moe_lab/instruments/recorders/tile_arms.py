"""Named builds of the base MoE GEMM's tile for the recording scripts and studies/kernels/resources.py (one home:
a script may not import another): the tile's one-token name, and the arms of record_kernels_base's `persist`
section. Host-side config objects only; nothing here launches a kernel.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ...kernels.configs import GemmConfig

TILE = re.compile(r"bm(\d+)/bn(\d+)/bk(\d+)/g(\d+)/w(\d+)/s(\d+)")


def tile_str(bm, t) -> str:
    """A tile tuple (see as_config) or a whole GemmConfig (then with its persistent / flatten / cap / early flags)."""
    if isinstance(t, GemmConfig):
        return cfg_str(bm, t)
    return (f"bm{bm}/bn{t[0]}/bk{t[1]}/g{t[2]}/w{t[3]}/s{t[4]}" + ("/tma" if len(t) > 5 and t[5] else "")
            + ("/masked" if len(t) > 6 and t[6] == "masked" else ""))


def as_config(t) -> GemmConfig:
    """(BLOCK_N, BLOCK_K, GROUP_M, warps, stages[, w_desc[, "masked"]]) -> GemmConfig; "masked": every load
    predicated, the kernel as it was before the EVEN flags (the peers' carried run measured that one). A GemmConfig
    is returned as it is (the table's own build, with the flags a tuple does not carry)."""
    if isinstance(t, GemmConfig):
        return t
    return GemmConfig(block_n=t[0], block_k=t[1], group_m=t[2], num_warps=t[3], num_stages=t[4],
                      w_desc=bool(t[5]) if len(t) > 5 else False, even=not (len(t) > 6 and t[6] == "masked"))


def as_tuple(c: GemmConfig) -> tuple:
    return (c.block_n, c.block_k, c.group_m, c.num_warps, c.num_stages, c.w_desc)


PERSIST_M = (1024, 4096, 8192, 16384)
# the persist section also times these (round 3): the points short of 1.0x vLLM sit at M = 1 and 16
PERSIST_SMALL_M = (1, 16)


def cfg_str(bm, cfg: GemmConfig) -> str:
    """bm: the alignment's BLOCK_M; `/m64`: the kernel's tile takes 64 of its rows (config sub_m)."""
    return tile_str(bm, as_tuple(cfg)) + (f"/p{cfg.persistent}" if cfg.persistent else "") + \
        ("/flat" if cfg.flatten else "") + (f"/cap{cfg.max_regs}" if cfg.max_regs else "") + \
        ("/early" if cfg.early_loads else "") + (f"/m{cfg.sub_m}" if cfg.sub_m else "")


def programs_per_sm(res, warps) -> int:
    """Programs of `warps` warps one H100/H200 SM holds with a build's static resources (res: regs a thread, shared
    bytes; studies/kernels/resources.py reads them from the cubin): 64K registers, 228 KB of shared memory (1 KB
    reserved per program), 64 warps."""
    by_regs = 65536 // (max(res["regs"], 1) * 32 * warps)
    by_smem = (228 * 1024) // (res["shared"] + 1024) if res["shared"] else 64
    return max(0, min(by_regs, by_smem, 64 // warps))


def config_of(tile: str) -> tuple[int, GemmConfig]:
    """'bm128/bn256/bk64/g16/w8/s4/tma[/masked][/p1][/flat][/cap128][/early][/m64]' (cfg_str's) -> (the alignment's
    BLOCK_M, GemmConfig). '/masked' is the build of the recordings' table_masked arm: every load predicated and no TMA
    (the kernel before the EVEN flags), whatever the table's tile said."""
    m = TILE.match(tile)
    if m is None:
        raise ValueError(f"not a base GEMM tile: {tile!r} (expected bm../bn../bk../g../w../s..[/tma][/p1]...)")
    bm, bn, bk, g, w, s = (int(v) for v in m.groups())
    flag = lambda f: re.search(rf"/{f}(\d+)", tile)
    return bm, GemmConfig(bn, bk, g, w, s, w_desc="/tma" in tile and "/masked" not in tile,
                          even="/masked" not in tile,
                          persistent=int(flag("p").group(1)) if flag("p") else 0, flatten="/flat" in tile,
                          max_regs=int(flag("cap").group(1)) if flag("cap") else 0, early_loads="/early" in tile,
                          sub_m=int(flag("m").group(1)) if flag("m") else 0)


def table_tile(cfg: GemmConfig) -> dict:
    """A GemmConfig as a tile table's entry (kernels/tiles.py): the tile, its flags, sub_m only where set."""
    d = dict(block_n=cfg.block_n, block_k=cfg.block_k, group_m=cfg.group_m, num_warps=cfg.num_warps,
             num_stages=cfg.num_stages, w_desc=cfg.w_desc, persistent=cfg.persistent, flatten=cfg.flatten,
             max_regs=cfg.max_regs, early_loads=cfg.early_loads)
    return dict(d, sub_m=cfg.sub_m) if cfg.sub_m else d


def persist_arms(bm, table: GemmConfig) -> dict:
    """arm -> GemmConfig at the table's BLOCK_M: the table's tile (with TMA where it lacks it) in a persistent grid
    (1 program per SM at 8 warps, 3 at 4 warps), with and without the flattened loop, and one narrower or wider
    tile persistent and flattened; `early`: the table's tile with the epilogue's gathers issued before the K loop.
    Compiled for sm_90 offline (studies/kernels/resources.py, Triton 3.6), the persistent loop costs 19-75 more
    registers a thread than one program per tile, and the flattened one up to 255 with a few spilled bytes and
    32 KB more shared memory; where the table's tile fits two programs of 8 warps (BLOCK_N 128), the loop alone
    drops that to one, so `p2_cap128` caps the registers at 128 (no spill there) to keep two.

    Where the alignment's BLOCK_M is 128 at 8 warps, the `m64` arms split each block into two sub-blocks of 64 rows
    (config sub_m; the same alignment): the 128 x 256 tile's 3 stages hold 144-176 KB of shared memory and 255
    registers a thread at TP=4 down (one program per SM, top stall `wait`, under ncu), where a static compile (Triton
    3.6, studies/kernels/resources.py) puts bm64/bn256/bk64/w8/s2, persistent and flattened, at 124 registers and 96
    KB: two programs per SM. `m64_p2_pf` is that build, `m64_p2` the same loop unflattened (127 registers, 80 KB: 2),
    `m64` a program per tile with 2 stages (98 registers, 80 KB: 2). The tables took `m64_p2_pf` at TP=4 down (round
    2); its warps now wait on loads (`long_scoreboard`) at 45 % of DRAM peak, so two more arms put more programs, each
    with its loads, on an SM: `m64_n128_p3_pf` (64 x 128 over 4 warps: 144 registers, 56 KB, 3 programs per SM) and
    `m32_n128_p4_pf` (32 x 128 over 4 warps: 127 registers, 22 KB, 4). The sessions that timed each arm:
    studies/kernels/README.md."""
    tma = replace(table, w_desc=True)
    k = 1 if table.num_warps == 8 else 3  # programs per SM the persistent grid launches (what fits, offline)
    arms = dict(table=table, tma=tma, early=replace(table, early_loads=True), p=replace(tma, persistent=k),
                pf=replace(tma, persistent=k, flatten=True))
    # the narrower / wider tile drops a cap the table's tile carries (the 128 of p2_cap128 does not compile at BLOCK_N
    # 256: ptxas asks for 154)
    if table.block_n > 128:
        arms["n128_pf"] = replace(tma, block_n=128, num_stages=3, persistent=k, flatten=True, max_regs=0)
    else:
        arms["n256_pf"] = replace(tma, block_n=256, num_stages=3, persistent=k, flatten=True, max_regs=0)
        if table.num_warps == 8:
            arms["p2_cap128"] = replace(tma, persistent=2, max_regs=128)
    # Look-ahead (round 3): the bytes-bound points short of their goal (TP=4 gate_up and qwen3 down at M = 1024, at
    # 78-90 % of the byte floor) stream weights; one more stage, or a BLOCK_K of 128, puts more bytes in flight a
    # program. The launcher clamps the stages to the shared memory (common.stages_for), so where the table's tile fills
    # it already (qwen3 at BLOCK_M 128: 192 KB) `deep` is the table's build timed twice: an A/A check.
    arms["deep"] = replace(table, num_stages=table.num_stages + 1)
    if table.block_k < 128:
        arms["bk128"] = replace(table, block_k=128)
    # Balance (round 3): ncu has the average SM busy 86 % of the span of TP=4 gate_up at M = 16 and 1024,
    # at the byte floor's bytes (1.02x): its 3 N tiles of 128 per block leave ~4.3 tiles per SM, so some SMs run 5
    # and some 4. Half the BLOCK_N doubles the tiles (finer tail) at fewer registers (Triton 3.6: 59 at BLOCK_M 64,
    # 4 programs per SM with 3 stages, 3 with 4).
    if table.block_n >= 64:
        half = replace(table, block_n=table.block_n // 2, persistent=0, flatten=False, max_regs=0, sub_m=0)
        arms.update(n_half=half, n_half_deep=replace(half, num_stages=table.num_stages + 1))
    # ... or half the rows: sub-blocks of the alignment's BLOCK_M (config sub_m) also double the tiles, and a sub-block
    # of padding only returns at once (bm64/bn128/bk64/w4/s3/m32 at TP=4 gate_up: 116 registers, 40 KB, 4 per SM).
    if bm in (32, 64) and not table.sub_m:
        arms["m_half"] = replace(tma, sub_m=bm // 2)
    if bm == 128 and table.num_warps == 8:
        m64 = replace(tma, sub_m=64, block_n=256, block_k=64, group_m=8, max_regs=0, early_loads=False)
        arms.update(m64_p2_pf=replace(m64, num_stages=2, persistent=2, flatten=True),
                    m64_p2=replace(m64, num_stages=2, persistent=2, flatten=False),
                    m64=replace(m64, num_stages=2, persistent=0, flatten=False),
                    m64_n128_p3_pf=replace(m64, block_n=128, num_warps=4, num_stages=2, persistent=3, flatten=True),
                    m32_n128_p4_pf=replace(m64, sub_m=32, block_n=128, num_warps=4, num_stages=2, persistent=4,
                                           flatten=True))
    if table.w_desc:
        arms.pop("tma")
    return arms
