"""Registers, spills and shared memory of the base MoE GEMM's builds, compiled for Hopper (sm_90) on a
machine without a GPU: the real launcher (`kernels.fused_moe.moe_gemm`) runs on CPU tensors of the
presets' shapes, so Triton specialises the arguments exactly as on the GPU (strides of 1, multiples of
16), and the launch is replaced by Triton's compile-only warm-up. Nothing runs; no timing comes from here.

    PYTHONPATH=/tmp/t36 python studies/kernels/resources.py        # with the GPU machine's Triton (3.6)
    python studies/kernels/resources.py --check base_s3     # a session of data/kernels/kernels_base_ncu.csv

Registers are read from the cubin (`cuobjdump -res-usage`, shipped with Triton). They depend on the
Triton and ptxas versions, so use the Triton the GPU machine runs; `--check` compares them with the
registers Nsight Compute reported for the same builds (launch__registers_per_thread) and fails on a
difference. Programs per SM = min(65536 // (registers * 32 * warps), 228 KB // (shared + 1 KB), 64 // warps)
is the static resource limit of one H100/H200 SM.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target, not the interpreter

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from lora_moe_lab.config import get_shape  # noqa: E402
from lora_moe_lab.instruments.recorders import tile_arms as ta  # noqa: E402
from lora_moe_lab.kernels import fused_moe, fused_moe_lora  # noqa: E402
from lora_moe_lab.kernels.align import moe_align  # noqa: E402
from lora_moe_lab.kernels.configs import (GemmConfig, LoRAKernelConfig, block_r, lora_block_m, lora_config,  # noqa: E402
                                         lora_down_config)

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


class _Hopper:
    """Just enough of Triton's CUDA driver for a compile-only warm-up: an sm_90 target, device 0."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda


class _Capture:
    """Stands in for `fused_moe_kernel[grid]`: compiles with Triton's warm-up (no launch) and keeps it."""

    def __init__(self, kernel):
        self.kernel, self.compiled = kernel, None

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.compiled = self.kernel.run(*args, grid=grid, warmup=True, **kwargs)
        return run


import contextlib  # noqa: E402


@contextlib.contextmanager
def _compile_only(module, kernel_name):
    """Inside: `module`'s launcher compiles its kernel for sm_90 through Triton's warm-up instead of launching
    it, on CPU tensors (the CPU checks and the SM count are patched out); yields the capture."""
    cap = _Capture(getattr(module, kernel_name))
    names = [n for n in ("check_compute_dtype", "_tma_device", "num_sms") if hasattr(module, n)]
    saved = {n: getattr(module, n) for n in names + [kernel_name]}
    patch = dict(check_compute_dtype=lambda x: None, _tma_device=lambda t: True, num_sms=lambda d: 132)
    drv = triton.runtime.driver
    prev, drv._active = drv._active, _Hopper()  # no real driver loads on a machine without CUDA
    try:
        setattr(module, kernel_name, cap)
        for n in names:
            setattr(module, n, patch[n])
        yield cap
    finally:
        for n, v in saved.items():
            setattr(module, n, v)
        drv._active = prev


def _shapes(preset, op):
    sh = get_shape(preset)
    N, K = (2 * sh.intermediate, sh.hidden) if op == "gate_up" else (sh.hidden, sh.intermediate)
    return sh.num_experts, sh.top_k, N, K


def _routing(M, E, k):
    return torch.stack([torch.randperm(E)[:k] for _ in range(8)]).int().repeat(M // 8, 1)


def compile_gemm(preset, op, bm, cfg: GemmConfig, M=8192, folded=None, slots=4, rank=32):
    """The base GEMM of `preset` (bf16) at token count M with tile cfg, compiled through moe_gemm; returns
    Triton's CompiledKernel. folded "ptr" or "tma": the GEMM with the LoRA expand in its K loop instead
    (studies/kernels/tried/fused_moe_lora_folded.py; "ptr" = pointer loads), `slots` adapters of `rank`;
    "packed" or "packed_slot": the packed expand (kernels/fused_moe_lora_packed.py), one dot over every slot or one
    per slot."""
    E, k, N, K = _shapes(preset, op)
    rows = M if op == "gate_up" else M * k
    x, w = torch.empty(rows, K, dtype=torch.bfloat16), torch.empty(E, N, K, dtype=torch.bfloat16)
    out = torch.empty(M * k, N, dtype=torch.bfloat16)
    rw = torch.rand(M, k) if op == "down" else None
    al = moe_align(_routing(M, E, k), E, bm)
    packed = None
    if folded in ("packed", "packed_slot"):  # kernels/fused_moe_lora_packed.py: all slots' columns, or per slot
        P, br = (2 if op == "gate_up" else 1), block_r(rank)
        u = torch.empty(al.sorted_token_ids.shape[1], P, slots * br, dtype=torch.bfloat16)
        blk = torch.zeros(al.expert_ids.shape[1], 2, dtype=torch.int32)
        packed = fused_moe.Packed(u, blk, torch.empty(E, N, P * slots * br, dtype=torch.bfloat16),
                                  br if folded == "packed_slot" else slots * br)
    elif folded:
        P = 2 if op == "gate_up" else 1
        t = torch.empty(al.sorted_token_ids.shape[1], P, block_r(rank), dtype=torch.bfloat16)
        b = torch.empty(P, slots, E, N // P, rank, dtype=torch.bfloat16)
        from studies.kernels.tried import fused_moe_switches as sw  # the folded build's kernel (the study's copy)
        lora = sw.Folded(t, b, torch.zeros(M, dtype=torch.int32), torch.arange(slots, dtype=torch.int32),
                         torch.ones(slots, dtype=torch.int32), folded == "tma")
        # the folded build: the study's copy of the kernel; the library's checks it calls are patched too
        with _compile_only(fused_moe, "fused_moe_kernel"), _compile_only(sw, "fused_moe_switches_kernel") as cap:
            sw.moe_gemm_switches(x, w, al, k, out, routed_weights=rw, gather=op == "gate_up", config=cfg, lora=lora)
        return cap.compiled
    with _compile_only(fused_moe, "fused_moe_kernel") as cap:
        fused_moe.moe_gemm(x, w, al, k, out, routed_weights=rw, gather=op == "gate_up", config=cfg, packed=packed)
    return cap.compiled


def compile_lora(preset, op, M=8192, cfg: LoRAKernelConfig | None = None, slots=4, rank=32, bm=None):
    """The aligned LoRA delta (kernels/fused_moe_lora.py) of `preset` at M with `slots` adapters of rank 32, with
    cfg or the layer's own config (configs.lora_config / lora_down_config); returns (config, CompiledKernel)."""
    E, k, N0, K = _shapes(preset, op)
    P, N = (2, N0 // 2) if op == "gate_up" else (1, N0)
    bm = bm or lora_block_m(M, k, E, slots)
    cfg = cfg or (lora_config if op == "gate_up" else lora_down_config)(M, k, E, slots, bm, N, K)
    rows = M if op == "gate_up" else M * k
    x = torch.empty(rows, K, dtype=torch.bfloat16)
    a = torch.empty(P, slots, E, rank, K, dtype=torch.bfloat16)
    b = torch.empty(P, slots, E, N, rank, dtype=torch.bfloat16)
    out = torch.empty(M * k, P * N, dtype=torch.bfloat16)
    slot = torch.arange(M, dtype=torch.int32) % slots
    al = moe_align(_routing(M, E, k), E, bm, slot, slots)
    ids, on = torch.arange(slots, dtype=torch.int32), torch.ones(slots, dtype=torch.int32)
    with _compile_only(fused_moe_lora, "fused_moe_lora_kernel") as cap:
        fused_moe_lora.lora_delta(x, a, b, al, ids, on, k, out, routed_weights=torch.rand(M, k) if op == "down"
                                  else None, gather=op == "gate_up", config=cfg)
    return cfg, cap.compiled


def resources(kernel) -> dict:
    """registers, stack bytes (spills) and shared memory of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    ttgir = kernel.asm.get("ttgir", "")  # the loops left after Triton's passes (a flattened persistent grid: one)
    return dict(regs=int(re.search(r"REG:(\d+)", text).group(1)), stack=int(re.search(r"STACK:(\d+)", text).group(1)),
                shared=int(kernel.metadata.shared), loops=ttgir.count("scf.for "), ifs=ttgir.count("scf.if "))


def report(preset, op, tile, M=8192, folded=None):
    bm, cfg = ta.config_of(tile)
    r = resources(compile_gemm(preset, op, bm, cfg, M, folded))
    r["programs_per_sm"] = ta.programs_per_sm(r, cfg.num_warps)
    name = tile + (f" folded/{folded}" if folded else "")
    print(f"{preset:<18} {op:<7} {name:<40} {r['regs']:>3} registers, stack {r['stack']:>4} B, shared "
          f"{r['shared'] // 1024:>3} KB -> {r['programs_per_sm']} program(s) per SM; {r['loops']} scf.for, "
          f"{r['ifs']} scf.if", flush=True)
    return r


def report_lora(preset, op, M=8192, cfg=None, bm=None):
    cfg, kern = compile_lora(preset, op, M, cfg, bm=bm)
    r = resources(kern)
    r["programs_per_sm"] = ta.programs_per_sm(r, cfg.num_warps)
    name = ("bm%d/" % bm if bm else "") + lora_str(cfg)
    print(f"{preset:<18} lora_{op:<7} M={M:<6} {name:<34} {r['regs']:>3} registers, stack {r['stack']:>4} B,"
          f" shared {r['shared'] // 1024:>3} KB -> {r['programs_per_sm']} program(s) per SM", flush=True)
    return r


LORA_TILE = re.compile(r"bn(\d+)/bk(\d+)/w(\d+)/s(\d+)/pf(\d+)")


def lora_config_of(s: str, base: LoRAKernelConfig) -> LoRAKernelConfig:
    """'bn128/bk64/w8/s3/pf2[/cap128][/xs3]' -> the layer's config `base` with these fields."""
    bn, bk, w, st, pf = (int(v) for v in LORA_TILE.search(s).groups())
    cap, xs = re.search(r"/cap(\d+)", s), re.search(r"/xs(\d+)", s)
    return replace(base, block_n=bn, block_k=bk, num_warps=w, num_stages=st, prefetch=pf,
                   max_regs=int(cap.group(1)) if cap else 0, expand_stages=int(xs.group(1)) if xs else 0)


def lora_str(c: LoRAKernelConfig) -> str:
    return (f"bn{c.block_n}/bk{c.block_k}/w{c.num_warps}/s{c.num_stages}/pf{c.prefetch}"
            + (f"/cap{c.max_regs}" if c.max_regs else "") + (f"/xs{c.expand_stages}" if c.expand_stages else ""))


def check(ncu_csv) -> int:
    """Every base-GEMM row of an ncu recording compiled here: registers equal to ncu's, or a failure. `ncu_csv`: a
    parsed ncu CSV, or a session of data/kernels/kernels_base_ncu.csv (studies/kernels/tidy.py)."""
    bad = 0
    if os.path.exists(ncu_csv):
        rows = list(csv.DictReader(open(ncu_csv)))
    else:
        from studies.kernels import tidy

        rows = tidy.rows("kernels_base", ncu_csv, ncu=True).astype(object).where(lambda t: t.notna(), "").astype(
            str).to_dict("records")
    for row in rows:
        if row["kernel"] == "fused_moe_lora_kernel":
            r = report_lora(row["preset"], row["op"].removeprefix("lora_"), int(row["M"]))
        elif row["kernel"] == "fused_moe_kernel":
            r = report(row["preset"], row["op"].removeprefix("base_"), row["tile"], int(row["M"]))
        else:
            continue
        if r["regs"] != int(float(row["registers"])):
            print(f"  MISMATCH: ncu reported {row['registers']} registers", flush=True)
            bad += 1
    print(f"{bad} mismatches against {ncu_csv} (Triton {triton.__version__})")
    return bad


def record(out):
    """DIR/kernel_resources.csv + .meta.json: the committed tables' tiles at M >= 1024 with every arm of
    record_kernels_base's persist section (at M = 8192 also the folded GEMM and the early-loads builds), and
    the aligned LoRA deltas at M = 1024 and 8192 with the layer's config and every candidate of
    record_kernels_expand's `stages` set. Static compile facts, no timing."""
    from lora_moe_lab import runtime
    from lora_moe_lab.instruments.recorders.kernel_cases import PRESETS, stages_candidates
    from lora_moe_lab.instruments.recorders.harness import Recorder
    from lora_moe_lab.kernels import configs, tiles

    rec = Recorder("kernel_resources", out,
                   params=dict(target="sm_90 (compiled, not run)", tool="studies/kernels/resources.py"))
    saved = (tiles.gpu_name, configs.runtime.interpreter)
    tiles.gpu_name, runtime.interpreter = (lambda: "NVIDIA H200"), (lambda: False)  # the H200 tables, GPU configs
    tiles._tables_of.cache_clear()
    try:
        for preset in PRESETS:
            sh = get_shape(preset)
            for M in ta.PERSIST_M:
                bm = configs.moe_block_m(M, sh.top_k, sh.num_experts, sh.hidden, sh.intermediate)
                for op in ("gate_up", "down"):
                    N, K = _shapes(preset, op)[2:]
                    for arm, cfg in ta.persist_arms(bm, configs.gemm_config(M, bm, N, K, sh.num_experts)).items():
                        r = report(preset, op, ta.cfg_str(bm, cfg), M)
                        rec.row(kernel="fused_moe_kernel", preset=preset, op=op, M=M, arm=arm, tile=ta.cfg_str(bm, cfg),
                                num_warps=cfg.num_warps, **r)
                    if M == 8192:  # the folded GEMM (the layer's pointer expand) and the early-loads builds
                        tab = ta.cfg_str(bm, configs.gemm_config(M, bm, N, K, sh.num_experts))
                        for arm, tile, fold in (("early", tab + "/early", None), ("folded", tab, "ptr"),
                                                ("folded_early", tab + "/early", "ptr")):
                            r = report(preset, op, tile, M, folded=fold)
                            rec.row(kernel="fused_moe_kernel", preset=preset, op=op, M=M, arm=arm, tile=tile,
                                    num_warps=ta.config_of(tile)[1].num_warps, **r)
            for M in (1024, 8192):
                for op in ("gate_up", "down"):
                    base, _ = compile_lora(preset, op, M)
                    bm = lora_block_m(M, sh.top_k, sh.num_experts, 4)
                    for i, (_, cfg) in enumerate([(bm, base)] + [(bm, c) for c in stages_candidates(op, base)]):
                        r = report_lora(preset, op, M, cfg)
                        rec.row(kernel="fused_moe_lora_kernel", preset=preset, op=op, M=M, arm="layer" if i == 0 else
                                "stages", tile=f"bm{bm}/" + lora_str(cfg), num_warps=cfg.num_warps, **r)
    finally:
        tiles.gpu_name, runtime.interpreter = saved
        tiles._tables_of.cache_clear()
    rec.meta["triton_compiler"] = triton.__version__
    print("wrote", rec.write())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", metavar="DIR", help="write DIR/kernel_resources.csv (+ .meta.json)")
    ap.add_argument("--check", metavar="NCU_CSV", help="compare with ncu's registers of the same builds (a parsed "
                    "ncu CSV, or a session of data/kernels/kernels_base_ncu.csv)")
    ap.add_argument("--tile", action="append", help="e.g. bm128/bn256/bk64/g16/w8/s4/tma/p1/flat (repeatable)")
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--op", choices=("gate_up", "down"), default="down")
    ap.add_argument("--M", type=int, default=8192)
    ap.add_argument("--lora", action="append", help="the aligned LoRA delta: bn128/bk64/w8/s3/pf2[/cap128] or "
                                                    "'layer' (the layer's own config); repeatable")
    ap.add_argument("--block-m", type=int, help="the LoRA alignment's BLOCK_M (default: the layer's)")
    ap.add_argument("--folded", action="append", choices=("ptr", "tma", "packed", "packed_slot"),
                    help="the GEMM's tile with the LoRA expand in its K loop too (repeatable)")
    a = ap.parse_args()
    if a.check:
        sys.exit(1 if check(a.check) else 0)
    if a.record:
        return record(a.record)
    if a.lora:
        base, _ = compile_lora(a.preset, a.op, a.M, bm=a.block_m)
        for s in a.lora:
            report_lora(a.preset, a.op, a.M, None if s == "layer" else lora_config_of(s, base), bm=a.block_m)
        return
    for tile in a.tile or ["bm128/bn256/bk64/g16/w8/s4/tma", "bm128/bn256/bk64/g16/w8/s4/tma/p1/flat"]:
        report(a.preset, a.op, tile, a.M)
        for f in a.folded or ():
            report(a.preset, a.op, tile, a.M, f)


if __name__ == "__main__":
    main()
