"""Where LoRA's share of the MoE layer goes: the layer's kernels, one by one, with and without the adapters (H200).

The layer section of studies/kernels/record_fold.py times LoRA's share of one MoE layer (paired CUDA-graph replays), and
`read_floors.share_floors` sets it beside the least time the adapters' bytes and FLOPs allow. This recording
says which kernels make up the difference: each arm's CUDA graph is replayed under torch.profiler, and every kernel's
GPU duration is read from the trace (CUPTI's records, one per kernel node of the graph).

Arms per preset and M (PARTS_M), built exactly as the layer section builds them (kernel_cases.lora_layer, x the first
K columns of the norm's wide buffer where gate_up takes the wide build):
  base        the layer without adapters
  picked_all  every token on one of the 4 adapters (rank 32), at the committed tables

Rows (section `parts`): per arm, kernel name and `occurrence` (the launch's place among that name's launches in the
forward, from 0: the base GEMM's gate_up is 0, its down 1), the launches per forward and the kernel's GPU time per
forward (median over the profiled forwards). parts_s1 kept one row per name (every occurrence summed). Per arm, a
row `<busy>`: the sum of every kernel's time per forward, and `<span>`: the first kernel's start to the last one's
end. These are attributions read from a profiled run; the live figures of the same layer are the layer section's
paired medians (lay_s*), and the analyser (`floors.layer_parts`) sets the two side by side.

    PYTHONPATH=. python3 studies/kernels/record_parts.py --out DIR [--forwards 20] [--tokens 64,128 --rank 16]

`--tokens` replaces PARTS_M (decode sizes: `--tokens 64,128`, the MoE part of decode in data/lora_tax/); `--rank` the
adapters' rank (default 32; data/lora_tax's rank-16 cells: 16).
"""
from __future__ import annotations

import argparse
import os

import torch

from lora_moe_lab.instruments.recorders import kernel_cases as kc
from lora_moe_lab.instruments.recorders.harness import Recorder, log, row
from lora_moe_lab.instruments.recorders.profiling import profile_forwards
from lora_moe_lab.kernels.fused_moe_lora_packed import x_wide_columns
from lora_moe_lab.model.graphs import GraphForward
from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors, LoRAInfo
from lora_moe_lab.model.moe import LoRAHook

from studies.kernels import tidy

S, RANK, BF = kc.S, kc.RANK, kc.BF
PRESETS = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
PARTS_M = (1024, 4096, 8192, 16384)
BUSY, SPAN = "<busy>", "<span>"  # the pseudo-kernels of each arm's totals


def _arms(preset, M, dev):
    """{arm: a CUDA graph's replay} of one layer at M tokens, as record_fold.py's layer section builds it."""
    sh, backend, lay, pool = kc.lora_layer(preset, dev)
    cx = x_wide_columns(pool.layers[0].gate_up_a, sh.top_k, True)
    xv = torch.randn(M, sh.hidden + cx, generator=torch.Generator(device=dev).manual_seed(M), device=dev).to(BF)
    xv = xv[:, :sh.hidden]
    xp = xv.contiguous()
    arms = {}
    for nm, adapters in (("base", False), ("picked_all", True)):
        hooks = []
        if adapters:
            names = [f"a{i % S}" for i in range(M)]
            info = LoRAInfo(pool.layers[0], LoRABatchTensors.from_batch(LoRABatchInfo.build(pool, names, [1] * M), dev),
                            kc.RANK)
            hooks = [LoRAHook(info, backend, sh.num_experts)]
        arms[nm] = GraphForward(lambda h=hooks: lay(xv if lay.input_columns(M, h) else xp, h, backend),
                                warmup=2).replay
    return arms


def _kernel_times(fn, forwards: int):
    """Per (kernel name, its launch's place among that name's launches in the forward, from 0): (launches per
    forward, median GPU µs per forward), plus BUSY and SPAN, from a profiled run."""
    t = profile_forwards(fn, n_warmup=2, n_active=forwards)
    k = t.kernels[(t.kernels.kind == "kernel") & (t.kernels.forward >= 0)].sort_values("start_ns")
    if k.empty:
        raise RuntimeError("the profiler recorded no kernel inside a forward: CUPTI did not report the graph's nodes")
    k = k.assign(occurrence=k.groupby(["forward", "name"]).cumcount())
    n = k.forward.nunique()
    per = k.groupby(["forward", "name", "occurrence"]).dur_ns.agg(["sum", "count"]).reset_index()
    out = {key: (g["count"].sum() / n, g["sum"].median() / 1e3) for key, g in per.groupby(["name", "occurrence"])}
    fw = k.groupby("forward")
    out[(BUSY, 0)] = (len(k) / n, fw.dur_ns.sum().median() / 1e3)
    out[(SPAN, 0)] = (1.0, (fw.end_ns.max() - fw.start_ns.min()).median() / 1e3)
    return out, n


def parts(dev, forwards, tokens=None):
    for preset in PRESETS:
        for M in tokens or PARTS_M:
            arms = _arms(preset, M, dev)
            for arm, fn in arms.items():
                got, n = _kernel_times(fn, forwards)
                for (name, occ), (calls, us) in got.items():
                    row(section="parts", preset=preset, M=M, arm=arm, kernel=name, occurrence=occ, calls=calls, us=us,
                        forwards=n)
                top = sorted(((nm, us) for (nm, _o), (_c, us) in got.items() if nm not in (BUSY, SPAN)),
                             key=lambda x: -x[1])
                log(f"parts {preset} M={M:>5} {arm:<10}: busy {got[(BUSY, 0)][1]:8.1f} us, span "
                    f"{got[(SPAN, 0)][1]:8.1f} us, {got[(BUSY, 0)][0]:.0f} kernels; top: "
                    + ", ".join(f"{nm[:40]} {us:.1f}" for nm, us in top[:5]))
            del arms
            torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    tidy.session_args(ap, "kernels_parts")
    ap.add_argument("--forwards", type=int, default=20, help="profiled replays per arm (default 20)")
    ap.add_argument("--tokens", default="", help=f"comma-separated M (default {','.join(map(str, PARTS_M))})")
    ap.add_argument("--rank", type=int, default=RANK, help=f"the adapters' rank (default {RANK})")
    args = ap.parse_args(argv)
    if args.forwards < 3:
        raise SystemExit(f"--forwards must be at least 3 for a median, got {args.forwards}")
    try:
        tokens = tuple(int(t) for t in args.tokens.split(",") if t) or PARTS_M
    except ValueError:
        raise SystemExit(f"--tokens must be comma-separated integers, got {args.tokens!r}") from None
    if min(tokens) < 1 or not 1 <= args.rank <= 64:
        raise SystemExit(f"--tokens must be >= 1 and --rank in 1..64, got {tokens} and {args.rank}")
    kc.RANK = args.rank  # kernel_cases.lora_layer reads it at call time
    dev = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)
    Recorder.claim(args.out, "kernels_parts", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("kernels_parts", args.out, params=dict(vars(args), rank=args.rank, slots=S, dtype="bfloat16",
                                                          presets=PRESETS, parts_m=tokens))
    rec.section("parts", parts, dev, args.forwards, tokens)
    rec.write()
    tidy.append_if_asked(args, "kernels_parts")


if __name__ == "__main__":
    main()
