"""Registers, spills and shared memory of the base MoE GEMM's builds, compiled for Hopper on a machine
without a GPU (Triton's own ptxas; nothing runs), so a tile's programs per SM can be read before a
device minute is spent on it.

    python scripts/kernel_resources.py                      # the committed tables' large-M tiles, both GEMMs
    python scripts/kernel_resources.py --tile 128,256,64,16,8,4 --persistent 1 --flatten --op down

Programs per SM = min(65536 // (registers * 32 * warps), 228 KB // shared); this is the static resource
limit, not a timing. Registers come from `cuobjdump -res-usage` of the compiled cubin.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target, not the interpreter

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lora_moe_lab.kernels import fused_moe  # noqa: E402

POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "sorted_ids_ptr": "*i32",
            "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32", "rw_ptr": "*fp32", "t_ptr": "*bf16", "b_ptr": "*bf16",
            "mapping_ptr": "*i32", "lora_ids_ptr": "*i32", "enabled_ptr": "*i32", "t_desc": "*bf16",
            "b_desc": "*bf16"}
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def compile_gemm(bm, bn, bk, warps, stages, *, gather, w_desc, persistent=False, flatten=False, max_regs=0):
    """The plain base GEMM (bf16, predicate-free loads) compiled for sm_90a; returns its CompiledKernel."""
    fn = fused_moe.fused_moe_kernel
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, GATHER=gather, HAS_RW=not gather, EVEN_K=True,
                 EVEN_N=True, W_DESC=w_desc, LORA=False, BLOCK_R=16, P=1, STRADDLE=False, FOLD_DESC=False,
                 PERSIST=persistent, FLATTEN=flatten)
    sig = {}
    for n in fn.arg_names:
        sig[n] = ("constexpr" if n in const else POINTERS.get(n) or
                  (f"tensordesc<bf16[{bn}, {bk}]>" if n == "w_desc" and w_desc else
                   "*bf16" if n == "w_desc" else "i32"))
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    opts = dict(num_warps=warps, num_stages=stages, **({"maxnreg": max_regs} if max_regs else {}))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def resources(kernel) -> dict:
    """registers, spill bytes (stores) and static + dynamic shared memory of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", text).group(1))
    spill = int(re.search(r"STACK:(\d+)", text).group(1))
    return dict(regs=regs, stack=spill, shared=int(kernel.metadata.shared))


def programs_per_sm(res, warps) -> int:
    by_regs = 65536 // (max(res["regs"], 1) * 32 * warps)
    by_smem = (228 * 1024) // (res["shared"] + 1024) if res["shared"] else 32
    return max(0, min(by_regs, by_smem, 64 // warps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", help="BLOCK_M,BLOCK_N,BLOCK_K,GROUP_M,warps,stages")
    ap.add_argument("--op", choices=("gate_up", "down"), default="down")
    ap.add_argument("--persistent", type=int, default=0)
    ap.add_argument("--flatten", action="store_true")
    ap.add_argument("--no-tma", action="store_true")
    a = ap.parse_args()
    tiles = ([tuple(int(v) for v in a.tile.split(","))] if a.tile else
             [(128, 256, 64, 16, 8, 4), (128, 128, 64, 16, 8, 3), (64, 128, 64, 16, 4, 3)])
    for bm, bn, bk, _g, warps, stages in tiles:
        for op in ((a.op,) if a.tile else ("gate_up", "down")):
            for pers, flat in (((a.persistent, a.flatten),) if a.tile else ((0, False), (1, False), (1, True))):
                k = compile_gemm(bm, bn, bk, warps, stages, gather=op == "gate_up", w_desc=not a.no_tma,
                                 persistent=bool(pers), flatten=flat)
                r = resources(k)
                print(f"{op:7s} bm{bm}/bn{bn}/bk{bk}/w{warps}/s{stages} persistent={pers} flatten={flat}: "
                      f"{r['regs']} registers, stack {r['stack']} B, shared {r['shared'] // 1024} KB -> "
                      f"{programs_per_sm(r, warps)} program(s) per SM")


if __name__ == "__main__":
    main()
