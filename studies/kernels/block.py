"""The kernels study's blocks (scripts/readme_tables.py collects `BLOCKS`): each function returns the markdown
between `<!-- begin:NAME -->` and `<!-- end:NAME -->`, written from data/kernels/ through the study's readers
(read.py, read_floors.py). The headline figures only: the lesson's launch costs (`kernels`), the base GEMM against
vLLM's tuned kernel and its roofline floor (`kernels-base`, `kernels-floors`, `kernels-base-headline`), the packed
LoRA path and LoRA's share of the layer (`kernels-packed`, `kernels-fold-headline`). The sessions'
history is in the tidy tables (data/kernels/README.md) and the findings tests (test_findings.py)."""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA, label, normalize_meta

FLOOR_NAME = {"bytes": "byte", "flops": "FLOP"}  # read_floors.gemm_floor's `bound` in a sentence
SHORT = {"qwen3-30b-a3b": "qwen3", "qwen3-30b-a3b-tp4": "qwen3-tp4"}


def kernels_block() -> str:
    d = schemas.read_csv(DATA / "kernels" / "kernels.csv", "kernel_recording")
    meta = normalize_meta(schemas.read_json(DATA / "kernels" / "kernels.meta.json"))
    k = d[d.section == "lora_gate_up"].drop_duplicates(["preset", "M"], keep="last").set_index(["preset", "M"])
    dis = d[d.section == "disabled"]
    Ms = sorted(k.loc["qwen3-30b-a3b"].index)
    head = "| M | " + " | ".join(str(m) for m in Ms) + " |"
    rows = [head, "| --- |" + " ---: |" * len(Ms)]
    q = k.loc["qwen3-30b-a3b"]
    rows.append("| qwen3-30b-a3b, ours (µs) | " + " | ".join(f"{q.loc[m, 'time_us']:.1f}" for m in Ms) + " |")
    rows.append("| share of measured copy bandwidth | "
                + " | ".join(f"{100 * q.loc[m, 'bw_frac']:.0f} %" for m in Ms) + " |")
    t = k.loc["qwen3-30b-a3b-tp4"]
    rows.append("| qwen3-30b-a3b-tp4, ours (µs) | " + " | ".join(f"{t.loc[m, 'time_us']:.1f}" for m in Ms) + " |")
    rows += ["", *_peer_lines()]
    return "\n".join([f"From `data/kernels/kernels.csv` ({label(meta)}): the gate_up LoRA delta, both slices, "
                      f"rank {meta.get('rank', 32)}, {meta.get('slots', 4)} adapters all enabled, one request per "
                      "token, top-8 of 128, bf16, timed as CUDA-graph replay.", ""] + rows + [
        "", f"- All adapters disabled, a LoRA launch costs {dis.time_us.min():.2f}–{dis.time_us.max():.2f} µs "
            f"against {dis.empty_kernel_us.min():.2f}–{dis.empty_kernel_us.max():.2f} µs for an empty Triton "
            "kernel: the persistent grid exits after one round of metadata loads."] + _decode_lines())


def _peer_lines() -> list[str]:
    """The peers' kernels: figures from elsewhere (data/kernels/peers_carried.csv, its README says whose run),
    not measured by this lab's scripts."""
    f = DATA / "kernels" / "peers_carried.csv"
    if not f.exists():
        return []
    p = schemas.read_csv(f, "kernel_peers")
    Ms = sorted(p.M.unique())
    head = "| carried, qwen3-30b-a3b (µs) | " + " | ".join(f"M={m}" for m in Ms) + " |"
    out = ["The peers, carried from another run, not this lab's scripts (`data/kernels/peers_carried.csv`: the same "
           "setting on an H200):", "",
           head, "| --- |" + " ---: |" * len(Ms)]
    names = {"vllm_fused_moe_lora": "vLLM fused MoE-LoRA, one-shot", "sglang_two_kernel": "SGLang two-kernel path"}
    for (e, op), g in p.groupby(["engine", "op"], sort=False):
        v = g.set_index("M").time_us
        out.append(f"| {names.get(e, e)}, {op} delta | " + " | ".join(f"{v[m]:g}" if m in v else "" for m in Ms) + " |")
    return out


def _decode_lines() -> list[str]:
    """The decode path (no alignment) against today's aligned path, its differential, and the fused-epilogue
    experiment, from the runs the package's recordings catalog names (recordings.load_kernel_run)."""
    from lora_moe_lab.instruments.analysers.recordings import load_kernel_run, run_name
    from lora_moe_lab.provenance import catalog
    from studies.kernels.plan_views import DECODE_MAX_PAIRS

    CANONICAL_KERNEL_RUN, FUSED_RUN = run_name(catalog("kernel_run.canonical")), run_name(catalog("kernel_run.fused"))
    run = load_kernel_run(CANONICAL_KERNEL_RUN)
    path = run.section("path")
    dd = pd.concat([d[d.section == "diff"] for d in (schemas.read_csv(f, "kernel_run", low_memory=False)
                                                     for f in catalog("kernel_run.differential"))])
    f1 = schemas.read_csv(catalog("kernel_run.fused"), "kernel_run", low_memory=False)
    fk = f1[f1.section == "fused"]
    return ["", f"- Decode path (`kernels/lora_decode.py`, M·top_k ≤ {DECODE_MAX_PAIRS} pairs: both deltas straight "
                f"from `topk_ids`, no alignment kernels; `{CANONICAL_KERNEL_RUN}`, {run.label}): "
                f"{path.ratio.min():.2f}–{path.ratio.max():.2f}× today's alignment + aligned deltas; "
                f"{int(dd.cases.sum())} random cases against float64, {int(dd.failures.sum())} failures.",
            f"- The delta fused into the base GEMM's epilogue (an experiment, not used by the layer; `{FUSED_RUN}`): "
            f"{fk.ratio.min():.2f}–{fk.ratio.max():.2f}× the base GEMM + the separate delta over {len(fk)} points."]


def kernels_base_block() -> str:
    """The base MoE GEMM (tuned tile tables) against vLLM's tuned kernel: direct and bridged ratios."""
    from studies.kernels import read as bg

    v = bg.versus_peers()  # the latest session that timed the carried run's own kernel
    Ms = sorted(v.M.unique())
    out = [f"The base GEMM (`kernels/fused_moe.py`, tuned tile tables `kernels/tile_tables/`; `{v.run.iloc[0]}`, "
           f"{bg.load_base_run(v.run.iloc[0]).label}): bf16, CUDA-graph replay, top-8 of 128. vLLM's tuned "
           "`fused_moe_kernel` is carried (`data/kernels/peers_base_carried.csv`, another run): direct = vLLM / ours; "
           "bridged = (vLLM / this lab's kernel in that run) × (that kernel / today's, paired, this run).", "",
           "| preset, GEMM | " + " | ".join(f"M={m}" for m in Ms) + " |", "| --- |" + " ---: |" * len(Ms)]
    for (pre, op), g in v.groupby(["preset", "op"], sort=False):
        g = g.set_index("M")
        out.append(f"| {SHORT.get(pre, pre)} {op}: µs | " + " | ".join(f"{g.loc[m, 'table_us']:.1f}" for m in Ms)
                   + " |")
        out.append("| direct / bridged | " + " | ".join(f"{g.loc[m, 'direct']:.2f} / {g.loc[m, 'bridged']:.2f}"
                                                      for m in Ms) + " |")
    big = v[v.M >= 1024]
    out += ["", f"- At least as fast as vLLM's by both ratios at {int(v.ge_1.sum())} of {len(v)} points; ≥ 1.15× at "
                f"{int(big.ge_1_15.sum())} of {len(big)} with M ≥ 1024."]
    return "\n".join(out)


def kernels_base_headline_block() -> str:
    from studies.kernels import read as bg

    vs = bg.peer_sessions()  # the same tables in each device session, oldest first

    def each(f):
        return " and ".join(f(v) for v in vs)
    return (f"Base MoE GEMM with tuned tile tables and TMA weight loads, {len(vs)} device sessions at today's tables: "
            "at M ≥ 1024, " + each(lambda v: f"{v[v.M >= 1024].direct.min():.2f}–{v[v.M >= 1024].direct.max():.2f}×")
            + " vLLM's tuned kernel (carried figures; bridged "
            + each(lambda v: f"{v[v.M >= 1024].bridged.min():.2f}–{v[v.M >= 1024].bridged.max():.2f}×")
            + f"), ≥ 1.0× by both ratios at {each(lambda v: str(int(v.ge_1.sum())))} of {len(vs[-1])} points, "
            f"≥ 1.15× at {each(lambda v: str(int(v[v.M >= 1024].ge_1_15.sum())))} of {int((vs[-1].M >= 1024).sum())} "
            f"with M ≥ 1024 (per point: `data/kernels/kernels_base.csv`). {_floors_clause(vs)}")


def _floors_clause(vs) -> str:
    from studies.kernels import read_floors as fl

    g = fl.goal_floors(vs[-1], fl.ceilings())
    w = g.loc[g.goal_of_floor.idxmax()]
    return (f"Against the H200's own ceilings, 1.15× vLLM at {w.preset} {w.op} M={w.M} would need "
            f"{100 * w.goal_of_floor:.1f} % of that GEMM's {FLOOR_NAME[w.bound]} floor (ours: "
            f"{100 * w.ours_of_floor:.1f} %): the table below.")


def kernels_floors_block() -> str:
    """The H200's ceilings and each base GEMM point at M >= 1024 against its roofline floor."""
    from studies.kernels import read as bg
    from studies.kernels import read_floors as fl

    c = fl.ceilings()
    g = fl.goal_floors(bg.peer_sessions()[-1], c)
    (c0, c1), (m0, m1) = c["copy_range"], c["matmul_range"]
    out = [f"Ceilings measured on the H200: device-to-device copy {c0 / 1e3:.2f}–{c1 / 1e3:.2f} TB/s, bf16 cuBLAS "
           f"product {m0:.0f}–{m1:.0f} TFLOP/s. A GEMM's floor is the larger of its bytes (the used experts' weights, "
           "its input and output, once each) over the copy ceiling and its FLOPs over the matmul ceiling; `of floor` = "
           "floor / time. `goal` = what a kernel 1.15× faster than vLLM's would need:", "",
           "| preset | GEMM | M | bound | ours, of floor | vLLM, of floor | goal, of floor |",
           "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for r in g.itertuples():
        out.append(f"| {SHORT.get(r.preset, r.preset)} | {r.op} | {r.M} | {r.bound} | "
                   f"{r.ours_of_floor:.2f} | {r.vllm_of_floor:.2f} | {r.goal_of_floor:.2f} |")
    hard = g[g.goal_of_floor >= 0.95]
    out += ["", f"- The goal needs ≥ 95 % of the floor at {len(hard)} of {len(g)} points"
            + (" (" + ", ".join(f"{SHORT.get(r.preset, r.preset)} {r.op} M={r.M}" for r in hard.itertuples()) + ")"
               if len(hard) else "") + ": the copy engine's own reach, beyond any tile table."]
    return "\n".join(out)


def kernels_packed_block() -> str:
    """LoRA's share of one MoE layer at the committed tables (separate deltas, as committed, all disabled) beside its
    floor and the goals (read.committed_layer, read_floors.share_floors)."""
    from studies.kernels import read as bg
    from studies.kernels import read_floors as fl

    cl, chk = bg.committed_layer(), bg.packed_check()
    sf = fl.share_floors().groupby(["preset", "M"]).mean(numeric_only=True)
    cl = cl[cl.M >= 1024]
    out = ["LoRA packed into the base GEMM (`kernels/fused_moe_lora_packed.py`: a shrink kernel writes each pair's "
           "rank-R result in its slot's columns, the base GEMM adds them as extra K iterations; "
           f"{int(chk.cases.sum())} random cases against float64 on the H200, {int(chk.failures.sum())} failures). "
           "LoRA's share of one MoE layer (CUDA-graph replay, 4 adapters of rank 32, every token on one; % of the "
           f"base layer, paired, 95 %; `{cl.session.iloc[-1]}`). `floor`: the least LoRA can add with the deltas "
           "folded, each kernel at the larger of its bytes over the copy ceiling and its FLOPs over the matmul "
           "ceiling; `goal / floor` above 1: no kernel meets the goal:", "",
           "| preset | M | separate deltas | as committed | all disabled | floor | goal | goal / floor |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in cl.itertuples():
        f = sf.loc[(r.preset, r.M)]
        out.append(f"| {SHORT.get(r.preset, r.preset)} | {r.M} | {r.separate:.1f} | {r.all:.1f} [{r.all_lo:.1f}, "
                   f"{r.all_hi:.1f}] | {r.none:.1f} | {f.floor_share_pct:.1f} | {f.goal_pct:.0f} | "
                   f"{f.goal_of_floor:.2f} |")
    return "\n".join(out)


def kernels_fold_headline_block() -> str:
    from studies.kernels import read as bg

    cl = bg.committed_layer()
    big = cl[cl.M >= 1024]
    return ("LoRA packed into the base GEMM, at the committed tables: LoRA's share of the layer at M ≥ 1024 is "
            + ", ".join(f"{p_} {g.all_lo.min():.1f}–{g.all_hi.max():.1f} % (separate deltas "
                        f"{g.separate_lo.min():.1f}–{g.separate_hi.max():.1f} %)"
                        for p_, g in big.groupby("preset", sort=False))
            + ", still above the goals of 12 % and 20 % (the table of the plan section). " + _share_floor_clause())


def _share_floor_clause() -> str:
    """The share goals against LoRA's floor and against a leaner base layer (read_floors.lean_base_shares)."""
    from studies.kernels import read_floors as fl

    s, lb = fl.share_floors(), fl.lean_base_shares()
    at = s[s.M == 1024]
    return ("At M = 1024 the goals ask for " + f"{at.goal_of_floor.min():.2f}–{at.goal_of_floor.max():.2f}× "
            "LoRA's floor, the least time its adapters' bytes and FLOPs take: out of any kernel's reach. With the "
            "base layer's torch parts (an fp32 router, SiLU and mul, the top-k sum) at their floors the same LoRA time "
            "is " + ", ".join(f"{g.lean_share_pct.min():.1f}–{g.lean_share_pct.max():.1f} % ({p_})"
                              for p_, g in lb.groupby("preset", sort=False)) + " of the layer.")


BLOCKS = {"kernels": kernels_block, "kernels-base": kernels_base_block,
          "kernels-base-headline": kernels_base_headline_block, "kernels-floors": kernels_floors_block,
          "kernels-packed": kernels_packed_block, "kernels-fold-headline": kernels_fold_headline_block,
          "kernels-share": _share_floor_clause}
