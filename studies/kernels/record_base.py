"""The base MoE GEMM's tuning sweep, its tile table, the table against the rules, and counters.

    python studies/kernels/record_base.py --out DIR [--sections sweep,compare] [--reps 15] [--dry]
    python studies/kernels/record_base.py --out DIR --sections compare --tables DIR   # a later session
    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \\
        --log-file DIR/ncu_raw.csv \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum \\
        python studies/kernels/record_base.py --out DIR --ncu-run      # one launch per target, counted
    python studies/kernels/record_base.py --out DIR --ncu-parse DIR/ncu_raw.csv   # -> kernels_base_ncu.csv
    python studies/kernels/record_base.py --out DIR --adopt-persist S1.csv S2.csv  # CPU: two sessions' persist

Sections (CUDA-graph replays, bf16, top-8 of 128 experts from softmax-topk of random router logits,
alignment outside the timed region, as data/kernels/README.md says of every base row):
  sweep    every candidate tile (BLOCK_M x BLOCK_N x BLOCK_K x GROUP_M x warps x stages) at each swept M,
           for gate_up and down of both presets: the median of --sweep-reps graph replays each.
           Then the pick: per (preset, M) the BLOCK_M whose best gate_up + best down is least (the
           two GEMMs share one alignment), and each GEMM's best tile at it. Written as the tile
           tables DIR/tile_tables/<GPU>_E.._H.._I...json (kernels/tiles.py reads them).
  variants the table's tile in three builds: every load predicated, predicate-free loads (K, N tile
           multiples), and the weight tile through a TMA descriptor; the tables get w_desc where TMA won.
  compare  the table against the rules it replaces (kernels/configs.py: rule_block_m, rule_gemm_config;
           `rules_masked`: the rules' tiles with every load predicated, the kernel the peers' run measured)
           and against the public vLLM H200 table's tiles on this kernel, interleaved and paired:
           --reps repetitions (each a replay of one graph), warm-up drift checked, the ratio's
           percentile-bootstrap 95 % interval.
  persist  the table's tile against persistent builds of it (a static grid of 1 or 2 programs per SM looping
           over the tiles, with and without Triton's flattened tile + K loop; where the alignment's BLOCK_M is 128,
           also sub-blocks of 64 rows: tile_arms.persist_arms) at M >= 1024, interleaved and
           paired like compare; the tables take the fastest build whose paired interval lies below 0.99
           (DIR/tile_tables). persist_check: 1000 random persistent launches against float64 and, bit for
           bit, against the same tile with a program per tile; every arm at the presets' shapes.
  --ncu-run  one launch of each counted target (targets.json): the base GEMMs at M=16 and 8192 with
           the table's tile and the rules' (at 8192 also the `m64_p2_pf` arm where the table's BLOCK_M is
           128), and the LoRA deltas as the layer runs them: the decode kernel at M=16, the aligned kernel at
           M=1024 and 8192 (rank 32, 4 adapters all enabled), between cudaProfilerStart/Stop so ncu counts
           only those. `persist` with `compare` in one run: compare measures the tables with this run's picks.
The candidate tiles include every tile of the vLLM table (its values are public facts: the tile
numbers only, no code), so the sweep can only match or beat it on this kernel.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import time

import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.analysers.stats import METHOD_BOOT, bootstrap_paired, warmup_check
from lora_moe_lab.instruments.recorders import harness
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.harness import ROWS, Recorder, graph_time_us, log, route, row
from lora_moe_lab.instruments.recorders.tile_arms import (PERSIST_M, PERSIST_SMALL_M, as_config, as_tuple, cfg_str,
                                                           config_of, persist_arms, table_tile, tile_str)
from lora_moe_lab.instruments.recorders.timing import time_interleaved
from lora_moe_lab.kernels import configs, tiles
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.configs import GemmConfig, rule_block_m, rule_gemm_config
from lora_moe_lab.kernels.fused_moe import moe_gemm
from lora_moe_lab.model.graphs import GraphForward
from lora_moe_lab.provenance import git_commit, repo_relative

from studies.kernels import read as bg
from studies.kernels import tidy

PRESETS = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
SWEEP_M = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
COMPARE_M = (1, 16, 128, 1024, 4096, 8192, 16384)  # the sizes of the peers' carried figures
BF = torch.bfloat16

# (BLOCK_N, BLOCK_K, GROUP_M, warps, stages) per BLOCK_M; the rules' tile and the vLLM table's are among them.
TILES = {
    16: [(64, 128, 1, 4, 4), (64, 64, 1, 4, 5), (64, 128, 1, 4, 3), (64, 256, 1, 4, 2), (128, 128, 1, 4, 2),
         (128, 128, 1, 4, 3), (64, 64, 32, 4, 3), (128, 64, 32, 4, 5), (128, 64, 1, 4, 4), (256, 128, 1, 8, 2),
         (64, 128, 16, 4, 2), (128, 128, 16, 4, 3)],
    32: [(64, 128, 4, 4, 4), (128, 64, 16, 4, 4), (128, 128, 16, 4, 3), (256, 128, 16, 4, 2), (128, 64, 1, 4, 3),
         (64, 64, 4, 4, 5), (256, 64, 8, 8, 3), (128, 128, 4, 4, 2)],
    64: [(128, 64, 8, 4, 4), (128, 64, 1, 4, 3), (128, 64, 16, 4, 3), (128, 64, 32, 4, 2), (128, 128, 8, 4, 3),
         (256, 64, 8, 8, 3), (256, 64, 8, 8, 4), (128, 128, 8, 8, 3), (256, 128, 8, 8, 2)],
    128: [(128, 64, 8, 8, 4), (256, 64, 16, 8, 4), (256, 64, 1, 8, 4), (256, 64, 8, 8, 3), (128, 64, 1, 8, 3),
          (128, 64, 16, 8, 3), (128, 128, 8, 8, 3), (256, 128, 8, 8, 2), (256, 32, 8, 8, 5), (256, 64, 32, 8, 4)],
}

# The public vLLM tables for H200, E=128 (N=768: qwen3-30b-a3b, N=192: its TP=4 shard): token count ->
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages). vLLM takes the entry whose key is nearest to M.
VLLM_H200 = {
    "qwen3-30b-a3b": {1: (16, 64, 64, 1, 4, 5), 16: (16, 64, 256, 1, 4, 2), 128: (16, 128, 128, 1, 4, 2),
                      1024: (128, 256, 64, 16, 8, 4), 4096: (128, 256, 64, 16, 8, 4)},
    "qwen3-30b-a3b-tp4": {1: (16, 64, 64, 1, 4, 5), 16: (16, 64, 64, 32, 4, 3), 128: (16, 128, 64, 32, 4, 5),
                          1024: (128, 256, 64, 16, 8, 4), 4096: (128, 128, 64, 1, 8, 3)},
}


def block_ms(M: int, k: int, E: int) -> list[int]:
    """BLOCK_M candidates at M: the rule's, one step either side, and the vLLM table's (capped at 128)."""
    bm0 = rule_block_m(M, k, E)
    steps = (16, 32, 64, 128)
    i = steps.index(bm0)
    return sorted({steps[j] for j in (i - 1, i, i + 1) if 0 <= j < len(steps)} | ({128} if M >= 1024 else set()))


class Case:
    """The inputs of one (preset, M): weights, activations, routing, outputs."""

    def __init__(self, preset, M, dev, gen):
        sh = get_shape(preset)
        self.K, self.I, self.E, self.k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
        K, I, E, k = self.K, self.I, self.E, self.k
        self.M = M
        self.w13 = (torch.randn(E, 2 * I, K, generator=gen, device=dev) * K ** -0.5).to(BF)
        self.w2 = (torch.randn(E, K, I, generator=gen, device=dev) * I ** -0.5).to(BF)
        self.x = torch.randn(M, K, generator=gen, device=dev).to(BF)
        self.h = torch.randn(M * k, I, generator=gen, device=dev).to(BF)
        self.rw, self.ids = route(M, E, k, gen, dev)
        self.inter = torch.empty(M * k, 2 * I, device=dev, dtype=BF)
        self.down = torch.empty(M * k, K, device=dev, dtype=BF)
        self._al = {}

    def align(self, bm):
        if bm not in self._al:
            self._al[bm] = moe_align(self.ids, self.E, bm)
        return self._al[bm]

    def fn(self, op, bm, cfg):
        al = self.align(bm)
        if op == "gate_up":
            return lambda: moe_gemm(self.x, self.w13, al, self.k, self.inter, config=cfg)
        return lambda: moe_gemm(self.h, self.w2, al, self.k, self.down, routed_weights=self.rw, gather=False,
                                config=cfg)

    def nk(self, op):
        """(N, K) of the GEMM: gate_up (2 * intermediate, hidden), down (hidden, intermediate)."""
        return (2 * self.I, self.K) if op == "gate_up" else (self.K, self.I)

    def flops(self, op):
        n, kk = self.nk(op)
        return 2 * self.M * self.k * n * kk


def inner_of(M):
    return 8 if M <= 1024 else 2


# ------------------------------------------------------------------------------------------------
def sweep(preset, dev, gen, reps):
    for M in SWEEP_M:
        c = Case(preset, M, dev, gen)
        for bm in block_ms(M, c.k, c.E):
            for t in TILES[bm]:
                for op in ("gate_up", "down"):
                    try:
                        us = graph_time_us([c.fn(op, bm, as_config(t))], inner=inner_of(M), reps=reps)
                        err = ""
                    except Exception as exc:  # noqa: BLE001 - a tile that does not compile is a row too
                        us, err = float("nan"), f"{type(exc).__name__}: {str(exc)[:160]}"
                        runtime.synchronize()
                    row(section="sweep", preset=preset, op=op, M=M, block_m=bm, tile=tile_str(bm, t), time_us=us,
                        tflops=c.flops(op) / (us * 1e-6) / 1e12 if us == us else float("nan"), error=err)
        best = pick_rows(preset, M)
        log(f"sweep {preset} M={M}: bm{best['block_m']} gate_up {best['gate_up'][1]:.1f} us "
            f"({best['gate_up'][0]}), down {best['down'][1]:.1f} us ({best['down'][0]})")
        del c
        torch.cuda.empty_cache()


def pick_rows(preset, M):
    rows = [r for r in ROWS if r["section"] == "sweep" and r["preset"] == preset and r["M"] == M
            and r["time_us"] == r["time_us"]]
    best = {}
    for bm in sorted({r["block_m"] for r in rows}):
        per = {}
        for op in ("gate_up", "down"):
            cand = [r for r in rows if r["block_m"] == bm and r["op"] == op]
            if cand:
                b = min(cand, key=lambda r: r["time_us"])
                per[op] = (b["tile"], b["time_us"])
        if len(per) == 2:
            best[bm] = per
    bm = min(best, key=lambda b: best[b]["gate_up"][1] + best[b]["down"][1])
    return dict(block_m=bm, **best[bm])


def parse_tile(s):
    bm, c = config_of(s)
    return bm, dict(block_n=c.block_n, block_k=c.block_k, group_m=c.group_m, num_warps=c.num_warps,
                    num_stages=c.num_stages)


def write_tables(out, meta):
    os.makedirs(os.path.join(out, "tile_tables"), exist_ok=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    paths = []
    for preset in PRESETS:
        sh = get_shape(preset)
        buckets = {}
        for M in SWEEP_M:
            p = pick_rows(preset, M)
            bm, gu = parse_tile(p["gate_up"][0])
            _, dn = parse_tile(p["down"][0])
            buckets[str(M)] = dict(block_m=bm, gate_up=gu, down=dn, gate_up_us=round(p["gate_up"][1], 2),
                                   down_us=round(p["down"][1], 2))
        table = dict(gpu=gpu, num_experts=sh.num_experts, hidden=sh.hidden, intermediate=sh.intermediate,
                     preset=preset, source=f"studies/kernels/record_base.py sweep at {meta.get('commit')}, "
                                           f"{meta.get('date')}", buckets=buckets)
        tiles.check_table({**table, "buckets": {b: {k: v for k, v in e.items() if not k.endswith("_us")}
                                                for b, e in buckets.items()}})
        f = os.path.join(out, "tile_tables", tiles.file_name(gpu, sh.num_experts, sh.hidden, sh.intermediate))
        tables.write_json_atomic(f, table)
        paths.append(f)
        log(f"wrote {f}")
    return paths


# ------------------------------------------------------------------------------------------------
def vllm_tile(preset, M):
    tab = VLLM_H200[preset]
    key = min(tab, key=lambda x: abs(x - M))
    t = tab[key]
    return t[0], t[1:]


def arms_of(c, preset, M, op):
    """arm -> (block_m, tile): the table's whole GemmConfig (as configs.py reads it, persistent / early flags and
    all), the rules' and the vLLM table's tile tuples."""
    bm_tab = configs.moe_block_m(M, c.k, c.E, c.K, c.I)
    tab = configs.gemm_config(M, bm_tab, *c.nk(op), c.E)
    bm_rule = rule_block_m(M, c.k, c.E)
    rules = as_tuple(rule_gemm_config(bm_rule))
    return dict(table=(bm_tab, tab), rules=(bm_rule, rules), vllm_tiles=vllm_tile(preset, M),
                rules_masked=(bm_rule, rules + ("masked",)))


def compare(preset, dev, gen, reps):
    for M in COMPARE_M:
        c = Case(preset, M, dev, gen)
        inner = inner_of(M)
        for op in ("gate_up", "down"):
            arms = arms_of(c, preset, M, op)
            graphs = {}
            for a, (bm, t) in arms.items():
                f = c.fn(op, bm, as_config(t))
                graphs[a] = f if harness.is_dry() else GraphForward(lambda f=f: [f() for _ in range(inner)], warmup=3)
            fns = {a: (g if harness.is_dry() else g.replay) for a, g in graphs.items()}
            for f in fns.values():
                f()
            got = time_interleaved(fns, reps=reps)
            samples = {a: [s / inner for s in t.samples_us] for a, t in got.items()}
            wc = warmup_check(samples)
            keep = slice(wc.dropped, None)
            s = {a: torch.tensor(v[keep]).tolist() for a, v in samples.items()}
            med = {a: float(torch.tensor(v).median()) for a, v in s.items()}
            r_rules = bootstrap_paired(s["rules"], s["table"], "ratio_of_medians")
            r_vllm = bootstrap_paired(s["vllm_tiles"], s["table"], "ratio_of_medians")
            r_masked = bootstrap_paired(s["rules_masked"], s["table"], "ratio_of_medians")
            row(section="compare", preset=preset, op=op, M=M, reps=reps, kept=len(s["table"]), stable=wc.stable,
                warmup=wc.note,
                table_tile=tile_str(*arms["table"]), rules_tile=tile_str(*arms["rules"]),
                vllm_tile=tile_str(*arms["vllm_tiles"]), table_us=med["table"], rules_us=med["rules"],
                vllm_tiles_us=med["vllm_tiles"], rules_over_table=r_rules[0], rules_over_table_lo=r_rules[1],
                rules_over_table_hi=r_rules[2], vllm_tiles_over_table=r_vllm[0], vllm_tiles_over_table_lo=r_vllm[1],
                vllm_tiles_over_table_hi=r_vllm[2], rules_masked_us=med["rules_masked"],
                rules_masked_over_table=r_masked[0], rules_masked_over_table_lo=r_masked[1],
                rules_masked_over_table_hi=r_masked[2], table_tflops=c.flops(op) / (med["table"] * 1e-6) / 1e12,
                interval=METHOD_BOOT)
            log(f"compare {preset} {op} M={M}: table {med['table']:.1f} us, rules {med['rules']:.1f} "
                f"({r_rules[0]:.3f} [{r_rules[1]:.3f}, {r_rules[2]:.3f}]), vllm tiles {med['vllm_tiles']:.1f} "
                f"({r_vllm[0]:.3f} [{r_vllm[1]:.3f}, {r_vllm[2]:.3f}]) {wc.note}")
            del graphs, fns
        del c
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
VARIANTS = {"masked": dict(even=False, w_desc=False), "even": dict(w_desc=False), "even_tma": dict(w_desc=True)}


def variants(preset, dev, gen, reps):
    """The table's tile in three builds of the kernel, interleaved and paired: `masked` (every load
    predicated, the kernel before the EVEN flags), `even` (no K/N predicates where K, N are tile
    multiples) and `even_tma` (also the weight tile through a TMA descriptor)."""
    from dataclasses import replace

    for M in SWEEP_M:
        c = Case(preset, M, dev, gen)
        inner = inner_of(M)
        for op in ("gate_up", "down"):
            bm, t = arms_of(c, preset, M, op)["table"]
            fns = {}
            for v, kw in VARIANTS.items():
                f = c.fn(op, bm, replace(as_config(t), **kw))
                fns[v] = f if harness.is_dry() else GraphForward(lambda f=f: [f() for _ in range(inner)],
                                                                 warmup=3).replay
            got = time_interleaved(fns, reps=reps)
            samples = {a: [x / inner for x in tm.samples_us] for a, tm in got.items()}
            wc = warmup_check(samples)
            s = {a: v[wc.dropped:] for a, v in samples.items()}
            r = {v: bootstrap_paired(s[v], s["masked"], "ratio_of_medians") for v in ("even", "even_tma")}
            # The TMA choice compares the two predicate-free builds only: their own warm-up check, their
            # own paired ratio (a drift of the masked arm says nothing about them).
            wc2 = warmup_check({a: samples[a] for a in ("even", "even_tma")})
            tma = bootstrap_paired(samples["even_tma"][wc2.dropped:], samples["even"][wc2.dropped:], "ratio_of_medians")
            row(section="variants", preset=preset, op=op, M=M, tile=tile_str(bm, t), reps=reps, stable=wc.stable,
                warmup=wc.note, **{f"{v}_us": float(torch.tensor(s[v]).median()) for v in VARIANTS},
                **{f"{v}_over_masked{sfx}": r[v][i] for v in r for i, sfx in enumerate(("", "_lo", "_hi"))},
                tma_over_even=tma[0], tma_over_even_lo=tma[1], tma_over_even_hi=tma[2], tma_pair_stable=wc2.stable,
                tma_chosen=bool(wc2.stable and tma[2] < 1.0), interval=METHOD_BOOT)
            masked_us = float(torch.tensor(s["masked"]).median())
            log(f"variants {preset} {op} M={M} {tile_str(bm, t)}: masked {masked_us:.1f} us, even/masked "
                f"{r['even'][0]:.3f} [{r['even'][1]:.3f}, {r['even'][2]:.3f}], even_tma/masked "
                f"{r['even_tma'][0]:.3f} [{r['even_tma'][1]:.3f}, {r['even_tma'][2]:.3f}] {wc.note}")
        del c
        torch.cuda.empty_cache()


def add_tma_choice(out):
    """The tables get w_desc where the TMA build was faster than the predicate-free one: the upper
    bound of the paired ratio even_tma / even below 1, its two arms free of drift (`tma_chosen`)."""
    for preset in PRESETS:
        sh = get_shape(preset)
        gpu = torch.cuda.get_device_name()
        f = os.path.join(out, "tile_tables", tiles.file_name(gpu, sh.num_experts, sh.hidden, sh.intermediate))
        table = json.load(open(f))
        for r in ROWS:
            if r["section"] == "variants" and r["preset"] == preset and str(r["M"]) in table["buckets"]:
                table["buckets"][str(r["M"])][r["op"]]["w_desc"] = r["tma_chosen"]
        tables.write_json_atomic(f, table)
        log(f"w_desc set in {f} where the TMA build won")


# ------------------------------------------------------------------------------------------------
def persist(preset, dev, gen, reps):
    """The table's tile against persistent builds of it, interleaved and paired (20 repetitions after a warm-up
    drift check; percentile bootstrap 95 % of each arm's ratio of medians to the table)."""
    for M in PERSIST_SMALL_M + PERSIST_M:
        c = Case(preset, M, dev, gen)
        inner = inner_of(M)
        for op in ("gate_up", "down"):
            bm, t = arms_of(c, preset, M, op)["table"]
            arms = persist_arms(bm, as_config(t))
            fns, errs = {}, {}
            for a, cfg in arms.items():
                f = c.fn(op, bm, cfg)
                try:
                    fns[a] = f if harness.is_dry() else GraphForward(lambda f=f: [f() for _ in range(inner)],
                                                                     warmup=3).replay
                except Exception as exc:  # noqa: BLE001 - a build that does not compile is left out, and said
                    errs[a] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    runtime.synchronize()
            got = time_interleaved(fns, reps=reps)
            samples = {a: [x / inner for x in tm.samples_us] for a, tm in got.items()}
            wc = warmup_check(samples)
            s = {a: v[wc.dropped:] for a, v in samples.items()}
            med = {a: float(torch.tensor(v).median()) for a, v in s.items()}
            for a in arms:
                r = bootstrap_paired(s[a], s["table"], "ratio_of_medians") if a in s else (float("nan"),) * 3
                row(section="persist", preset=preset, op=op, M=M, arm=a, tile=cfg_str(bm, arms[a]),
                    reps=reps, kept=len(s["table"]), stable=wc.stable, warmup=wc.note,
                    time_us=med.get(a, float("nan")), over_table=r[0], over_table_lo=r[1], over_table_hi=r[2],
                    tflops=c.flops(op) / (med[a] * 1e-6) / 1e12 if a in med else float("nan"),
                    error=errs.get(a, ""), interval=METHOD_BOOT)
            best = min(med, key=med.get)
            log(f"persist {preset} {op} M={M}: table {med['table']:.1f} us ({cfg_str(bm, arms['table'])}); "
                + ", ".join(f"{a} {med[a] / med['table']:.3f}" for a in med if a != "table")
                + f"; best {best} {wc.note}" + (f"; left out {errs}" if errs else ""))
        del c
        torch.cuda.empty_cache()


PERSIST_DIFF = (GemmConfig(64, 64, 8, 4, 3, persistent=1), GemmConfig(128, 64, 8, 4, 3, w_desc=True, persistent=2,
                                                                     flatten=True),
                GemmConfig(64, 128, 1, 4, 2, w_desc=True, persistent=1, flatten=True),
                GemmConfig(64, 64, 8, 4, 3, even=False, persistent=2, flatten=True),
                GemmConfig(64, 64, 8, 4, 3, w_desc=True, persistent=2, flatten=True, sub_m=16),  # sub-blocks of 16 rows
                GemmConfig(128, 64, 8, 4, 2, w_desc=True, persistent=2, sub_m=16))


def persist_check(dev, gen, n_cases):
    """n_cases random launches of the persistent builds (bf16, NaN-poisoned outputs) against float64, each also
    bit for bit against the same tile with a program per tile; then the presets' shapes at PERSIST_M with every
    arm of `persist` against the table's build."""
    import random
    from dataclasses import replace

    from lora_moe_lab.instruments.recorders import kernel_cases as kc
    from lora_moe_lab.ops.reference import ref_moe_gemm_grouped as ref_gemm
    from lora_moe_lab.ops.reference import rel, tolerance

    rng, g = random.Random(3), torch.Generator(device=dev).manual_seed(3)
    fails, worst = 0, 0.0
    for i in range(n_cases):
        cfg = PERSIST_DIFF[i % len(PERSIST_DIFF)]
        c = kc.random_gemm_case(rng, g, dev, BF, i)
        out, one = c["out"], c["out"].clone()
        for o, cf in ((out, cfg), (one, replace(cfg, persistent=0, flatten=False))):
            moe_gemm(c["x"], c["w"], c["align"], c["k"], o, routed_weights=c["rw"], gather=c["gather"], config=cf)
        err = (rel(out.double(), ref_gemm(c["x"], c["w"], c["ids"], c["k"], c["rw"], c["gather"]))
               if torch.isfinite(out).all() else float("inf"))
        same = torch.equal(out.view(torch.int16), one.view(torch.int16))
        worst = max(worst, err)
        fails += not (err < tolerance(BF, dev) and same)
    row(section="persist_check", op="random_persistent", cases=n_cases, failures=fails, worst=worst,
        tol=tolerance(BF, dev))
    log(f"persist_check: {n_cases} random persistent launches, {fails} failures (float64 and bit for bit against "
        f"a program per tile), worst {worst:.1e}")
    for preset in PRESETS:
        for M in PERSIST_M[:2]:
            c = Case(preset, M, dev, gen)
            for op in ("gate_up", "down"):
                bm, t = arms_of(c, preset, M, op)["table"]
                outs, errs = {}, {}
                for a, cfg in persist_arms(bm, as_config(t)).items():
                    o = c.inter if op == "gate_up" else c.down
                    o.fill_(float("nan"))
                    try:
                        c.fn(op, bm, cfg)()
                    except Exception as exc:  # noqa: BLE001 - a build that does not compile is left out, and said
                        errs[a] = f"{type(exc).__name__}: {str(exc)[:160]}"
                        continue
                    outs[a] = o.clone()
                ref = outs["table"]
                bad = [a for a, o in outs.items() if not torch.isfinite(o).all()
                       or rel(o.double(), ref.double()) > tolerance(BF, dev)]
                same = [a for a, o in outs.items() if torch.equal(o.view(torch.int16), ref.view(torch.int16))]
                row(section="persist_check", preset=preset, op=op, M=M, arms=",".join(outs), failures=len(bad),
                    failed=",".join(bad), bitwise_as_table=",".join(same), left_out=",".join(errs))
                log(f"persist_check {preset} {op} M={M}: {len(bad)} arms off the table's output {bad}; "
                    f"bit for bit: {same}" + (f"; left out (no build) {errs}" if errs else ""))
            del c
            torch.cuda.empty_cache()


def add_persist_choice(out, sessions=None, gpu=None, note=""):
    """The tables take a persistent arm where it beat the table's tile (persist_choices) in every session given
    (default: this run's rows; `gpu`: the sessions' card, default this one). Written to DIR/tile_tables."""
    picks = bg.persist_choices(sessions or [ROWS])
    for preset in PRESETS:
        sh = get_shape(preset)
        src = tiles.TABLE_DIR / tiles.file_name(gpu or torch.cuda.get_device_name(), sh.num_experts, sh.hidden,
                                                sh.intermediate)
        table = json.load(open(src))
        for (p, op, M), best in sorted(picks.items()):
            if p != preset:
                continue
            bm, cfg = config_of(best["tile"])
            if bm != table["buckets"][str(M)]["block_m"]:
                raise ValueError(f"persist choice {preset} {op} M={M}: {best['tile']} is not at the table's block_m")
            table["buckets"][str(M)][op] = table_tile(cfg)
            log(f"persist choice {preset} {op} M={M}: {best['tile']} (worst of {best['sessions']} session(s): "
                f"{float(best['over_table']):.3f} [{float(best['over_table_lo']):.3f}, "
                f"{float(best['over_table_hi']):.3f}])")
        table["source"] += note or f"; persistent builds from the persist section at {git_commit()}"
        os.makedirs(os.path.join(out, "tile_tables"), exist_ok=True)
        tables.write_json_atomic(os.path.join(out, "tile_tables", src.name), table)


def adopt_persist(csvs, out):
    """CPU: the committed tables take the arms that beat the table's tile in every recorded session (csvs)."""
    sessions = [list(csv.DictReader(open(f))) for f in csvs]
    gpus = {json.load(open(f[:-len(".csv")] + ".meta.json"))["gpu"] for f in csvs}
    if len(gpus) != 1:
        raise ValueError(f"--adopt-persist: the sessions ran on different cards {sorted(gpus)}; adopt per card")
    add_persist_choice(out, sessions, gpu=gpus.pop(),
                       note="; persistent builds where they won in every one of " + ", ".join(map(repo_relative, csvs)))


# ------------------------------------------------------------------------------------------------
def ncu_run(out, dev, gen):
    """One launch per target between cudaProfilerStart/Stop (warm-ups and alignments outside)."""
    from dataclasses import replace

    from lora_moe_lab.instruments.recorders.kernel_cases import S, RANK
    from lora_moe_lab.kernels.configs import lora_block_m, lora_down_config
    from lora_moe_lab.kernels.fused_moe_lora import lora_delta
    from lora_moe_lab.kernels.lora_decode import lora_delta_decode

    targets = []
    launches = []
    for preset in PRESETS:
        for M in (16, 1024, 8192):  # 1024: the bytes-bound points short of 1.15x vLLM
            c = Case(preset, M, dev, gen)
            for op in ("gate_up", "down"):
                arms = arms_of(c, preset, M, op)
                picks = [("table", *arms["table"], {}), ("rules", *arms["rules"], {})]
                if M >= 1024:  # the table's tile as the kernel was before the EVEN flags and TMA
                    picks.append(("table_masked", *arms["table"], dict(even=False, w_desc=False)))
                    sub = persist_arms(arms["table"][0], as_config(arms["table"][1])).get("m64_p2_pf")
                    # the sub-block build (does `wait` fall with two programs per SM?), unless it is the table's
                    if sub is not None and sub != as_config(arms["table"][1]):
                        picks.append(("m64_p2_pf", arms["table"][0], sub, {}))
                for a, bm, t, kw in picks:
                    launches.append(c.fn(op, bm, replace(as_config(t), **kw)))
                    targets.append(dict(kernel="fused_moe_kernel", preset=preset, M=M, op=f"base_{op}", arm=a,
                                        tile=tile_str(bm, t) + ("/masked" if kw else ""), flops=c.flops(op), cls=c))
        # The LoRA deltas as the layer runs them: the decode kernel at M = 16 (no alignment), the aligned kernel
        # at M = 1024 and 8192 (the down delta with its own tile table), every token with one of 4 adapters.
        for M, path in ((16, "decode"), (1024, "aligned"), (8192, "aligned")):
            c = Case(preset, M, dev, gen)
            E, K, I, k = c.E, c.K, c.I, c.k
            slot = torch.randint(0, S, (M,), generator=gen, device=dev, dtype=torch.int32)
            lora_ids = torch.arange(S, dtype=torch.int32, device=dev)
            enabled = torch.ones(S, dtype=torch.int32, device=dev)
            a13 = (torch.randn(2, S, E, RANK, K, generator=gen, device=dev) * K ** -0.5).to(BF)
            b13 = (torch.randn(2, S, E, I, RANK, generator=gen, device=dev) * RANK ** -0.5).to(BF)
            a2 = (torch.randn(1, S, E, RANK, I, generator=gen, device=dev) * I ** -0.5).to(BF)
            b2 = (torch.randn(1, S, E, K, RANK, generator=gen, device=dev) * RANK ** -0.5).to(BF)
            if path == "decode":
                launches.append(lambda c=c, s_=slot, a=a13, b=b13, li=lora_ids, en=enabled: lora_delta_decode(
                    c.x, a, b, c.ids, s_, li, en, c.inter))
                launches.append(lambda c=c, s_=slot, a=a2, b=b2, li=lora_ids, en=enabled: lora_delta_decode(
                    c.h, a, b, c.ids, s_, li, en, c.down, routed_weights=c.rw, gather=False))
                kernel = "lora_decode_kernel"
            else:
                bml = lora_block_m(M, k, E, S)
                al = moe_align(c.ids, E, bml, slot, S)
                cfg2 = lora_down_config(M, k, E, S, bml, K, I)
                launches.append(lambda c=c, al=al, a=a13, b=b13, li=lora_ids, en=enabled: lora_delta(
                    c.x, a, b, al, li, en, k, c.inter))
                launches.append(lambda c=c, al=al, a=a2, b=b2, li=lora_ids, en=enabled, cfg2=cfg2: lora_delta(
                    c.h, a, b, al, li, en, k, c.down, routed_weights=c.rw, gather=False, config=cfg2))
                kernel = "fused_moe_lora_kernel"
            used = int(torch.unique(slot.long().repeat_interleave(k) * E + c.ids.flatten().long()).numel())
            n_pairs = M * k
            for op, n, kk, P in (("lora_gate_up", I, K, 2), ("lora_down", K, I, 1)):
                # used A and B slices once, x once per row (gate_up: tokens; down: pairs), out read and written
                floor = used * P * (RANK * kk + n * RANK) * 2 + (M if op == "lora_gate_up" else n_pairs) * kk * 2 \
                    + 2 * n_pairs * P * n * 2
                targets.append(dict(kernel=kernel, preset=preset, M=M, op=op, arm=path if path == "decode" else "table",
                                    tile="", byte_floor=floor))
    harness.counted_launches(launches)  # compiled and warmed first, then counted
    for t in targets:
        if "cls" in t:
            c = t.pop("cls")
            n, kk = c.nk(t["op"][len("base_"):])
            used = int(torch.unique(c.ids).numel())
            rows_in = c.M if t["op"] == "base_gate_up" else c.M * c.k
            t["byte_floor"] = used * n * kk * 2 + rows_in * kk * 2 + c.M * c.k * n * 2
    tables.write_json_atomic(os.path.join(out, "targets.json"), targets)
    log(f"ncu-run: {len(targets)} targets launched once each; targets.json written")


NCU_COLS = {  # our column -> ncu raw metric
    "duration_us": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct_peak": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm_pct_peak": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "registers": "launch__registers_per_thread",
    "instructions": "smsp__inst_executed.sum",
    # load balance over the SMs (requested with --metrics sm__cycles_active.avg,sm__cycles_active.max): the average
    # SM's active cycles over the busiest SM's is the share of the kernel's span the average SM works
    "sm_active_cycles_avg": "sm__cycles_active.avg",
    "sm_active_cycles_max": "sm__cycles_active.max",
}
# ncu prints scaled units unless --print-units base; either way each value is brought to bytes and ns
UNIT = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6}
_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def _num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return float("nan")


KERNEL_NAMES = ("lora_shrink_kernel", "packed_shrink_kernel", "lora_decode_kernel", "fused_moe_lora_kernel",
                "fused_moe_kernel")  # matched in this order


def ncu_parse(raw_csv, out, stem="kernels_base_ncu"):
    """ncu's raw CSV (one row per profiled kernel, a units row after the header) + targets.json ->
    <stem>.csv: DRAM bytes against the byte floor, throughput, occupancy, top stall reasons."""
    with open(raw_csv) as fh:
        lines = [ln for ln in fh if ln.startswith('"')]  # ncu's own log lines ("==PROF==") are not CSV
    rows = list(csv.DictReader(lines))
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # drops the units row
    targets = json.load(open(os.path.join(out, "targets.json")))
    by_kernel = {}
    for r in rows:
        name = r.get("Kernel Name", "")
        key = next((k for k in KERNEL_NAMES if k in name), None)
        if key:
            by_kernel.setdefault(key, []).append(r)
    seen = {}
    recs = []
    for t in targets:
        i = seen.get(t["kernel"], 0)
        seen[t["kernel"]] = i + 1
        r = by_kernel.get(t["kernel"], [])[i] if i < len(by_kernel.get(t["kernel"], [])) else None
        if r is None:
            raise ValueError(f"{raw_csv}: no {i + 1}-th {t['kernel']} launch for target {t}")
        rec = dict(t)
        units = units_of(lines)
        for col, metric in NCU_COLS.items():
            rec[col] = _num(r.get(metric, "nan")) * UNIT.get(units.get(metric, "").strip(), 1.0)
        rec["duration_us"] *= 1e-3  # ns (UNIT's base) -> us
        stalls = sorted(((_num(v), m.group(1)) for k, v in r.items() if (m := _STALL.match(k))), reverse=True)
        stalls = [(v, s) for v, s in stalls if v == v]
        rec["top_stall"] = stalls[0][1] if stalls else ""
        rec["top_stall_ratio"] = stalls[0][0] if stalls else float("nan")
        rec["second_stall"] = stalls[1][1] if len(stalls) > 1 else ""
        rec["dram_bytes_over_floor"] = (rec["dram_read_bytes"] + rec["dram_write_bytes"]) / rec["byte_floor"]
        mx = rec["sm_active_cycles_max"]  # nan where the metric was not asked for
        rec["sm_busy_avg_over_max"] = rec["sm_active_cycles_avg"] / mx if mx > 0 else float("nan")
        recs.append(rec)
    keys = list(dict.fromkeys(k for r in recs for k in r))
    f = os.path.join(out, f"{stem}.csv")
    # whole (temp file + os.replace); sealed in the section metadata (<section>.meta.json) if the recorder wrote one
    mp = os.path.join(out, stem.removesuffix("_ncu") + ".meta.json")
    tables.write_table(f, recs, keys, meta_path=mp, seal_it=os.path.exists(mp))
    for r in recs:
        log(f"ncu {r['preset']:<18}{r['op']:<13}M={r['M']:<5}{r['arm']:<6}{r['duration_us']:8.1f} us "
            f"DRAM {r['dram_pct_peak']:5.1f} % tensor {r['tensor_pipe_pct']:5.1f} % "
            f"bytes/floor {r['dram_bytes_over_floor']:.2f} "
            f"occ {r['achieved_occupancy_pct']:5.1f} % L2 hit {r['l2_hit_pct']:5.1f} % stall {r['top_stall']}")
    return f


def units_of(lines):
    """The units row of ncu's raw CSV (the first data row, its ID empty): metric -> unit."""
    rd = csv.reader(lines[:2])
    head, units = next(rd), next(rd)
    return dict(zip(head, units))


# ------------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "build/kernels_base"), help="default: $OUT")
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    tidy.session_args(ap, "kernels_base")  # --ncu-parse: appended to the --ncu-stem section's counters
    ap.add_argument("--sections", default="sweep,variants,compare", help="default: sweep,variants,compare")
    ap.add_argument("--reps", type=int, default=15, help="interleaved repetitions of compare (default 15)")
    ap.add_argument("--sweep-reps", type=int, default=10, help="replays per sweep timing (default 10)")
    ap.add_argument("--check-cases", type=int, default=1000, help="random launches of persist_check (default 1000)")
    ap.add_argument("--tables", help="read the tile tables from DIR/tile_tables (compare in a later session)")
    ap.add_argument("--ncu-run", action="store_true", help="launch the counted targets once (run under ncu)")
    ap.add_argument("--ncu-parse", metavar="RAW_CSV", help="ncu's raw CSV -> kernels_base_ncu.csv (CPU is fine)")
    ap.add_argument("--ncu-stem", default="kernels_base_ncu", help="the parsed CSV's name (default kernels_base_ncu)")
    ap.add_argument("--adopt-persist", nargs="+", metavar="CSV",
                    help="CPU: write DIR/tile_tables with the persistent arms that won in every session's CSV")
    ap.add_argument("--dry", action="store_true", help="CPU: every path once on tiny shapes, fake timer")
    args = ap.parse_args(argv)
    if args.adopt_persist:
        return adopt_persist(args.adopt_persist, args.out)
    if args.ncu_parse:
        f = ncu_parse(args.ncu_parse, args.out, args.ncu_stem)
        tidy.append_if_asked(args, args.ncu_stem.removesuffix("_ncu"), ncu_only=True)
        return f
    dev = torch.device("cuda")
    if args.dry or not torch.cuda.is_available():
        dev = _dry()
    gen = torch.Generator(device=dev).manual_seed(0)
    if args.ncu_run:
        os.makedirs(args.out, exist_ok=True)
        if args.tables:
            use_tables(os.path.join(args.tables, "tile_tables"))
        return ncu_run(args.out, dev, gen)
    Recorder.claim(args.out, "kernels_base", args.overwrite)  # before any work: no table is replaced unasked
    rec = Recorder("kernels_base", args.out, params=dict(vars(args), sweep_m=SWEEP_M, compare_m=COMPARE_M,
                                                         vllm_h200=VLLM_H200, dtype="bfloat16"))
    secs = args.sections.split(",")
    t0 = time.time()
    if "sweep" in secs:
        for preset in PRESETS:
            rec.section(f"sweep {preset}", sweep, preset, dev, gen, args.sweep_reps)
            log(f"[sweep {preset} done at {time.time() - t0:.0f}s]")
        if not harness.is_dry():
            rec.meta["tile_tables"] = repo_relative(write_tables(args.out, rec.meta))
    tdir = args.tables or (args.out if "sweep" in secs else None)
    if tdir and not harness.is_dry():
        use_tables(os.path.join(tdir, "tile_tables"))
    rec.meta["tile_table_dir"] = repo_relative(str(tiles.TABLE_DIR))
    if "variants" in secs:
        for preset in PRESETS:
            rec.section(f"variants {preset}", variants, preset, dev, gen, args.reps)
            log(f"[variants {preset} done at {time.time() - t0:.0f}s]")
        if not harness.is_dry() and "sweep" in secs:
            add_tma_choice(args.out)
            use_tables(os.path.join(args.out, "tile_tables"))
    if "persist_check" in secs:
        rec.section("persist_check", persist_check, dev, gen, args.check_cases)
        log(f"[persist_check done at {time.time() - t0:.0f}s]")
    if "persist" in secs:
        for preset in PRESETS:
            rec.section(f"persist {preset}", persist, preset, dev, gen, args.reps)
            log(f"[persist {preset} done at {time.time() - t0:.0f}s]")
        if not harness.is_dry():
            add_persist_choice(args.out)
            use_tables(os.path.join(args.out, "tile_tables"))  # compare (if asked) measures this session's picks
    if "compare" in secs:
        for preset in PRESETS:
            rec.section(f"compare {preset}", compare, preset, dev, gen, args.reps)
            log(f"[compare {preset} done at {time.time() - t0:.0f}s]")
    rec.write()
    tidy.append_if_asked(args, "kernels_base")


def use_tables(path):
    """Point kernels/tiles.py at freshly written tables (the sweep's), so compare measures them."""
    tiles.TABLE_DIR = type(tiles.TABLE_DIR)(path)
    tiles._tables_of.cache_clear()


def _dry():
    global PRESETS, SWEEP_M, COMPARE_M, PERSIST_M, PERSIST_SMALL_M, BF, TILES, VLLM_H200  # this module's names
    harness.set_dry()
    PRESETS, SWEEP_M, COMPARE_M, PERSIST_M, BF = ("tiny",), (1, 16), (1, 16), (16,), torch.float32
    PERSIST_SMALL_M = ()
    TILES = {bm: [(32, 32, 4, 4, 1)] for bm in (16, 32, 64, 128)}
    VLLM_H200 = {"tiny": {1: (16, 32, 32, 1, 4, 1)}}
    torch.cuda.synchronize = lambda *a: None
    return torch.device("cpu")


if __name__ == "__main__":
    main()
