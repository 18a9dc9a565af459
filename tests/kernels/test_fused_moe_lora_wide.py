"""The wide LoRA build (kernels/fused_moe_lora_packed.py, `moe_gemm_lora_wide`): the adapters' columns in the GEMM's
own operands, x_wide = x | u and w_wide = w | B_packed, walked by the plain GEMM's K loop when any adapter is live
(`fused_moe.Tail`), against float64. The down GEMM (u past K of each pair's row) and gate_up (token rows, each pair's
u at its own place past K: the row pointers jump there, `Tail.jump`).

Interpreter on CPU (tiny shapes, fp32), unchanged on CUDA (bf16 added). `out` and x_wide's u columns start
NaN-poisoned: every row of out must be written, every real row of u written before the GEMM reads it (and not read
at all with no adapter live); rows of pairs without a live adapter must equal the plain GEMM bit for bit.
"""
import pytest
import torch
from helpers import covering
from lora_gemm_cases import check_against_float64, make_case

from lora_moe_lab import runtime
from lora_moe_lab.kernels import align as align_mod
from lora_moe_lab.kernels.align import moe_align, slot_major_order, slot_major_order_torch
from lora_moe_lab.kernels.configs import GemmConfig
from lora_moe_lab.kernels.fused_moe import Tail, moe_gemm
from lora_moe_lab.kernels.fused_moe_lora_packed import (lora_shrink_packed, moe_gemm_lora_wide, pack_lora_b,
                                                        wide_columns, wide_weights, x_wide_columns)

DEV = runtime.default_device()
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV.type == "cuda" else [])
# the plain GEMM's tiles the wide build runs as they are: a program per tile (BLOCK_K dividing K and C, and not:
# K predicates), TMA weights, a flattened persistent grid over sub-blocks
TILES = {"ppt": GemmConfig(32, 32, 4, 4, 2), "ppt_k16": GemmConfig(32, 16, 4, 4, 2),
         "desc": GemmConfig(16, 32, 4, 4, 2, w_desc=True),
         "persist_sub": GemmConfig(16, 32, 4, 4, 2, persistent=2, flatten=True, sub_m=16, early_loads=True)}
SHRINKS = {"dense": {}, "win1": dict(slot_window=1), "sub16": dict(sub_m=16)}


def wide_case(c, dtype, E, top_k, N, bm, order=False):
    """Device tensors of a case (down, or gate_up where c["gather"]; N: all of w's rows): x_wide (u columns NaN),
    w_wide, the alignment and the plain GEMM's out."""
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    K = c["x"].shape[1]
    C = wide_columns(c["a"])
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(E, N, K, generator=g) * K ** -0.5).to(dtype)
    x_wide = torch.full((c["x"].shape[0], K + x_wide_columns(c["a"], top_k, c["gather"])), float("nan"), dtype=dtype,
                        device=DEV)
    x_wide[:, :K] = d["x"].to(dtype)
    w_wide = wide_weights(w.to(DEV), pack_lora_b(d["b"].to(dtype)))
    al = moe_align(d["ids"], E, bm, order_by=d["mapping"] if order else None)
    return d, w, x_wide, w_wide, al, K, C


def run_wide(c, dtype, E, top_k, N, bm=16, config=None, shrink=None, order=False, per_block=False, window=0):
    d, w, x_wide, w_wide, al, K, C = wide_case(c, dtype, E, top_k, N, bm, order)
    base = torch.full((c["ids"].numel(), N), float("nan"), dtype=dtype, device=DEV)
    gather = c["gather"]
    moe_gemm(x_wide[:, :K], w_wide[..., :K], al, top_k, base, routed_weights=d["rw"], gather=gather, config=config)
    out = torch.full_like(base, float("nan"))
    res = moe_gemm_lora_wide(x_wide[:, :K], w_wide[..., :K], al, top_k, out, d["a"].to(dtype), d["mapping"],
                             d["lora_ids"], d["enabled"], routed_weights=d["rw"], gather=gather, config=config,
                             shrink=shrink, per_block=per_block, window=window)
    assert res is out
    codes = check_against_float64(c, w, top_k, out, base, dtype,
                                  unwritten="a row of out was not written, or a NaN of u was read")
    return codes, x_wide


@pytest.mark.parametrize("dtype,tile,shrink", covering(DTYPES, TILES, SHRINKS))
def test_wide_matches_reference(dtype, tile, shrink):
    """Fresh random down cases: several slots per block, a rank below BLOCK_R, rows without adapter, a disabled row
    and an empty slot, routed weights, K and N not multiples of the tile."""
    for seed in range(2):
        g = torch.Generator().manual_seed(31 * seed + len(tile) + len(shrink))
        M, N = (int(v) for v in torch.randint(10, 40, (2,), generator=g))
        K = 32 * int(torch.randint(1, 3, (1,), generator=g)) + (0 if seed == 0 else 16)
        c = make_case(seed + 5, M, K, N, 5, 3, 4, 4, 5 + seed * 7, 1, gather=False, with_rw=True,
                      lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
        bm = 32 if tile == "ppt" else 16
        codes, _ = run_wide(c, dtype, 5, 3, N, bm=bm, config=TILES[tile], shrink=SHRINKS[shrink],
                            order=shrink == "win1")
        assert (codes == 0).any() and (codes != 0).any()


GATE_UP_SHRINKS = dict(SHRINKS, w1s=dict(slot_window=1, both_slices=True, sub_m=16))


@pytest.mark.parametrize("dtype,tile,shrink", covering(DTYPES, TILES, GATE_UP_SHRINKS))
def test_wide_gate_up_matches_reference(dtype, tile, shrink):
    """gate_up: x's rows are tokens, each of a token's top_k pairs has its own u past K, two slices (a tile across
    the gate/up boundary where N/2 is not a multiple of BLOCK_N). K a multiple of every tile's BLOCK_K (the pointers
    jump between two K steps); the tail C not always one (K predicates in the tail only)."""
    for seed in range(2):
        g = torch.Generator().manual_seed(17 * seed + len(tile) + len(shrink))
        M, NS = (int(v) for v in torch.randint(8, 30, (2,), generator=g))
        K = 32 * int(torch.randint(1, 4, (1,), generator=g))
        R = 5 + seed * 7  # BLOCK_R 16: C = 2 x 4 x 16 = 128 (down: 64)
        c = make_case(seed + 9, M, K, NS, 5, 3, 3, 4, R, 2, gather=True,
                      lora_ids=[0, 2, -1, 1], enabled=[1, 1, 1, 0])
        bm = 32 if tile == "ppt" else 16
        codes, x_wide = run_wide(c, dtype, 5, 3, 2 * NS, bm=bm, config=TILES[tile], shrink=GATE_UP_SHRINKS[shrink],
                                 order=shrink != "dense")
        assert (codes == 0).any() and (codes != 0).any()
        assert not torch.isnan(x_wide).any(), "a pair's u columns were not written"


@pytest.mark.parametrize("dtype,tile,shrink,op", covering(DTYPES, ["ppt", "desc", "persist_sub"], ["dense", "w1s"],
                                                          ["gate_up", "down"]))
def test_wide_per_block_matches_reference(dtype, tile, shrink, op):
    """per_block: each tile walks only its block's slot columns of its own slice (BLOCK_K 32 over BLOCK_R 16: a
    range rounded out to whole steps takes a neighbouring slot's zeros), on the base alignment (every slot in a
    block) and the ordered one (one or two); N per slice not a multiple of BLOCK_N (tiles across the slices)."""
    gu = op == "gate_up"
    for seed in range(2):
        g = torch.Generator().manual_seed(23 * seed + len(tile) + len(shrink) + len(op))
        M, NS = (int(v) for v in torch.randint(8, 30, (2,), generator=g))
        K = 32 * int(torch.randint(1, 4, (1,), generator=g))
        c = make_case(seed + 13, M, K, NS, 5, 3, 3, 4, 5 + seed * 7, 2 if gu else 1, gather=gu, with_rw=not gu,
                      lora_ids=[0, 2, -1, 1], enabled=[1, 1, 1, 0])
        sh = GATE_UP_SHRINKS[shrink] if gu else dict(GATE_UP_SHRINKS[shrink], both_slices=False)
        codes, x_wide = run_wide(c, dtype, 5, 3, NS * (2 if gu else 1), bm=32 if tile == "ppt" else 16,
                                 config=TILES[tile], shrink=sh, order=seed == 1, per_block=True)
        assert (codes == 0).any() and (codes != 0).any()


# the window reads w's tail through TMA (past K + C the copy fills zeros): the tiles with TMA weights
WIN_TILES = {"desc": TILES["desc"], "ppt_desc": GemmConfig(32, 32, 4, 4, 2, w_desc=True),
             "persist_sub_desc": GemmConfig(16, 32, 4, 4, 2, w_desc=True, persistent=2, flatten=True, sub_m=16,
                                            early_loads=True)}


@pytest.mark.parametrize("dtype,tile,slots", covering(DTYPES, WIN_TILES, ["adjacent", "spread"]))
def test_wide_window_matches_reference(dtype, tile, slots):
    """The down GEMM's window (`window=32`: two slots of BLOCK_R 16, one BLOCK_K step of 32, against C = 64): on the
    ordered alignment with slots 2 and 3 in use every block fits a window (from column 32: a tile that started at 0
    would miss slot 3); with slots 0, 1 and 3 some block spills over and every tile walks all C. Enough tokens that
    a block of 32 rows fills its second program of 16 (sub_m 16): each program shifts by the whole block's window.
    Both against float64, out and u NaN-poisoned."""
    lids = [2, 3, -1, 3] if slots == "adjacent" else [0, 3, -1, 1]  # slots 2, 3: the window starts past 0
    for seed in range(2):
        g = torch.Generator().manual_seed(29 * seed + len(tile) + len(slots))
        M, N = int(torch.randint(40, 70, (1,), generator=g)), int(torch.randint(8, 30, (1,), generator=g))
        K = 32 * int(torch.randint(1, 4, (1,), generator=g))
        c = make_case(seed + 19, M, K, N, 5, 3, 4, 4, 5 + seed * 7, 1, gather=False, with_rw=True, lora_ids=lids,
                      enabled=[1, 1, 1, 0])
        codes, _ = run_wide(c, dtype, 5, 3, N, bm=32 if tile == "ppt_desc" else 16, config=WIN_TILES[tile],
                            shrink=dict(slot_window=1, sub_m=16 if seed else 0), order=seed == 0, window=32)
        assert (codes == 0).any() and (codes != 0).any()


@pytest.mark.parametrize("order", [True, False])
def test_shrink_window_decides_the_tail_from_every_block(order):
    """tail_cols after the shrink with tail_win: the window where every block's live slot columns [lo, hi) span at
    most it, C where one spans more, 0 with nothing live; the blocks' ranges are those the GEMM reads."""
    for lids, en in (([2, 3, -1, 3], [1, 1, 1, 0]), ([0, 3, -1, 1], [1, 1, 1, 1]), ([0, 1, 2, 3], [0, 0, 0, 0])):
        c = make_case(3, 40, 64, 16, 5, 3, 4, 4, 8, 1, gather=False, lora_ids=lids, enabled=en)
        d, _, x_wide, _, al, K, C = wide_case(c, torch.float32, 5, 3, 16, 16, order)
        u = torch.as_strided(x_wide, (40, 3, 1, C), (3 * x_wide.stride(0), x_wide.stride(0), C, 1), K)
        blk = torch.full((al.expert_ids.shape[1], 2), -7, dtype=torch.int32, device=DEV)
        cols = torch.full((1,), 99, dtype=torch.int32, device=DEV)  # the launcher zeroes it first
        lora_shrink_packed(x_wide[:, :K], d["a"], al, 3, d["mapping"], d["lora_ids"], d["enabled"], u, blk,
                           gather=False, u_pair=True, tail_cols=cols, tail_win=32)
        live = [b for b in blk.tolist() if b[1] > b[0]]
        want = 0 if not live else (32 if all(hi - lo <= 32 for lo, hi in live) else C)
        assert int(cols) == want, (lids, en, live)
        if lids == [2, 3, -1, 3] and order:
            assert want == 32  # two adjacent slots on the ordered alignment: every block fits


def test_window_errors():
    c = make_case(1, 12, 64, 16, 5, 3, 4, 4, 8, 1, gather=False)
    d, _, x_wide, w_wide, al, K, C = wide_case(c, torch.float32, 5, 3, 16, 16)
    out = torch.empty(36, 16, device=DEV)
    args = (x_wide[:, :K], w_wide[..., :K], al, 3, out, d["a"], d["mapping"], d["lora_ids"], d["enabled"])
    with pytest.raises(ValueError, match="needs u_pair, one slice and a multiple of BLOCK_R"):
        moe_gemm_lora_wide(*args, window=24)
    with pytest.raises(ValueError, match="window is the down GEMM's"):
        moe_gemm_lora_wide(*args, window=32, per_block=True)
    with pytest.raises(ValueError, match="must be a multiple of the tile's BLOCK_K=64"):
        moe_gemm_lora_wide(*args, window=32, config=GemmConfig(32, 64, 4, 4, 2, w_desc=True))
    with pytest.raises(ValueError, match="needs the tile's TMA weight loads"):
        moe_gemm_lora_wide(*args, window=32, config=GemmConfig(32, 32, 4, 4, 2))


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("shrink_name", ["dense", "w1s"])
def test_shrink_block_order_is_the_same_u_bit_for_bit(shrink_name, contiguous):
    """slot_major_order: the gate_up shrink's programs take the ordered alignment's blocks slot by slot (a slot's
    blocks first, padding and blocks without a live slot last). Each block is computed as before: u (NaN-poisoned
    first, so every real row is written) and the block ranges the same bit for bit; the order is a permutation."""
    M, top_k, E = 26, 3, 5
    mapping = [i * 4 // M for i in range(M)] if contiguous else None  # a request's tokens side by side, or random
    c = make_case(31, M, 64, 12, E, top_k, 3, 4, 8, 2, gather=True, mapping=mapping, lora_ids=[0, 2, -1, 1],
                  enabled=[1, 1, 1, 0])
    d, w, x_wide, w_wide, al, K, C = wide_case(c, torch.float32, E, top_k, 24, 16, order=True)
    order = slot_major_order(al, top_k, d["mapping"], d["lora_ids"], 4)
    assert torch.equal(order, slot_major_order_torch(al, top_k, d["mapping"], d["lora_ids"], 4))

    def shrink(enabled=d["enabled"], **kw):
        """The shrink into a copy of x_wide (u NaN) and a poisoned blk: (x_wide after, blk)."""
        xw = x_wide.clone()
        u = torch.as_strided(xw, (M, top_k, 2, C // 2), (xw.stride(0), C, C // 2, 1), K)
        blk = torch.full((al.expert_ids.shape[1], 2), -7, dtype=torch.int32, device=DEV)
        lora_shrink_packed(xw[:, :K], d["a"], al, top_k, d["mapping"], d["lora_ids"], enabled, u, blk, u_pair=True,
                           tail_cols=torch.zeros(1, dtype=torch.int32, device=DEV), **GATE_UP_SHRINKS[shrink_name],
                           **kw)
        return xw, blk

    ref = shrink()
    assert not torch.isnan(ref[0]).any()
    for xw, blk in (shrink(block_order=order), shrink(slot_order=True)):  # given, or computed by the launcher
        assert torch.equal(ref[0], xw) and torch.equal(ref[1], blk)
    # nothing live: the programs keep their own blocks and never read the order (here: out of range everywhere)
    xw, blk = shrink(torch.zeros_like(d["enabled"]), block_order=torch.full_like(order, 1 << 30))
    assert (blk == 0).all() and torch.isnan(xw[:, K:]).all()
    with pytest.raises(ValueError, match="block_order must be an int32 permutation"):
        shrink(block_order=order[:-1])


@pytest.mark.parametrize("chunk", [4096, 32])
@pytest.mark.parametrize("seed", range(4))
def test_slot_major_order_matches_the_torch_reference(seed, chunk, monkeypatch):
    """The order kernel (one program, a counting sort: every block in one step, or in steps of 32 blocks) against
    the torch reference: a permutation, slot-major, stable; mappings with rows of no adapter (-1), slots without a
    row, an empty slot, the plain and the ordered alignment. With nothing live it writes nothing."""
    monkeypatch.setattr(align_mod, "ORDER_CHUNK", chunk)
    g = torch.Generator().manual_seed(seed)
    M, E, top_k, S = (300, 700, 57, 1200)[seed], (8, 64, 5, 128)[seed], (2, 8, 3, 4)[seed], (4, 4, 2, 8)[seed]
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)]).int().to(DEV)
    mapping = torch.randint(-1, 3, (M,), generator=g, dtype=torch.int32).to(DEV)
    lora_ids = torch.tensor([S - 1, 0, -1], dtype=torch.int32, device=DEV)
    al = moe_align(ids, E, (16, 64, 16, 32)[seed], order_by=mapping if seed % 2 else None)
    got = slot_major_order(al, top_k, mapping, lora_ids, S)
    assert got.dtype == torch.int32 and got.shape == (al.expert_ids.shape[1],)
    assert torch.equal(got, slot_major_order_torch(al, top_k, mapping, lora_ids, S))
    assert sorted(got.tolist()) == list(range(al.expert_ids.shape[1]))
    poison = torch.full_like(got, -7)  # slot -1's flag alone is on: nothing live, the kernel returns at once
    slot_major_order(al, top_k, mapping, lora_ids, S, torch.tensor([0, 0, 1], dtype=torch.int32, device=DEV),
                     out=poison)
    assert (poison == -7).all()
    assert torch.equal(slot_major_order(al, top_k, mapping, lora_ids, S, out=poison), got)


@pytest.mark.parametrize("slot_order", [False, True])
@pytest.mark.parametrize("per_block", [False, True])
@pytest.mark.parametrize("tile", TILES)
def test_wide_nothing_live_reads_no_u_and_is_the_plain_gemm(tile, per_block, slot_order):
    """Every adapter disabled: the shrink writes nothing (u stays NaN) and the GEMM stops at K (NaN never read):
    every row bit for bit the plain GEMM's. slot_order: the order kernel returns without writing the order, and the
    shrink's programs keep their own blocks (they must not read it)."""
    c = make_case(3, 20, 32, 24, 4, 2, 2, 2, 8, 1, gather=False, with_rw=True, enabled=[0, 0])
    codes, x_wide = run_wide(c, torch.float32, 4, 2, 24, config=TILES[tile], per_block=per_block,
                             shrink=dict(slot_order=True) if slot_order else None)
    assert (codes != 0).all()
    assert torch.isnan(x_wide[:, 32:]).all()


def test_wide_tile_deeper_than_the_tail():
    """BLOCK_K 128 over K = 128 and C = 64 adapter columns: K is a multiple of the tile but K + C is not, so the last
    step needs K predicates (unmasked it read the next row's x, and past the end of x_wide on the last row: the
    GPU differential's NaN, wide_s1c). Pointer weights: beyond K + C they would read the next row of w too."""
    c = make_case(9, 24, 128, 24, 4, 3, 4, 3, 16, 1, gather=False, with_rw=True)
    codes, _ = run_wide(c, torch.float32, 4, 3, 24, config=GemmConfig(32, 128, 4, 4, 2))
    assert (codes == 0).any()


def test_wide_errors():
    c = make_case(4, 6, 32, 16, 4, 2, 2, 2, 8, 1, gather=False)
    d, w, x_wide, w_wide, al, K, C = wide_case(c, torch.float32, 4, 2, 16, 16)
    out = torch.empty(12, 16, device=DEV)
    args = (al, 2, out, d["a"], d["mapping"], d["lora_ids"], d["enabled"])
    with pytest.raises(ValueError, match="x must be the first K=32 columns of a tensor with K \\+ 32 = 64"):
        moe_gemm_lora_wide(x_wide[:, :K].contiguous(), w_wide[..., :K], *args)
    with pytest.raises(ValueError, match="w must be the first K=32 columns"):
        moe_gemm_lora_wide(x_wide[:, :K], w.to(DEV), *args)
    with pytest.raises(ValueError, match="lora_a must be \\(1, S, E, R, K\\)"):
        moe_gemm_lora_wide(x_wide[:, :K], w_wide[..., :K], al, 2, out, d["a"].expand(2, -1, -1, -1, -1),
                           *args[4:])
    with pytest.raises(ValueError, match="tail needs x to be the first K=32 columns"):
        moe_gemm(x_wide[:, :K].contiguous(), w_wide[..., :K], al, 2, out, gather=False,
                 tail=Tail(C, torch.zeros(1, dtype=torch.int32, device=DEV)))
    with pytest.raises(ValueError, match="wide_weights: b_packed"):
        wide_weights(w, torch.zeros(4, 8, C))


def test_wide_gate_up_errors():
    """gate_up's x rows must hold top_k tails; K must be a multiple of BLOCK_K (the jump between two K steps)."""
    c = make_case(4, 6, 48, 8, 4, 2, 2, 2, 8, 2, gather=True)
    d, w, x_wide, w_wide, al, K, C = wide_case(c, torch.float32, 4, 2, 16, 16)
    out = torch.empty(12, 16, device=DEV)
    args = (al, 2, out, d["a"], d["mapping"], d["lora_ids"], d["enabled"])
    narrow = torch.zeros(6, K + C, device=DEV)  # one pair's tail, not top_k = 2
    with pytest.raises(ValueError, match="x must be the first K=48 columns of a tensor with K \\+ 128 = 176"):
        moe_gemm_lora_wide(narrow[:, :K], w_wide[..., :K], *args, gather=True)
    with pytest.raises(ValueError, match="lora_a must be \\(2, S, E, R, K\\), the gate_up GEMM's"):
        moe_gemm_lora_wide(x_wide[:, :K], w_wide[..., :K], al, 2, out, d["a"][:1], *args[4:], gather=True)
    with pytest.raises(ValueError, match="needs K=48 to be a multiple of the tile's BLOCK_K=32"):
        moe_gemm_lora_wide(x_wide[:, :K], w_wide[..., :K], *args, gather=True, config=GemmConfig(16, 32, 4, 4, 2))
    with pytest.raises(ValueError, match="tail.jump=8 needs gathered rows \\(gather=True\\) and jump >= tail.c=64"):
        moe_gemm(x_wide[:, :K], w_wide[..., :K], al, 2, out, gather=True,
                 tail=Tail(C, torch.zeros(1, dtype=torch.int32, device=DEV), 8))
