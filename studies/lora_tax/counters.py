"""ncu counters of LoRA's largest separate kernels in the lora_tax cells, each adapter at its own rank and padded.

    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \\
        --log-file DIR/ncu_raw.csv --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum \\
        python -m studies.lora_tax.counters --run DIR        # one launch per target (targets.json), counted
    python -m studies.lora_tax.counters --parse DIR         # -> DIR/lora_tax_ncu.csv (CPU is fine)

Targets: the aligned delta (kernels/fused_moe_lora.py, the plan's "separate" path, with the plan's alignment block
and tile) where the lora_tax cells run it: both ops of the MoE part of decode at M = 64 (qwen3 and TP=4 shapes), and
TP=4's gate_up in prefill at M = 16384. The pool of the mixed settings: 4 adapters of ranks 8, 16, 32, 64 padded to
64, tokens spread evenly (token t on slot t mod 4), top-k from random router logits (bf16). Each target twice: `own`
(the batch's rank per row, `lora_ranks`, the default) and `padded` (every adapter read at 64, the path before).
Columns: studies/kernels/record_base.py's ncu columns; `byte_floor` is the bytes the adapters need at their own
ranks (each used (slot, expert)'s A and B once, the input rows once, out read and written), `byte_floor_padded` at 64.
One profiled launch each: counters, never a timing (the timings are lora_tax.csv and own_rank.csv).
"""
from __future__ import annotations

import argparse
import os

RANKS = (8, 16, 32, 64)
PRESETS = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
TARGETS = ((64, ("gate_up", "down"), PRESETS), (16384, ("gate_up",), ("qwen3-30b-a3b-tp4",)))


def run(out: str, targets_=TARGETS, device="cuda") -> None:
    """The launches, once each under the profiler range (on another device, a smoke run: once, no range)."""
    import torch

    from lora_moe_lab.config import get_shape
    from lora_moe_lab.instruments.recorders import harness, tables
    from lora_moe_lab.kernels.align import moe_align
    from lora_moe_lab.kernels.fused_moe_lora import lora_delta
    from lora_moe_lab.kernels.plan import LoRADims, plan

    dev = torch.device(device)
    bf = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    S, R = len(RANKS), max(RANKS)
    launches, targets = [], []
    for M, ops, presets in targets_:
        for preset in presets:
            sh = get_shape(preset)
            E, K, I, k = sh.num_experts, sh.hidden, sh.intermediate, sh.top_k
            rw, ids = harness.route(M, E, k, gen, dev)
            slot = (torch.arange(M, device=dev) % S).to(torch.int32)
            lids = torch.arange(S, dtype=torch.int32, device=dev)
            en = torch.ones(S, dtype=torch.int32, device=dev)
            own = torch.tensor(RANKS, dtype=torch.int32, device=dev)
            used = torch.unique(slot.long().repeat_interleave(k) * E + ids.flatten().long())
            per_slot = [int((used // E == s).sum()) for s in range(S)]  # (slot, expert) pairs each slot's tokens use
            for op in ops:
                p = plan(op, M, sh, dev, lora=LoRADims(S, R, S))
                if p.path != "separate":
                    raise SystemExit(f"{preset} {op} M={M}: the plan runs {p.path!r} here, not the separate delta")
                P, N, kk = (2, I, K) if op == "gate_up" else (1, K, I)
                a = torch.randn(P, S, E, R, kk, generator=gen, device=dev).mul_(kk ** -0.5).to(bf)
                b = torch.randn(P, S, E, N, R, generator=gen, device=dev).mul_(R ** -0.5).to(bf)
                for s, r in enumerate(RANKS):  # zero-padded past each adapter's rank, as the pool keeps them
                    a[:, s, :, r:] = 0
                    b[:, s, :, :, r:] = 0
                x = torch.randn(M if op == "gate_up" else M * k, kk, generator=gen, device=dev).to(bf)
                o = torch.zeros(M * k, P * N, device=dev, dtype=bf)
                al = moe_align(ids, E, p.lora_block_m, slot, S)
                rows_in = M if op == "gate_up" else M * k
                io = rows_in * kk * 2 + 2 * M * k * P * N * 2

                def floor(ranks):
                    return sum(n * P * r * (kk + N) * 2 for n, r in zip(per_slot, ranks)) + io
                for arm, rk in (("own", own), ("padded", None)):
                    kw = dict(routed_weights=None if op == "gate_up" else rw, gather=op == "gate_up",
                              config=p.config, lora_ranks=rk)
                    launches.append(lambda args=(x, a, b, al, lids, en, k, o), kw=kw: lora_delta(*args, **kw))
                    targets.append(dict(kernel="fused_moe_lora_kernel", preset=preset, M=M, op=f"lora_{op}", arm=arm,
                                        tile=f"lbm{p.lora_block_m}", ranks=",".join(map(str, RANKS)),
                                        byte_floor=floor(RANKS), byte_floor_padded=floor([R] * S)))
    if dev.type == "cuda":
        harness.counted_launches(launches)
    else:
        for f in launches:
            f()
    os.makedirs(out, exist_ok=True)
    tables.write_json_atomic(os.path.join(out, "targets.json"), targets)
    print(f"counters: {len(targets)} targets launched once each; {out}/targets.json written", flush=True)


def parse(out: str) -> str:
    from studies.kernels.record_base import ncu_parse

    return ncu_parse(os.path.join(out, "ncu_raw.csv"), out, stem="lora_tax_ncu")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--run", metavar="DIR", help="launch the targets once each (under ncu)")
    g.add_argument("--parse", metavar="DIR", help="DIR/ncu_raw.csv + DIR/targets.json -> DIR/lora_tax_ncu.csv")
    a = ap.parse_args(argv)
    if a.run:
        run(a.run)
    else:
        print(parse(a.parse))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
