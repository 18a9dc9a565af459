"""Floors and ceilings: what the hardware allows a kernel, and what a speed goal demands of it.

    c = ceilings()                 # the H200's copy bandwidth and bf16 matmul rate, measured in device sessions
    goal_floors(versus_peers(), c) # the base GEMM per point: its floor, ours and vLLM's share of it, and the
                                   # share of the floor a goal of 1.15x vLLM would demand
    down_candidates()              # the down delta's tiles of `--candidates down` against the table's, per session
    down_balance()                 # round 2: the split and wide tiles, paired against the table, per session
    down_counters()                # the same tiles counted by ncu (one launch each): DRAM, occupancy, stalls
    occupancy_test()               # per (preset, M): the table beside BLOCK_N 64 at 3 and at 2 programs per SM
    share_floors()                 # LoRA's share of the layer: its floor with the deltas folded, beside the goal and
                                   # the committed tables' share, per session, preset and M
    layer_parts()                  # the layer's kernels grouped into parts, without and with the adapters (profiled)
    lean_base_shares()             # LoRA's share against a base layer whose torch parts (router, SiLU-and-mul, top-k
                                   # sum) ran at their floors, as an engine's fused kernels come near

A kernel cannot beat the larger of two times: the fewest bytes it must move over the measured copy bandwidth,
and the arithmetic it must do over the measured matrix rate. `of_floor` = floor / time is the fraction of the
hardware's reach a kernel takes (1.0 = at the roofline). A goal whose `goal_of_floor` nears or passes 1.0 asks
for more than the machine does with its own copy engine and cuBLAS, and is not met by tuning. The ceilings are
recorded by `studies/kernels/record_expand.py` (`harness.copy_bandwidth`, `harness.matmul_rate`) in the meta of
each run that has them; the most generous (highest) of the sessions is used, so every demand is a lower bound.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from lora_moe_lab.config import get_shape

from . import tidy
from .read import COMMITTED_LAYER

BF16_BYTES = 2
# the recordings whose meta holds both ceilings (this session's `down` sweep and the 1000-case differential, two
# invocations on one machine) and the down sweep's sessions
CEILING_RUNS = ("down_s1", "delta_random_s2", "down_s2")
DOWN_SESSIONS = ("down_s1", "down_s2")
DOWN_NCU_RUN = "down_s2"  # studies/kernels/record_expand.py --ncu-run under ncu, in the down_s2 device call
# round 2 (`--sections down_paired --candidates balance`, two fresh machines): the load-balance hypothesis (SPLIT_N 2,
# 4) and BLOCK_N 256 at BLOCK_M 16, paired against the table; down_s3 also ran --ncu-run with the SMs' active cycles
BALANCE_SESSIONS = ("down_s3", "down_s4")
BALANCE_NCU_RUN = "down_s3"


def ceilings(names=CEILING_RUNS, path: str | Path | None = None) -> dict:
    """{copy_gbps, matmul_tflops}: the highest of the named runs' measurements, and `runs`, `copy_range`,
    `matmul_range` (each run's figure) for the spread between them."""
    metas = []
    for n in names:
        f = tidy._dir(path) / "kernels_expand.meta.json"
        if n not in tidy.section_meta("kernels_expand", path)["sessions"]:
            raise FileNotFoundError(f"no ceilings of {n!r} in {f}: record them with studies/kernels/record_expand.py")
        m = tidy.meta("kernels_expand", n, path)
        if "matmul_tflops" not in m:
            raise ValueError(f"{n} ({f}) has no matmul_tflops: it predates harness.matmul_rate")
        metas.append(m)
    copy, mm = [m["copy_gbps"] for m in metas], [m["matmul_tflops"] for m in metas]
    return dict(copy_gbps=max(copy), matmul_tflops=max(mm), runs=list(names), copy_range=(min(copy), max(copy)),
                matmul_range=(min(mm), max(mm)))


def experts_hit(M: int, E: int, k: int) -> float:
    """Expected distinct experts among M tokens routing to k of E each, uniformly: E (1 - (1 - k/E)^M)."""
    return E * (1.0 - (1.0 - k / E) ** M)


def gemm_floor(preset: str, op: str, M: int, c: dict) -> dict:
    """The base MoE GEMM's floor at M tokens: bytes = the hit experts' weights once + its input once + its output
    once (gate_up reads x (M, K); down reads the (M*k, I) activations and writes (M*k, K)); flops = 2 M k N K."""
    if op not in ("gate_up", "down"):
        raise ValueError(f"op must be 'gate_up' or 'down', got {op!r}")
    sh = get_shape(preset)
    E, k, H, I = sh.num_experts, sh.top_k, sh.hidden, sh.intermediate
    N, K = (2 * I, H) if op == "gate_up" else (H, I)
    pairs = M * k
    nbytes = BF16_BYTES * (experts_hit(M, E, k) * N * K + (M if op == "gate_up" else pairs) * K + pairs * N)
    flops = 2.0 * pairs * N * K
    t_bytes, t_flops = nbytes / (c["copy_gbps"] * 1e3), flops / (c["matmul_tflops"] * 1e6)  # µs
    return dict(bytes=nbytes, flops=flops, bytes_us=t_bytes, flops_us=t_flops, floor_us=max(t_bytes, t_flops),
                bound="bytes" if t_bytes >= t_flops else "flops")


def goal_floors(peers: pd.DataFrame, c: dict, goal: float = 1.15, min_m: int = 1024) -> pd.DataFrame:
    """Per point of `peers` (base_gemm.versus_peers) with M >= min_m: the floor, the table's kernel and vLLM's as
    fractions of it, and `goal_of_floor`: the fraction a kernel `goal` times faster than vLLM would need."""
    rows = []
    for r in peers[peers.M >= min_m].itertuples():
        f = gemm_floor(r.preset, r.op, int(r.M), c)
        goal_us = r.vllm_us / goal
        fl = f["floor_us"]
        rows.append(dict(preset=r.preset, op=r.op, M=int(r.M), run=r.run, bound=f["bound"], floor_us=fl,
                         table_us=r.table_us, vllm_us=r.vllm_us, goal_us=goal_us, ours_of_floor=fl / r.table_us,
                         vllm_of_floor=fl / r.vllm_us, goal_of_floor=fl / goal_us, direct=r.direct))
    return pd.DataFrame(rows)


def down_candidates(names=DOWN_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The down delta in each `--candidates down` session: per (preset, M, config) its sweep time, share of the
    copy bandwidth, registers, grid, and `over_table` (time over the table's tile in the same session; sweep
    medians of graph replays, not paired)."""
    out = []
    for n in names:
        s = tidy.rows("kernels_expand", n, path)
        s = s[(s.section == "sweep") & (s.op == "down")].copy()
        s["session"] = n
        table = s[s.table.astype(bool)].set_index(["preset", "M"]).time_us
        s["over_table"] = [t / table[(p, m)] for p, m, t in zip(s.preset, s.M, s.time_us)]
        out.append(s[["session", "preset", "M", "config", "table", "time_us", "bw_frac", "regs", "grid", "shared",
                      "over_table"]])
    return pd.concat(out, ignore_index=True)


def down_balance(names=BALANCE_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """The down delta's `down_paired` rows in each session: per (preset, M, config) the median time, its share of the
    copy bandwidth and its paired ratio to the table's tile with the percentile bootstrap 95 % interval."""
    out = []
    for n in names:
        s = tidy.rows("kernels_expand", n, path)
        s = s[s.section == "down_paired"].copy()
        s["session"] = n
        out.append(s[["session", "preset", "M", "config", "table", "time_us", "bw_frac", "over_table", "over_table_lo",
                      "over_table_hi", "stable", "grid", "regs"]])
    return pd.concat(out, ignore_index=True)


def down_counters(name: str = DOWN_NCU_RUN, path: str | Path | None = None) -> pd.DataFrame:
    """ncu's counters of the down delta's table tile and `down` candidates (one launch each, `<name>_kernels_expand_
    ncu.csv`, parsed by studies/kernels/record_base.py --ncu-parse): duration under ncu (not a timing), DRAM % of peak,
    bytes over the byte floor, achieved occupancy, L2 hit rate, registers, the top stall and its cycles per issue."""
    if not tidy.has("kernels_expand", name, path, ncu=True):
        raise FileNotFoundError(f"no counters of {name!r} in data/kernels/kernels_expand_ncu.csv: "
                                "studies/kernels/record_expand.py --ncu-run under ncu")
    c = tidy.rows("kernels_expand", name, path, ncu=True)
    return c[["preset", "M", "arm", "tile", "duration_us", "dram_pct_peak", "dram_bytes_over_floor",
              "achieved_occupancy_pct", "l2_hit_pct", "registers", "top_stall", "top_stall_ratio"]
             + [c_ for c_ in ("sm_busy_avg_over_max",) if c_ in c]]


# the builds of the occupancy hypothesis, by their tile strings: BLOCK_N 64 with 3 stages (3 programs per SM at
# BLOCK_M 64) and with 4 stages (2 programs per SM, as the table)
NARROW, NARROW_DEEP = ("/bn64/bk64/", "/pps4/xs3"), ("/bn64/bk64/", "/pps4/xs4")


def occupancy_test(c: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (preset, M) of `down_counters`: the table's counters (`_table`), BLOCK_N 64 at 3 programs per SM
    (`_narrow`) and BLOCK_N 64 with 4 stages (`_deep`), side by side: what the occupancy hypothesis predicts and
    what the counters saw."""
    c = down_counters() if c is None else c
    cols = ["achieved_occupancy_pct", "dram_pct_peak", "dram_bytes_over_floor", "top_stall", "top_stall_ratio"]

    def pick(mask, tag):
        return c[mask].set_index(["preset", "M"])[cols].add_suffix(f"_{tag}")
    tile = c.tile.astype(str)
    return pd.concat([pick(c.arm == "table", "table"),
                      pick(tile.str.contains(NARROW[0]) & tile.str.endswith(NARROW[1]), "narrow"),
                      pick(tile.str.contains(NARROW_DEEP[0]) & tile.str.endswith(NARROW_DEEP[1]), "deep")],
                     axis=1).reset_index()


# the goals for LoRA's share of the layer at M >= 1024, in % of the base layer's time
SHARE_GOALS = {"qwen3-30b-a3b": 12.0, "qwen3-30b-a3b-tp4": 20.0}


def _roof_us(nbytes: float, flops: float, c: dict) -> float:
    return max(nbytes / (c["copy_gbps"] * 1e3), flops / (c["matmul_tflops"] * 1e6))


def lora_floor(preset: str, M: int, c: dict, rank: int, slots: int) -> dict:
    """The least time LoRA can add to one MoE layer with the deltas folded as the goal asks: each shrink its own
    kernel (the used adapter-experts' A once, its input once, u written once), each expand extra K steps of the
    base GEMM (the used B once, u read once, its FLOPs on top of the GEMM's). The tokens spread evenly over `slots`
    adapters, as in the layer section (token i uses adapter i % slots). `weights_us`: the used A and B alone at the
    copy bandwidth, the part no kernel design avoids; `added_us`: the sum over the four kernels, each at the larger
    of its bytes and FLOPs (a folded GEMM counts what it adds to its own roofline, so LoRA's bytes hide under a
    FLOP-bound GEMM and its FLOPs under a byte-bound one)."""
    if M < 1 or rank < 1 or slots < 1:
        raise ValueError(f"M, rank and slots must be positive, got M={M}, rank={rank}, slots={slots}")
    sh = get_shape(preset)
    E, k, H, I, R = sh.num_experts, sh.top_k, sh.hidden, sh.intermediate, rank
    pairs, used = M * k, slots * experts_hit(-(-M // slots), E, k)  # adapter-experts with at least one pair
    parts, weights = {}, 0.0
    # op: (slices, the shrink's input elements, its K, the GEMM's N)
    for op, (sl, inp, K, N) in {"gate_up": (2, M * H, H, 2 * I), "down": (1, pairs * I, I, H)}.items():
        a, b, u = used * sl * R * K * BF16_BYTES, used * N * R * BF16_BYTES, pairs * sl * R * BF16_BYTES
        weights += a + b
        parts[f"{op}_shrink_us"] = _roof_us(a + inp * BF16_BYTES + u, 2.0 * pairs * K * sl * R, c)
        g = gemm_floor(preset, op, M, c)
        parts[f"{op}_expand_us"] = _roof_us(g["bytes"] + b + u, g["flops"] + 2.0 * pairs * R * N, c) - g["floor_us"]
    return dict(parts, weights_us=weights / (c["copy_gbps"] * 1e3), added_us=sum(parts.values()))


def share_floors(runs: tuple[tuple[str, str], ...] = COMMITTED_LAYER, c: dict | None = None,
                 path: str | Path | None = None) -> pd.DataFrame:
    """Per layer session, preset and M: the base layer (µs, median), LoRA's measured share at the committed tables
    (`share_pct`, paired, bootstrap 95 % `_lo`/`_hi`) and the time it adds (`added_us`, medians), its floor
    (`lora_floor`) as a share of the same base (`floor_share_pct`, `weights_share_pct`), the goal (`goal_pct`, from
    M >= 1024) and `goal_of_floor` = floor / the time the goal allows: above 1.0 the goal asks for less than the
    adapters' own bytes and FLOPs take at the machine's ceilings, and no kernel meets it. `added_over_floor` is how
    far the committed kernels are from their floor."""
    c = ceilings() if c is None else c
    rows = []
    for name, arm in runs:
        if not tidy.has("kernels_fold", name, path):
            raise FileNotFoundError(f"no layer session {name!r} in data/kernels/kernels_fold.csv: "
                                    "studies/kernels/record_fold.py --sections layer")
        p = tidy.meta("kernels_fold", name, path)["params"]
        t = tidy.rows("kernels_fold", name, path)
        for r in t[t.section == "layer"].itertuples():
            fl = lora_floor(r.preset, int(r.M), c, int(p["rank"]), int(p["slots"]))
            goal = SHARE_GOALS.get(r.preset) if r.M >= 1024 else None
            base, added, floor = float(r.base_us), float(getattr(r, f"{arm}_all_us")) - float(r.base_us), fl["added_us"]
            rows.append(dict(session=name, preset=r.preset, M=int(r.M), base_us=base,
                             **{f"share_pct{x}": float(getattr(r, f"{arm}_all_share_pct{x}"))
                                for x in ("", "_lo", "_hi")},
                             added_us=added, floor_us=floor, floor_share_pct=100 * floor / base,
                             weights_share_pct=100 * fl["weights_us"] / base, goal_pct=goal,
                             goal_of_floor=None if goal is None else floor / (goal / 100 * base),
                             added_over_floor=added / floor,
                             **{n: v for n, v in fl.items() if n.endswith(("_shrink_us", "_expand_us"))}))
    return pd.DataFrame(rows)


# studies/kernels/record_parts.py's sessions, two machines. parts_s1 summed each kernel name's launches, so its base
# GEMMs are one part (`GEMMs`); parts_s2 keeps each launch's place: the base GEMM's gate_up, then its down.
PARTS_SESSIONS = ("parts_s1", "parts_s2")
BUSY, SPAN = "<busy>", "<span>"


def part_of(name: str, occurrence: float | None = None) -> str:
    """The layer part a kernel of the profiled layer belongs to, by its name (Triton's function names, torch's and
    cuBLAS's kernel templates)."""
    if name in (BUSY, SPAN):
        return name
    if name == "fused_moe_kernel":
        return {0: "GEMM gate_up", 1: "GEMM down"}.get(occurrence, "GEMMs")
    named = {"fused_moe_lora_kernel": "LoRA separate delta", "packed_shrink_kernel": "LoRA shrink",
             "_slot_order_kernel": "LoRA slot order",
             # the production-like base layer (kernels/router.py, activation.py, moe_sum.py): one kernel each
             "router_kernel": "router", "silu_and_mul_kernel": "SiLU and mul", "moe_sum_kernel": "top-k sum"}
    if name in named:
        return named[name]
    if name.startswith("_align"):
        return "alignment"
    if "silu_kernel" in name or ("MulFunctor" in name and "BFloat16" in name):
        return "SiLU and mul (torch)"
    if "reduce_kernel" in name and "BFloat16" in name:
        return "top-k sum (torch)"
    if ("xmma_gemm_f32" in name or "softmax_warp_forward" in name or "gatherTopK" in name or "bitonicSort" in name
            or "DivFunctor" in name or "reduce_kernel" in name or ("direct_copy" in name and "(float)" in name)):
        return "router (fp32, torch)"
    return "other"


def layer_parts(names=PARTS_SESSIONS, path: str | Path | None = None) -> pd.DataFrame:
    """Per session, preset, M and part (`part_of`): the GPU µs per forward of the layer without adapters (`base_us`)
    and with every token on one (`lora_us`, the committed tables), and `added_us`. The rows `<busy>` (every kernel's
    time summed) and `<span>` (first start to last end) are the totals. Profiled, so attributions: set them beside
    the layer section's live paired figures, not in their place."""
    out = []
    for n in names:
        if not tidy.has("kernels_parts", n, path):
            raise FileNotFoundError(f"no layer parts of {n!r} in data/kernels/kernels_parts.csv: record them with "
                                    "studies/kernels/record_parts.py")
        t = tidy.rows("kernels_parts", n, path)
        occ = t["occurrence"] if "occurrence" in t else pd.Series([None] * len(t))
        t["part"] = [part_of(k, None if o is None or pd.isna(o) else int(o)) for k, o in zip(t.kernel, occ)]
        g = t.groupby(["preset", "M", "part", "arm"]).us.sum().unstack("arm").fillna(0.0).reset_index()
        g = g.rename(columns={"base": "base_us", "picked_all": "lora_us"})
        g["added_us"] = g.lora_us - g.base_us
        g.insert(0, "session", n)
        out.append(g[["session", "preset", "M", "part", "base_us", "lora_us", "added_us"]])
    return pd.concat(out, ignore_index=True)


TORCH_PARTS = ("router (fp32, torch)", "SiLU and mul (torch)", "top-k sum (torch)")


def torch_part_floors(preset: str, M: int, c: dict) -> dict:
    """The floors of the base layer's parts the lab runs as torch ops: the router (a bf16 product of x and the
    router's weights on tensor cores, float logits out), SiLU-and-mul as one kernel (read the (pairs, 2I) product,
    write (pairs, I)), and the sum over top_k (read the (pairs, H) down output, write (M, H))."""
    sh = get_shape(preset)
    H, I, E, k = sh.hidden, sh.intermediate, sh.num_experts, sh.top_k
    P = M * k
    return {"router (fp32, torch)": _roof_us(BF16_BYTES * (M * H + E * H) + 4 * M * E, 2.0 * M * H * E, c),
            "SiLU and mul (torch)": _roof_us(BF16_BYTES * (P * 2 * I + P * I), 0.0, c),
            "top-k sum (torch)": _roof_us(BF16_BYTES * (P * H + M * H), 0.0, c)}


def lean_base_shares(parts: pd.DataFrame | None = None, shares: pd.DataFrame | None = None, session: str | None = None,
                     c: dict | None = None) -> pd.DataFrame:
    """Per preset and M: the live base layer and LoRA's added time (share_floors, the sessions' means), the time its
    torch parts took (layer_parts, one profiled session: the last of PARTS_SESSIONS), their floors
    (`torch_part_floors`), and LoRA's share against the base with those parts at their floors (`lean_share_pct`): the
    share an engine's base layer would show at best, since its fused kernels cannot beat the floors. A bound
    computed from measured parts, not a measurement of such a layer."""
    parts = layer_parts() if parts is None else parts
    shares = share_floors() if shares is None else shares
    session = session or parts.session.iloc[-1]
    c = ceilings() if c is None else c
    p = parts[parts.session == session]
    live = shares.groupby(["preset", "M"])[["base_us", "added_us", "share_pct"]].mean()
    rows = []
    for (preset, M), g in p.groupby(["preset", "M"]):
        if (preset, M) not in live.index:
            continue
        g, fl = g.set_index("part"), torch_part_floors(preset, int(M), c)
        took = sum(float(g.base_us.get(n, 0.0)) for n in TORCH_PARTS)
        lv = live.loc[(preset, M)]
        lean = lv.base_us - took + sum(fl.values())
        rows.append(dict(preset=preset, M=int(M), session=session, base_us=lv.base_us, added_us=lv.added_us,
                         share_pct=lv.share_pct, gemm_pct=100 * g.base_us[g.index.str.startswith("GEMM")].sum()
                         / g.base_us["<busy>"], torch_parts_us=took, torch_parts_pct=100 * took / g.base_us["<busy>"],
                         torch_floors_us=sum(fl.values()), lean_base_us=lean, lean_share_pct=100 * lv.added_us / lean))
    return pd.DataFrame(rows)
