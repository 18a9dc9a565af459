"""data/kernels/decode_*: the decode-path LoRA delta (no alignment), the down delta's tiles, the
all-disabled launch against a same-grid empty kernel, and LoRA's share of the MoE layer.

    python studies/kernels/record_decode.py --out DIR [--budget-s 420] [--cases 1200] [--dry]

Sections (rows of DIR/kernels_decode.csv; metadata in DIR/kernels_decode.meta.json):
  diff     random differential run of the decode kernel against float64 (dtypes, pool ranks 16/32 with
           per-slot ranks zero-padded, odd K/N, tokens without adapter, rows without adapter, disabled
           rows, expert -1, a device-side live-pair count, routed weights); NaN-poisoned exiting rows
           compared bit for bit; half the cases read each row's own rank (`lora_ranks`) and must equal the
           padded launch bit for bit. Few compile variants: K and N come from short lists.
  path     the whole LoRA path of one layer at decode sizes, graph replay, bf16, rank 32, 4 adapters, every
           token with an adapter: today's (alignment + gate_up delta + down delta) against the decode path
           (two launches), and each part; `decode_tile` rows: other decode splits/tiles.
  disabled all adapters disabled against an empty kernel of the same grid and arguments, both paths.
  down     the aligned down delta (P=1, routed weights) over tile variants at M >= 128, and the gate_up
           delta at the table's tile: bytes moved over time against the measured copy bandwidth.
  layer    one MoE layer (router, alignment, two grouped GEMMs, SiLU-and-mul, top-k sum) in graph replay:
           base alone, with LoRA all adapters active, with LoRA configured but none active.
"""
from __future__ import annotations

import argparse
import time

import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.recorders import harness
from lora_moe_lab.instruments.recorders import kernel_cases as kc
from lora_moe_lab.instruments.recorders.harness import (ROWS, Recorder, cfg_str, copy_bandwidth, graph_time_us, log,
                                                        log_rows, row)
from lora_moe_lab.kernels import fused_moe_lora
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.configs import LoRAKernelConfig, lora_block_m, lora_config, lora_down_config
from lora_moe_lab.kernels.fused_moe_lora import lora_delta

from studies.kernels import plan_views

DOWN_M = (128, 1024, 8192)


def down_candidates(bm, base, new):
    out = [(bm, base), (bm, new)]
    for bn, bk, sp, w, st, pps in ((128, 64, 1, 4, 3, 4), (128, 64, 1, 8, 3, 4), (256, 64, 1, 8, 3, 2),
                                   (64, 64, 1, 4, 3, 8), (128, 32, 1, 4, 4, 4), (128, 64, 2, 8, 3, 4),
                                   (64, 128, 2, 4, 3, 4), (256, 32, 1, 8, 3, 4)):
        c = (bm, LoRAKernelConfig(bn, bk, max(base.split_n, sp), w, st, pps))
        if c not in out:
            out.append(c)
    if bm == 64:
        out.append((128, LoRAKernelConfig(128, 64, 1, 8, 3, 2)))
        out.append((32, LoRAKernelConfig(128, 64, 1, 4, 3, 4)))
    return out


def time_down(preset, dev, gen, copy_gbps, deadline):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    a13, b13, a2, b2 = kc.weights(sh, dev, gen)
    ids_s = torch.arange(kc.S, dtype=torch.int32, device=dev)
    on = torch.ones(kc.S, dtype=torch.int32, device=dev)
    for M in DOWN_M:
        n_sets = 6 if M <= 1024 else 2
        sets = [kc.make_set(sh, M, dev, gen) for _ in range(n_sets)]
        bm0 = lora_block_m(M, k, E, kc.S)
        aligns = {}
        for op, P, N, Kin in (("gate_up", 2, I, K), ("down", 1, K, I)):
            nbytes = sum(kc.lora_bytes(s, sh, P, N, Kin, P == 2) for s in sets) / n_sets
            base = lora_config(M, k, E, kc.S, bm0, N, Kin)
            new = lora_down_config(M, k, E, kc.S, bm0, N, Kin)
            cands = down_candidates(bm0, base, new) if op == "down" else [(bm0, base)]
            for i, (bm, cfg) in enumerate(cands):
                if i and time.time() > deadline:
                    log(f"  down sweep cut at {preset} M={M} (budget)")
                    break
                if bm not in aligns:
                    aligns[bm] = [moe_align(s["ids"], E, bm, s["slot"], kc.S) for s in sets]
                if P == 2:
                    fns = [lambda s=s, a_=a_, c=cfg: lora_delta(s["x"], a13, b13, a_, ids_s, on, k, s["inter"],
                                                                config=c)
                           for s, a_ in zip(sets, aligns[bm])]
                else:
                    fns = [lambda s=s, a_=a_, c=cfg: lora_delta(s["act"], a2, b2, a_, ids_s, on, k, s["down"],
                                                                routed_weights=s["rw"], gather=False, config=c)
                           for s, a_ in zip(sets, aligns[bm])]
                t = graph_time_us(fns, inner=4 if M <= 1024 else 1, reps=15)
                gbps = nbytes / (t * 1e-6) / 1e9
                s0 = sets[0]  # what those launches ran
                lp = (fused_moe_lora.lora_launch_plan(s0["x"], a13, b13, aligns[bm][0], k, config=cfg) if P == 2 else
                      fused_moe_lora.lora_launch_plan(s0["act"], a2, b2, aligns[bm][0], k, gather=False,
                                                      routed_weights=s0["rw"], config=cfg))
                row(section="down" if op == "down" else "gate_up_bw", preset=preset, M=M, op=op,
                    config=cfg_str(bm, cfg),
                    table=i == 0, down_table=op == "down" and cfg == new and bm == bm0, time_us=t, bytes=nbytes,
                    gbps=gbps, bw_frac=gbps / copy_gbps,
                    grid=lp["programs"])
            best = min((r for r in ROWS if r.get("op") == op and r["preset"] == preset and r["M"] == M
                        and r["section"] in ("down", "gate_up_bw")), key=lambda r: r["time_us"])
            log(f"{op} {preset} M={M}: table {ROWS_by(preset, M, op)['time_us']:.1f} us, best {best['time_us']:.1f} us "
                f"({100 * best['bw_frac']:.0f}% copy) {best['config']}")
        sets = aligns = None  # frees the buffers before the next M
    torch.cuda.empty_cache()


def ROWS_by(preset, M, op):
    return next(r for r in ROWS if r.get("op") == op and r["preset"] == preset and r["M"] == M and r.get("table"))


# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--cases", type=int, default=1200)
    ap.add_argument("--sections", default="diff,path,down,layer")
    ap.add_argument("--dry", action="store_true", help="CPU: every section once on the tiny preset, fake timer")
    args = ap.parse_args(argv)
    global DOWN_M
    if args.dry:
        harness.set_dry()
        kc.set_tiny()
        DOWN_M = (16,)
    Recorder.claim(args.out, "kernels_decode", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("kernels_decode", args.out, params=dict(vars(args), rank=kc.RANK, slots=kc.S, dtype="bfloat16",
                                                            decode_max_pairs=plan_views.legacy("DECODE_MAX_PAIRS")))
    if not args.dry and not runtime.has_cuda():
        kc.differential(torch.device("cpu"), 6)  # interpreter smoke check only
        rec.write()
        return
    t0, meta = rec.t0, rec.meta
    dev = runtime.default_device()
    gen = torch.Generator(device=dev).manual_seed(0)
    secs = args.sections.split(",")
    budget = {"path": 0.45, "down": 0.7, "layer": 1.0}  # cumulative shares of the budget
    if "diff" in secs:
        rec.section("diff", kc.differential, dev, args.cases)
        log(f"[diff done at {time.time() - t0:.0f}s]")
    meta["copy_gbps"], meta["copy_times_us"] = copy_bandwidth(dev)
    for sec, fn in (("path", kc.time_paths), ("down", time_down), ("layer", kc.time_layer)):
        if sec in secs:
            for preset in kc.PRESETS:
                dl = t0 + args.budget_s * budget[sec]
                extra = {"path": (gen, dl), "down": (gen, meta["copy_gbps"], dl), "layer": (dl,)}[sec]
                rec.section(f"{sec} {preset}", fn, preset, dev, *extra)
            log(f"[{sec} done at {time.time() - t0:.0f}s]")
    rec.write()
    summary(meta)


def summary(meta):
    log(f"\ncopy {meta['copy_gbps']:.0f} GB/s; errors: {meta['errors']}")
    log_rows("diff", lambda r: f"diff: {r['cases']} cases, {r['failures']} failures, worst {r['worst']}")
    log(f"{'path':<18}{'M':>5}{'today':>8}{'decode':>8}{'ratio':>7}")
    log_rows("path", lambda r: f"{r['preset']:<18}{r['M']:>5}{r['today']:>8.1f}{r['decode']:>8.1f}{r['ratio']:>7.2f}")
    log_rows("disabled", lambda r: f"off {r['preset']} M={r['M']}: decode {r['decode_ratio']:.2f}x, aligned "
                                   f"{r['aligned_ratio']:.2f}x same-grid empty")
    for r in ROWS:
        if r["section"] in ("down", "gate_up_bw") and r["table"]:
            best = min((x for x in ROWS
                        if x["section"] == r["section"] and x["preset"] == r["preset"] and x["M"] == r["M"]),
                       key=lambda x: x["time_us"])
            nt = next((x for x in ROWS
                       if x["section"] == r["section"] and x["preset"] == r["preset"] and x["M"] == r["M"]
                       and x.get("down_table")), r)
            log(f"{r['op']:<8}{r['preset']:<18}{r['M']:>5} table {r['time_us']:7.1f} us {100 * r['bw_frac']:3.0f}%  "
                f"new "
                f"{nt['time_us']:7.1f} us {100 * nt['bw_frac']:3.0f}%  best "
                f"{best['time_us']:7.1f} us {100 * best['bw_frac']:3.0f}% {best['config']}")
    log_rows("layer", lambda r: f"layer {r['preset']:<18}{r['M']:>6} base {r['base']:8.1f} "
                                f"all {100 * r['lora_share']:5.1f}% none {100 * r['none_active_share']:5.1f}% "
                                f"({r['path']})")


if __name__ == "__main__":
    main()
