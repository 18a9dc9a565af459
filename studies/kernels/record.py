"""GPU checks and benchmarks of the Triton kernels (base fused-MoE GEMM, fused MoE-LoRA delta).

    python studies/kernels/record.py --out DIR [--sweep] [--skip-check]

On a CUDA GPU:
  (a) correctness at the qwen3 presets in bf16/fp16/fp32 for M in {1,16,128,1024,8192,16384}, each op
      against a float64 reference on fresh random inputs (poisoned / random outputs, untouched rows
      checked bit for bit);
  (b) CUDA-graph replay timings of the gate_up LoRA delta (rank 32, 4 slots all enabled, one random
      adapter per token, top-8 of 128 experts from softmax-topk of random router logits, bf16),
      and its achieved bandwidth against a measured device-to-device copy;
  (c) an all-disabled LoRA launch against an empty Triton kernel (graph replay);
  (d) base moe_gemm timings (gate_up and down).
Writes kernels.csv and kernels.meta.json to --out and prints a compact table last.
Without a GPU it only runs a tiny interpreter smoke check (nothing heavy).
"""
from __future__ import annotations

import argparse
import time

import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.recorders.harness import (ROWS, Recorder, cfg_str, copy_bandwidth, graph_time_us, log,
                                                        log_rows, route, row)
from lora_moe_lab.kernels.align import moe_align, moe_align_torch, moe_align_triton
from lora_moe_lab.kernels.common import cdiv
from lora_moe_lab.kernels.configs import LoRAKernelConfig, lora_block_m, lora_config, moe_block_m
from lora_moe_lab.kernels.empty import empty_kernel
from lora_moe_lab.kernels.fused_moe import moe_gemm
from lora_moe_lab.kernels.fused_moe_lora import lora_delta, lora_launch_plan
from lora_moe_lab.ops.reference import ref_lora_delta_grouped as ref_lora
from lora_moe_lab.ops.reference import ref_moe_gemm_grouped as ref_gemm
from lora_moe_lab.ops.reference import rel, tolerance

CHECK_M = (1, 16, 128, 1024, 8192, 16384)
TIME_M = (1, 16, 128, 1024, 8192)
PRESETS = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
S, RANK = 4, 32


# ------------------------------------------------------------------------------------------------
# (a) correctness
# ------------------------------------------------------------------------------------------------
def check_preset(preset, dtype, dev, gen, Ms=CHECK_M):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k

    def rnd(*size, std=1.0):
        return (torch.randn(*size, generator=gen, device=dev) * std).to(dtype)

    w13, w2 = rnd(E, 2 * I, K, std=K ** -0.5), rnd(E, K, I, std=I ** -0.5)
    a13, b13 = rnd(2, S, E, RANK, K, std=K ** -0.5), rnd(2, S, E, I, RANK, std=RANK ** -0.5)
    a2, b2 = rnd(1, S, E, RANK, I, std=I ** -0.5), rnd(1, S, E, K, RANK, std=RANK ** -0.5)
    lora_ids = torch.tensor([0, 1, 2, -1], dtype=torch.int32, device=dev)  # slot 3 empty
    enabled = torch.tensor([1, 0, 1, 1], dtype=torch.int32, device=dev)  # slot 1 disabled
    for M in Ms:
        x = rnd(M, K)
        rw, ids = route(M, E, k, gen, dev)
        token_slot = torch.randint(-1, S, (M,), generator=gen, device=dev, dtype=torch.int32)
        token_slot[0] = 0  # at least one live token, also at M=1
        bm = moe_block_m(M, k, E)
        al = moe_align(ids, E, bm)
        # base gate_up (gather) and down (per-pair rows, routed weights), outputs poisoned with NaN
        inter = torch.full((M * k, 2 * I), float("nan"), dtype=dtype, device=dev)
        moe_gemm(x, w13, al, k, inter)
        h = rnd(M * k, I)
        down = torch.full((M * k, K), float("nan"), dtype=dtype, device=dev)
        moe_gemm(h, w2, al, k, down, routed_weights=rw, gather=False)
        runtime.synchronize(dev)
        for op, got, ref in (("moe_gemm_gate_up", inter, ref_gemm(x, w13, ids, k)),
                             ("moe_gemm_down", down, ref_gemm(h, w2, ids, k, rw, gather=False))):
            err = rel(got.double(), ref)
            ok = bool(torch.isfinite(got).all()) and err < tolerance(dtype, dev)
            row(section="check", preset=preset, op=op, dtype=str(dtype)[6:], M=M, block_m=bm, rel_err=err,
                tol=tolerance(dtype, dev), ok=ok)
        inter = down = None  # frees the buffers before the next M
        for bml in sorted({bm, lora_block_m(M, k, E, S)}):
            al_l = moe_align(ids, E, bml, token_slot, S)
            for op, xin, a, b, N, r, gather in (("lora_gate_up", x, a13, b13, I, None, True),
                                                ("lora_down", h, a2, b2, K, rw, False)):
                out0 = rnd(M * k, a.shape[0] * N)
                if r is not None:  # down: the base output it adds to carries the routed weight too
                    out0 = (out0.float() * r.reshape(-1, 1)).to(dtype)
                out = out0.clone()
                lora_delta(xin, a, b, al_l, lora_ids, enabled, k, out, routed_weights=r, gather=gather)
                ref, live = ref_lora(xin, a, b, ids, token_slot, lora_ids, enabled, k, r, gather)
                untouched = torch.equal(out[~live], out0[~live])
                err = rel(out[live].double() - out0[live].double(), ref[live]) if live.any() else 0.0
                ok = untouched and err < tolerance(dtype, dev)
                row(section="check", preset=preset, op=op, dtype=str(dtype)[6:], M=M, block_m=bml, rel_err=err,
                    tol=tolerance(dtype, dev), untouched_rows_identical=untouched, ok=ok)
                out = out0 = ref = None  # frees the buffers before the next M
        log(f"check {preset} {dtype} M={M}: " + " ".join(
            f"{r['op']}={r['rel_err']:.1e}{'' if r['ok'] else '(FAIL)'}" for r in ROWS[-6:] if r["M"] == M))
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# timing: CUDA-graph replays (instruments.recorders.timing), device events, median
# ------------------------------------------------------------------------------------------------




def lora_bytes(ids, token_slot, E, K, N, k, elt=2, P=2):
    """Bytes the gate_up delta must move: every used (slot, expert) A and B once, x once, out read+written."""
    M = ids.shape[0]
    slot = token_slot.long().repeat_interleave(k)
    key = slot * E + ids.flatten().long()
    used = torch.unique(key[slot >= 0]).numel()
    pairs = int((slot >= 0).sum())
    return used * P * (RANK * K + N * RANK) * elt + M * K * elt + 2 * pairs * P * N * elt, used


def make_sets(preset, M, n_sets, dev, gen, dtype=torch.bfloat16, all_tokens_active=True):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    sets = []
    for _ in range(n_sets):
        x = torch.randn(M, K, generator=gen, device=dev).to(dtype)
        rw, ids = route(M, E, k, gen, dev)
        lo = 0 if all_tokens_active else -1
        token_slot = torch.randint(lo, S, (M,), generator=gen, device=dev, dtype=torch.int32)
        out = torch.randn(M * k, 2 * I, generator=gen, device=dev).to(dtype)
        sets.append(dict(x=x, rw=rw, ids=ids, slot=token_slot, out=out))
    return sets


def lora_weights(preset, dev, gen, dtype=torch.bfloat16):
    sh = get_shape(preset)
    K, I, E = sh.hidden, sh.intermediate, sh.num_experts
    a = (torch.randn(2, S, E, RANK, K, generator=gen, device=dev) * K ** -0.5).to(dtype)
    b = (torch.randn(2, S, E, I, RANK, generator=gen, device=dev) * RANK ** -0.5).to(dtype)
    return a, b




def sweep_candidates(preset, M):
    sh = get_shape(preset)
    E, k, I, K = sh.num_experts, sh.top_k, sh.intermediate, sh.hidden
    out = []
    bm0 = lora_block_m(M, k, E, S)
    for bm in (16, 32, 64):
        if bm > 16 and M * k / (E * S) < bm / 4:
            continue  # blocks mostly padding
        base = lora_config(M, k, E, S, bm, I, K)
        variants = [(base.block_n, base.block_k, base.split_n, 4, 3, base.programs_per_sm)]
        if bm == bm0:
            variants += [(base.block_n, base.block_k, base.split_n, 4, 3, p) for p in (2, 3, 6, 8, 16)]
            variants += [(64, 128, base.split_n, 4, 3, base.programs_per_sm),
                         (128, 64, base.split_n, 4, 3, base.programs_per_sm),
                         (64, 64, base.split_n, 4, 4, base.programs_per_sm),
                         (base.block_n, base.block_k, max(1, base.split_n // 2), 4, 3, base.programs_per_sm),
                         (base.block_n, base.block_k, base.split_n * 2, 4, 3, base.programs_per_sm)]
        for bn, bk, split, w, st, pps in variants:
            c = LoRAKernelConfig(bn, bk, max(1, min(split, cdiv(I, bn))), w, st, pps)
            if (bm, c) not in out:
                out.append((bm, c))
    return out


# ------------------------------------------------------------------------------------------------
# (b) LoRA gate_up timings, (c) all-disabled launch, (d) base GEMM
# ------------------------------------------------------------------------------------------------
def time_lora(preset, dev, gen, copy_gbps, sweep, deadline):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    a, b = lora_weights(preset, dev, gen)
    lora_ids = torch.arange(S, dtype=torch.int32, device=dev)
    on = torch.ones(S, dtype=torch.int32, device=dev)
    off = torch.zeros(S, dtype=torch.int32, device=dev)
    x1 = torch.zeros(1, device=dev)
    for M in TIME_M:
        n_sets = 16 if M <= 128 else 8 if M <= 1024 else 3
        sets = make_sets(preset, M, n_sets, dev, gen)
        byts = [lora_bytes(s_["ids"], s_["slot"], E, K, I, k) for s_ in sets]
        nbytes = sum(b_ for b_, _ in byts) / len(byts)
        used = sum(u for _, u in byts) / len(byts)
        bm0 = lora_block_m(M, k, E, S)
        cfg0 = lora_config(M, k, E, S, bm0, I, K)
        cands = [(bm0, cfg0)]
        if sweep:
            cands += [c for c in sweep_candidates(preset, M) if c != (bm0, cfg0)]
        aligns = {}
        best = None
        for i, (bm, cfg) in enumerate(cands):
            if i > 0 and time.time() > deadline:
                log(f"  sweep cut short at {preset} M={M} (time budget)")
                break
            if bm not in aligns:
                aligns[bm] = [moe_align(s_["ids"], E, bm, s_["slot"], S) for s_ in sets]
            fns = [lambda s_=s_, al=al, c=cfg: lora_delta(s_["x"], a, b, al, lora_ids, on, k, s_["out"],
                                                                      config=c)
                   for s_, al in zip(sets, aligns[bm])]
            t_rot = graph_time_us(fns, inner=max(1, 32 // n_sets) if M <= 1024 else 1, reps=15 if i else 25)
            r = row(section="lora_gate_up" if i == 0 else "lora_sweep", preset=preset, op="lora_delta_gate_up",
                    dtype="bfloat16", M=M, config=cfg_str(bm, cfg), time_us=t_rot,
                    bytes=nbytes, used_adapter_experts=used, gbps=nbytes / (t_rot * 1e-6) / 1e9,
                    copy_gbps=copy_gbps, bw_frac=nbytes / (t_rot * 1e-6) / 1e9 / copy_gbps)
            lp = lora_launch_plan(sets[0]["x"], a, b, aligns[bm][0], k, config=cfg)  # what those launches ran
            r.update(grid=lp["programs"], programs_per_sm=lp["programs_per_sm"], stages=lp["num_stages"])
            if i == 0:
                # Same op on one input set repeated (weights hot in L2 at small M): for reference.
                r["time_us_hot"] = graph_time_us([fns[0]], inner=16, reps=15)
            if best is None or t_rot < best[0]:
                best = (t_rot, cfg_str(bm, cfg))
        if sweep:
            log(f"  sweep {preset} M={M}: table {ROWS_by(preset, M)['time_us']:.1f} us, "
                f"best {best[0]:.1f} us {best[1]}")
        # (c) all adapters disabled: the same launch exits early everywhere; vs an empty kernel.
        al = aligns[bm0][0]
        s0 = sets[0]
        t_off = graph_time_us([lambda: lora_delta(s0["x"], a, b, al, lora_ids, off, k, s0["out"])],
                              inner=32, reps=15)
        t_empty = graph_time_us([lambda: empty_kernel[(1,)](x1)], inner=32, reps=15)
        nprog = lora_launch_plan(s0["x"], a, b, al, k)["programs"]
        row(section="disabled", preset=preset, op="lora_delta_gate_up_all_disabled", dtype="bfloat16", M=M,
            config=cfg_str(bm0, cfg0), programs=nprog, time_us=t_off, empty_kernel_us=t_empty, ratio=t_off / t_empty)
        log(f"lora {preset} M={M}: {ROWS_by(preset, M)['time_us']:.1f} us, "
            f"disabled {t_off:.2f} us vs empty {t_empty:.2f} us")
        sets = aligns = None  # frees the buffers before the next M
    torch.cuda.empty_cache()


def ROWS_by(preset, M, section="lora_gate_up"):
    return next(r for r in ROWS if r["section"] == section and r["preset"] == preset and r["M"] == M)


def time_base(preset, dev, gen):
    sh = get_shape(preset)
    K, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    dt = torch.bfloat16
    w13 = (torch.randn(E, 2 * I, K, generator=gen, device=dev) * K ** -0.5).to(dt)
    w2 = (torch.randn(E, K, I, generator=gen, device=dev) * I ** -0.5).to(dt)
    for M in TIME_M:
        x = torch.randn(M, K, generator=gen, device=dev).to(dt)
        rw, ids = route(M, E, k, gen, dev)
        bm = moe_block_m(M, k, E)
        al = moe_align(ids, E, bm)
        inter = torch.empty(M * k, 2 * I, device=dev, dtype=dt)
        h = torch.randn(M * k, I, generator=gen, device=dev).to(dt)
        down = torch.empty(M * k, K, device=dev, dtype=dt)
        inner = 8 if M <= 1024 else 2
        t13 = graph_time_us([lambda: moe_gemm(x, w13, al, k, inter)], inner=inner, reps=15)
        t2 = graph_time_us([lambda: moe_gemm(h, w2, al, k, down, routed_weights=rw, gather=False)],
                           inner=inner, reps=15)
        try:
            t_al = graph_time_us([lambda: moe_align(ids, E, bm, None, 1)], inner=inner, reps=15)  # as the layer does
        except Exception as exc:  # the torch alignment should be capturable; record it if not
            log(f"  alignment capture failed: {type(exc).__name__}: {exc}")
            t_al = float("nan")
        used = torch.unique(ids).numel()
        for op, t, n, kk, wb in (("moe_gemm_gate_up", t13, 2 * I, K, w13), ("moe_gemm_down", t2, K, I, w2)):
            flops = 2 * M * k * n * kk
            nbytes = used * n * kk * 2 + M * k * (n + kk) * 2
            row(section="base", preset=preset, op=op, dtype="bfloat16", M=M, config=f"bm{bm}", time_us=t,
                tflops=flops / (t * 1e-6) / 1e12, gbps=nbytes / (t * 1e-6) / 1e9, align_us=t_al)
        log(f"base {preset} M={M}: gate_up {t13:.1f} us, down {t2:.1f} us, align {t_al:.1f} us")
    torch.cuda.empty_cache()


def same_alignment(a, b):
    """Same groups: expert_ids, num_tokens_post_padded, and per slot the (expert, pair) multiset
    (the order of pairs inside one group may differ: the Triton version ranks them with atomics)."""
    if not (torch.equal(a.expert_ids, b.expert_ids)
            and torch.equal(a.num_tokens_post_padded, b.num_tokens_post_padded)):
        return False

    def groups(x):
        st = x.sorted_token_ids.long()
        e = x.expert_ids.long().repeat_interleave(x.block_m, dim=1)
        return ((e + 1) * (st.max() + 1) + st).sort(dim=1).values

    return torch.equal(groups(a), groups(b))


def time_align(preset, dev, gen):
    """(e) the torch alignment (many small ops) against the Triton one, same inputs, graph replay."""
    sh = get_shape(preset)
    E, k = sh.num_experts, sh.top_k
    for M in CHECK_M:
        _, ids = route(M, E, k, gen, dev)
        token_slot = torch.randint(-1, S, (M,), generator=gen, device=dev, dtype=torch.int32)
        for slots, ts in ((1, None), (S, token_slot)):
            bm = lora_block_m(M, k, E, S) if ts is not None else moe_block_m(M, k, E)
            same = all(same_alignment(moe_align_torch(ids, E, bm, ts, slots), moe_align_triton(ids, E, bm, ts, slots))
                       for _ in range(3))
            t_torch = graph_time_us([lambda: moe_align_torch(ids, E, bm, ts, slots)], inner=8, reps=15)
            t_tri = graph_time_us([lambda: moe_align_triton(ids, E, bm, ts, slots)], inner=8, reps=15)
            row(section="align", preset=preset, op=f"moe_align_S{slots}", dtype="int32", M=M, block_m=bm,
                torch_us=t_torch, triton_us=t_tri, speedup=t_torch / t_tri, ok=same)
            log(f"align {preset} S={slots} M={M}: torch {t_torch:.1f} us, triton {t_tri:.1f} us, same={same}")


# ------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for kernels.csv and kernels.meta.json")
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    ap.add_argument("--sweep", action="store_true", help="also time alternative LoRA tile configs")
    ap.add_argument("--skip-check", action="store_true", help="skip the (a) correctness section")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget; the sweep stops early")
    args = ap.parse_args(argv)
    Recorder.claim(args.out, "kernels", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("kernels", args.out, params=dict(vars(args), rank=RANK, slots=S))
    t0, meta = rec.t0, rec.meta
    if not runtime.has_cuda():
        # No GPU: a tiny interpreter smoke check only (the full suite is tests/kernels/test_kernels.py).
        check_preset("tiny", torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0), Ms=(1, 3))
        meta["note"] = "no GPU: interpreter smoke check only"
        rec.write()
        summary()
        return
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    if not args.skip_check:
        for preset in PRESETS:
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                rec.section(f"check {preset} {dtype}", check_preset, preset, dtype, dev, gen)
        log(f"[checks done at {time.time() - t0:.0f}s]")
    copy_gbps, t_copy = copy_bandwidth(dev)
    meta["copy_gbps"], meta["copy_times_us"] = copy_gbps, t_copy
    log(f"device-to-device copy: {copy_gbps:.0f} GB/s (read+write)")
    for preset in PRESETS:
        rec.section(f"lora {preset}", time_lora, preset, dev, gen, copy_gbps, args.sweep, t0 + args.budget_s)
    for preset in PRESETS:
        rec.section(f"base {preset}", time_base, preset, dev, gen)
    rec.section("align", time_align, PRESETS[0], dev, gen)
    rec.write()
    summary()
    for e in meta["errors"]:
        log(f"ERROR {e}")


def summary():
    chk = [r for r in ROWS if r["section"] == "check"]
    if chk:
        bad = [r for r in chk if not r["ok"]]
        worst = {}
        for r in chk:
            key = (r["op"], r["dtype"])
            worst[key] = max(worst.get(key, 0.0), r["rel_err"])
        log(f"\ncorrectness: {len(chk) - len(bad)}/{len(chk)} ok; worst rel err: " +
            ", ".join(f"{o}/{d} {e:.1e}" for (o, d), e in sorted(worst.items())))
        for r in bad:
            log(f"  FAIL {r}")
    log("\nLoRA gate_up delta, bf16, r=32, 4 adapters, graph replay (rotating inputs)")
    log(f"{'preset':<18}{'M':>6}{'us':>9}{'hot us':>8}{'GB/s':>7}{'%copy':>6}"
        f"{'off us':>8}{'empty':>7}  config")
    for r in ROWS:
        if r["section"] == "lora_gate_up":
            d = next((x for x in ROWS
                      if x["section"] == "disabled" and x["preset"] == r["preset"] and x["M"] == r["M"]),
                     dict(time_us=float("nan"), empty_kernel_us=float("nan")))
            log(f"{r['preset']:<18}{r['M']:>6}{r['time_us']:>9.1f}{r['time_us_hot']:>8.1f}"
                f"{r['gbps']:>7.0f}{100 * r['bw_frac']:>5.0f}%{d['time_us']:>8.2f}"
                f"{d['empty_kernel_us']:>7.2f}  {r['config']}")
    al = [r for r in ROWS if r["section"] == "align"]
    if al:
        log("\nalignment (qwen3, graph replay): " + ", ".join(
            f"S{r['op'][-1]} M={r['M']} {r['torch_us']:.0f}->{r['triton_us']:.1f}us{'' if r['ok'] else ' DIFF'}"
            for r in al))
    log("\nbase moe_gemm, bf16 (us / TFLOP/s)")
    log_rows("base", lambda r: f"{r['preset']:<18}{r['op']:<18}{r['M']:>6}{r['time_us']:>9.1f}{r['tflops']:>7.0f}  "
                               f"align {r['align_us']:.1f} us")


if __name__ == "__main__":
    main()
