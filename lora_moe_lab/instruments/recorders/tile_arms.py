"""Named builds of the base MoE GEMM's tile for the recording scripts and scripts/kernel_resources.py (one home:
a script may not import another): the tile's one-token name, and the arms of record_kernels_base's `persist`
section. Host-side config objects only; nothing here launches a kernel.
"""
from __future__ import annotations

from dataclasses import replace

from ...kernels.configs import GemmConfig


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


def cfg_str(bm, cfg: GemmConfig) -> str:
    return tile_str(bm, as_tuple(cfg)) + (f"/p{cfg.persistent}" if cfg.persistent else "") + \
        ("/flat" if cfg.flatten else "") + (f"/cap{cfg.max_regs}" if cfg.max_regs else "") + \
        ("/early" if cfg.early_loads else "")


def persist_arms(bm, table: GemmConfig) -> dict:
    """arm -> GemmConfig at the table's BLOCK_M: the table's tile (with TMA where it lacks it) in a persistent grid
    (1 program per SM at 8 warps, 3 at 4 warps), with and without the flattened loop, and one narrower or wider
    tile persistent and flattened; `early`: the table's tile with the epilogue's gathers issued before the K loop.
    Compiled for sm_90 offline (scripts/kernel_resources.py, Triton 3.6), the persistent loop costs 19-75 more
    registers a thread than one program per tile, and the flattened one up to 255 with a few spilled bytes and
    32 KB more shared memory; where the table's tile fits two programs of 8 warps (BLOCK_N 128), the loop alone
    drops that to one, so `p2_cap128` caps the registers at 128 (no spill there) to keep two."""
    tma = replace(table, w_desc=True)
    k = 1 if table.num_warps == 8 else 3  # programs per SM the persistent grid launches (what fits, offline)
    arms = dict(table=table, tma=tma, early=replace(table, early_loads=True), p=replace(tma, persistent=k),
                pf=replace(tma, persistent=k, flatten=True))
    if table.block_n > 128:
        arms["n128_pf"] = replace(tma, block_n=128, num_stages=3, persistent=k, flatten=True)
    else:
        arms["n256_pf"] = replace(tma, block_n=256, num_stages=3, persistent=k, flatten=True)
        if table.num_warps == 8:
            arms["p2_cap128"] = replace(tma, persistent=2, max_regs=128)
    if table.w_desc:
        arms.pop("tma")
    return arms
