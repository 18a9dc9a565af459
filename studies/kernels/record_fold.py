"""data/kernels/fold_*: the LoRA path folded into the base GEMM (kernels/fused_moe_lora_folded.py) against
the base GEMM and today's separate deltas, its differential, and the base GEMM's TMA / predicate-free builds'.

    python studies/kernels/record_fold.py --out DIR [--sections check,kernels,layer] [--reps 20] [--cases 1000]
    python studies/kernels/record_fold.py --out DIR --ncu-run     # under ncu (the command of record_kernels_base)

Sections (rows of DIR/kernels_fold.csv, metadata DIR/kernels_fold.meta.json; bf16, rank 32, 4 adapters,
top-8 of 128 experts from softmax-topk of random logits, CUDA-graph replays, alignment outside the
timed region):
  check    `--cases` random cases of the folded GEMM (its four builds in turn: TMA expand, pointer expand, and
           ordered alignment + per-row shrink with either expand), `--cases` of the packed build (dense or per slot,
           base or ordered alignment, PACKED_TILES: persistent grids and sub-blocks too) and `--cases` of the base
           GEMM's builds (TMA weight
           tiles, predicate-free loads, masked loads; half of each with `early_loads`) against float64, plus the
           presets' shapes at
           M = 1..8192; `out` and the shrink's intermediate NaN-poisoned; rows of pairs without a live
           adapter compared bit for bit with the plain GEMM. Few distinct tiles, so few compiles.
  kernels  per preset, op and M: the base GEMM (the tile table), base + today's separate delta (the decode
           kernel at <= DECODE_MAX_PAIRS pairs, else the aligned kernel; the LoRA alignment is its own arm),
           the folded path (shrink + GEMM; the intermediate and B through TMA where they allow it), the same
           with pointer loads in the expand (`folded_ptr`), the folded path on an alignment ordered by LoRA
           row with the per-row shrink (`folded_rows`; `base_ordered`: the base GEMM on that alignment), the
           folded path with every adapter disabled, and the folded GEMM alone with every adapter disabled; and
           the layer's build (`rows_ptr`: ordered alignment, per-row shrink, pointer expand), enabled, disabled
           and its GEMM alone disabled (`rows_ptr_off`, `gemm_rows_off`; `*_early`: the epilogue's gathers before
           the K loop, config early_loads; each `_over_base`), and with a register cap of 128
           (`rows_ptr_cap`: two programs of 8 warps per SM, as the plain GEMM at TP=4 gate_up); the base
           alignment as the layer builds it (`align`) and ordered by LoRA row (`align_ordered`: the layer's
           folded build needs it; Triton since ce2b959, the torch sort before).
           Interleaved, `--reps` paired repetitions after a warm-up
           checked for drift; percentile-bootstrap 95 % intervals of the paired ratios and differences.
  packed   per preset, op and M: the packed build (kernels/fused_moe_lora_packed.py) against the base GEMM and the
           separate delta (with its LoRA alignment): one dot over every slot (`packed`), one per slot on the alignment
           ordered by LoRA row (`packed_slot`, priced with the ordered alignment's extra time), both with the shrink
           in programs of 64 or 32 rows (`packed_sub64`, `packed_slot_sub32`, ...), all disabled
           (`packed_off`) and its GEMM alone with nothing live (`gemm_packed_off`: every block's range empty; in
           fold_s15, whose GEMM had a launch-wide guard, the guard's plain branch, and `gemm_packed_idle` the packed
           branch with every range empty); LoRA's added time in % of the base.
  shrink   the packed shrink's tiles (block_k, warps, stages, rows per program) per op at SHRINK_M against the
           committed one.
  window   the packed shrink one window of slots per dot, both slices per program, pointer tiles rebuilt per step
           and x kept in L2 (WINDOW_SHRINKS), alone against the committed shrink on the same alignment, and end to
           end (WINDOW_PATHS, e.g. `packed_slot_w1k`: the per-slot expand on the ordered alignment with a shrink
           window of one slot, both slices per program, x kept) against the separate delta, at WINDOW_M.
  expand   the packed GEMM's expand (EXPAND_BUILDS): the committed loop, guarded steps without a loop (`un`), its
           operands prefetched into L2 before the K loop (`pf`), both (`unpf`), two slots per dot (`d64`), u by
           pointer loads beside B's TMA copy (`uptr`), the first step's operands loaded before the K loop (`early`,
           `early_d64`), the packed GEMM on a program per tile where the plain GEMM's table runs a persistent grid
           (`ppt`, `ppt_d64`); per slot on the ordered alignment:
           the GEMM alone (`gemm_*`), disabled (`off_*`) and the path end to end (`path_*`), at EXPAND_M.
  wide     the down GEMM's wide build (`moe_gemm_lora_wide`: u and B_packed as columns past K of its own x and w,
           walked by the plain GEMM's loop when any adapter is live): the GEMM alone (`gemm_wide`), with nothing
           live (`off_wide`), on the views (`base_view`), the path end to end on the plain alignment (`path_wide`)
           and the ordered one with the W1S shrink (`path_wide_w1`), disabled (`path_wide_off`), against the
           committed packed path (`path_committed`, `_off`) and the separate delta, at WIDE_M.
  layer    one MoE layer (model/moe.py) under CUDA-graph replay: base, LoRA all active with the separate deltas,
           at the committed tables (`picked_all`; `picked_none`: every adapter disabled, every kernel launched) and
           at PREV (`prev_*`: the tables before this session's changes); x the first K columns of a buffer
           with room for gate_up's u, as the layer's norm writes it; interleaved rounds; LoRA's
           share of the layer per round, its median and bootstrap 95 %. (Until exp_s9 it also ran the rows build,
           the packed build at every size and a candidate table.)
  --ncu-run  one launch each of the folded GEMM and its shrink at M=8192 (both presets, both GEMMs), for
           each build: TMA expand, pointer expand, ordered alignment + per-row shrink, packed, packed per slot,
           and packed per slot with a shrink window of one slot (`packed_slot_w1`: both slices per program; `_w1p`:
           a program per slice), and the expand's builds (`packed_slot_<EXPAND_BUILDS>`, e.g. `_d64`, `_early`);
           `--ncu-builds` picks some.
"""
from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import replace

import torch

from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.analysers.stats import METHOD_BOOT, bootstrap_paired, warmup_check
from lora_moe_lab.instruments.recorders import harness
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders import kernel_cases as kc
from lora_moe_lab.instruments.recorders.harness import Recorder, log, row
from lora_moe_lab.instruments.recorders.timing import time_interleaved
from lora_moe_lab.kernels import configs
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.configs import GemmConfig, block_r, lora_block_m, lora_down_config, moe_block_m
from lora_moe_lab.kernels.common import pow2
from lora_moe_lab.kernels.fused_moe import Packed, Tail, moe_gemm
from lora_moe_lab.kernels.fused_moe_lora import lora_delta
from lora_moe_lab.kernels.fused_moe_lora_packed import (lora_shrink_packed, moe_gemm_lora_packed, moe_gemm_lora_wide,
                                                        pack_lora_b, wide_columns, wide_weights, x_wide_columns)
from lora_moe_lab.kernels.lora_decode import lora_delta_decode
from lora_moe_lab.model.graphs import GraphForward
from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors, LoRAInfo
from lora_moe_lab.model.moe import LoRAHook
from lora_moe_lab.ops.reference import ref_moe_gemm_grouped as ref_gemm
from lora_moe_lab.ops.reference import rel, tolerance

from studies.kernels import plan_views, tidy
from studies.kernels.tried.fused_moe_lora_folded import lora_shrink, moe_gemm_lora_folded
from studies.kernels.tried.fused_moe_switches import Folded, PackedSwitches, moe_gemm_switches
from studies.kernels.tried.packed_switches import lora_shrink_packed_switches, moe_gemm_lora_packed_switches

TRIED_EXPAND = ("unroll", "prefetch", "u_ptr", "early")  # the expand options only the study's copy takes


def _tried(shrink=None, expand=None) -> bool:
    """Whether the options name a build only the study's copies run (tried/packed_switches.py)."""
    return bool((shrink or {}).get("x_keep")) or any((expand or {}).get(o) for o in TRIED_EXPAND)

S, RANK, BF = kc.S, kc.RANK, kc.BF
KERNEL_M = (1, 16, 128, 1024, 4096, 8192, 16384)  # the sizes of the peers' carried figures
LAYER_M = (128, 256, 1024, 4096, 8192, 16384)
CHECK_M = (1, 16, 256, 2048, 8192)
# The differential's tiles: few, so that 1000 cases compile a few dozen binaries (N and K are run-time).
DIFF_TILES = (GemmConfig(64, 64, 8, 4, 3), GemmConfig(128, 64, 8, 4, 3, w_desc=True),
              GemmConfig(64, 128, 1, 4, 2, w_desc=True), GemmConfig(64, 64, 8, 4, 3, even=False))


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


# ------------------------------------------------------------------------------------------------
def check(dev, gen, n_cases, diffs=("presets", "folded", "packed", "base"), first=0):
    """first > 0 (`--cases-from`): the packed differential's cases first .. first + n_cases - 1, each drawn from a
    seed of its own index, so shards in parallel processes (their compiles on separate CPUs) together run the
    cases one process would; every other part runs from 0 as before."""
    fails = _check_presets(dev, gen) if "presets" in diffs else 0
    rng, g = random.Random(2), torch.Generator(device=dev).manual_seed(2)
    worst, f_fold = {"folded": float("nan"), "packed": float("nan")}, 0
    for i in range(n_cases if "folded" in diffs else 0):  # the folded GEMM, random shapes
        err, same = _fold_case(rng, g, dev, i)
        worst["folded"] = max(worst["folded"] if i else 0.0, err)
        f_fold += not (err < tolerance(BF, dev) and same)
    f_pack = 0
    for name, case in (("packed", _packed_case), ("wide", _wide_case)):  # random shapes and tiles, sharded
        f, worst[name] = 0, float("nan")
        for i in range(first, first + n_cases if name in diffs else 0):
            if first:
                rng, g = random.Random(1_000_003 + i), torch.Generator(device=dev).manual_seed(1_000_003 + i)
            err, same = case(rng, g, dev, i)
            worst[name] = max(worst[name] if i > first else 0.0, err)
            f += not (err < tolerance(BF, dev) and same)
            if (i + 1 - first) % 100 == 0:  # progress: a call cut short still says how many cases passed
                log(f"{name} differential: {i + 1 - first} cases from {first}, {f} failures, worst {worst[name]:.1e}")
        if name in diffs:
            row(section="check", op=f"random_{name}", cases=n_cases, failures=f, worst=worst[name], first=first)
        f_pack += f
    f_base = 0
    for i in range(n_cases if "base" in diffs else 0):  # the base GEMM's builds
        err, tile = _base_case(rng, g, dev, i)
        worst[tile] = max(worst.get(tile, 0.0), err)
        f_base += not err < tolerance(BF, dev)
    row(section="check", op="random_folded", cases=n_cases if "folded" in diffs else 0, failures=f_fold,
        worst=worst["folded"])
    builds = ("folded", "packed", "wide")
    row(section="check", op="random_base", cases=n_cases if "base" in diffs else 0, failures=f_base,
        worst=max((v for k, v in worst.items() if k not in builds), default=float("nan")),
        tiles=str(sorted(k for k in worst if k not in builds)))
    n = {d: n_cases if d in diffs else 0 for d in builds + ("base",)}
    log(f"check: presets {fails} failures; folded {n['folded']} random cases, {f_fold} failures "
        f"(worst {worst['folded']:.1e}); packed {n['packed']} and wide {n['wide']} random cases, {f_pack} failures "
        f"(worst {worst['packed']:.1e}, {worst['wide']:.1e}); base builds {n['base']} random cases, {f_base} "
        f"failures; worst {worst}")


def _fold_run(x, w, al, k, a, b, mapping, lids, en, rw, gather, cfg=None, desc=True, rows=False):
    """One folded launch on NaN-poisoned `out` and intermediate, beside the plain GEMM: (out, base).
    desc: t and B through TMA descriptors where they allow it, else pointer loads; rows: the per-row shrink."""
    n = al_pairs(x, k, gather)
    base = torch.full((n, w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    moe_gemm(x, w, al, k, base, routed_weights=rw, gather=gather, config=cfg)
    out = torch.full_like(base, float("nan"))
    t = torch.full((al.sorted_token_ids.shape[1], a.shape[0], block_r(a.shape[3])), float("nan"), dtype=x.dtype,
                   device=x.device)
    moe_gemm_lora_folded(x, w, al, k, out, a, b, mapping, lids, en, routed_weights=rw, gather=gather, config=cfg,
                         shrink_out=t, fold_desc=desc, shrink_per_row=rows)
    return out, base


def al_pairs(x, k, gather):
    return x.shape[0] * k if gather else x.shape[0]


def _verdict(out, base, ref, live):
    same = torch.equal(_bits(out[~live]), _bits(base[~live]))
    return (rel(out.double(), ref) if torch.isfinite(out).all() else float("inf")), same


def _check_presets(dev, gen):
    fails = 0
    for c in kc.preset_lora_cases(dev, gen, CHECK_M, table=True):  # the table's tiles, TMA where it won
        E = c["w"].shape[0]
        # layer: ordered alignment, per-row shrink, pointer expand; packed: the table's tile as it is (persistent
        # grids, sub-blocks); packed_slot: one expand dot per slot, on the ordered alignment
        for build in ("tma", "layer", "packed", "packed_slot"):
            lay = build in ("layer", "packed_slot")
            al = moe_align(c["ids"], E, c["align"].block_m, order_by=c["mapping"]) if lay else c["align"]
            if build.startswith("packed"):
                n = al_pairs(c["x"], c["k"], c["gather"])
                base = torch.full((n, c["w"].shape[1]), float("nan"), dtype=c["x"].dtype, device=dev)
                moe_gemm(c["x"], c["w"], al, c["k"], base, routed_weights=c["rw"], gather=c["gather"])
                out = torch.full_like(base, float("nan"))
                moe_gemm_lora_packed(c["x"], c["w"], al, c["k"], out, c["a"], c["b"], c["mapping"], c["lids"],
                                     c["en"], routed_weights=c["rw"], gather=c["gather"], per_slot=lay)
            else:
                out, base = _fold_run(c["x"], c["w"], al, c["k"], c["a"], c["b"], c["mapping"], c["lids"], c["en"],
                                      c["rw"], c["gather"], desc=not lay, rows=lay)
            err, same = _verdict(out, base, c["ref"], c["live"])
            ok = err < tolerance(BF, dev) and same
            fails += not ok
            row(section="check", preset=c["preset"], op=c["op"], M=c["M"], block_m=c["align"].block_m, build=build,
                rel_err=err, adapterless_rows_bitwise=same, ok=ok)
            log(f"check {c['preset']} {c['op']} M={c['M']} {build}: {err:.1e}{'' if ok else ' FAIL'}")
    return fails


def _fold_case(rng, g, dev, i):
    P, gather = (2, True) if i % 2 == 0 else (1, False)
    M, E, k = rng.randint(1, 96), rng.choice((4, 9)), rng.randint(1, 4)
    L, R, bm = rng.randint(1, S), rng.choice((8, 16, 32)), rng.choice((16, 64))
    K, N = rng.choice((64, 128, 192)), rng.choice((64, 96))  # N per slice: 96 puts a 64-wide tile across slices
    cfg = replace(DIFF_TILES[i % 2], early_loads=i % 8 >= 4)  # half the cases: the epilogue's gathers early
    c = kc.random_lora_case(rng, g, dev, BF, M=M, E=E, k=k, L=L, S=S, R=R, K=K, N=N, P=P, gather=gather)
    # 0: TMA expand, 1: pointer expand, 2 and 3: the alignment ordered by LoRA row and the per-row shrink, with the
    # TMA expand (2) and the pointer expand (3: the layer's build)
    v = i % 4
    al = moe_align(c["ids"], E, bm, order_by=c["mapping"] if v >= 2 else None)
    out, base = _fold_run(c["x"], c["w"], al, k, c["a"], c["b"], c["mapping"], c["lids"], c["en"], c["rw"], gather,
                          cfg, desc=v in (0, 2), rows=v >= 2)
    return _verdict(out, base, c["ref"], c["live"])


# The packed build's tiles: a program per tile, and the persistent grids over sub-blocks of the tables (TMA weights).
PACKED_TILES = (GemmConfig(64, 64, 8, 4, 3), GemmConfig(64, 64, 8, 4, 3, w_desc=True, early_loads=True),
                GemmConfig(64, 64, 8, 4, 2, w_desc=True, persistent=2, flatten=True, sub_m=16),
                GemmConfig(64, 128, 1, 4, 2, w_desc=True, persistent=1, flatten=True))


def _packed_case(rng, g, dev, i):
    """The packed build on a random case: dense or per slot, base or ordered alignment, one of PACKED_TILES, the
    shrink in whole blocks or in programs of 16 rows, over every slot or windows of 1 or 2, per slice or both, with
    the pointer tiles rebuilt per step and x kept in L2 or not, under a register cap of 128 or not, the expand
    unrolled or not, prefetched into L2 or not, one or two slots per expand dot, u by pointers or TMA, the first
    step loaded before the K loop or not;
    `out` and u NaN-poisoned; (error against float64, rows without a live adapter bit-exact with the plain GEMM)."""
    P, gather = (2, True) if i % 2 == 0 else (1, False)
    M, E, k = rng.randint(1, 96), rng.choice((4, 9)), rng.randint(1, 4)
    L, R, bm = rng.randint(1, S), rng.choice((8, 16, 32)), rng.choice((16, 64))
    K, N = rng.choice((64, 128, 192)), rng.choice((64, 96))  # N per slice: 96 puts a 64-wide tile across slices
    cfg = PACKED_TILES[(i // 2) % len(PACKED_TILES)]
    c = kc.random_lora_case(rng, g, dev, BF, M=M, E=E, k=k, L=L, S=S, R=R, K=K, N=N, P=P, gather=gather)
    slot = (i // 8) % 2 == 1
    al = moe_align(c["ids"], E, bm, order_by=c["mapping"] if slot else None)
    x, w, rw = c["x"], c["w"], c["rw"]
    base = torch.full((al_pairs(x, k, gather), w.shape[1]), float("nan"), dtype=x.dtype, device=dev)
    moe_gemm(x, w, al, k, base, routed_weights=rw, gather=gather, config=cfg)
    out = torch.full_like(base, float("nan"))
    u = torch.full((al.sorted_token_ids.shape[1], P, pow2(S) * block_r(R)), float("nan"), dtype=x.dtype, device=dev)
    sub = 16 if (i // 4) % 2 == 1 and bm > 16 else 0  # the shrink in programs of 16 rows
    win, both = (0, 1, 2)[(i // 16) % 3], (i // 48) % 2 == 1  # slots per shrink dot; both slices per program
    fast = (i // 96) % 2 == 1  # pointer tiles rebuilt per step, x kept in L2
    # a register cap (4 programs of 4 warps per SM) on one-slot windows only: a wider dot's accumulator needs more
    # (ptxas C7602 asked for 154 at every slot, both slices, rank 32: win_s3c)
    cap = 128 if (i // 192) % 2 == 1 and win == 1 else 0
    # the expand's guarded steps, L2 prefetch, two slots per dot
    expand = dict(unroll=rng.random() < 0.5, prefetch=rng.random() < 0.5, depth=rng.choice((0, 2 * block_r(R))),
                  u_ptr=rng.random() < 0.5)
    expand["early"] = not expand["unroll"] and rng.random() < 0.5  # the first step loaded before the K loop
    moe_gemm_lora_packed_switches(x, w, al, k, out, c["a"], c["b"], c["mapping"], c["lids"], c["en"],
                                  routed_weights=rw, gather=gather, config=cfg, shrink_out=u, per_slot=slot,
                                  shrink=dict(sub_m=sub, slot_window=win, both_slices=both, row_ptrs=fast,
                                              x_keep=fast, max_regs=cap), expand=expand)
    return _verdict(out, base, c["ref"], c["live"])


def _wide_case(rng, g, dev, i):
    """The wide build (`moe_gemm_lora_wide`) on a random case, gate_up (odd i: token rows, each pair's tail at its own
    place, `Tail.jump`) or down (even i): one of PACKED_TILES, the base or the ordered alignment, the shrink in whole
    blocks or programs of 16 rows, over every slot or windows of 1 or 2, both slices per program or not (gate_up),
    the pointer tiles rebuilt per step or not, a register cap of 128 on one-slot windows or not, the blocks taken
    slot by slot (`slot_order`) or in order; every tile over all C columns, only its block's slots' (`per_block`,
    where K is a multiple of BLOCK_K) or, down, a window of two slots' columns (`window`, where the tile reads w
    through TMA and BLOCK_K divides K and the window); down's K a multiple of 64 or of 8 only (K predicates),
    gate_up's a multiple of the tile's BLOCK_K (the jump needs it); x_wide's u columns and `out` NaN-poisoned (with no
    adapter live the GEMM must not read u: the shrink writes none of it); (error against float64, rows without a live
    adapter bit-exact)."""
    gu = i % 2 == 1
    M, E, k = rng.randint(1, 96), rng.choice((4, 9)), rng.randint(1, 4)
    L, R, bm = rng.randint(1, S), rng.choice((8, 16, 32)), rng.choice((16, 64))
    cfg = PACKED_TILES[(i // 2) % len(PACKED_TILES)]
    K = cfg.block_k * rng.randint(1, 3) if gu else rng.choice((64, 128, 192, 72, 200))
    N = rng.choice((64, 96, 136))  # gate_up: per slice (96: a 64-wide tile across the slices)
    c = kc.random_lora_case(rng, g, dev, BF, M=M, E=E, k=k, L=L, S=S, R=R, K=K, N=N, P=2 if gu else 1, gather=gu)
    al = moe_align(c["ids"], E, bm, order_by=c["mapping"] if rng.random() < 0.5 else None)
    C = wide_columns(c["a"])
    x_wide = torch.full((c["x"].shape[0], K + C * (k if gu else 1)), float("nan"), dtype=BF, device=dev)
    x_wide[:, :K] = c["x"]
    w_wide = wide_weights(c["w"], pack_lora_b(c["b"]))
    x, w, rw = x_wide[:, :K], w_wide[..., :K], c["rw"]
    base = torch.full((al_pairs(x, k, gu), w.shape[1]), float("nan"), dtype=BF, device=dev)
    moe_gemm(x, w, al, k, base, routed_weights=rw, gather=gu, config=cfg)
    out = torch.full_like(base, float("nan"))
    win = rng.choice((0, 1, 2))
    shrink = dict(sub_m=16 if bm > 16 and rng.random() < 0.5 else 0, slot_window=win, row_ptrs=rng.random() < 0.5,
                  max_regs=128 if win == 1 and rng.random() < 0.5 else 0, both_slices=gu and rng.random() < 0.5,
                  slot_order=rng.random() < 0.5)
    W = 2 * (C // pow2(S))  # down's window of two slots, where the tile reads w through TMA and steps evenly over it
    window = W if (not gu and cfg.w_desc and K % cfg.block_k == 0 and W % cfg.block_k == 0 and W < C
                   and rng.random() < 0.8) else 0
    per_block = not window and K % cfg.block_k == 0 and rng.random() < 0.5  # each tile walks its block's slots only
    moe_gemm_lora_wide(x, w, al, k, out, c["a"], c["mapping"], c["lids"], c["en"], routed_weights=rw, gather=gu,
                       config=cfg, shrink=shrink, per_block=per_block, window=window)
    return _verdict(out, base, c["ref"], c["live"])


def _base_case(rng, g, dev, i):
    cfg = replace(DIFF_TILES[i % len(DIFF_TILES)], early_loads=i % 8 >= 4)
    c = kc.random_gemm_case(rng, g, dev, BF, i)
    out = c["out"]
    moe_gemm(c["x"], c["w"], c["align"], c["k"], out, routed_weights=c["rw"], gather=c["gather"], config=cfg)
    err = (rel(out.double(), ref_gemm(c["x"], c["w"], c["ids"], c["k"], c["rw"], c["gather"]))
           if torch.isfinite(out).all() else float("inf"))
    tile = (f"bn{cfg.block_n}/bk{cfg.block_k}" + ("/tma" if cfg.w_desc else "") + ("" if cfg.even else "/masked")
            + ("/early" if cfg.early_loads else ""))
    return err, tile


# ------------------------------------------------------------------------------------------------
def _aligned_sets(sh, M, dev, gen):
    """Input sets of M tokens (several at small M: rotating sets keep small-M weights out of a hot L2), each with
    the base alignment (`al`), the one ordered by LoRA row per expert (`al_ord`) and, off the decode path, the LoRA
    alignment (`lal`): (sets, base BLOCK_M, LoRA BLOCK_M, decode path)."""
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    n_sets = 1 if harness.is_dry() else 8 if M <= 64 else 4 if M <= 1024 else 1
    sets = [kc.make_set(sh, M, dev, gen) for _ in range(n_sets)]
    bm, bml, dec = moe_block_m(M, k, E, K, I), lora_block_m(M, k, E, S), plan_views.use_decode_path(M, k)
    for s in sets:
        s["al"] = moe_align(s["ids"], E, bm)
        s["al_ord"] = moe_align(s["ids"], E, bm, order_by=s["slot"])
        s["lal"] = None if dec else moe_align(s["ids"], E, bml, s["slot"], S)
    return sets, bm, bml, dec


def _separate_delta(s, X, O, a, b, lids, on, k, gu, dec, cfg2):
    """Today's separate delta on set s: the decode kernel at <= DECODE_MAX_PAIRS pairs, else the aligned kernel
    over the LoRA alignment (the down delta with its own tile, cfg2)."""
    if dec:
        lora_delta_decode(s[X], a, b, s["ids"], s["slot"], lids, on, s[O], routed_weights=s["rw_op"], gather=gu)
    else:
        lora_delta(s[X], a, b, s["lal"], lids, on, k, s[O], routed_weights=s["rw_op"], gather=gu,
                   **({} if gu else dict(config=cfg2)))


def kernels(preset, dev, gen, reps):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    w13, w2 = kc.base_weights(sh, dev, gen)
    a13, b13, a2, b2 = kc.weights(sh, dev, gen)
    lids = torch.arange(S, dtype=torch.int32, device=dev)
    on, off = torch.ones_like(lids), torch.zeros_like(lids)
    for M in KERNEL_M:
        sets, bm, bml, dec = _aligned_sets(sh, M, dev, gen)
        cfg2 = lora_down_config(M, k, E, S, bml, K, I)
        inner = 4 if M <= 256 and not harness.is_dry() else 1
        for op in ("gate_up", "down"):
            gu = op == "gate_up"
            w, a, b = (w13, a13, b13) if gu else (w2, a2, b2)
            X = "x" if gu else "act"
            O = "inter" if gu else "down"
            for s in sets:  # the folded GEMM alone reads a shrink computed once, outside the timed region
                s["rw_op"] = None if gu else s["rw"]
                s["t"] = torch.zeros(s["al"].sorted_token_ids.shape[1], a.shape[0], block_r(RANK), dtype=BF, device=dev)
                lora_shrink(s[X], a, s["al"], k, s["slot"], lids, on, s["t"], gather=gu)

            def base(s):
                moe_gemm(s[X], w, s["al"], k, s[O], routed_weights=s["rw_op"], gather=gu)

            def delta(s):
                _separate_delta(s, X, O, a, b, lids, on, k, gu, dec, cfg2)

            # the GEMM's tile with a register cap of 128 per thread: two programs of 8 warps per SM, the plain
            # GEMM's occupancy where it has <= 128 registers (TP=4 gate_up: 95, folded 154; ncu, fold_s2)
            n_op, k_op = (2 * I, K) if gu else (K, I)
            cap = replace(configs.gemm_config(M, bm, n_op, k_op, E), max_regs=128)

            def folded(s, en, desc=True, rows=False, cfg=None):
                moe_gemm_lora_folded(s[X], w, s["al_ord" if rows else "al"], k, s[O], a, b, s["slot"], lids, en,
                                     routed_weights=s["rw_op"], gather=gu, fold_desc=desc, shrink_per_row=rows,
                                     config=cfg)

            def gemm_off(s, rows=False, cfg=None):  # rows: the layer's build (ordered alignment, pointer expand)
                moe_gemm_switches(s[X], w, s["al_ord" if rows else "al"], k, s[O], routed_weights=s["rw_op"],
                                  gather=gu, lora=Folded(s["t"], b, s["slot"], lids, off, not rows), config=cfg)

            early = replace(configs.gemm_config(M, bm, n_op, k_op, E), early_loads=True)  # gathers before the K loop

            arms = {"base": base, "separate": lambda s: (base(s), delta(s)), "folded": lambda s: folded(s, on),
                    "folded_ptr": lambda s: folded(s, on, False), "folded_rows": lambda s: folded(s, on, rows=True),
                    "base_ordered": lambda s: moe_gemm(s[X], w, s["al_ord"], k, s[O], routed_weights=s["rw_op"],
                                                       gather=gu),
                    "folded_off": lambda s: folded(s, off), "gemm_off": gemm_off,
                    # the layer's build (plan_views.FOLDED_ORDER_BY_ROW): ordered alignment, per-row shrink, pointer
                    # expand; with every adapter enabled, disabled, and its GEMM alone disabled
                    "rows_ptr": lambda s: folded(s, on, False, True),
                    "rows_ptr_off": lambda s: folded(s, off, False, True),
                    "gemm_rows_off": lambda s: gemm_off(s, True),
                    "rows_ptr_cap": lambda s: folded(s, on, False, True, cap),
                    # the epilogue's gathers issued before the K loop (config early_loads): the plain GEMM, the
                    # layer's build, and its GEMM alone with every adapter disabled (the disabled cost)
                    "base_early": lambda s: moe_gemm(s[X], w, s["al"], k, s[O], routed_weights=s["rw_op"], gather=gu,
                                                     config=early),
                    "rows_ptr_early": lambda s: folded(s, on, False, True, early),
                    "gemm_rows_off_early": lambda s: gemm_off(s, True, early)}
            if not harness.is_dry() and not _compiles(lambda: folded(sets[0], on, False, True, cap)):
                del arms["rows_ptr_cap"]  # ptxas cannot fit this tile in 128 registers (it says how many it needs)
            if not dec:
                arms["lora_align"] = lambda s: moe_align(s["ids"], E, bml, s["slot"], S)
            # the base GEMM's alignment as the layer builds it: Triton, and ordered by LoRA row (torch), the
            # price of the layer's folded build
            arms["align"] = lambda s: moe_align(s["ids"], E, bm)
            arms["align_ordered"] = lambda s: moe_align(s["ids"], E, bm, order_by=s["slot"])
            med, s_, wc = _interleave(arms, sets, inner, reps)
            r = {nm: bootstrap_paired(s_[nm], s_["base"], "ratio_of_medians")
                 for nm in ("folded_off", "gemm_off", "rows_ptr_off", "gemm_rows_off", "gemm_rows_off_early",
                            "base_early")}
            rp = bootstrap_paired(s_["rows_ptr"], s_["separate"], "ratio_of_medians")  # the layer's build / separate
            rc = (bootstrap_paired(s_["rows_ptr_cap"], s_["rows_ptr"], "ratio_of_medians")  # register cap 128 / none
                  if "rows_ptr_cap" in s_ else (float("nan"),) * 3)
            drp = bootstrap_paired(s_["rows_ptr"], s_["base"], "median_diff")
            fs = bootstrap_paired(s_["folded"], s_["separate"], "ratio_of_medians")
            fp = bootstrap_paired(s_["folded"], s_["folded_ptr"], "ratio_of_medians")  # TMA expand / pointer expand
            fr = bootstrap_paired(s_["folded_rows"], s_["separate"], "ratio_of_medians")  # ordered, per-row shrink
            dsep = bootstrap_paired(s_["separate"], s_["base"], "median_diff")
            dfold = bootstrap_paired(s_["folded"], s_["base"], "median_diff")
            row(section="kernels", preset=preset, op=op, M=M, block_m=bm, path="decode" if dec else "aligned",
                reps=reps, kept=len(s_["base"]), stable=wc.stable, warmup=wc.note,
                **{f"{nm}_us": v for nm, v in med.items()},
                delta_separate_us=dsep[0], delta_separate_lo=dsep[1], delta_separate_hi=dsep[2],
                delta_folded_us=dfold[0], delta_folded_lo=dfold[1], delta_folded_hi=dfold[2],
                folded_over_separate=fs[0], folded_over_separate_lo=fs[1], folded_over_separate_hi=fs[2],
                folded_over_ptr=fp[0], folded_over_ptr_lo=fp[1], folded_over_ptr_hi=fp[2],
                folded_rows_over_separate=fr[0], folded_rows_over_separate_lo=fr[1],
                folded_rows_over_separate_hi=fr[2],
                rows_ptr_over_separate=rp[0], rows_ptr_over_separate_lo=rp[1], rows_ptr_over_separate_hi=rp[2],
                delta_rows_ptr_us=drp[0], delta_rows_ptr_lo=drp[1], delta_rows_ptr_hi=drp[2],
                cap_over_rows_ptr=rc[0], cap_over_rows_ptr_lo=rc[1], cap_over_rows_ptr_hi=rc[2],
                **{f"{nm}_over_base{sfx}": r[nm][j] for nm in r for j, sfx in enumerate(("", "_lo", "_hi"))},
                interval=METHOD_BOOT)
            log(f"kernels {preset} {op:<7} M={M:>5}: base {med['base']:8.1f} us  +sep {dsep[0]:7.1f}  +folded "
                f"{dfold[0]:7.1f} [{dfold[1]:.1f}, {dfold[2]:.1f}]  folded/sep {fs[0]:.3f} [{fs[1]:.3f}, {fs[2]:.3f}]"
                f"  tma/ptr {fp[0]:.3f}  rows/sep {fr[0]:.3f} [{fr[1]:.3f}, {fr[2]:.3f}]"
                f"  rows_ptr/sep {rp[0]:.3f} [{rp[1]:.3f}, {rp[2]:.3f}]  rows_ptr_off/base {r['rows_ptr_off'][0]:.3f}"
                f"  gemm_rows_off/base {r['gemm_rows_off'][0]:.3f}  cap128/rows_ptr {rc[0]:.3f}"
                f"  align {med['align']:.1f} ordered {med['align_ordered']:.1f} us"
                f"  off/base {r['folded_off'][0]:.3f}  gemm_off/base {r['gemm_off'][0]:.3f} "
                f"[{r['gemm_off'][1]:.3f}, {r['gemm_off'][2]:.3f}] {wc.note}")
        sets = None
        torch.cuda.empty_cache()


def _packed_weights(preset, dev, gen):
    """The packed sections' weights: (shape, the gate_up w, A, B, B_packed then the down four, the L slot ids)."""
    sh = get_shape(preset)
    w13, w2 = kc.base_weights(sh, dev, gen)
    a13, b13, a2, b2 = kc.weights(sh, dev, gen)
    wts = (w13, a13, b13, pack_lora_b(b13), w2, a2, b2, pack_lora_b(b2))
    return sh, wts, torch.arange(S, dtype=torch.int32, device=dev)


def _packed_op(op, sets, wts, dev):
    """One op of the packed sections: (gate_up?, w, A, B, B_packed, input key, output key, C) from wts = the gate_up
    four then the down four; each set gets the op's routed weights (`rw_op`) and a zeroed u (EM, P, C)."""
    gu = op == "gate_up"
    w, a, b, bp = wts[:4] if gu else wts[4:]
    C = pow2(S) * block_r(a.shape[3])
    for s in sets:
        s["rw_op"] = None if gu else s["rw"]
        s["u"] = torch.zeros(s["al"].sorted_token_ids.shape[1], a.shape[0], C, dtype=BF, device=dev)
    return (gu, w, a, b, bp) + (("x", "inter") if gu else ("act", "down")) + (C,)


def packed(preset, dev, gen, reps):
    """The packed build (kernels/fused_moe_lora_packed.py) per op and M against the base GEMM and today's separate
    delta: all slots' columns in one dot on the base alignment (`packed`), one dot per slot on the alignment ordered
    by LoRA row (`packed_slot`), every adapter disabled (`packed_off`: both kernels launched), and its GEMM alone with
    nothing live (`gemm_packed_off`: the disabled cost of the GEMM)."""
    sh, wts, lids = _packed_weights(preset, dev, gen)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    on, off = torch.ones_like(lids), torch.zeros_like(lids)
    for M in KERNEL_M:
        sets, bm, bml, dec = _aligned_sets(sh, M, dev, gen)
        for s in sets:
            s["blk0"] = torch.zeros(s["al"].expert_ids.shape[1], 2, dtype=torch.int32, device=dev)  # nothing live
        cfg2 = lora_down_config(M, k, E, S, bml, K, I)
        inner = 4 if M <= 256 and not harness.is_dry() else 1
        for op in ("gate_up", "down"):
            gu, w, a, b, bp, X, O, C = _packed_op(op, sets, wts, dev)

            def base(s, al="al"):
                moe_gemm(s[X], w, s[al], k, s[O], routed_weights=s["rw_op"], gather=gu)

            def delta(s):
                _separate_delta(s, X, O, a, b, lids, on, k, gu, dec, cfg2)

            def pk(s, en, slot=False, sub=0):
                moe_gemm_lora_packed(s[X], w, s["al_ord" if slot else "al"], k, s[O], a, b, s["slot"], lids, en,
                                     routed_weights=s["rw_op"], gather=gu, b_packed=bp, shrink_out=s["u"],
                                     per_slot=slot, shrink=dict(sub_m=sub))

            arms = {"base": base, "separate": lambda s: (base(s), delta(s)),
                    "packed": lambda s: pk(s, on), "packed_slot": lambda s: pk(s, on, True),
                    # the shrink in programs of 64 / 32 rows (the alignment's BLOCK_M when that is no more)
                    **{f"packed{sl}_sub{r}": (lambda s, r=r, sl=sl: pk(s, on, sl == "_slot", r))
                       for r in SUB_ROWS for sl in ("", "_slot")},
                    "packed_off": lambda s: pk(s, off),
                    "gemm_packed_off": lambda s: moe_gemm(
                        s[X], w, s["al"], k, s[O], routed_weights=s["rw_op"], gather=gu,
                        packed=Packed(s["u"], s["blk0"], bp, C)),
                    "base_ordered": lambda s: base(s, "al_ord"),
                    "align": lambda s: moe_align(s["ids"], E, bm),
                    "align_ordered": lambda s: moe_align(s["ids"], E, bm, order_by=s["slot"])}
            if not dec:
                arms["lora_align"] = lambda s: moe_align(s["ids"], E, bml, s["slot"], S)
            med, s_, wc = _interleave(arms, sets, inner, reps)
            # the layer's price of each build: the separate delta needs its own LoRA alignment; the per-slot build
            # needs the ordered base alignment in place of the plain one
            sep = [v + la for v, la in zip(s_["separate"], s_.get("lora_align", [0.0] * len(s_["separate"])))]
            slot_l = [v + ao - al for v, ao, al in zip(s_["packed_slot"], s_["align_ordered"], s_["align"])]
            subs = {f"packed{sl}_sub{r}": [v + (ao - al if sl else 0.0) for v, ao, al in
                                           zip(s_[f"packed{sl}_sub{r}"], s_["align_ordered"], s_["align"])]
                    for r in SUB_ROWS for sl in ("", "_slot")}
            rat = {"packed": bootstrap_paired(s_["packed"], sep, "ratio_of_medians"),
                   "packed_slot": bootstrap_paired(slot_l, sep, "ratio_of_medians"),
                   **{nm: bootstrap_paired(v, sep, "ratio_of_medians") for nm, v in subs.items()},
                   "packed_off": bootstrap_paired(s_["packed_off"], s_["base"], "ratio_of_medians"),
                   "gemm_packed_off": bootstrap_paired(s_["gemm_packed_off"], s_["base"], "ratio_of_medians")}
            share = {nm: bootstrap_paired(v, s_["base"], "median_change_pct")
                     for nm, v in (("separate", sep), ("packed", s_["packed"]), ("packed_slot", slot_l))}
            row(section="packed", preset=preset, op=op, M=M, block_m=bm, path="decode" if dec else "aligned",
                reps=reps, kept=len(s_["base"]), stable=wc.stable, warmup=wc.note,
                **{f"{nm}_us": v for nm, v in med.items()},
                **{f"{nm}_over_{'base' if nm.endswith('_off') else 'separate'}{sfx}": rat[nm][j]
                   for nm in rat for j, sfx in enumerate(("", "_lo", "_hi"))},
                **{f"{nm}_added_pct{sfx}": share[nm][j] for nm in share for j, sfx in enumerate(("", "_lo", "_hi"))},
                interval=METHOD_BOOT)
            log(f"packed {preset} {op:<7} M={M:>5}: base {med['base']:8.1f} us  LoRA adds: "
                + "  ".join(f"{nm} {share[nm][0]:+.1f} % [{share[nm][1]:+.1f}, {share[nm][2]:+.1f}]" for nm in share)
                + "  " + "  ".join(f"{nm} {rat[nm][0]:.3f} [{rat[nm][1]:.3f}, {rat[nm][2]:.3f}]" for nm in rat)
                + f"  {wc.note}")
        sets = None
        torch.cuda.empty_cache()


SUB_ROWS = (64, 32)  # the packed section's shrinks in programs of fewer rows than the alignment's BLOCK_M
SHRINK_M = (1024, 8192)
SHRINK_TILES = ((64, 4, 3, 0), (64, 4, 4, 0), (32, 4, 4, 0), (64, 4, 3, 64), (64, 4, 4, 64), (32, 4, 4, 64),
                (128, 4, 3, 64), (64, 8, 3, 64), (64, 4, 3, 32), (64, 4, 4, 32), (32, 4, 4, 32), (128, 4, 3, 32),
                (64, 4, 2, 32), (128, 4, 2, 32))  # (block_k, warps, stages, sub_m: rows per program, 0 = BLOCK_M)


def shrink(preset, dev, gen, reps):
    """The packed shrink's tile sweep (block_k, warps, stages, rows per program) per op at SHRINK_M, every tile
    against the committed one (64, 4, 3, the alignment's BLOCK_M), interleaved: which tile the table should take."""
    sh = get_shape(preset)
    k = sh.top_k
    a13, _, a2, _ = kc.weights(sh, dev, gen)
    lids = torch.arange(S, dtype=torch.int32, device=dev)
    on = torch.ones_like(lids)
    for M in SHRINK_M:
        sets, bm, _, _ = _aligned_sets(sh, M, dev, gen)
        for op in ("gate_up", "down"):
            gu = op == "gate_up"
            a, X = (a13, "x") if gu else (a2, "act")
            C = pow2(S) * block_r(a.shape[3])
            for s in sets:
                s["u"] = torch.zeros(s["al"].sorted_token_ids.shape[1], a.shape[0], C, dtype=BF, device=dev)
                s["blk"] = torch.zeros(s["al"].expert_ids.shape[1], 2, dtype=torch.int32, device=dev)

            def run(s, t):
                lora_shrink_packed(s[X], a, s["al"], k, s["slot"], lids, on, s["u"], s["blk"], gather=gu,
                                   block_k=t[0], num_warps=t[1], num_stages=t[2], sub_m=t[3])

            arms = {f"bk{t[0]}/w{t[1]}/s{t[2]}" + (f"/sub{t[3]}" if t[3] else ""): (lambda s, t=t: run(s, t))
                    for t in SHRINK_TILES if (not t[3] or t[3] < bm) and _compiles(lambda t=t: run(sets[0], t))}
            med, s_, wc = _interleave(arms, sets, 1, reps)
            ref = "bk64/w4/s3"
            for nm in arms:
                r = bootstrap_paired(s_[nm], s_[ref], "ratio_of_medians")
                row(section="shrink", preset=preset, op=op, M=M, block_m=bm, tile=nm, us=med[nm],
                    over_committed=r[0], over_committed_lo=r[1], over_committed_hi=r[2], reps=reps,
                    kept=len(s_[nm]), stable=wc.stable, warmup=wc.note, interval=METHOD_BOOT)
            best = min(med, key=med.get)
            log(f"shrink {preset} {op:<7} M={M:>5}: committed {med[ref]:7.1f} us, best {best} {med[best]:7.1f} us; "
                + "  ".join(f"{nm} {med[nm]:.1f}" for nm in sorted(med, key=med.get)[:6]) + f"  {wc.note}")
        sets = None
        torch.cuda.empty_cache()


WINDOW_M = (4096, 8192, 16384)  # win_s1, win_s2: also 1024 (the windows lost there: 1.7-2.1x the one-dot shrink)
WINDOW_KEEP = dict(row_ptrs=True, x_keep=True)  # pointer tiles rebuilt per step; x evict_last, A and u evict_first
W1B = dict(slot_window=1, both_slices=True)
W1S = dict(W1B, row_ptrs=True, sub_m=64, max_regs=128)  # + programs of 64 rows, 4 per SM under a cap of 128
# the shrink's builds in the window section: name -> (alignment, lora_shrink_packed's options); "all" and "all_ord"
# are the committed shrink on the plain and the ordered alignment. win_s1 and win_s2 ran more builds (their commits'
# tables): every slot with x kept, two slots per dot, 8 warps; each lost or tied.
WINDOW_SHRINKS = {"all": ("al", {}), "all_ord": ("al_ord", {}),
                  "w1_ord_keep": ("al_ord", dict(WINDOW_KEEP, slot_window=1)),
                  "w1_ord_sub64_cap": ("al_ord", dict(slot_window=1, row_ptrs=True, sub_m=64, max_regs=128)),
                  "w1_both_ord_keep": ("al_ord", dict(W1B, **WINDOW_KEEP)),
                  "w1_both_ord_sub64": ("al_ord", dict(W1B, row_ptrs=True, sub_m=64)),
                  "w1_both_ord_sub64_cap": ("al_ord", W1S),
                  "w1_both_ord_sub64_cap_s4": ("al_ord", dict(W1S, num_stages=4))}
# end to end: name -> (per-slot expand on the ordered alignment, shrink options)
WINDOW_PATHS = {"packed": (False, {}), "packed_slot": (True, {}), "packed_slot_w1k": (True, dict(W1B, **WINDOW_KEEP)),
                "packed_slot_w1s": (True, W1S)}


def window(preset, dev, gen, reps):
    """The packed shrink one window of slots per dot (`slot_window`), both slices per program (`both_slices`), its
    pointer tiles rebuilt per step and x kept in L2 (`row_ptrs`, `x_keep`): the shrink alone in each build
    (WINDOW_SHRINKS, each against the committed shrink on the same alignment), then the packed path end to end
    (WINDOW_PATHS), each priced as the layer pays it (the ordered alignment in place of the plain one where its
    expand is per slot) against the base GEMM + the separate delta with its LoRA alignment."""
    sh, wts, lids = _packed_weights(preset, dev, gen)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    on = torch.ones_like(lids)
    for M in WINDOW_M:
        sets, bm, bml, dec = _aligned_sets(sh, M, dev, gen)
        cfg2 = lora_down_config(M, k, E, S, bml, K, I)
        for op in ("gate_up", "down"):
            gu, w, a, b, bp, X, O, C = _packed_op(op, sets, wts, dev)
            for s in sets:
                s["blk"] = torch.zeros(s["al"].expert_ids.shape[1], 2, dtype=torch.int32, device=dev)

            def shr(s, al, opts):
                run = lora_shrink_packed_switches if _tried(shrink=opts) else lora_shrink_packed
                run(s[X], a, s[al], k, s["slot"], lids, on, s["u"], s["blk"], gather=gu, **opts)

            def pk(s, slot, opts):
                run = moe_gemm_lora_packed_switches if _tried(shrink=opts) else moe_gemm_lora_packed
                run(s[X], w, s["al_ord" if slot else "al"], k, s[O], a, b, s["slot"], lids, on,
                    routed_weights=s["rw_op"], gather=gu, b_packed=bp, shrink_out=s["u"], per_slot=slot, shrink=opts)

            # down has one slice: its "both" shrink builds would repeat the others
            builds = {nm: v for nm, v in WINDOW_SHRINKS.items() if gu or not v[1].get("both_slices")}
            paths = dict(WINDOW_PATHS)  # down: the "both" paths run its one slice
            arms = {f"shrink_{nm}": (lambda s, v=v: shr(s, *v)) for nm, v in builds.items()
                    if _compiles(lambda v=v: shr(sets[0], *v))}
            arms.update({nm: (lambda s, v=v: pk(s, *v)) for nm, v in paths.items()})
            arms.update(base=lambda s: moe_gemm(s[X], w, s["al"], k, s[O], routed_weights=s["rw_op"], gather=gu),
                        align=lambda s: moe_align(s["ids"], E, bm),
                        align_ordered=lambda s: moe_align(s["ids"], E, bm, order_by=s["slot"]))
            if not dec:
                arms["separate"] = lambda s: (arms["base"](s), _separate_delta(s, X, O, a, b, lids, on, k, gu, dec,
                                                                               cfg2))
                arms["lora_align"] = lambda s: moe_align(s["ids"], E, bml, s["slot"], S)
            med, s_, wc = _interleave(arms, sets, 1, reps)
            out = {}
            for nm, (al, _) in builds.items():  # each shrink against the committed one on its alignment
                if f"shrink_{nm}" in s_:
                    ref = "shrink_all_ord" if al == "al_ord" else "shrink_all"
                    out[f"shrink_{nm}_over_committed"] = bootstrap_paired(s_[f"shrink_{nm}"], s_[ref],
                                                                          "ratio_of_medians")
            d_al = [ao - al for ao, al in zip(s_["align_ordered"], s_["align"])]
            priced = {nm: [v + d for v, d in zip(s_[nm], d_al)] if paths[nm][0] else s_[nm] for nm in paths}
            if not dec:
                sep = [v + la for v, la in zip(s_["separate"], s_["lora_align"])]
                for nm, v in priced.items():
                    out[f"{nm}_over_separate"] = bootstrap_paired(v, sep, "ratio_of_medians")
            _ratio_row("window", preset, op, M, bm, reps, s_, wc, med, out)
        sets = None
        torch.cuda.empty_cache()


EXPAND_M = (1024, 4096, 8192, 16384)
# the GEMM's expand builds (moe_gemm_lora_packed(expand=...)): name -> options; "loop" is the committed one
# exp_s1 and exp_s2 ran pf (prefetch=True), un (unroll=True) and unpf (both) too (their commits' tables): each lost;
# exp_s5 ran uptr (u_ptr=True): it tied; exp_s6 ran early_d64 (early=True, depth=64): it tied d64.
# ppt: the packed GEMM on a program per tile (expand option `tile`: GemmConfig fields replaced in the plain GEMM's
# table tile), no persistent loop for the expand's loop to unflatten
PPT = dict(persistent=0, flatten=False)
EXPAND_BUILDS = {"loop": {}, "d64": dict(depth=64), "early": dict(early=True), "ppt": dict(tile=PPT),
                 "ppt_d64": dict(depth=64, tile=PPT)}


def expand(preset, dev, gen, reps):
    """The packed GEMM's expand builds (EXPAND_BUILDS: `moe_gemm_lora_packed(expand=...)`), per slot on the ordered
    alignment: the GEMM alone on a u and blk written once (`gemm_<build>`, against the committed loop's GEMM and the
    plain GEMM on the same alignment), the GEMM with every adapter disabled (`off_<build>`, blk all empty, against
    the plain GEMM), and the path end to end with the committed shrink (`path_<build>`, priced as the layer pays it,
    against the base GEMM + the separate delta with its LoRA alignment, and against the dense build on the plain
    alignment, `path_dense`)."""
    sh, wts, lids = _packed_weights(preset, dev, gen)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    on = torch.ones_like(lids)
    for M in EXPAND_M:
        sets, bm, bml, dec = _aligned_sets(sh, M, dev, gen)
        cfg2 = lora_down_config(M, k, E, S, bml, K, I)
        for op in ("gate_up", "down"):
            gu, w, a, b, bp, X, O, C = _packed_op(op, sets, wts, dev)
            br = block_r(a.shape[3])
            for s in sets:
                nb = s["al_ord"].expert_ids.shape[1]
                s["blk"] = torch.zeros(nb, 2, dtype=torch.int32, device=dev)
                s["blk0"] = torch.zeros(s["al"].expert_ids.shape[1], 2, dtype=torch.int32, device=dev)
                s["u_g"] = torch.zeros_like(s["u"])
                lora_shrink_packed(s[X], a, s["al_ord"], k, s["slot"], lids, on, s["u_g"], s["blk"], gather=gu)

            table = configs.gemm_config(M, bm, w.shape[1], w.shape[2], E)  # the plain GEMM's tile at M

            def tile(opts):
                return replace(table, **opts["tile"]) if "tile" in opts else None

            def gemm(s, opts, off=False):
                ops = (s["u_g"], s["blk0" if off else "blk"], bp, opts.get("depth", br))
                kw = dict(routed_weights=s["rw_op"], gather=gu, config=tile(opts))
                if _tried(expand=opts):
                    moe_gemm_switches(s[X], w, s["al" if off else "al_ord"], k, s[O], **kw,
                                      packed=PackedSwitches(*ops, *(bool(opts.get(o)) for o in TRIED_EXPAND)))
                else:
                    moe_gemm(s[X], w, s["al" if off else "al_ord"], k, s[O], **kw, packed=Packed(*ops))

            def path(s, opts):
                run = moe_gemm_lora_packed_switches if _tried(expand=opts) else moe_gemm_lora_packed
                run(s[X], w, s["al_ord"], k, s[O], a, b, s["slot"], lids, on, routed_weights=s["rw_op"], gather=gu,
                    b_packed=bp, shrink_out=s["u"], per_slot=True, expand=opts)

            base = (lambda s, al="al": moe_gemm(s[X], w, s[al], k, s[O], routed_weights=s["rw_op"], gather=gu))
            arms = {"base": base, "base_ordered": lambda s: base(s, "al_ord"),
                    "align": lambda s: moe_align(s["ids"], E, bm),
                    "align_ordered": lambda s: moe_align(s["ids"], E, bm, order_by=s["slot"])}
            for nm, opts in EXPAND_BUILDS.items():
                arms[f"gemm_{nm}"] = lambda s, o=opts: gemm(s, o)
                arms[f"off_{nm}"] = lambda s, o=opts: gemm(s, o, off=True)
                arms[f"path_{nm}"] = lambda s, o=opts: path(s, o)
            # the committed build below PACKED_PER_SLOT_TOKENS: one dot over every slot on the plain alignment
            arms["path_dense"] = lambda s: moe_gemm_lora_packed(
                s[X], w, s["al"], k, s[O], a, b, s["slot"], lids, on, routed_weights=s["rw_op"], gather=gu,
                b_packed=bp, shrink_out=s["u"])
            if not dec:
                arms["separate"] = lambda s: (base(s), _separate_delta(s, X, O, a, b, lids, on, k, gu, dec, cfg2))
                arms["lora_align"] = lambda s: moe_align(s["ids"], E, bml, s["slot"], S)
            med, s_, wc = _interleave(arms, sets, 1, reps)
            out = {}
            d_al = [ao - al for ao, al in zip(s_["align_ordered"], s_["align"])]
            for nm in EXPAND_BUILDS:  # per slot on the ordered alignment (its extra time in) against the dense build
                out[f"path_{nm}_over_dense"] = bootstrap_paired([v + d for v, d in zip(s_[f"path_{nm}"], d_al)],
                                                                s_["path_dense"], "ratio_of_medians")
            sep = None if dec else [v + la for v, la in zip(s_["separate"], s_["lora_align"])]
            if sep:
                out["path_dense_over_separate"] = bootstrap_paired(s_["path_dense"], sep, "ratio_of_medians")
            for nm in EXPAND_BUILDS:
                out[f"gemm_{nm}_over_loop"] = bootstrap_paired(s_[f"gemm_{nm}"], s_["gemm_loop"], "ratio_of_medians")
                out[f"gemm_{nm}_over_base"] = bootstrap_paired(s_[f"gemm_{nm}"], s_["base_ordered"],
                                                               "ratio_of_medians")
                out[f"off_{nm}_over_base"] = bootstrap_paired(s_[f"off_{nm}"], s_["base"], "ratio_of_medians")
                if sep:
                    priced = [v + d for v, d in zip(s_[f"path_{nm}"], d_al)]
                    out[f"path_{nm}_over_separate"] = bootstrap_paired(priced, sep, "ratio_of_medians")
            log(f"expand {preset} {op} M={M}: the table's tile {table}")
            _ratio_row("expand", preset, op, M, bm, reps, s_, wc, med, out)
        sets = None
        torch.cuda.empty_cache()


WIDE_M = (1024, 4096, 8192, 16384)
WIDE_OPS = ("gate_up", "down")


def wide(preset, dev, gen, reps):
    """The wide build (`moe_gemm_lora_wide`: u and B_packed as columns past K of the GEMM's own x and w, walked by the
    plain GEMM's loop when any adapter is live) per op of WIDE_OPS at WIDE_M: the GEMM alone on a u written once
    (`gemm_wide`, against the plain GEMM) and with no adapter live (`off_wide`); the plain GEMM on the wide tensors'
    views (`base_view`: the views cost nothing); the path end to end, shrink and GEMM, on the plain alignment with
    the one-dot shrink (`path_wide`), on the ordered alignment with the committed shrink table's W1S (`path_wide_w1`,
    priced with the ordered alignment's extra time), and with every adapter disabled (`path_wide_off`); against the
    layer's committed packed path (`path_committed`: configs' per-slot, shrink, expand and tile choices at M, priced
    the same way; `path_committed_off`) and the separate delta with its LoRA alignment. gate_up's x rows are tokens,
    each with top_k tails (`Tail.jump`); `copy_x` times writing x into x_wide's first K columns, which the layer
    pays where nothing upstream writes x there. `*_blk` (`per_block`): each tile walks only its block's slots'
    columns of its own slice, on the ordered alignment: the GEMM alone (`gemm_wide_blk`, against the plain GEMM on
    that alignment, `base_ordered`), the path with the committed shrink at M (`path_wide_blk`), with W1S
    (`path_wide_blk_w1`), with W1S taking its blocks slot by slot (`path_wide_blk_w1o`: `slot_order`) and disabled
    (`path_wide_blk_off`), priced with the ordered alignment's extra time."""
    sh, wts, lids = _packed_weights(preset, dev, gen)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    on, off = torch.ones_like(lids), torch.zeros_like(lids)
    ord_m = plan_views.folded_order_by_row  # the committed path's alignment: ordered by LoRA row at these buckets
    for op in WIDE_OPS:
        gu = op == "gate_up"
        w, a, b, bp = wts[:4] if gu else wts[4:]
        C = wide_columns(a)
        KX, jump = w.shape[2], C if gu else 0  # the GEMM's K; gate_up's pairs' tails C apart in the token's row
        w_wide = wide_weights(w, bp)
        wv = w_wide[..., :KX]
        def u_of(s, gu=gu, C=C, KX=KX):  # u's view in x_wide: pair (token, j)'s columns past K
            P, xs, rows = a.shape[0], s["xw"].shape[1], s["xw"].shape[0]
            m = rows if gu else rows // k
            return torch.as_strided(s["xw"], (m, k, P, C // P), (xs, C, C // P, 1) if gu else (k * xs, xs, C, 1), KX)

        for M in WIDE_M:
            sets, bm, bml, dec = _aligned_sets(sh, M, dev, gen)
            cfg2 = lora_down_config(M, k, E, S, bml, K, I)
            X, O = _packed_op(op, sets, wts, dev)[5:7]  # also each set's routed weights and u
            for s in sets:
                rows, cx = s[X].shape[0], C * (k if gu else 1)
                s["xw"] = torch.zeros(rows, KX + cx, dtype=BF, device=dev)
                s["xw"][:, :KX] = s[X]
                s["xv"] = s["xw"][:, :KX]
                s["on_c"] = torch.full((1,), C, dtype=torch.int32, device=dev)
                s["off_c"] = torch.zeros(1, dtype=torch.int32, device=dev)
                blk = torch.zeros(s["al"].expert_ids.shape[1], 2, dtype=torch.int32, device=dev)
                u = u_of(s)
                lora_shrink_packed(s["xv"], a, s["al"], k, s["slot"], lids, on, u, blk, gather=gu, u_pair=True,
                                   tail_cols=torch.zeros(1, dtype=torch.int32, device=dev))
                # the ordered alignment's per-block slot columns (u's rows are the pairs': the same u serves it)
                s["blk_ord"] = torch.zeros(s["al_ord"].expert_ids.shape[1], 2, dtype=torch.int32, device=dev)
                lora_shrink_packed(s["xv"], a, s["al_ord"], k, s["slot"], lids, on, u, s["blk_ord"], gather=gu,
                                   u_pair=True, tail_cols=torch.zeros(1, dtype=torch.int32, device=dev))
            per_slot = ord_m(M)
            shr, exp = plan_views.packed_shrink(M), plan_views.packed_expand(M, op, w.shape[1], w.shape[2])

            def committed(s, en):
                moe_gemm_lora_packed(s[X], w, s["al_ord" if per_slot else "al"], k, s[O], a, b, s["slot"], lids, en,
                                     routed_weights=s["rw_op"], gather=gu, b_packed=bp, shrink_out=s["u"],
                                     per_slot=per_slot, shrink=shr, expand=exp)

            def wide_path(s, en, al="al", shrink=None, per_block=False, window=0):
                moe_gemm_lora_wide(s["xv"], wv, s[al], k, s[O], a, s["slot"], lids, en, routed_weights=s["rw_op"],
                                   gather=gu, shrink=shrink, per_block=per_block, window=window)

            # down's window of two slots (`window`), where the table's tile allows it (TMA weights, BLOCK_K dividing
            # it): the layer's path today on the ordered alignment (`path_wide_ordc`, all C) against it; `win_held`:
            # the share of the sets whose every block fit a window (else the launch walks all C)
            W = 2 * block_r(a.shape[3])
            cfg_w = configs.gemm_config(M, bm, w.shape[1], KX, E)
            win = W if not gu and cfg_w.w_desc and W % cfg_w.block_k == 0 and W < C else 0
            held = []
            for s in sets if win else ():
                cols = torch.zeros(1, dtype=torch.int32, device=dev)
                lora_shrink_packed(s["xv"], a, s["al_ord"], k, s["slot"], lids, on, u_of(s), s["blk_ord"], gather=gu,
                                   u_pair=True, tail_cols=cols, tail_win=win, **shr)
                held.append(float(int(cols) == win))

            def base(s, x=X, ww=w, tail=None, al="al"):
                moe_gemm(s[x], ww, s[al], k, s[O], routed_weights=s["rw_op"], gather=gu, tail=tail)

            arms = {"base": base, "base_view": lambda s: base(s, "xv", wv),
                    "gemm_wide": lambda s: base(s, "xv", wv, Tail(C, s["on_c"], jump)),
                    "off_wide": lambda s: base(s, "xv", wv, Tail(C, s["off_c"], jump)),
                    "path_wide": lambda s: wide_path(s, on), "path_wide_off": lambda s: wide_path(s, off),
                    "path_wide_w1": lambda s: wide_path(s, on, "al_ord", plan_views.legacy("W1S")),
                    # per_block: each tile walks its block's slots' columns of its slice, on the ordered alignment
                    "base_ordered": lambda s: base(s, al="al_ord"),
                    "gemm_wide_blk": lambda s: base(s, "xv", wv, Tail(C, s["on_c"], jump, s["blk_ord"], a.shape[0]),
                                                    "al_ord"),
                    "path_wide_blk": lambda s: wide_path(s, on, "al_ord", shr, True),
                    "path_wide_blk_w1": lambda s: wide_path(s, on, "al_ord", plan_views.legacy("W1S"), True),
                    # the same with the shrink's blocks slot by slot (its order kernel's launch in)
                    "path_wide_blk_w1o": lambda s: wide_path(s, on, "al_ord",
                                                             dict(plan_views.legacy("W1S"), slot_order=True), True),
                    "path_wide_blk_off": lambda s: wide_path(s, off, "al_ord", shr, True),
                    "path_committed": lambda s: committed(s, on), "path_committed_off": lambda s: committed(s, off),
                    **({"path_wide_ordc": lambda s: wide_path(s, on, "al_ord", shr),
                        "path_wide_win": lambda s: wide_path(s, on, "al_ord", shr, window=win),
                        "path_wide_win_off": lambda s: wide_path(s, off, "al_ord", shr, window=win)} if win else {}),
                    "copy_x": lambda s: s["xv"].copy_(s[X]),
                    "align": lambda s: moe_align(s["ids"], E, bm),
                    "align_ordered": lambda s: moe_align(s["ids"], E, bm, order_by=s["slot"])}
            if not dec:
                arms["separate"] = lambda s: (base(s), _separate_delta(s, X, O, a, b, lids, on, k, gu, dec, cfg2))
                arms["lora_align"] = lambda s: moe_align(s["ids"], E, bml, s["slot"], S)
            med, s_, wc = _interleave(arms, sets, 1, reps)
            d_al = [ao - al for ao, al in zip(s_["align_ordered"], s_["align"])]
            com = [v + (d if per_slot else 0.0) for v, d in zip(s_["path_committed"], d_al)]
            w1 = [v + d for v, d in zip(s_["path_wide_w1"], d_al)]
            pb = [v + d for v, d in zip(s_["path_wide_blk"], d_al)]
            pb1 = [v + d for v, d in zip(s_["path_wide_blk_w1"], d_al)]
            pbo = [v + d for v, d in zip(s_["path_wide_blk_w1o"], d_al)]
            out = {"gemm_wide_over_base": bootstrap_paired(s_["gemm_wide"], s_["base"], "ratio_of_medians"),
                   "off_wide_over_base": bootstrap_paired(s_["off_wide"], s_["base"], "ratio_of_medians"),
                   "base_view_over_base": bootstrap_paired(s_["base_view"], s_["base"], "ratio_of_medians"),
                   "path_wide_over_committed": bootstrap_paired(s_["path_wide"], com, "ratio_of_medians"),
                   "path_wide_w1_over_committed": bootstrap_paired(w1, com, "ratio_of_medians"),
                   "gemm_wide_blk_over_base": bootstrap_paired(s_["gemm_wide_blk"], s_["base_ordered"],
                                                               "ratio_of_medians"),
                   "path_wide_blk_over_committed": bootstrap_paired(pb, com, "ratio_of_medians"),
                   "path_wide_blk_w1_over_committed": bootstrap_paired(pb1, com, "ratio_of_medians"),
                   "path_wide_blk_w1o_over_committed": bootstrap_paired(pbo, com, "ratio_of_medians"),
                   "path_wide_blk_w1o_over_w1": bootstrap_paired(s_["path_wide_blk_w1o"], s_["path_wide_blk_w1"],
                                                                 "ratio_of_medians"),
                   "path_wide_blk_off_over_base": bootstrap_paired(s_["path_wide_blk_off"], s_["base"],
                                                                   "ratio_of_medians"),
                   "path_wide_blk_added_pct": bootstrap_paired(pb, s_["base"], "median_change_pct"),
                   "path_wide_blk_w1_added_pct": bootstrap_paired(pb1, s_["base"], "median_change_pct"),
                   "path_wide_off_over_base": bootstrap_paired(s_["path_wide_off"], s_["base"], "ratio_of_medians"),
                   "path_committed_off_over_base": bootstrap_paired(s_["path_committed_off"], s_["base"],
                                                                    "ratio_of_medians"),
                   "path_wide_added_pct": bootstrap_paired(s_["path_wide"], s_["base"], "median_change_pct"),
                   "path_committed_added_pct": bootstrap_paired(com, s_["base"], "median_change_pct")}
            if win:
                out["path_wide_win_over_ordc"] = bootstrap_paired(s_["path_wide_win"], s_["path_wide_ordc"],
                                                                  "ratio_of_medians")
                out["path_wide_win_off_over_base"] = bootstrap_paired(s_["path_wide_win_off"], s_["base"],
                                                                      "ratio_of_medians")
                out["win_held"] = (sum(held) / len(held),) * 3
            if gu:  # with x copied into x_wide on every call (a layer whose input is not written there)
                cw = [v + c for v, c in zip(s_["path_wide"], s_["copy_x"])]
                out["path_wide_copy_over_committed"] = bootstrap_paired(cw, com, "ratio_of_medians")
            if not dec:
                sep = [v + la for v, la in zip(s_["separate"], s_["lora_align"])]
                out["path_wide_over_separate"] = bootstrap_paired(s_["path_wide"], sep, "ratio_of_medians")
                out["path_wide_blk_over_separate"] = bootstrap_paired(pb, sep, "ratio_of_medians")
                out["path_wide_blk_w1_over_separate"] = bootstrap_paired(pb1, sep, "ratio_of_medians")
                out["path_wide_blk_w1o_over_separate"] = bootstrap_paired(pbo, sep, "ratio_of_medians")
                out["path_committed_over_separate"] = bootstrap_paired(com, sep, "ratio_of_medians")
            log(f"wide {preset} {op} M={M}: committed per_slot={per_slot} shrink={shr} expand={exp}, C={C}")
            _ratio_row("wide", preset, op, M, bm, reps, s_, wc, med, out)
            sets = None
            torch.cuda.empty_cache()


def _ratio_row(section, preset, op, M, bm, reps, s_, wc, med, out):
    """One point of a section: every arm's median (µs) and every paired ratio in `out` (value, lo, hi), logged."""
    row(section=section, preset=preset, op=op, M=M, block_m=bm, reps=reps, kept=len(s_["base"]), stable=wc.stable,
        warmup=wc.note, **{f"{nm}_us": v for nm, v in med.items()},
        **{f"{nm}{sfx}": r[j] for nm, r in out.items() for j, sfx in enumerate(("", "_lo", "_hi"))},
        interval=METHOD_BOOT)
    log(f"{section} {preset} {op:<7} M={M:>5}: " + "  ".join(f"{nm} {v:.1f}" for nm, v in med.items())
        + "  |  " + "  ".join(f"{nm} {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" for nm, r in out.items()) + f"  {wc.note}")


def _compiles(fn) -> bool:
    """fn() once; False (and the compiler's reason logged) where ptxas refuses it, e.g. a register cap below
    what one instruction needs: that arm is left out of the point, not the whole preset."""
    try:
        fn()
        return True
    except Exception as e:  # triton.runtime.errors.PTXASError; its module moves between Triton releases
        if "PTXAS" not in type(e).__name__.upper():
            raise
        why = next((ln.strip() for ln in str(e).splitlines() if "ptxas fatal" in ln and "C7602" in ln), str(e)[:200])
        log(f"  left out: {why}")
        return False


def _interleave(arms, sets, inner, reps):
    """Each arm as one CUDA graph of `inner` passes over the sets; interleaved replays; per-call samples
    with the warm-up drop (checked over every arm) applied to all: (medians, kept samples, check)."""
    graphs = {}
    for nm, f in arms.items():
        body = (lambda f=f: [f(s) for _ in range(inner) for s in sets])
        graphs[nm] = body if harness.is_dry() else GraphForward(body, warmup=2).replay
    for g in graphs.values():
        g()
    got = time_interleaved(graphs, reps=reps)
    per = {nm: [v / (inner * len(sets)) for v in t.samples_us] for nm, t in got.items()}
    wc = warmup_check(per)
    kept = {nm: v[wc.dropped:] for nm, v in per.items()}
    return {nm: float(torch.tensor(v).median()) for nm, v in kept.items()}, kept, wc


# ------------------------------------------------------------------------------------------------
def layer(preset, dev, reps):
    """One MoE layer under CUDA-graph replay: base, LoRA all active with the separate deltas (`separate_all`), at the
    committed tables (`picked_all`; `picked_none`: every adapter disabled, every kernel launched) and at PREV
    (`prev_*`). Until exp_s9 the section also ran the rows build, the packed build at every size and a candidate
    table (the columns of the sessions that have them)."""
    sh, backend, lay, pool = kc.lora_layer(preset, dev)
    none_ops = {op: frozenset() for op in ("gate_up", "down")}
    # x as the layer's norm writes it (`MoELayer.norm`): where the arm's gate_up takes the wide build, the first K
    # columns of a buffer with room for each pair's u (xv), else a plain tensor of the same values (xp)
    cx = x_wide_columns(pool.layers[0].gate_up_a, sh.top_k, True)
    for M in LAYER_M:
        xv = torch.randn(M, sh.hidden + cx, generator=torch.Generator(device=dev).manual_seed(M), device=dev).to(BF)
        xv = xv[:, :sh.hidden]
        xp = xv.contiguous()
        arms = {}
        for nm, adapters, table in (("base", None, none_ops), ("separate_all", "all", none_ops),
                                    ("picked_all", "all", None),  # None: the committed table decides
                                    ("picked_none", "none", None),
                                    ("prev_all", "all", PREV), ("prev_none", "none", PREV)):
            hooks = []
            if adapters is not None:
                names = [f"a{i % S}" for i in range(M)] if adapters == "all" else [None] * M
                info = LoRAInfo(pool.layers[0], LoRABatchTensors.from_batch(LoRABatchInfo.build(pool, names, [1] * M),
                                                                            dev), RANK)
                hooks = [LoRAHook(info, backend, sh.num_experts)]
            f = (lambda h=hooks, t=table: _with_table(t, lambda: lay(xv if lay.input_columns(M, h) else xp, h,
                                                                     backend)))
            arms[nm] = f if harness.is_dry() else GraphForward(f, warmup=2).replay  # the path is fixed at capture
        for g in arms.values():
            g()
        got = time_interleaved(arms, reps=reps)
        per = {nm: t.samples_us for nm, t in got.items()}
        wc = warmup_check(per)
        s_ = {nm: v[wc.dropped:] for nm, v in per.items()}
        sh_ = {nm: bootstrap_paired(s_[nm], s_["base"], "median_change_pct") for nm in arms if nm != "base"}
        pk = {"picked_over_separate": bootstrap_paired(s_["picked_all"], s_["separate_all"], "ratio_of_medians"),
              "picked_all_over_prev": bootstrap_paired(s_["picked_all"], s_["prev_all"], "ratio_of_medians"),
              "picked_none_over_prev": bootstrap_paired(s_["picked_none"], s_["prev_none"], "ratio_of_medians")}
        row(section="layer", preset=preset, M=M, reps=reps, kept=len(s_["base"]), stable=wc.stable, warmup=wc.note,
            **{f"{nm}_us": float(torch.tensor(v).median()) for nm, v in s_.items()},
            **{f"{nm}_share_pct{sfx}": sh_[nm][j] for nm in sh_ for j, sfx in enumerate(("", "_lo", "_hi"))},
            **{f"{nm}{sfx}": pk[nm][j] for nm in pk for j, sfx in enumerate(("", "_lo", "_hi"))},
            interval=METHOD_BOOT)
        log(f"layer {preset} M={M:>5}: base {float(torch.tensor(s_['base']).median()):8.1f} us  LoRA share: "
            + "  ".join(f"{nm} {sh_[nm][0]:+.1f} % [{sh_[nm][1]:+.1f}, {sh_[nm][2]:+.1f}]" for nm in sh_)
            + "  " + "  ".join(f"{nm} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for nm, v in pk.items()) + f"  {wc.note}")
    torch.cuda.empty_cache()


PREV = "prev"  # the layer section's tables before this session's last change: the down GEMM's wide build over all C
# columns, without its window (lay_s9 on); gate_up's wide shrink without the slot-major block order (lay_s6-lay_s8).
# In lay_s5 it was the earlier tables (without TP=4 gate_up's fold at M >= 8192 and the down
# GEMM's wide build at M = 128, 256), in lay_s3 and lay_s4 the committed tables without gate_up's wide build, in
# lay_s1 and lay_s2 without the down GEMM's, in exp_s8 and exp_s9 without the packed GEMM's tiles per shape, in
# exp_s2-exp_s4 the per-op table alone with the one-dot shrink.
PREV_TABLES = {"WIDE_DOWN_WINDOW_TOKENS": frozenset()}


def _with_table(table, fn):
    """fn() on the committed plan (table None). The table arms (PREV, an explicit per-op FOLDED_LORA_TOKENS table)
    set module-level tables the layer no longer reads: port them to plan_table.override first."""
    if table is not None:
        raise NotImplementedError("record_fold's table arms set configs' fold tables, which the layer no longer reads; "
                                  "port them to plan_table.override(plan_table.table_for().but(ops=...)) first")
    return fn()


# ------------------------------------------------------------------------------------------------
NCU_BUILDS: tuple = ()  # --ncu-builds: the builds ncu_run launches (empty: all)


def ncu_run(out, dev, gen):
    """One launch of the folded path (shrink, then GEMM) per build, preset and GEMM at M=8192, all 4 adapters live
    (builds: TMA expand, pointer expand, ordered alignment + per-row shrink);
    DIR/targets.json names each launch for `record_base.py --ncu-parse RAW --ncu-stem kernels_fold_ncu`."""
    M = 8192
    targets = []
    for preset in kc.PRESETS:
        sh = get_shape(preset)
        K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
        w13, w2 = kc.base_weights(sh, dev, gen)
        a13, b13, a2, b2 = kc.weights(sh, dev, gen)
        s = kc.make_set(sh, M, dev, gen)
        al = moe_align(s["ids"], E, moe_block_m(M, k, E, K, I))
        lids = torch.arange(S, dtype=torch.int32, device=dev)
        on = torch.ones_like(lids)
        al_ord = moe_align(s["ids"], E, al.block_m, order_by=s["slot"])
        builds = {"folded": dict(), "folded_ptr": dict(fold_desc=False),  # TMA expand, pointer expand,
                  "folded_rows": dict(shrink_per_row=True),               # ordered alignment + per-row shrink
                  "packed": dict(), "packed_slot": dict(per_slot=True),   # the packed build, dense and per slot
                  # one slot per shrink dot, both slices per program; x kept in L2 (WINDOW_KEEP)
                  "packed_slot_w1": dict(per_slot=True, shrink=dict(slot_window=1, both_slices=True)),
                  "packed_slot_w1k": dict(per_slot=True, shrink=dict(WINDOW_KEEP, slot_window=1, both_slices=True)),
                  "packed_slot_w1p": dict(per_slot=True, shrink=dict(slot_window=1)),
                  "packed_keep": dict(shrink=WINDOW_KEEP), "packed_slot_w1s": dict(per_slot=True, shrink=W1S),
                  # the expand's builds (EXPAND_BUILDS), per slot with the committed shrink
                  **{f"packed_slot_{nm}": dict(per_slot=True, expand=o) for nm, o in EXPAND_BUILDS.items()
                     if nm != "loop"},
                  # the down GEMM's wide build (its gate_up launches are the packed build's, as `packed`); both GEMMs'
                  "wide": dict(), "wide_both": dict(),
                  # gate_up's wide build per block (its block's slots' columns only), ordered alignment, W1S shrink
                  "wide_blk": dict()}
        builds = {nm: v for nm, v in builds.items() if not NCU_BUILDS or nm in NCU_BUILDS}
        bp13, bp2 = pack_lora_b(b13), pack_lora_b(b2)
        jobs = []
        if any(nm.startswith("wide") for nm in builds):
            C, C13 = wide_columns(a2), wide_columns(a13)
            w2w, w13w = wide_weights(w2, bp2), wide_weights(w13, bp13)
            xw = torch.zeros(s["act"].shape[0], I + C, dtype=BF, device=dev)
            xw[:, :I] = s["act"]
            xw13 = torch.zeros(M, K + k * C13, dtype=BF, device=dev)
            xw13[:, :K] = s["x"]
        for arm, kw in builds.items():
            if arm.startswith("wide"):
                jobs += [(lambda: moe_gemm_lora_wide(xw13[:, :K], w13w[..., :K], al_ord, k, s["inter"], a13,
                                                     s["slot"], lids, on, gather=True, shrink=W1S, per_block=True))
                         if arm == "wide_blk" else
                         (lambda: moe_gemm_lora_wide(xw13[:, :K], w13w[..., :K], al, k, s["inter"], a13, s["slot"],
                                                     lids, on, gather=True)) if arm == "wide_both" else
                         (lambda: moe_gemm_lora_packed(s["x"], w13, al, k, s["inter"], a13, b13, s["slot"], lids, on,
                                                       b_packed=bp13)),
                         lambda: moe_gemm_lora_wide(xw[:, :I], w2w[..., :I], al, k, s["down"], a2, s["slot"], lids, on,
                                                    routed_weights=s["rw"])]
                continue
            a_ = al_ord if arm == "folded_rows" or arm.startswith("packed_slot") else al
            pk = arm.startswith("packed")
            f = moe_gemm_lora_packed if pk else moe_gemm_lora_folded
            kw13, kw2 = (dict(kw, b_packed=bp13), dict(kw, b_packed=bp2)) if pk else (kw, kw)
            jobs += [lambda a_=a_, kw=kw13, f=f: f(s["x"], w13, a_, k, s["inter"], a13, b13, s["slot"], lids, on,
                                                   **kw),
                     lambda a_=a_, kw=kw2, f=f: f(s["act"], w2, a_, k, s["down"], a2, b2, s["slot"], lids, on,
                                                  routed_weights=s["rw"], gather=False, **kw)]
        harness.counted_launches(jobs)  # compiled and warmed first, then counted
        # Byte floors: what each kernel must move at least (bf16): its used weights once, its inputs once,
        # its outputs once. used: the (expert) and (slot, expert) pairs the routing touches.
        n_pairs = M * k
        used_e = int(torch.unique(s["ids"]).numel())
        used_se = int(torch.unique(s["slot"].long().repeat_interleave(k) * E + s["ids"].flatten().long()).numel())
        br = block_r(RANK)
        for arm in builds:  # the launch order of `jobs`: per build, gate_up then down, each shrink then GEMM
            for op, N, Kin, P, rows_in in (("gate_up", 2 * I, K, 2, M), ("down", K, I, 1, n_pairs)):
                shrink = rows_in * Kin * 2 + used_se * P * RANK * Kin * 2 + n_pairs * P * br * 2
                gemm = (used_e * N * Kin * 2 + rows_in * Kin * 2 + n_pairs * N * 2
                        + n_pairs * P * br * 2 + used_se * N * RANK * 2)
                pk = arm.startswith("packed") or arm.startswith("wide")
                targets += [dict(kernel="packed_shrink_kernel" if pk else "lora_shrink_kernel", preset=preset, M=M,
                                 op=f"shrink_{op}", arm=arm, tile="", byte_floor=shrink),
                            dict(kernel="fused_moe_kernel", preset=preset, M=M, op=f"folded_{op}", arm=arm,
                                 tile="", byte_floor=gemm)]
        log(f"ncu targets {preset} M={M}: {', '.join(builds)}: gate_up (shrink, gemm), down (shrink, gemm)")
    tables.write_json_atomic(os.path.join(out, "targets.json"), targets)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    tidy.session_args(ap, "kernels_fold")
    ap.add_argument("--sections", default="check,kernels,layer", help="default: check,kernels,layer")
    ap.add_argument("--reps", type=int, default=20, help="interleaved paired repetitions (default 20)")
    ap.add_argument("--cases", type=int, default=1000, help="random cases per differential (default 1000)")
    ap.add_argument("--diffs", default="presets,folded,packed,base",
                    help="check's parts: the presets' shapes and the random differentials (default all)")
    ap.add_argument("--ncu-run", action="store_true", help="launch the counted targets once (run under ncu)")
    ap.add_argument("--cases-from", type=int, default=0,
                    help="the packed differential's first case (shards run in parallel processes; default 0)")
    ap.add_argument("--ncu-builds", default="", help="with --ncu-run: the builds to launch, comma-separated")
    ap.add_argument("--wide-m", default="", help="the wide section's token counts, comma-separated (default WIDE_M)")
    ap.add_argument("--wide-ops", default="", help="the wide section's ops, comma-separated (default WIDE_OPS)")
    ap.add_argument("--dry", action="store_true", help="CPU: every path once on tiny shapes, fake timer")
    args = ap.parse_args(argv)
    global WIDE_M, WIDE_OPS
    if args.wide_m:
        WIDE_M = tuple(int(m) for m in args.wide_m.split(","))
    if args.wide_ops:
        WIDE_OPS = tuple(args.wide_ops.split(","))
    dev = _dry() if args.dry else torch.device("cuda")
    if args.dry:
        args.cases, args.reps = min(args.cases, 4), 10
    gen = torch.Generator(device=dev).manual_seed(0)
    if args.ncu_run:
        global NCU_BUILDS
        NCU_BUILDS = tuple(b for b in args.ncu_builds.split(",") if b)
        os.makedirs(args.out, exist_ok=True)
        return ncu_run(args.out, dev, gen)
    Recorder.claim(args.out, "kernels_fold", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("kernels_fold", args.out, params=dict(vars(args), rank=RANK, slots=S, dtype="bfloat16",
                                                         kernel_m=KERNEL_M, layer_m=LAYER_M,
                                                         decode_max_pairs=plan_views.legacy("DECODE_MAX_PAIRS")))
    secs = args.sections.split(",")
    t0 = time.time()
    if "check" in secs:
        rec.section("check", check, dev, gen, args.cases, args.diffs.split(","), args.cases_from)
        log(f"[check done at {time.time() - t0:.0f}s]")
    for sec, fn, extra in (("kernels", kernels, (gen,)), ("packed", packed, (gen,)), ("shrink", shrink, (gen,)),
                           ("window", window, (gen,)), ("expand", expand, (gen,)), ("wide", wide, (gen,)),
                           ("layer", layer, ())):
        if sec in secs:
            for preset in kc.PRESETS:
                rec.section(f"{sec} {preset}", fn, preset, dev, *extra, args.reps)
                log(f"[{sec} {preset} done at {time.time() - t0:.0f}s]")
    rec.write()
    tidy.append_if_asked(args, "kernels_fold")


def _dry():
    global KERNEL_M, LAYER_M, CHECK_M, SHRINK_M, BF, WINDOW_M, EXPAND_M, WIDE_M
    harness.set_dry()
    kc.set_tiny()
    KERNEL_M, LAYER_M, CHECK_M, SHRINK_M, BF = (1, 16), (16,), (1, 16), (16,), torch.float32
    WINDOW_M = EXPAND_M = WIDE_M = (16, 64)
    torch.cuda.synchronize = lambda *a: None
    return torch.device("cpu")


if __name__ == "__main__":
    main()
