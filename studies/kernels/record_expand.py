"""data/kernels/expand_*: the aligned LoRA delta with its expand loop pipelined by hand
(`LoRAKernelConfig.prefetch`), the floor of an all-disabled exit, and (with the table as committed)
LoRA's share of the MoE layer.

    python studies/kernels/record_expand.py --out DIR [--sections check,sweep,floor] [--budget-s 400] [--dry]

Sections (rows of DIR/kernels_expand.csv; metadata in DIR/kernels_expand.meta.json):
  random  `--cases` random launches of the aligned delta over the expand loop's builds (Triton's pipeliner 2-4
          stages, the hand prefetch 0-2, the register cap) against float64, untouched rows bit for bit; each slot
          zero-padded past its own rank, and half the cases read those ranks (`lora_ranks`): the padded launch bit
          for bit.
  check   every swept tile on the presets' real shapes (bf16, rank 32, 4 slots, one slot empty, one
          disabled, tokens without adapter) against float64; rows that must not change compared bit
          for bit.
  sweep   gate_up and down delta at M = 128 .. 8192: the table's tile against prefetch 1/2 and a few
          other tiles; bytes (used adapter-experts' A and B once, x once, out read + written) per
          second over the measured copy bandwidth (`bw_frac`).
  down_paired  the down delta's table tile against the `--candidates` tiles (`balance`: split into more items,
          BLOCK_N 256 at BLOCK_M 16) at M = 1024-8192, captured once each and replayed interleaved, paired: ratio of
          medians to the table with a percentile bootstrap 95 % interval, and each arm's share of the copy bandwidth.
  floor   all adapters disabled, decode and aligned paths, against the same-grid empty kernel and a
          same-grid kernel whose programs load one device flag and exit (kernels/empty.py).
  layer   one MoE layer in graph replay: base, LoRA all active, LoRA none active (instruments/recorders/kernel_cases.py,
          each case timed on its own).
  layer_paired  the same three cases captured once each and replayed interleaved (rotated order) for
          REPS rounds: the share per round (all / base - 1, none / base - 1), its median and 10-90 %
          interval, so drifts between runs land on all three alike.
  compact one adapter active on every token: the LoRA path over the pool's 4 rows against one compacted
          row (the per_active_count graph strategy's batch), paired the same way.
  path    the whole LoRA path of one layer at M = 1..64 (instruments/recorders/kernel_cases.py).

--ncu-run (no sections): the down delta's table tile and `--candidates down` tiles launched once each, for ncu:
    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base --log-file DIR/ncu_raw.csv \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum \\
        python studies/kernels/record_expand.py --out DIR --ncu-run
    python studies/kernels/record_base.py --out DIR --ncu-parse DIR/ncu_raw.csv --ncu-stem kernels_expand_ncu
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.analysers.stats import METHOD_BOOT, bootstrap_paired, warmup_check
from lora_moe_lab.instruments.recorders import harness
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders import kernel_cases as kc
from lora_moe_lab.instruments.recorders.harness import (ROWS, Recorder, cfg_str, copy_bandwidth, graph_time_us, log,
                                                        log_rows, matmul_rate, row)
from lora_moe_lab.instruments.recorders.timing import _quantile, time_interleaved
from lora_moe_lab.kernels import configs, fused_moe_lora
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.configs import lora_block_m, lora_config, lora_down_config
from lora_moe_lab.kernels.empty import flag_exit_kernel
from lora_moe_lab.kernels.fused_moe_lora import lora_delta
from lora_moe_lab.kernels.lora_decode import decode_launch_plan, lora_delta_decode
from lora_moe_lab.model.graphs import GraphForward
from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors, LoRAInfo
from lora_moe_lab.model.moe import LoRAHook
from lora_moe_lab.ops.reference import ref_lora_delta_grouped as ref_lora
from lora_moe_lab.ops.reference import rel, tolerance

from studies.kernels import plan_views, tidy

PRESETS = kc.PRESETS
S, RANK, BF = kc.S, kc.RANK, torch.bfloat16
SWEEP_M = (128, 1024, 2048, 8192)  # sweep M of --candidates tiles (and the check's M); regs/table: REGS_M
REGS_M = (256, 512, 1024, 2048, 4096, 8192, 16384)
STAGES_M = (64, 128) + REGS_M  # the small-M branch of the down config covers M = 33..256
BLOCKS_M = (1024, 2048, 4096)
GATE_UP_M = (4096, 8192, 16384)  # the `gate_up` candidates: the separate gate_up delta where TP=4's prefill runs it
DOWN_M = (1024, 2048, 4096, 8192)  # the `down` candidates (the down delta's copy-bandwidth goal at M >= 1024)
FLOOR_M = (1, 8, 64)


def sweep_ms(which):
    """The sweep's M for candidates `which` ("table": the table's tile at every REGS_M)."""
    return {"tiles": SWEEP_M, "blocks": BLOCKS_M, "stages": STAGES_M, "down": DOWN_M, "balance": DOWN_M,
            "gate_up": GATE_UP_M}.get(which, REGS_M)


def candidates(op, M, bm0, table_for, which="regs"):
    """(block_m, config) pairs, the table's first; table_for(bm) is the table's tile for block height bm. "tiles" (run
    1): prefetch 1/2 and a few other tiles and block heights; "regs" (run 2): prefetch 0/1/2 with and without a
    register cap (maxnreg) that lets 4 programs of 4 warps fit on an SM (128) or 3 (168); "blocks" (run 6): every
    block height x prefetch 0/1/2 x cap 0/128, and prefetch 2 with 168; "gate_up": the gate_up delta's shrink depth
    and stages, warps, programs per SM and block heights (`gate_up_candidates`), down at the table's only; "table":
    the table's tile only; "stages": the expand loop pipelined by Triton (`expand_stages` 2-4, prefetch off: the
    `out` tiles stream into shared memory), beside the hand pipeline of the table; "down": the down delta's narrower
    tiles and register cap (kernel_cases.down_candidates), gate_up at the table's only; "balance" (round 2): the
    down delta split into more items and BLOCK_N 256 at BLOCK_M 16 (kernel_cases.balance_candidates), gate_up at the
    table's only."""
    table = table_for(bm0)
    out = [(bm0, table)]
    if which == "table" or (which in ("down", "balance") and op != "down") or (which == "gate_up" and op != which):
        return out
    if which == "gate_up":
        return _unique(out + gate_up_candidates(table, bm0))
    if which == "down":
        return _unique(out + [(bm0, c) for c in kc.down_candidates(table)])
    if which == "balance":
        return _unique(out + [(bm0, c) for c in kc.balance_candidates(table, bm0)])
    if which == "stages":
        return _unique(out + [(bm0, c) for c in kc.stages_candidates(op, table)])
    if which == "blocks":
        for bm in (16, 32, 64):
            t = table_for(bm)
            out += [(bm, replace(t, prefetch=pf, max_regs=cap, expand_stages=0))
                    for pf in (0, 1, 2) for cap in (0, 128)]
            out.append((bm, replace(t, prefetch=2, max_regs=168, expand_stages=0)))
        return _unique(out)
    table = replace(table, expand_stages=0)  # below: the hand prefetch and the cap over the table's tile
    out += [(bm0, replace(table, prefetch=1)), (bm0, replace(table, prefetch=2))]
    if which == "tiles":
        if op == "down":
            out += [(bm0, replace(table, block_n=64, prefetch=2)), (bm0, replace(table, num_warps=8, prefetch=2)),
                    (bm0, replace(table, block_n=256, num_warps=8, programs_per_sm=2, prefetch=2))]
        else:
            out += [(bm0, replace(table, block_n=128, prefetch=2)), (bm0, replace(table, num_warps=8, prefetch=2)),
                    (bm0, replace(table, block_k=64, num_stages=4, prefetch=2))]
        if M >= 2048:  # other block heights (a different alignment)
            for bm in (32, 128):
                out.append((bm, replace(table, num_warps=8 if bm == 128 else 4, prefetch=2)))
    else:
        out += [(bm0, replace(table, max_regs=128, prefetch=pf)) for pf in (0, 1, 2)]
        out += [(bm0, replace(table, max_regs=168, prefetch=2))]
        if op == "gate_up":
            out += [(bm0, replace(table, block_k=64, num_stages=4, prefetch=2))]
    return _unique(out)


def gate_up_candidates(table, bm0):
    """The separate gate_up delta at M >= 4096 (`--candidates gate_up`): at TP=4's M = 16384 ncu saw it latency-bound
    (occupancy 18 %, top stall long_scoreboard, DRAM 45 % of peak; data/lora_tax/lora_tax_ncu.csv), so more bytes in
    flight per program (deeper or wider K steps of the shrink), more programs per SM, and other block heights."""
    base = replace(table, expand_stages=0, prefetch=0)
    out = [(bm0, replace(base, block_k=bk, num_stages=st, max_regs=cap))
           for bk in (64, 128) for st in (3, 4, 5) for cap in (128, 0)]
    out += [(bm0, replace(base, block_k=128, num_stages=st, num_warps=8, max_regs=0)) for st in (3, 4)]
    out += [(bm0, replace(table, programs_per_sm=pps, max_regs=cap)) for pps, cap in ((2, 0), (6, 80), (8, 64))]
    out += [(bm, replace(table, num_warps=8 if bm == 128 else 4)) for bm in (32, 128) if bm != bm0]
    return out


def _unique(pairs):
    return list(dict.fromkeys(pairs))  # first occurrence kept, order kept


def op_args(op, sh):
    K, I = sh.hidden, sh.intermediate
    return (2, I, K, True) if op == "gate_up" else (1, K, I, False)  # P, N, K_in, gather


def table_config(op, M, sh, bm):
    P, N, Kin, _ = op_args(op, sh)
    f = lora_config if op == "gate_up" else lora_down_config
    return f(M, sh.top_k, sh.num_experts, S, bm, N, Kin)


def run_delta(op, s, w, al, ids_s, en, k, cfg, out=None):
    a13, b13, a2, b2 = w
    if op == "gate_up":
        return lora_delta(s["x"], a13, b13, al, ids_s, en, k, s["inter"] if out is None else out, config=cfg)
    return lora_delta(s["act"], a2, b2, al, ids_s, en, k, s["down"] if out is None else out, routed_weights=s["rw"],
                      gather=False, config=cfg)


def delta_launch(op, s, w, al, k, cfg) -> dict:
    """What `run_delta` launches (fused_moe_lora.lora_launch_plan): its grid, and its registers and shared memory
    once a launch has compiled it."""
    a13, b13, a2, b2 = w
    if op == "gate_up":
        return fused_moe_lora.lora_launch_plan(s["x"], a13, b13, al, k, config=cfg)
    return fused_moe_lora.lora_launch_plan(s["act"], a2, b2, al, k, gather=False, routed_weights=s["rw"], config=cfg)


# ------------------------------------------------------------------------------------------------
# The random differential's builds of the expand loop: Triton's pipeliner (2-4 stages), the hand prefetch (0-2), and
# the register cap, each on the layer's tile per GEMM; few, so that the cases compile a few dozen binaries.
RANDOM_BUILDS = tuple(dict(expand_stages=xs) for xs in (2, 3, 4)) + tuple(dict(prefetch=pf) for pf in (0, 1, 2)) + (
    dict(prefetch=0, max_regs=128),)


def random_cases(dev, n_cases, seed=3, shard=(0, 1)) -> dict:
    """`n_cases` random launches of the aligned LoRA delta (the builds of RANDOM_BUILDS in turn, gate_up with its
    gather and two slices on even cases, down with routed weights on odd ones; random M, E, top-k, rank, K and N, a
    token on no slot, an empty slot, a disabled adapter) against float64 on NaN-free random `out`, the rows without
    a live adapter compared bit for bit. Cases shard[0], shard[0] + shard[1], ... each from its own seed
    (kernel_cases.case_seed: studies/kernels/differentials.py splits them over processes). One row; returns it."""
    import random

    fails, bit_fails, worst, ran = 0, 0, 0.0, 0
    for i in range(shard[0], n_cases, shard[1]):
        rng = random.Random(kc.case_seed(seed, i))
        gen = torch.Generator(device=dev).manual_seed(kc.case_seed(seed, i))
        P, gather = (2, True) if i % 2 == 0 else (1, False)
        M, E, k = rng.randint(33, 40 if harness.is_dry() else 300), rng.choice((4, 9)), rng.randint(1, 4)
        # the tile per GEMM as the layer has it (BLOCK_N 64 with N split for gate_up, 128 for down) and BLOCK_R 16:
        # the binaries are the builds x GEMMs x BLOCK_M, ~30 compiles (a random tile per case compiled for minutes)
        R, K, N = rng.choice((8, 16)), rng.choice((64, 128, 192)), rng.choice((64, 96, 160))
        bm = rng.choice((16, 64))
        cfg = configs.LoRAKernelConfig(block_n=64 if P == 2 else 128, block_k=64, split_n=2 if P == 2 else 1,
                                       num_stages=3, **RANDOM_BUILDS[(i // 2) % len(RANDOM_BUILDS)])

        def rnd(*s_, std=1.0):
            return (torch.randn(*s_, generator=gen, device=dev) * std).to(BF)
        x, a, b = rnd(M if gather else M * k, K), rnd(P, S, E, R, K, std=K ** -0.5), rnd(P, S, E, N, R, std=R ** -0.5)
        slot_r = [rng.randint(1, R) for _ in range(S)]
        for s_, r_ in enumerate(slot_r):  # each slot zero-padded past its own rank, as the pool keeps them
            a[:, s_, :, r_:] = 0
            b[:, s_, :, :, r_:] = 0
        # half the cases read each row's own rank (lora_ranks; a few 0 = the padded R): the padded launch bit for bit
        own = i % 4 in (2, 3)
        ranks = torch.tensor([slot_r[r] if rng.random() < 0.9 else 0 for r in range(S)], dtype=torch.int32,
                             device=dev) if own else None
        rw, ids = kc.route(M, E, k, gen, dev)
        rw = None if gather else rw
        slot = torch.randint(-1, S, (M,), generator=gen, device=dev, dtype=torch.int32)
        empty = rng.randrange(S)  # row s is slot s (the pool's batches), one of them empty
        lids = torch.tensor([-1 if r == empty else r for r in range(S)], dtype=torch.int32, device=dev)
        en = torch.tensor([rng.choice((0, 1, 1)) for _ in range(S)], dtype=torch.int32, device=dev)
        ref, live = ref_lora(x, a, b, ids, slot, lids, en, k, rw, gather)
        # out starts on the scale of the delta it receives (as kernel_cases' decode differential): a slot zero-padded
        # to a small rank adds a delta far below out's bf16 rounding step at scale 1, which out - out0 cannot resolve
        scale = max(ref[live].abs().max().item(), 1e-4) if live.any() else 1.0
        out0 = (rnd(M * k, P * N).float() * scale).to(BF)
        out = out0.clone()
        al = moe_align(ids, E, bm, slot, S)
        lora_delta(x, a, b, al, lids, en, k, out, routed_weights=rw, gather=gather, config=cfg, lora_ranks=ranks)
        bits = torch.int16 if out.element_size() == 2 else torch.int32
        same = torch.equal(out[~live].view(bits), out0[~live].view(bits))
        if own:
            padded = lora_delta(x, a, b, al, lids, en, k, out0.clone(), routed_weights=rw, gather=gather, config=cfg)
            same = same and torch.equal(out.view(bits), padded.view(bits))
        err = rel(out[live].double() - out0[live].double(), ref[live]) if live.any() else 0.0
        worst = max(worst, err)
        fails += not (same and err < tolerance(BF, dev))
        bit_fails += not same
        ran += 1
        if ran % 100 == 0:
            log(f"random: {ran} launches, {fails} failures ({bit_fails} not bit for bit), worst {worst:.1e}")
    builds = [cfg_str(0, replace(configs.LoRAKernelConfig(64, 32), **b)).split("/", 1)[1] for b in RANDOM_BUILDS]
    r = row(section="random", op="random_delta", cases=ran, failures=fails, bit_failures=bit_fails, worst=worst,
            seed=seed, dtype=str(BF)[6:], builds=str(builds))
    log(f"random: {ran} random launches of the aligned delta, {fails} failures, worst {worst:.1e}")
    return r


def check(preset, dev, gen, deadline, which="regs"):
    sh = get_shape(preset)
    E, k = sh.num_experts, sh.top_k
    w = kc.weights(sh, dev, gen)
    lora_ids = torch.tensor([0, 1, 2, -1], dtype=torch.int32, device=dev)  # slot 3 empty
    enabled = torch.tensor([1, 0, 1, 1], dtype=torch.int32, device=dev)  # slot 1 disabled
    for M in (16,) + SWEEP_M:
        if time.time() > deadline:
            log(f"  check cut at {preset} M={M} (budget)")
            break
        s = kc.make_set(sh, M, dev, gen)
        s["slot"] = torch.randint(-1, S, (M,), generator=gen, device=dev, dtype=torch.int32)  # some without adapter
        bm0 = lora_block_m(M, k, E, S)
        for op in ("gate_up", "down"):
            P, N, Kin, gather = op_args(op, sh)
            xin = s["x"] if gather else s["act"]
            a, b = (w[0], w[1]) if P == 2 else (w[2], w[3])
            ref, live = ref_lora(xin, a, b, s["ids"], s["slot"], lora_ids, enabled, k, None if gather else s["rw"],
                                 gather)
            # down: the expert outputs it adds to carry the routed weight too (out on the delta's scale)
            out0 = s["inter"] if P == 2 else (s["down"].float() * s["rw"].reshape(-1, 1)).to(BF)
            fails = 0
            table_for = lambda bm, op=op, M=M: table_config(op, M, sh, bm)  # noqa: E731
            for bm, cfg in _unique(candidates(op, max(M, 128), bm0, table_for, which)
                                   + candidates(op, max(M, 128), bm0, table_for, "tiles")):
                al = moe_align(s["ids"], E, bm, s["slot"], S)
                out = out0.clone()
                run_delta(op, s, w, al, lora_ids, enabled, k, cfg, out)
                bits = torch.int16 if out.element_size() == 2 else torch.int32
                untouched = torch.equal(out[~live].view(bits), out0[~live].view(bits))
                err = rel(out[live].double() - out0[live].double(), ref[live]) if live.any() else 0.0
                ok = untouched and err < tolerance(BF, dev)
                fails += not ok
                row(section="check", preset=preset, op=op, M=M, config=cfg_str(bm, cfg), rel_err=err,
                    tol=tolerance(BF, dev),
                    untouched_rows_identical=untouched, ok=ok)
            worst = max(r['rel_err'] for r in ROWS
                        if r['section'] == 'check' and r['M'] == M and r['op'] == op and r['preset'] == preset)
            log(f"check {preset} M={M} {op}: {fails} failures, worst "
                f"{worst:.1e}")
            ref = live = None  # frees the buffers before the next M
        s = None  # frees the buffers before the next M
    torch.cuda.empty_cache()


def sweep(preset, dev, gen, copy_gbps, deadline, which="regs"):
    sh = get_shape(preset)
    E, k = sh.num_experts, sh.top_k
    w = kc.weights(sh, dev, gen)
    ids_s = torch.arange(S, dtype=torch.int32, device=dev)
    on = torch.ones(S, dtype=torch.int32, device=dev)
    for M in sweep_ms(which):  # "table": the table's tile at every REGS_M
        n_sets = 6 if M <= 1024 else 2
        sets = [kc.make_set(sh, M, dev, gen) for _ in range(n_sets)]
        bm0 = lora_block_m(M, k, E, S)
        aligns = {}
        for op in ("gate_up", "down"):
            P, N, Kin, gather = op_args(op, sh)
            nbytes = sum(kc.lora_bytes(s, sh, P, N, Kin, gather) for s in sets) / n_sets
            table_for = lambda bm, op=op, M=M: table_config(op, M, sh, bm)  # noqa: E731
            for i, (bm, cfg) in enumerate(candidates(op, M, bm0, table_for, which)):
                if i > 1 and time.time() > deadline:
                    log(f"  sweep cut at {preset} M={M} {op} (budget)")
                    break
                if bm not in aligns:
                    aligns[bm] = [moe_align(s["ids"], E, bm, s["slot"], S) for s in sets]
                fns = [lambda s=s, a_=a_, c=cfg, op=op, w=w: run_delta(op, s, w, a_, ids_s, on, k, c)
                       for s, a_ in zip(sets, aligns[bm])]
                t = graph_time_us(fns, inner=4 if M <= 1024 else 1, reps=15)
                gbps = nbytes / (t * 1e-6) / 1e9
                lp = delta_launch(op, sets[0], w, aligns[bm][0], k, cfg)
                row(section="sweep", preset=preset, M=M, op=op, config=cfg_str(bm, cfg), table=i == 0,
                    prefetch=cfg.prefetch,
                    time_us=t, bytes=nbytes, gbps=gbps, bw_frac=gbps / copy_gbps,
                    grid=lp["programs"], regs=lp["regs"], shared=lp["shared"])
            rs = [r for r in ROWS
                  if r["section"] == "sweep" and r["preset"] == preset and r["M"] == M and r["op"] == op]
            best = min(rs, key=lambda r: r["time_us"])
            log(f"{op:8}{preset:<19}M={M:<5} table {rs[0]['time_us']:7.1f} us {100 * rs[0]['bw_frac']:3.0f}%  best "
                f"{best['time_us']:7.1f} us {100 * best['bw_frac']:3.0f}% {best['config']}")
        sets = aligns = None  # frees the buffers before the next M
    torch.cuda.empty_cache()


def down_paired(preset, dev, gen, copy_gbps, deadline, which="balance", reps=15):
    """The down delta's table tile against the `which` candidates at DOWN_M, each captured once as a graph over the
    same input sets and replayed interleaved (rotated order) for `reps` rounds after a warm-up drift check: per arm
    the median time, its share of the copy bandwidth, and its ratio of medians to the table with a percentile
    bootstrap 95 % interval (the tables' bar: under 0.99 in two device sessions)."""
    sh = get_shape(preset)
    E, k = sh.num_experts, sh.top_k
    w = kc.weights(sh, dev, gen)
    ids_s = torch.arange(S, dtype=torch.int32, device=dev)
    on = torch.ones(S, dtype=torch.int32, device=dev)
    P, N, Kin, gather = op_args("down", sh)
    for M in DOWN_M:
        if time.time() > deadline:
            log(f"  down_paired cut at {preset} M={M} (budget)")
            break
        n_sets = 6 if M <= 1024 else 2
        sets = [kc.make_set(sh, M, dev, gen) for _ in range(n_sets)]
        bm0 = lora_block_m(M, k, E, S)
        al = [moe_align(s["ids"], E, bm0, s["slot"], S) for s in sets]
        nbytes = sum(kc.lora_bytes(s, sh, P, N, Kin, gather) for s in sets) / n_sets
        arms = candidates("down", M, bm0, lambda bm: table_config("down", M, sh, bm), which)
        fns, grids = {}, {}
        for bm, cfg in arms:
            body = [lambda s=s, a_=a_, c=cfg: run_delta("down", s, w, a_, ids_s, on, k, c) for s, a_ in zip(sets, al)]
            body[0]()
            lp = delta_launch("down", sets[0], w, al[0], k, cfg)
            grids[cfg_str(bm, cfg)] = (lp["programs"], lp["regs"])
            fns[cfg_str(bm, cfg)] = GraphForward(lambda b=body: [f() for f in b], warmup=3).replay
        got = time_interleaved(fns, reps=reps)
        samples = {a: [x / n_sets for x in tm.samples_us] for a, tm in got.items()}
        wc = warmup_check(samples)
        smp = {a: v[wc.dropped:] for a, v in samples.items()}
        table = cfg_str(*arms[0])
        med = {a: float(torch.tensor(v).median()) for a, v in smp.items()}
        of_copy = {a: nbytes / (t * 1e-6) / 1e9 / copy_gbps for a, t in med.items()}
        for a in fns:
            r = bootstrap_paired(smp[a], smp[table], "ratio_of_medians")
            row(section="down_paired", preset=preset, M=M, op="down", config=a, table=a == table, reps=reps,
                kept=len(smp[a]), stable=wc.stable, warmup=wc.note, time_us=med[a], bytes=nbytes,
                bw_frac=of_copy[a], over_table=r[0], over_table_lo=r[1],
                over_table_hi=r[2], grid=grids[a][0], regs=grids[a][1], interval=METHOD_BOOT)
        log(f"down_paired {preset} M={M}: table {med[table]:.1f} us "
            f"({100 * of_copy[table]:.0f} % of copy, {table}); "
            + ", ".join(f"{a} {med[a] / med[table]:.3f}" for a in fns if a != table) + f" {wc.note}")
        sets = al = fns = None  # frees the buffers and graphs before the next M
    torch.cuda.empty_cache()


def floor(preset, dev, gen, deadline):
    sh = get_shape(preset)
    E, k = sh.num_experts, sh.top_k
    w = kc.weights(sh, dev, gen)
    ids_s = torch.arange(S, dtype=torch.int32, device=dev)
    on, off = torch.ones(S, dtype=torch.int32, device=dev), torch.zeros(S, dtype=torch.int32, device=dev)
    flag, sink = torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    for M in FLOOR_M:
        s = kc.make_set(sh, M, dev, gen)
        al = moe_align(s["ids"], E, lora_block_m(M, k, E, S), s["slot"], S)
        for op in ("gate_up", "down"):
            P, N, Kin, gather = op_args(op, sh)
            a, b = (w[0], w[1]) if P == 2 else (w[2], w[3])
            xin, out = (s["x"], s["inter"]) if gather else (s["act"], s["down"])
            rw = None if gather else s["rw"]

            def dec(en, empty=False):
                lora_delta_decode(xin, a, b, s["ids"], s["slot"], ids_s, en, out, routed_weights=rw, gather=gather,
                                  empty=empty)
            t = dict(decode_off_us=graph_time_us([lambda: dec(off)], inner=32),
                     decode_empty_us=graph_time_us([lambda: dec(on, True)], inner=32))
            g = decode_launch_plan(s["ids"].numel(), a.shape[0], b.shape[3], a.shape[4], a.shape[3])["programs"]
            t["decode_flag_us"] = graph_time_us([lambda: flag_exit_kernel[(g,)](flag, sink)], inner=32)
            t["aligned_off_us"] = graph_time_us([lambda: lora_delta(xin, a, b, al, ids_s, off, k, out,
                                                                    routed_weights=rw, gather=gather)], inner=32)
            ga = fused_moe_lora.lora_launch_plan(xin, a, b, al, k, gather=gather, routed_weights=rw)["programs"]
            t["aligned_empty_us"] = graph_time_us([lambda: kc.aligned_empty(xin, a, b, al, ids_s, on, k, out,
                                                                             routed_weights=rw, gather=gather)],
                                                  inner=32)
            t["aligned_flag_us"] = graph_time_us([lambda: flag_exit_kernel[(ga,)](flag, sink)], inner=32)
            row(section="floor", preset=preset, M=M, op=op, decode_programs=g, aligned_programs=ga, **t,
                decode_ratio=t["decode_off_us"] / t["decode_empty_us"],
                decode_flag_ratio=t["decode_flag_us"] / t["decode_empty_us"],
                aligned_ratio=t["aligned_off_us"] / t["aligned_empty_us"],
                aligned_flag_ratio=t["aligned_flag_us"] / t["aligned_empty_us"])
            log(f"floor {preset} M={M} {op}: decode off {t['decode_off_us']:.2f} / empty {t['decode_empty_us']:.2f} / "
                f"flag {t['decode_flag_us']:.2f} us ({g} programs); aligned off {t['aligned_off_us']:.2f} / empty "
                f"{t['aligned_empty_us']:.2f} / flag {t['aligned_flag_us']:.2f} us ({ga})")
    torch.cuda.empty_cache()


def _paired_layer(preset, dev, deadline, Ms, cases, section, reps=31):
    """One MoE layer per case (name -> (adapters per token or None for the base layer, LoRA rows or
    None)), captured once each and replayed interleaved `reps` times; returns per M the per-round
    times per call of each case (us) and writes nothing."""
    sh, backend, layer, pool = kc.lora_layer(preset, dev)
    for M in Ms:
        if time.time() > deadline:
            log(f"  {section} cut at {preset} M={M} (budget)")
            break
        x = torch.randn(M, sh.hidden, generator=torch.Generator(device=dev).manual_seed(M), device=dev).to(BF)
        inner = 8 if M <= 64 else (4 if M <= 1024 else 1)  # one replay holds `inner` layer calls
        graphs = {}
        for case, (adapters, rows, *bm) in cases(M).items():
            hooks = []
            if adapters is not None:
                b = LoRABatchInfo.build(pool, adapters, [1] * M, rows=rows)
                info = LoRAInfo(pool.layers[0], LoRABatchTensors.from_batch(b, dev), RANK)
                hooks = [LoRAHook(info, backend, sh.num_experts)]

            def body(h=hooks, layer=layer, x=x, inner=inner):
                for _ in range(inner):
                    out = layer(x, h, backend)
                return out
            # forced choices ("bm": LoRA BLOCK_M, "split": split_n of both deltas), made while the graph
            # is captured (the layer picks blocks and tiles then; replays repeat what was captured)
            force = bm[0] if bm else {}
            real_cfg = fused_moe_lora.lora_config
            if "bm" in force:
                backend.lora_block_m = lambda *a, _bm=force["bm"]: _bm
            if "split" in force:
                fused_moe_lora.lora_config = lambda *a, _s=force["split"]: replace(real_cfg(*a), split_n=_s)
                backend.lora_down_config = lambda *a, _s=force["split"]: replace(lora_down_config(*a), split_n=_s)
            try:
                graphs[case] = GraphForward(body, warmup=2)
            finally:
                backend.__dict__.pop("lora_block_m", None)
                backend.__dict__.pop("lora_down_config", None)
                fused_moe_lora.lora_config = real_cfg
        for g in graphs.values():  # warm replays
            for _ in range(3):
                g.replay()
        t = time_interleaved({c: g.replay for c, g in graphs.items()}, reps=reps)
        yield M, inner, {c: [v / inner for v in t[c].samples_us] for c in t}
        graphs = None  # frees the buffers before the next M
    torch.cuda.empty_cache()


def _q(xs):
    return _quantile(xs, 0.5), _quantile(xs, 0.1), _quantile(xs, 0.9)


def layer_paired(preset, dev, deadline, reps=31):
    """Base layer, LoRA with all 4 adapters active (round robin over tokens), LoRA with none active."""
    k = get_shape(preset).top_k
    names = [f"a{i}" for i in range(S)]
    cases = lambda M: {"base": (None, None), "lora_all_active": ([names[i % S] for i in range(M)], None),  # noqa: E731
                       "lora_none_active": ([None] * M, None)}
    for M, inner, per in _paired_layer(preset, dev, deadline, kc.LAYER_M, cases, "layer_paired", reps):
        share, p10, p90 = _q([a / b - 1 for a, b in zip(per["lora_all_active"], per["base"])])
        none, n10, n90 = _q([a / b - 1 for a, b in zip(per["lora_none_active"], per["base"])])
        med = {c: _quantile(v, 0.5) for c, v in per.items()}
        path = "decode" if plan_views.use_decode_path(M, k) else "aligned"
        row(section="layer_paired", preset=preset, M=M, path=path,
            reps=reps, inner=inner, base=med["base"], lora_all_active=med["lora_all_active"],
            lora_none_active=med["lora_none_active"], lora_share=share, lora_share_p10=p10, lora_share_p90=p90,
            none_active_share=none, none_active_share_p10=n10, none_active_share_p90=n90)
        log(f"layer_paired {preset} M={M}: base {med['base']:.1f} us, all active +{100 * share:.1f} % "
            f"[{100 * p10:.1f}, {100 * p90:.1f}], none active +{100 * none:.1f} % [{100 * n10:.1f}, {100 * n90:.1f}]")


COMPACT_M = (64, 512, 2048)


def compact(preset, dev, deadline, reps=31):
    """One adapter active on every token: the LoRA path with the pool's 4 rows (3 of them exit) against
    one compacted row (the per_active_count graph strategy's batch): the LoRA part of each, and the ratio."""
    cases = lambda M: {"base": (None, None), "rows4": (["a1"] * M, None), "rows1": (["a1"] * M, 1),  # noqa: E731
                       "rows1_bm16": (["a1"] * M, 1, {"bm": 16}), "rows1_split1": (["a1"] * M, 1, {"split": 1})}
    for M, inner, per in _paired_layer(preset, dev, deadline, COMPACT_M, cases, "compact", reps):
        r, r10, r90 = _q([(c - b) / (a - b) if a > b else float("nan")
                          for a, b, c in zip(per["rows4"], per["base"], per["rows1"])])
        s16, s10, s90 = _q([(c - b) / (a - b) if a > b else float("nan")
                            for a, b, c in zip(per["rows4"], per["base"], per["rows1_bm16"])])
        p1, p10_, p90_ = _q([(c - b) / (a - b) if a > b else float("nan")
                             for a, b, c in zip(per["rows4"], per["base"], per["rows1_split1"])])
        med = {c: _quantile(v, 0.5) for c, v in per.items()}
        row(section="compact", preset=preset, M=M, reps=reps, inner=inner, base=med["base"], rows4=med["rows4"],
            rows1=med["rows1"], lora_rows1_over_rows4=r, lora_rows1_over_rows4_p10=r10, lora_rows1_over_rows4_p90=r90,
            rows1_bm16=med["rows1_bm16"], lora_rows1_bm16_over_rows4=s16, lora_rows1_bm16_over_rows4_p10=s10,
            lora_rows1_bm16_over_rows4_p90=s90, rows1_split1=med["rows1_split1"], lora_rows1_split1_over_rows4=p1,
            lora_rows1_split1_over_rows4_p10=p10_, lora_rows1_split1_over_rows4_p90=p90_,
            block_m_rows4=configs.lora_block_m(M, get_shape(preset).top_k, get_shape(preset).num_experts, S),
            block_m_rows1=configs.lora_block_m(M, get_shape(preset).top_k, get_shape(preset).num_experts, 1))
        log(f"compact {preset} M={M}: base {med['base']:.1f} us, one adapter over 4 rows "
            f"+{med['rows4'] - med['base']:.1f} "
            f"us, over 1 row +{med['rows1'] - med['base']:.1f} us: x{r:.2f} [{r10:.2f}, {r90:.2f}]; "
            f"1 row with BLOCK_M 16 "
            f"x{s16:.2f} [{s10:.2f}, {s90:.2f}]; 1 row with split_n 1 x{p1:.2f} [{p10_:.2f}, {p90_:.2f}]")


NCU_M = (2048, 8192)  # the down candidates counted: where BLOCK_N 64 lost most (2048) and at the largest M


def ncu_run(out, dev, gen, which="down"):
    """`--ncu-run` (under ncu, --profile-from-start off): the down delta with the table's tile and each `down`
    candidate, one launch each at NCU_M on both presets between cudaProfilerStart/Stop, every launch compiled and
    warmed first; DIR/targets.json names them in launch order with their byte floor (the used adapter-experts' A
    and B once, the activations once per pair, `out` read and written), for record_base.py --ncu-parse."""
    import os

    targets, launches = [], []
    ids_s = torch.arange(S, dtype=torch.int32, device=dev)
    on = torch.ones(S, dtype=torch.int32, device=dev)
    for preset in PRESETS:
        sh = get_shape(preset)
        w = kc.weights(sh, dev, gen)
        for M in (1024, 4096) if which == "balance" else NCU_M:  # balance: where items are few per program
            s = kc.make_set(sh, M, dev, gen)
            bm0 = lora_block_m(M, sh.top_k, sh.num_experts, S)
            al = moe_align(s["ids"], sh.num_experts, bm0, s["slot"], S)
            P, N, Kin, gather = op_args("down", sh)
            floor = kc.lora_bytes(s, sh, P, N, Kin, gather)
            for i, (bm, cfg) in enumerate(candidates("down", M, bm0, lambda b: table_config("down", M, sh, b), which)):
                launches.append(lambda s=s, w=w, al=al, cfg=cfg, k=sh.top_k: run_delta("down", s, w, al, ids_s, on, k,
                                                                                       cfg))
                targets.append(dict(kernel="fused_moe_lora_kernel", preset=preset, M=M, op="lora_down",
                                    arm="table" if i == 0 else "candidate", tile=cfg_str(bm, cfg), byte_floor=floor))
    harness.counted_launches(launches)  # compiled and warmed first, then counted
    os.makedirs(out, exist_ok=True)
    tables.write_json_atomic(os.path.join(out, "targets.json"), targets)
    log(f"ncu-run: {len(targets)} down-delta launches counted once each; targets.json written")


# ------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    tidy.session_args(ap, "kernels_expand")
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--sections", default="check,sweep,floor")
    ap.add_argument("--candidates",
                    choices=("tiles", "regs", "table", "blocks", "stages", "down", "balance", "gate_up"),
                    default="regs",
                    help="sweep candidates: 'tiles' = run 1 (prefetch, tiles, block heights), 'regs' = run 2, "
                         "'table' = the committed table's tile only, 'blocks' = BLOCK_M 16/32/64 x prefetch x cap, "
                         "'gate_up' = the gate_up delta's tiles at M >= 4096")
    ap.add_argument("--cases", type=int, default=1000, help="launches of the random section (default 1000)")
    ap.add_argument("--dry", action="store_true", help="CPU: every section once on the tiny preset, fake timer")
    ap.add_argument("--ncu-run", action="store_true",
                    help="the down delta's table and `down` candidates, one launch each (run under ncu; then "
                         "studies/kernels/record_base.py --ncu-parse)")
    args = ap.parse_args(argv)
    if args.ncu_run:
        if not runtime.has_cuda():
            raise SystemExit("--ncu-run needs a CUDA GPU")
        return ncu_run(args.out, runtime.default_device(), torch.Generator(device="cuda").manual_seed(0),
                       "balance" if args.candidates == "balance" else "down")
    if args.dry:
        _dry()
    elif not runtime.has_cuda():
        raise SystemExit("studies/kernels/record_expand.py needs a CUDA GPU (or --dry)")
    Recorder.claim(args.out, "kernels_expand", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("kernels_expand", args.out, params=dict(vars(args), rank=RANK, slots=S, dtype="bfloat16",
                                                            sweep_m=sweep_ms(args.candidates)))
    t0, meta = rec.t0, rec.meta
    dev = runtime.default_device()
    gen = torch.Generator(device=dev).manual_seed(0)
    meta["copy_gbps"], meta["copy_times_us"] = copy_bandwidth(dev)
    meta["matmul_tflops"], meta["matmul_times_us"] = matmul_rate(dev)  # the FLOP ceiling of the floors
    secs = args.sections.split(",")
    if "random" in secs:  # once, not per preset: its shapes are random
        rec.section("random", random_cases, dev, min(args.cases, 4) if args.dry else args.cases)
    t_budget = time.time()  # the budget's shares count from here: the random cases have none
    shares = {"check": 0.15, "sweep": 0.6, "down_paired": 0.6, "floor": 0.65, "layer": 0.75, "layer_paired": 0.85,
              "compact": 0.9, "path": 1.0}
    for sec in shares:  # in this order; the deadlines are cumulative budget shares
        if sec not in secs:
            continue
        for preset in PRESETS:
            dl = t_budget + args.budget_s * shares[sec]
            fn, extra = {"check": (check, (gen, dl, args.candidates)),
                         "sweep": (sweep, (gen, meta["copy_gbps"], dl, args.candidates)),
                         "down_paired": (down_paired, (gen, meta["copy_gbps"], dl, args.candidates)),
                         "floor": (floor, (gen, dl)), "layer": (kc.time_layer, (dl,)),
                         "layer_paired": (layer_paired, (dl,)), "compact": (compact, (dl,)),
                         "path": (kc.time_paths, (gen, dl))}[sec]
            rec.section(f"{sec} {preset}", fn, preset, dev, *extra)
        log(f"[{sec} done at {time.time() - t0:.0f}s]")
    rec.write()
    tidy.append_if_asked(args, "kernels_expand")
    summary(meta)


def _dry():
    """Exercise every section on the CPU (interpreter, tiny preset, each fn called once as 'timing')."""
    global PRESETS, SWEEP_M, FLOOR_M, BF, COMPACT_M
    harness.set_dry()
    kc.set_tiny()
    g = globals()
    PRESETS, SWEEP_M, FLOOR_M, BF, COMPACT_M = ("tiny",), (16,), (1,), torch.float32, (16,)
    g["REGS_M"] = g["BLOCKS_M"] = g["STAGES_M"] = g["DOWN_M"] = (16,)
    g["time_interleaved"] = lambda fns, reps=1: {  # each fn called once, its "time" repeated: the stats see `reps`
        c: type("T", (), {"samples_us": [float(f() is not None) + 1.0] * reps})() for c, f in fns.items()}

    class _G:  # no capture on the CPU: the "graph" calls the body
        def __init__(self, fn, warmup=0):
            self.fn = fn

        def replay(self):
            return self.fn()
    g["GraphForward"] = _G


def summary(meta):
    log(f"\ncopy {meta['copy_gbps']:.0f} GB/s, bf16 matmul {meta.get('matmul_tflops', 0):.0f} TFLOP/s; errors: "
        f"{meta['errors']}")
    chk = [r for r in ROWS if r["section"] == "check"]
    if chk:
        log(f"check: {len(chk)} cases, {sum(not r['ok'] for r in chk)} failures, "
            f"worst {max(r['rel_err'] for r in chk):.2e}")
    for r in ROWS:
        if r["section"] == "sweep" and r["table"]:
            rs = [x for x in ROWS if x["section"] == "sweep" and x["preset"] == r["preset"] and x["M"] == r["M"]
                  and x["op"] == r["op"]]
            best = min(rs, key=lambda x: x["time_us"])
            pf = min((x for x in rs if x["config"] == r["config"] + "/pf2"), key=lambda x: x["time_us"], default=r)
            log(f"{r['op']:<8}{r['preset']:<19}{r['M']:>5} table {r['time_us']:7.1f} us {100 * r['bw_frac']:3.0f}% "
                f"({r['grid']} prog, {r.get('regs')} regs) | pf2 {pf['time_us']:7.1f} {100 * pf['bw_frac']:3.0f}% "
                f"| best "
                f"{best['time_us']:7.1f} {100 * best['bw_frac']:3.0f}% {best['config']} "
                f"({best['grid']} prog, {best.get('regs')} regs)")
    log_rows("floor", lambda r: f"off {r['preset']:<19}M={r['M']:<3}{r['op']:<8} decode {r['decode_ratio']:.2f}x "
                                f"(flag floor {r['decode_flag_ratio']:.2f}x), aligned {r['aligned_ratio']:.2f}x (flag"
                                f" {r['aligned_flag_ratio']:.2f}x)")
    log_rows("compact", lambda r: f"compact {r['preset']:<18}{r['M']:>6} LoRA over 1 row / over 4 rows "
                                  f"x{r['lora_rows1_over_rows4']:.2f} [{r['lora_rows1_over_rows4_p10']:.2f}, "
                                  f"{r['lora_rows1_over_rows4_p90']:.2f}]")
    log_rows(("layer", "layer_paired"), lambda r: f"{r['section']:<13}{r['preset']:<18}{r['M']:>6} base "
                                                  f"{r['base']:8.1f} all {100 * r['lora_share']:5.1f}% "
                                                  f"none {100 * r['none_active_share']:5.1f}% ({r['path']})")


if __name__ == "__main__":
    main()
