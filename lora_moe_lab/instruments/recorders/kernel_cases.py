"""The inputs and timed cases the kernel recordings share (studies/kernels/record_decode.py,
studies/kernels/record_expand.py, studies/kernels/record_fused.py): LoRA weights and input sets at a preset, the
decode kernel's random differential against float64, the whole LoRA path of a layer at decode sizes
(today's aligned path against the decode path, with the all-disabled exit against same-grid empty
kernels), and one MoE layer with and without LoRA. Rows go to harness.ROWS.

Module constants (PRESETS, S, RANK, BF, PATH_M, LAYER_M) are read at call time, so a dry run
(`set_tiny`) shrinks every case at once.
"""
from __future__ import annotations

import json
import random
import time

import torch

from ...config import LoRAConfig, get_shape
from ...kernels import configs, fused_moe_lora, plan_table
from ...kernels.align import moe_align
from ...kernels.configs import DecodeConfig, lora_block_m
from ...kernels.empty import empty_args_kernel
from ...kernels.fused_moe_lora import lora_delta
from ...kernels.lora_decode import decode_launch_plan, lora_delta_decode
from ...model.lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo
from ...model.moe import LoRAHook, MoELayer
from ...ops import get_backend
from ...ops.reference import ref_lora_delta_grouped, ref_moe_gemm_grouped, tolerance
from ...ops.reference_rows import ref_lora_delta_rows
from .harness import ROWS, graph_time_us, log, route, row

PRESETS = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
S, RANK, BF = 4, 32, torch.bfloat16
PATH_M = (1, 2, 4, 8, 16, 32, 64)
LAYER_M = tuple(2 ** i for i in range(15))  # 1 .. 16384


def set_tiny() -> None:
    """The dry run's shapes: the tiny preset, fp32 (the interpreter's bf16 is wrong), rank 8."""
    global PRESETS, PATH_M, LAYER_M, BF, RANK
    PRESETS, PATH_M, LAYER_M, BF, RANK = ("tiny",), (1, 8), (1, 16), torch.float32, 8


def case_seed(seed: int, i: int) -> int:
    """Case i's own seed: a case's inputs do not depend on which cases ran before it, so a differential split over
    processes (`shard`) runs exactly the cases one process would."""
    return seed * 1_000_003 + i


def differential(dev, n_cases, seed=0, shard=(0, 1)) -> dict:
    """The decode kernel's random differential (studies/kernels/record_decode.py, section diff): cases
    shard[0], shard[0] + shard[1], ... below n_cases, each from its own seed. One row; returns it."""
    j, n_jobs = shard
    fails, worst, variants, ran = [], {}, set(), 0
    for i in range(j, n_cases, n_jobs):
        rng = random.Random(case_seed(seed, i))
        g = torch.Generator().manual_seed(case_seed(seed, i))
        dtype = (torch.float32, torch.float16, torch.bfloat16 if dev.type == "cuda" else torch.float16)[i % 3]
        P, gather = (2, True) if i % 2 == 0 else (1, False)
        M, E = rng.randint(1, 16), rng.choice((8, 16, 33))
        k, Sn = rng.randint(1, 8), rng.randint(1, 4)
        L, R = rng.randint(1, Sn), rng.choice((16, 32, 32, 48))
        K, N = rng.choice((37, 96, 128, 208)), rng.choice((45, 64, 160, 71))
        if i % 8 == 4:  # gate_up of one or two tokens with a long K: the table's BLOCK_K 512 / 8-warp tile
            M, k, K = rng.randint(1, 2), rng.randint(1, 4), rng.choice((1040, 2048))
        c_ = configs.decode_config(M * k, P, N, K, R)  # split_n is a run-time argument: not a compile variant
        variants.add(f"bn{c_.block_n}/bk{c_.block_k}/w{c_.num_warps}/br{configs.block_r(R)}")
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).int()
        ids.view(-1)[torch.randperm(M * k, generator=g)[:rng.choice((0, 0, 1, 3))]] = -1
        a = torch.randn(P, Sn, E, R, K, generator=g) * K ** -0.5
        b = torch.randn(P, Sn, E, N, R, generator=g) * R ** -0.5
        slot_r = [rng.randint(1, R) for _ in range(Sn)]
        for s, r in enumerate(slot_r):  # per-slot ranks zero-padded to the pool's R, as the adapter pool does
            a[:, s, :, r:] = 0
            b[:, s, :, :, r:] = 0
        x = torch.randn(M if gather else M * k, K, generator=g)
        mapping = torch.randint(-1, L, (M,), generator=g).int()
        lora_ids = torch.tensor([rng.choice(list(range(Sn)) + [-1]) for _ in range(L)], dtype=torch.int32)
        enabled = torch.tensor([rng.choice((0, 1, 1, 1)) for _ in range(L)], dtype=torch.int32)
        rw = torch.rand(M, k, generator=g) + 0.1 if not gather else None
        # half the cases read each row's own rank (the batch's lora_ranks: its slot's, a few 0 = the padded R), and
        # must equal the padded launch bit for bit
        own = i % 4 in (2, 3)
        ranks = torch.tensor([(slot_r[s] if rng.random() < 0.9 else 0) if s >= 0 else rng.randint(0, R)
                              for s in lora_ids.tolist()], dtype=torch.int32) if own else None
        flags = i % 3 == 1  # a third with the live count and the exit map
        live = rng.randint(0, M * k) if flags else None
        x, a, b = (t.to(dtype) for t in (x, a, b))
        ref, codes = ref_lora_delta_rows(x, a, b, ids, mapping, lora_ids, enabled, routed_weights=rw,
                                         gather=gather, num_live_pairs=live)
        on = codes == 0
        # `out` starts on the scale of the delta it receives: a delta far below out's rounding step (a
        # rank-1 slot, an x nearly orthogonal to A) is lost in the add, and out - out0 cannot resolve it
        # (seen on the H200 in a random fp16 case, delta 1e-4 on out ~1, and the same error under the interpreter;
        # studies/kernels/README.md).
        scale = max(ref[on].abs().max().item(), 1e-4) if on.any() else 1.0
        out0 = (torch.randn(M * k, P * N, generator=g) * scale).to(dtype)
        out0[~on] = float("nan")
        out = out0.to(dev, copy=True)
        ex = torch.full((M * k,), -7, dtype=torch.int32, device=dev) if flags else None
        cnt = torch.tensor([live], dtype=torch.int32, device=dev) if flags else None
        args = (x.to(dev), a.to(dev), b.to(dev), ids.to(dev), mapping.to(dev), lora_ids.to(dev), enabled.to(dev))
        kw = dict(routed_weights=None if rw is None else rw.to(dev), gather=gather, num_live_pairs=cnt)
        lora_delta_decode(*args, out, exit_codes=ex, lora_ranks=None if ranks is None else ranks.to(dev), **kw)
        out = out.cpu()
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        untouched = torch.equal(out[~on].view(bits), out0[~on].view(bits))
        if own:  # the padded launch on the same start: the same bits everywhere
            padded = lora_delta_decode(*args, out0.to(dev, copy=True), **kw).cpu()
            untouched = untouched and torch.equal(out.view(bits), padded.view(bits))
        err = 0.0
        if on.any():
            d = out[on].double() - out0[on].double()
            err = (((d - ref[on]).norm() / ref[on].norm().clamp_min(1e-300)).item() if torch.isfinite(d).all()
                   else float("inf"))
        codes_ok = ex is None or torch.equal(ex.cpu(), codes)
        ok = untouched and err < tolerance(dtype, dev) and codes_ok
        key = str(dtype)[6:]
        worst[key] = max(worst.get(key, 0.0), err)
        if not ok:
            fails.append(dict(i=i, dtype=key, M=M, K=K, N=N, R=R, P=P, err=err, untouched=untouched, codes=codes_ok))
        ran += 1
        if ran % 200 == 0:
            log(f"differential: {ran} cases, {len(fails)} failures")
    r = row(section="diff", op="lora_delta_decode", cases=ran, failures=len(fails), seed=seed,
            worst=json.dumps(worst), fail_examples=json.dumps(fails[:5]), table_tiles=json.dumps(sorted(variants)))
    log(f"differential: {ran} cases, {len(fails)} failures, worst rel err {worst}; decode tiles {sorted(variants)}")
    for f in fails[:5]:
        log(f"  FAIL {f}")
    return r


def random_lora_case(rng, g, dev, dtype, *, M, E, k, L, S, R, K, N, P, gather) -> dict:
    """One random case of a GEMM with its LoRA delta (the folded and fused differentials): x, w, A and B of S
    slots, top-k routing, L LoRA rows (a token on row -1 has no adapter; a row's slot may be -1 and its adapter
    disabled); `ref` the float64 GEMM + delta, `live` the rows that have a live adapter."""
    def rnd(*s_, std=1.0):
        return (torch.randn(*s_, generator=g, device=dev) * std).to(dtype)

    x, w = rnd(M if gather else M * k, K), rnd(E, P * N, K, std=K ** -0.5)
    a, b = rnd(P, S, E, R, K, std=K ** -0.5), rnd(P, S, E, N, R, std=R ** -0.5)
    rw, ids = route(M, E, k, g, dev)
    rw = None if gather else rw
    mapping = torch.randint(-1, L, (M,), generator=g, device=dev, dtype=torch.int32)
    lids = torch.tensor([rng.choice(list(range(S)) + [-1]) for _ in range(L)], dtype=torch.int32, device=dev)
    en = torch.tensor([rng.choice((0, 1, 1)) for _ in range(L)], dtype=torch.int32, device=dev)
    d, codes = ref_lora_delta_rows(x, a, b, ids, mapping, lids, en, routed_weights=rw, gather=gather)  # rows -> slots
    ref = ref_moe_gemm_grouped(x, w, ids, k, rw, gather) + d.to(dev)
    return dict(x=x, w=w, a=a, b=b, rw=rw, ids=ids, mapping=mapping, lids=lids, en=en, ref=ref,
                live=(codes == 0).to(dev))


def random_gemm_case(rng, g, dev, dtype, i) -> dict:
    """The i-th random base-GEMM launch of a GPU differential: gather on 2 of 3, routed weights on 1 of 4, K and N
    tile multiples on even i (predicate-free loads) or not (multiples of 8, so TMA rows stay 16-byte aligned)."""
    gather = i % 3 != 0
    M, E, bm = rng.randint(1, 300), rng.choice((4, 16)), rng.choice((16, 64))
    k = rng.randint(1, min(8, E))
    even = i % 2 == 0
    K = rng.choice((128, 256)) if even else rng.choice((72, 200))
    N = rng.choice((128, 256)) if even else rng.choice((40, 136))
    x = torch.randn(M if gather else M * k, K, generator=g, device=dev).to(dtype)
    w = (torch.randn(E, N, K, generator=g, device=dev) * K ** -0.5).to(dtype)
    rw, ids = route(M, E, k, g, dev)
    return dict(x=x, w=w, ids=ids, rw=rw if i % 4 == 1 else None, k=k, gather=gather, align=moe_align(ids, E, bm),
                out=torch.full((M * k, N), float("nan"), dtype=dtype, device=dev))


def stages_candidates(op, table) -> list:
    """The aligned LoRA delta's `stages` candidates beside the table's tile `table`: the expand loop
    pipelined by Triton (`expand_stages` 2-4, the hand prefetch and the register cap off: the `out` tiles stream
    into shared memory), and for the down delta also BLOCK_N 256 over 8 warps with 3 stages, and the table's tile
    over 8 warps with 3 stages (the hypothesis: more warps to hide the `out` loads at the same programs per SM;
    measured on the H200: 166 registers at BLOCK_M 64, one program per SM, 1.2-1.3x slower; studies/kernels/README.md).
    (block_m, config) pairs at the table's BLOCK_M is the caller's part."""
    from dataclasses import replace

    out = [replace(table, prefetch=0, max_regs=0, expand_stages=xs) for xs in (2, 3, 4) if xs != table.expand_stages]
    if op == "down":
        out.append(replace(table, block_n=256, num_warps=8, prefetch=0, max_regs=0, expand_stages=3))
        out.append(replace(table, num_warps=8, prefetch=0, max_regs=0, expand_stages=3))
    if table.expand_stages:  # the table pipelines already: the hand prefetch it replaced, for the paired check
        out.append(replace(table, expand_stages=0, prefetch=2))
    return out


def down_candidates(table) -> list:
    """The down delta's `down` candidates at M >= 1024 beside the table's tile `table` (80-84 % of the copy
    bandwidth at M = 1024-4096, goal 85 %), each with Triton's pipelined expand: BLOCK_N 64 (fewer registers, so
    more programs per SM, each with half the `out` bytes in flight), BLOCK_K 32 on the shrink (a smaller x tile),
    a register cap of 168 (3 programs of 4 warps per SM; the compiler may spill), 4 stages at BLOCK_N 64, and BLOCK_N
    64 on a grid of 5 programs per SM (at BLOCK_M 16 its 101 registers fit 5). Static compile with Triton 3.6
    (studies/kernels/resources.py, qwen3): at BLOCK_M 64 the table's tile holds 254 registers (2 programs per SM),
    BLOCK_N 64 160 (3), the cap 168 spills 200 B; at BLOCK_M 16 166 (3) against 101 (5) and BLOCK_K 32 128 (4).
    Timed on the H200 in two device sessions, every candidate lost to the table but BLOCK_N 64 at qwen3 M = 4096
    (0.98x, unpaired), and ncu saw occupancy rise while DRAM throughput fell (the kernels study:
    studies/kernels/README.md). (block_m, config) pairs are the caller's."""
    from dataclasses import replace

    xs = dict(prefetch=0, max_regs=0, expand_stages=3)
    return [replace(table, block_n=64, **xs), replace(table, block_n=64, **dict(xs, expand_stages=4)),
            replace(table, block_n=64, programs_per_sm=5, **xs),
            replace(table, block_k=32, **xs), replace(table, block_n=64, block_k=32, **xs),
            replace(table, **dict(xs, max_regs=168))]


def balance_candidates(table, block_m: int) -> list:
    """The down delta's `balance` candidates (round 2) beside the table's tile `table` at BLOCK_M
    `block_m`. Round 1 (above) rejected more programs per SM. Two hypotheses are left, each with its own arms:
    * load balance: the persistent grid hands item g to program g % nprog, and an item's time is its rows' bytes, so
      at M = 1024-4096 (about 2-4 items a program, blocks 1-64 rows full) the last programs run alone. SPLIT_N 2 and
      4 cut each item's columns into smaller items (more of them, each re-running the shrink: x read 2-4 times);
    * bytes in flight at BLOCK_M 16 (M = 1024): a 16 x 128 `out` tile is 4 KB, so 3 programs with 2 tiles ahead hold
      24 KB of `out` reads per SM, about what Little's law asks at 4.2 TB/s (~25 KB a SM for ~0.8 us). BLOCK_N 256
      over 8 warps (alone and split in 2) holds 32 KB (Triton 3.6, studies/kernels/resources.py: 128 registers, 53 KB,
      2 programs per SM).
    At BLOCK_M 64 the table already holds 64 KB a SM, so there BLOCK_N 64 (0.98x at qwen3 M = 4096 in round 1) runs
    beside the split instead. ncu's sm__cycles_active avg / max over the SMs reads the imbalance."""
    from dataclasses import replace

    out = [replace(table, split_n=2), replace(table, split_n=4)]
    if block_m == 16:
        wide = replace(table, block_n=256, num_warps=8, prefetch=0, max_regs=0, expand_stages=3)
        return out + [wide, replace(wide, split_n=2)]
    if table.block_n == 128 and table.block_k == 64:
        out.append(replace(table, block_n=64, prefetch=0, max_regs=0, expand_stages=3))
    return out


def lora_layer(preset, dev):
    """One MoE layer of `preset` (bf16, seeded) on the Triton backend and an adapter pool with S adapters of
    rank RANK loaded as a0..a{S-1}: (shape, backend, layer, pool)."""
    sh = get_shape(preset)
    backend = get_backend("triton", dev)
    layer = MoELayer(sh, BF, dev, torch.Generator(device=dev).manual_seed(1))
    pool = AdapterPool(sh, LoRAConfig(max_loras=S, max_rank=RANK), num_layers=1, dtype=BF, device=dev)
    for i in range(S):
        pool.load(f"a{i}", rank=RANK, seed=i)
    return sh, backend, layer, pool


def base_weights(sh, dev, gen):
    """The base MoE weights at a preset's shapes: w13 (E, 2I, K) and w2 (E, K, I), drawn in that order."""
    K, I, E = sh.hidden, sh.intermediate, sh.num_experts
    return ((torch.randn(E, 2 * I, K, generator=gen, device=dev) * K ** -0.5).to(BF),
            (torch.randn(E, K, I, generator=gen, device=dev) * I ** -0.5).to(BF))


def preset_lora_cases(dev, gen, check_m, *, table: bool):
    """The base GEMM with a LoRA delta at the presets' shapes (bf16), for checks of a fused kernel: per
    preset, M in `check_m` and GEMM, a dict of its inputs (x, w, a, b, rw, gather, ids, mapping, lids, en,
    top_k k, the base alignment `align`: the tuned table's BLOCK_M when `table`, else the rules') and
    its float64 reference `ref` with `live`, the pairs whose token has a live adapter. LoRA rows: 0 and 2
    live, 1 disabled, 3 without a slot; tokens on every row and on none."""
    lids = torch.tensor([0, 1, 2, -1], dtype=torch.int32, device=dev)
    en = torch.tensor([1, 0, 1, 1], dtype=torch.int32, device=dev)
    for preset in PRESETS:
        sh = get_shape(preset)
        K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
        w13, w2 = base_weights(sh, dev, gen)
        a13, b13, a2, b2 = weights(sh, dev, gen)
        for M in check_m:
            x = torch.randn(M, K, generator=gen, device=dev).to(BF)
            h = torch.randn(M * k, I, generator=gen, device=dev).to(BF)
            rw, ids = route(M, E, k, gen, dev)
            mapping = torch.randint(-1, S, (M,), generator=gen, device=dev, dtype=torch.int32)
            bm = configs.moe_block_m(M, k, E, K, I) if table else configs.moe_block_m(M, k, E)
            al = moe_align(ids, E, bm)
            for op, xin, w, a, b, r, gather in (("gate_up", x, w13, a13, b13, None, True),
                                                ("down", h, w2, a2, b2, rw, False)):
                d, live = ref_lora_delta_grouped(xin, a, b, ids, mapping, lids, en, k, r, gather)
                yield dict(preset=preset, M=M, op=op, x=xin, w=w, a=a, b=b, rw=r, gather=gather, ids=ids, k=k,
                           mapping=mapping, lids=lids, en=en, align=al,
                           ref=ref_moe_gemm_grouped(xin, w, ids, k, r, gather) + d, live=live)


def weights(sh, dev, gen):
    K, I, E = sh.hidden, sh.intermediate, sh.num_experts

    def rnd(*size, std):
        return (torch.randn(*size, generator=gen, device=dev) * std).to(BF)

    return (rnd(2, S, E, RANK, K, std=K ** -0.5), rnd(2, S, E, I, RANK, std=RANK ** -0.5),
            rnd(1, S, E, RANK, I, std=I ** -0.5), rnd(1, S, E, K, RANK, std=RANK ** -0.5))


def make_set(sh, M, dev, gen):
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    rw, ids = route(M, E, k, gen, dev)
    return dict(x=torch.randn(M, K, generator=gen, device=dev).to(BF), rw=rw, ids=ids,
                slot=torch.randint(0, S, (M,), generator=gen, device=dev, dtype=torch.int32),
                act=torch.randn(M * k, I, generator=gen, device=dev).to(BF),
                inter=torch.randn(M * k, 2 * I, generator=gen, device=dev).to(BF),
                down=torch.randn(M * k, K, generator=gen, device=dev).to(BF))


class _EmptyLike:
    """Stands in for fused_moe_lora_kernel: `[grid](*args, **constexprs)` launches the empty kernel
    with the very grid and positional arguments the LoRA launcher computed."""

    def __getitem__(self, grid):
        return lambda *args, num_warps=4, **_: empty_args_kernel[grid](*args, num_warps=num_warps)


def aligned_empty(*a, **kw):
    real = fused_moe_lora.fused_moe_lora_kernel
    fused_moe_lora.fused_moe_lora_kernel = _EmptyLike()
    try:
        return lora_delta(*a, **kw)
    finally:
        fused_moe_lora.fused_moe_lora_kernel = real


def time_paths(preset, dev, gen, deadline):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    a13, b13, a2, b2 = weights(sh, dev, gen)
    ids_s = torch.arange(S, dtype=torch.int32, device=dev)
    on, off = torch.ones(S, dtype=torch.int32, device=dev), torch.zeros(S, dtype=torch.int32, device=dev)
    for M in PATH_M:
        if time.time() > deadline:
            log(f"  path section cut at {preset} M={M} (budget)")
            break
        sets = [make_set(sh, M, dev, gen) for _ in range(16)]
        bm = lora_block_m(M, k, E, S)
        al = [moe_align(s["ids"], E, bm, s["slot"], S) for s in sets]

        def today(s, a_=None, en=on, parts=("align", "gu", "down")):
            a_ = a_ if a_ is not None else moe_align(s["ids"], E, bm, s["slot"], S)
            if "gu" in parts:
                lora_delta(s["x"], a13, b13, a_, ids_s, en, k, s["inter"])
            if "down" in parts:
                lora_delta(s["act"], a2, b2, a_, ids_s, en, k, s["down"], routed_weights=s["rw"], gather=False)

        def dec(s, parts=("gu", "down"), en=on, cfg13=None, cfg2=None, empty=False):
            if "gu" in parts:
                lora_delta_decode(s["x"], a13, b13, s["ids"], s["slot"], ids_s, en, s["inter"], config=cfg13,
                                  empty=empty)
            if "down" in parts:
                lora_delta_decode(s["act"], a2, b2, s["ids"], s["slot"], ids_s, en, s["down"], routed_weights=s["rw"],
                                  gather=False, config=cfg2, empty=empty)

        t = {}
        t["today"] = graph_time_us([lambda s=s: today(s) for s in sets], inner=2)
        t["today_align"] = graph_time_us([lambda s=s: moe_align(s["ids"], E, bm, s["slot"], S) for s in sets], inner=2)
        t["today_gate_up"] = graph_time_us([lambda s=s, a_=a_: today(s, a_, parts=("gu",))
                                            for s, a_ in zip(sets, al)], inner=2)
        t["today_down"] = graph_time_us([lambda s=s, a_=a_: today(s, a_, parts=("down",))
                                         for s, a_ in zip(sets, al)], inner=2)
        t["decode"] = graph_time_us([lambda s=s: dec(s) for s in sets], inner=2)
        t["decode_gate_up"] = graph_time_us([lambda s=s: dec(s, ("gu",)) for s in sets], inner=2)
        plan13 = decode_launch_plan(M * k, a13.shape[0], b13.shape[3], a13.shape[4], a13.shape[3])  # what dec ran
        t["decode_down"] = graph_time_us([lambda s=s: dec(s, ("down",)) for s in sets], inner=2)
        plan2 = decode_launch_plan(M * k, a2.shape[0], b2.shape[3], a2.shape[4], a2.shape[3])
        row(section="path", preset=preset, M=M, pairs=M * k, block_m=bm, **t, ratio=t["decode"] / t["today"],
            decode_cfg_gate_up=f"{plan13['config']} programs={plan13['programs']}",
            decode_cfg_down=f"{plan2['config']} programs={plan2['programs']}")
        log(f"path {preset} M={M}: today {t['today']:.1f} us (align {t['today_align']:.1f} + gu "
            f"{t['today_gate_up']:.1f}"
            f" + down {t['today_down']:.1f}), decode {t['decode']:.1f} us (gu {t['decode_gate_up']:.1f} + down "
            f"{t['decode_down']:.1f}) -> {t['decode'] / t['today']:.2f}x")
        # all disabled: each path against an empty kernel of the same grid and arguments
        s0 = sets[0]
        t_doff = graph_time_us([lambda: dec(s0, ("down",), en=off)], inner=32)
        t_demp = graph_time_us([lambda: dec(s0, ("down",), empty=True)], inner=32)
        t_aoff = graph_time_us([lambda: today(s0, al[0], en=off, parts=("down",))], inner=32)
        t_aemp = graph_time_us([lambda: aligned_empty(s0["act"], a2, b2, al[0], ids_s, on, k, s0["down"],
                                                      routed_weights=s0["rw"], gather=False)], inner=32)
        row(section="disabled", preset=preset, M=M, op="lora_down", decode_off_us=t_doff, decode_empty_us=t_demp,
            decode_ratio=t_doff / t_demp, aligned_off_us=t_aoff, aligned_empty_us=t_aemp, aligned_ratio=t_aoff / t_aemp,
            decode_programs=plan2["programs"],
            aligned_programs=fused_moe_lora.lora_launch_plan(s0["act"], a2, b2, al[0], k, gather=False,
                                                             routed_weights=s0["rw"])["programs"])
        log(f"  disabled M={M}: decode {t_doff:.2f} vs same-grid empty {t_demp:.2f} us; aligned {t_aoff:.2f} vs "
            f"{t_aemp:.2f} us")
        if M in (1, 8):  # other decode tiles/splits (split is a run-time argument: no new compile)
            for p_, op in ((2, "gate_up"), (1, "down")):
                base = configs.decode_config(M * k, p_, I if p_ == 2 else K, K if p_ == 2 else I, RANK)
                cands = [DecodeConfig(base.block_n, base.block_k, sp, base.num_warps, 1) for sp in (1, 2, 4, 8, 16, 32)]
                cands += [DecodeConfig(64, 256, base.split_n, 4, 1), DecodeConfig(64, 256, base.split_n, 8, 3),
                          DecodeConfig(64, 128, base.split_n, 8, 1), DecodeConfig(32, 512, base.split_n, 8, 1),
                          DecodeConfig(128, 256, base.split_n, 8, 1), DecodeConfig(64, 512, base.split_n, 16, 1),
                          DecodeConfig(32, 1024, base.split_n, 8, 1), DecodeConfig(64, 512, base.split_n, 8, 1),
                          DecodeConfig(32, 512, base.split_n, 16, 1)]
                for c in cands:
                    kw = dict(cfg13=c) if p_ == 2 else dict(cfg2=c)
                    tt = graph_time_us([lambda s=s: dec(s, ("gu",) if p_ == 2 else ("down",), **kw) for s in sets],
                                       inner=2, reps=15)
                    row(section="decode_tile", preset=preset, M=M, op=op, config=str(c), table=c == base,
                        programs=decode_launch_plan(M * k, p_, I if p_ == 2 else K, K if p_ == 2 else I, RANK,
                                                    c)["programs"], time_us=tt)
                best = min((r for r in ROWS if r["section"] == "decode_tile" and r["preset"] == preset and r["M"] == M
                            and r["op"] == op), key=lambda r: r["time_us"])
                log(f"  decode tiles {op} M={M}: table {t['decode_' + op]:.1f} us, best {best['time_us']:.1f} "
                    f"{best['config']}")
        sets = al = None  # frees the buffers before the next M
    torch.cuda.empty_cache()


def lora_bytes(s, sh, P, N, Kin, gather):
    k, E = sh.top_k, sh.num_experts
    M = s["ids"].shape[0]
    used = torch.unique(s["slot"].long().repeat_interleave(k) * E + s["ids"].flatten().long()).numel()
    xrows = M if gather else M * k
    return used * P * (RANK * Kin + N * RANK) * 2 + xrows * Kin * 2 + 2 * M * k * P * N * 2


def time_layer(preset, dev, deadline):
    sh, backend, layer, pool = lora_layer(preset, dev)
    E, k = sh.num_experts, sh.top_k
    names = [f"a{i}" for i in range(S)]
    for M in LAYER_M:
        if time.time() > deadline:
            log(f"  layer section cut at {preset} M={M} (budget)")
            break
        x = torch.randn(M, sh.hidden, generator=torch.Generator(device=dev).manual_seed(M), device=dev).to(BF)
        t = {}
        for case, adapters in (("base", None), ("lora_all_active", [names[i % S] for i in range(M)]),
                               ("lora_none_active", [None] * M)):
            hooks = []
            if adapters is not None:
                b = LoRABatchInfo.build(pool, adapters, [1] * M)
                info = LoRAInfo(pool.layers[0], LoRABatchTensors.from_batch(b, dev), RANK)
                hooks = [LoRAHook(info, backend, E)]
            t[case] = graph_time_us([lambda h=hooks: layer(x, h, backend)], inner=4 if M <= 256 else 1, reps=10)
        path = "decode" if M * k <= plan_table.table_for().decode_max_pairs else "aligned"
        row(section="layer", preset=preset, M=M, path=path, **t,
            lora_share=(t["lora_all_active"] - t["base"]) / t["base"],
            none_active_share=(t["lora_none_active"] - t["base"]) / t["base"])
        log(f"layer {preset} M={M}: base {t['base']:.1f} us, +LoRA all active {t['lora_all_active']:.1f} "
            f"({100 * (t['lora_all_active'] / t['base'] - 1):.0f}%), none active {t['lora_none_active']:.1f} "
            f"({100 * (t['lora_none_active'] / t['base'] - 1):.0f}%)")
    torch.cuda.empty_cache()
