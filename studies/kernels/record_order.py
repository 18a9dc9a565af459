"""gate_up's packed shrink in another block order: a probe of x's reuse in L2 (H200).

The shrink (`lora_shrink_packed`, the layer's W1S options, u in the wide build's per-pair layout) reads each token's
x row once per expert of the token: top_k times. Its programs take the alignment's blocks expert by expert, so the
programs in flight need rows of nearly every token, and ncu saw the kernel move about 2x its byte floor (wg_n1: x
rows come back from DRAM). The probe: the same kernel with its blocks taken slot by slot (`slot_major_order`),
under two adapter mappings: each token's adapter drawn at random (the kernel recordings' mapping), and requests of
contiguous tokens, one adapter per request (a prefill batch). With requests, a slot's blocks read only its requests'
rows, which may stay in L2 while every expert's A streams by once; at random, a slot's tokens are everywhere and the
order should not matter.

Arms per mapping (M = ORDER_M, qwen3-30b-a3b's gate_up shapes; its TP=4 shape has the same A and x):
  expert      the shrink as the layer runs it (the alignment ordered by LoRA row, blocks in their order)
  slot        the same launch with block_order = slot_major_order (computed once, outside the timed region)
  slot_paid   the order's kernel and the shrink, both timed (`slot_order=True`: what a layer pays)
Each arm is replayed as a CUDA graph (since ord_s2; ord_s1 ran eagerly, each arm's time with Triton's host launch
time in). Ratios paired per repetition (percentile bootstrap 95 %): slot / expert and slot_paid / expert per
mapping, and requests / random for the expert order. The u of both orders is compared bit for bit before timing.

    PYTHONPATH=. python3 studies/kernels/record_order.py --out DIR [--reps 20]
    PYTHONPATH=. python3 studies/kernels/record_order.py --out DIR --ncu-run   # under ncu: one launch per arm, M=8192
    PYTHONPATH=. python3 studies/kernels/record_base.py --out DIR --ncu-parse RAW --ncu-stem shrink_order_ncu
"""
from __future__ import annotations

import argparse
import os

import torch

from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.analysers.stats import METHOD_BOOT, bootstrap_paired, warmup_check
from lora_moe_lab.instruments.recorders import harness
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders import kernel_cases as kc
from lora_moe_lab.instruments.recorders.harness import Recorder, log, row
from lora_moe_lab.instruments.recorders.timing import time_interleaved
from lora_moe_lab.kernels.align import moe_align, slot_major_order
from lora_moe_lab.kernels.configs import block_r, moe_block_m
from lora_moe_lab.kernels.fused_moe_lora_packed import lora_shrink_packed, wide_columns
from lora_moe_lab.model.graphs import GraphForward

from studies.kernels import plan_views, tidy

S, RANK, BF = kc.S, kc.RANK, kc.BF
W1S = plan_views.W1S  # the layer's gate_up shrink options, without the block order
PRESET = "qwen3-30b-a3b"
ORDER_M = (4096, 8192, 16384)
REQUESTS = 8  # the requests mapping: REQUESTS requests of M / REQUESTS contiguous tokens, request r on slot r % S
MAPPINGS = ("random", "requests")


def _case(M, mapping, dev, gen):
    """The shrink's inputs at M under one mapping: x_wide (M, K + top_k * C), A, the ordered alignment, u's view."""
    sh = get_shape(PRESET)
    K, E, k = sh.hidden, sh.num_experts, sh.top_k
    a13 = kc.weights(sh, dev, gen)[0]
    s = kc.make_set(sh, M, dev, gen)
    if mapping == "requests":
        s["slot"] = ((torch.arange(M, device=dev) * REQUESTS // M) % S).to(torch.int32)
    C = wide_columns(a13)
    xw = torch.zeros(M, K + k * C, dtype=BF, device=dev)
    xw[:, :K] = s["x"]
    al = moe_align(s["ids"], E, moe_block_m(M, k, E, K, sh.intermediate), order_by=s["slot"])
    lids = torch.arange(S, dtype=torch.int32, device=dev)
    u = torch.as_strided(xw, (M, k, 2, C // 2), (xw.stride(0), C, C // 2, 1), K)
    blk = torch.zeros(al.expert_ids.shape[1], 2, dtype=torch.int32, device=dev)
    cols = torch.zeros(1, dtype=torch.int32, device=dev)
    used_se = int(torch.unique(s["slot"].long().repeat_interleave(k) * E + s["ids"].flatten().long()).numel())
    floor = M * K * 2 + used_se * 2 * RANK * K * 2 + M * k * 2 * block_r(RANK) * 2  # x, used A, u: once each

    def run(order=None, paid=False):
        return lora_shrink_packed(xw[:, :K], a13, al, k, s["slot"], lids, torch.ones_like(lids), u, blk,
                                  u_pair=True, tail_cols=cols, block_order=order, slot_order=paid, **W1S)
    return run, slot_major_order(al, k, s["slot"], lids, S), xw, floor


def order(dev, gen, reps):
    for M in ORDER_M:
        arms, same = {}, {}
        for mp in MAPPINGS:
            run, o, xw, _ = _case(M, mp, dev, gen)
            run()
            ref = xw.clone()
            run(o)
            same[mp] = bool(torch.equal(ref, xw))
            arms[f"{mp}_expert"] = run
            arms[f"{mp}_slot"] = lambda run=run, o=o: run(o)
            arms[f"{mp}_slot_paid"] = lambda run=run: run(paid=True)
        # each arm as a CUDA graph (GPU time only: an eager launch adds Triton's host time, about 70 us, to every arm;
        # ord_s1 was timed eagerly)
        arms = {nm: f if harness.is_dry() else GraphForward(f, warmup=2).replay for nm, f in arms.items()}
        for f in arms.values():
            f()
        got = time_interleaved(arms, reps=reps)
        per = {nm: t.samples_us for nm, t in got.items()}
        wc = warmup_check(per)
        s_ = {nm: v[wc.dropped:] for nm, v in per.items()}
        pk = {f"{mp}_{a}_over_expert": bootstrap_paired(s_[f"{mp}_{a}"], s_[f"{mp}_expert"], "ratio_of_medians")
              for mp in MAPPINGS for a in ("slot", "slot_paid")}
        pk["requests_over_random"] = bootstrap_paired(s_["requests_expert"], s_["random_expert"], "ratio_of_medians")
        row(section="order", preset=PRESET, op="shrink_gate_up", M=M, reps=reps, kept=len(s_["random_expert"]),
            stable=wc.stable, warmup=wc.note, same_u=all(same.values()),
            **{f"{nm}_us": float(torch.tensor(v).median()) for nm, v in s_.items()},
            **{f"{nm}{sfx}": pk[nm][j] for nm in pk for j, sfx in enumerate(("", "_lo", "_hi"))}, interval=METHOD_BOOT)
        log(f"order M={M:>5}: " + "  ".join(f"{nm} {float(torch.tensor(v).median()):.1f}" for nm, v in s_.items())
            + "  |  " + "  ".join(f"{nm} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for nm, v in pk.items())
            + f"  u bit for bit: {same}  {wc.note}")


def ncu_run(out, dev, gen):
    """One launch per mapping and order at M = 8192 (counted by ncu); DIR/targets.json names them."""
    M, targets, jobs = 8192, [], []
    for mp in MAPPINGS:
        run, o, _, floor = _case(M, mp, dev, gen)
        for arm, f in (("expert", run), ("slot", lambda run=run, o=o: run(o))):
            jobs.append(f)
            targets.append(dict(kernel="packed_shrink_kernel", preset=PRESET, M=M, op="shrink_gate_up",
                                arm=f"{mp}_{arm}", tile="", byte_floor=floor))
    harness.counted_launches(jobs)
    tables.write_json_atomic(os.path.join(out, "targets.json"), targets)
    log(f"ncu-run: {len(targets)} shrink launches at M={M}; targets.json written")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    tidy.session_args(ap, "shrink_order")
    ap.add_argument("--reps", type=int, default=20, help="interleaved paired repetitions (default 20)")
    ap.add_argument("--ncu-run", action="store_true", help="launch each arm once at M=8192 (run under ncu)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    if args.ncu_run:
        return ncu_run(args.out, dev, gen)
    Recorder.claim(args.out, "shrink_order", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("shrink_order", args.out, params=dict(vars(args), rank=RANK, slots=S, dtype="bfloat16",
                                                         preset=PRESET, order_m=ORDER_M, requests=REQUESTS,
                                                         shrink=W1S))
    rec.section("order", order, dev, gen, args.reps)
    rec.write()
    tidy.append_if_asked(args, "shrink_order")


if __name__ == "__main__":
    main()
