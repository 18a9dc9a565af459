"""Regenerate the figures of README.md and docs/results.md from data/: every number sits between a
pair of markers `<!-- begin:NAME -->` ... `<!-- end:NAME -->` and is written here from a recording.

    python scripts/readme_tables.py           # rewrite the blocks in both files
    python scripts/readme_tables.py --check   # exit 1 if a file is not what data/ says (a test runs this)

A block whose generator is not written yet, or whose data folder is absent (BLOCK_DATA), gets a
note saying so instead of figures; the run does not fail.

Blocks: guards (the canonical guards recording), traces (the recorded profiler traces), kernels
(the kernel recording), production (the decoder's chunked prefill under TP, when recorded),
simulator (the fitted queue model and its production extrapolation).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.analysers.recordings import load_guards
from lora_moe_lab.provenance import DATA, label, normalize_meta

ROOT = Path(__file__).resolve().parents[1]

README = ROOT / "README.md"
FILES = (README, ROOT / "docs" / "results.md")
BLOCK_DATA = {"tp4": "tp_emulation", "tp4-headline": "tp_emulation"}  # block -> the data folder it reads


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f}"


def _guards_ci(e: float, lo: float, hi: float, nd: int = 0, unit: str = "") -> str:
    """'125 [-34, 266]' (or '1.17x [0.98, 1.30]'); an unstable point says so instead of a number."""
    if e != e:  # NaN: an unstable point, not averaged
        return "unstable, not averaged"
    f = f"{{:.{nd}f}}{unit}"
    return f"{f.format(e)} [{f.format(lo)}, {f.format(hi)}]"


def _guards_where(r) -> str:
    return f"{r.preset} M = {int(r.tokens)}" + (", half active" if r.active else "")


def _guards_card(meta: dict) -> str:
    """The card as the session found and left it: driver, SM / memory clocks, power (provenance.gpu_state)."""
    bits = [f"driver {meta['driver']}"] if meta.get("driver") else []
    for when, st in (("at the start", meta.get("gpu_state") or {}), ("at the end", meta.get("gpu_state_end") or {})):
        if "clocks_sm" in st:
            bits.append(f"SM clock {st['clocks_sm']:.0f} MHz (max {st.get('clocks_max_sm', float('nan')):.0f}), memory "
                        f"{st.get('clocks_mem', float('nan')):.0f} MHz, power "
                        f"{st.get('power_draw', float('nan')):.0f} of "
                        f"{st.get('power_limit', float('nan')):.0f} W {when}")
    if meta.get("dirty") is not None:
        bits.append("dirty tree" if meta["dirty"] else "clean tree")
    return ", ".join(bits) or "card state not recorded"


def _guards_protocol(rec) -> str:
    """How each session timed a point (its recorded parameters) and the card it found."""
    cards = "; ".join(f"`{x}`: {_guards_card(m)}" for x, m in rec.session_meta.items())
    how = {}
    for x, m in rec.session_meta.items():
        q = m.get("params", {})
        if "max_reps" in q:
            how.setdefault(f"{q['warmup']} untimed warm-up rounds of every arm and at least {q['warmup_s']:g} s of "
                           f"them, "
                           f"then {q['reps']} timed repetitions, up to {q['max_reps']} while an arm had not settled",
                           []).append(f"`{x}`")
    if len(how) == 1:
        proto = f"Per point, {next(iter(how))}"
    else:
        proto = "Per point, " + "; ".join(f"{', '.join(v)}: {k}" for k, v in how.items())
    return f"{proto}. The card: {cards}." if how else f"The card: {cards}."


def guards_block(folder: Path | None = None) -> str:
    """The guard end to end, from data/guards/: the two sessions pooled (their spread beside the
    within-session interval), one session (the second pending), or, while none is recorded, the
    archived recording of 2026-11-30, which predates the warm-up check."""
    from lora_moe_lab.instruments.analysers.recordings import GUARDS_DIR, session_files
    from lora_moe_lab.instruments.analysers.stats import MIN_PAIRED_REPS

    folder = Path(folder) if folder is not None else GUARDS_DIR
    rec = load_guards(folder)
    sessions = rec.sessions if session_files(folder) else []
    rel = lambda p: p.relative_to(ROOT).as_posix() if ROOT in p.parents else p.name  # noqa: E731
    s = rec.summary().set_index(["preset", "tokens", "active", "variant"])["median_us"]
    p = rec.paired("sync", "cpu_flag")
    per = rec.paired("sync", "cpu_flag", by_session=True).set_index(["session", "preset", "tokens", "active"])
    layers, requests = int(p.layers.iloc[0]), rec.meta.get("params", {}).get("requests", 8)
    files = ", ".join(f"`{rel(f)}`" for f in rec.paths)
    if not sessions:
        head = (f"From the archived guards recording {files} ({rec.label}), recorded before the warm-up check: "
                f"{int(p.n.min())} interleaved repetitions per point after 3 untimed calls per guard, every repetition "
                "used as recorded. **The two sessions of the new protocol are pending** (`studies/guards/record.py "
                "--session s1` and `--session s2`, on separate device sessions).")
    else:
        n_s = "one session; the second is pending" if len(sessions) == 1 else f"{len(sessions)} device sessions"
        head = f"From the canonical guards recording, {n_s}: {files} ({rec.label}). " + _guards_protocol(rec)
    lines = [head + f" {layers} distinct MoE layers, bf16, Triton backend, {requests} requests; the table: no "
             "adapter active. Each repetition runs the three guards and a CUDA-graph replay back to back, in a "
             "rotating order, each from an idle GPU. Times are medians of the kept repetitions; `sync / cpu_flag` is "
             "the ratio of the medians and the lost time per sync the median of the paired per-repetition difference "
             f"`sync − cpu_flag` over the {int(p.syncs.max())} syncs, both with a **paired bootstrap, 95 %** interval "
             f"(10,000 resamples of the n kept repetitions)"
             + (", and across the sessions the reader's figure: the mean of the two with the union of their "
                "intervals, the wider, honest range (`stats.between_sessions`)." if len(sessions) > 1 else "."), ""]
    two = len(sessions) > 1
    if two:
        cols = (["n kept (" + " / ".join(sessions) + ")", "sync (ms)", "cpu_flag (ms)",
                 "sync / cpu_flag, take [between sessions]"]
                + [f"lost per sync (µs), {x} [95 %]" for x in sessions]
                + ["**lost per sync (µs), take** [between sessions]", "launch_always (ms)", "graph replay (ms)"])
    else:
        cols = ["n kept", "sync (ms)", "cpu_flag (ms)", "sync / cpu_flag [paired bootstrap, 95 %]",
                "lost per sync (µs) [paired bootstrap, 95 %]", "launch_always (ms)", "graph replay (ms)"]
    lines += ["| preset | M (tokens) | " + " | ".join(cols) + " |", "| --- | ---: |" + " ---: |" * len(cols)]
    ms = lambda k, v: "" if (k + (v,)) not in s.index or s[k + (v,)] != s[k + (v,)] else _ms(s[k + (v,)])  # noqa: E731
    for r in p[p.active == 0].itertuples():
        k = (r.preset, r.tokens, r.active)
        ratio = _guards_ci(r.ratio, r.ratio_lo95, r.ratio_hi95, 2).replace(" [", "x [", 1)
        take = _guards_ci(r.us_per_sync, r.us_per_sync_lo95, r.us_per_sync_hi95)
        if two:
            n = " / ".join(str(int(per.loc[(x,) + k, "n"])) if (x,) + k in per.index else "–" for x in sessions)
            sess = [_guards_ci(*per.loc[(x,) + k, ["us_per_sync", "us_per_sync_lo95", "us_per_sync_hi95"]])
                    if (x,) + k in per.index else "–" for x in sessions]
            if r.stable and r.sessions < len(sessions):
                take += f" ({r.session} only)"
            elif r.stable and not r.agree:
                take += " †"
            cells = [n, ms(k, "sync"), ms(k, "cpu_flag"), ratio] + sess + [f"**{take}**"]
        else:
            cells = [str(int(r.n)) if r.stable else "0", ms(k, "sync"), ms(k, "cpu_flag"), ratio, take]
        lines.append(f"| {r.preset} | {r.tokens} | " + " | ".join(cells) + f" | {ms(k, 'launch_always')} | "
                                                                           f"{ms(k, 'graph')} |")
    ok = p[p.stable]
    half, big = ok[ok.active > 0], ok[(ok.active == 0) & (ok.tokens >= 1024)]
    small = ok[(ok.active == 0) & (ok.tokens == p.tokens.min())]
    notes = [""]
    if two:
        dis = p[p.stable & (p.sessions > 1) & ~(p.agree & p.agree_ratio)]
        notes.append(f"- † Between the sessions: {int((p.stable & (p.sessions > 1) & p.agree & p.agree_ratio).sum())} "
                     f"of "
                     f"{int((p.stable & (p.sessions > 1)).sum())} points agree within their intervals on both "
                     "`sync / cpu_flag` and the lost time per sync"
                     + ("." if dis.empty else "; they disagree at " + "; ".join(
                         f"{_guards_where(r)} (lost per sync "
                         + ", ".join(f"{x} {per.loc[(x, r.preset, r.tokens, r.active), 'us_per_sync']:.0f}"
                                     for x in sessions) + " µs)" for r in dis.itertuples())
                        + ": there the take spans both sessions' intervals."))
    if len(big):
        top = big.loc[big.us_per_sync.idxmax()]
        above = "every interval lies above zero" if (big.us_per_sync_lo95 > 0).all() else \
            f"{int((big.us_per_sync_lo95 > 0).sum())} of {len(big)} intervals lie above zero"
        notes.append(f"- From M = 1024 up, {above}: {big.us_per_sync.min():.0f}–{big.us_per_sync.max():.0f} µs lost "
                     f"per sync, most at M = {int(top.tokens)} ({top.preset}, {top.ratio:.2f}x).")
    if len(small):
        m0 = int(small.tokens.iloc[0])
        g16 = {r.preset: s[(r.preset, r.tokens, 0.0, "cpu_flag")] / s[(r.preset, r.tokens, 0.0, "graph")]
               for r in small.itertuples() if (r.preset, r.tokens, 0.0, "graph") in s.index}
        gone = p[(p.active == 0) & (p.tokens == m0) & ~p.stable]
        notes.append(f"- At M = {m0} the eager forward is host-bound: "
                     + ", ".join([f"{r.preset} {_guards_ci(r.us_per_sync, r.us_per_sync_lo95, r.us_per_sync_hi95)} µs"
                                  for r in small.itertuples()] + [f"{r.preset} unstable" for r in gone.itertuples()])
                     + (". A graph replay removes the host from the critical path: "
                        + ", ".join(f"{v:.1f}x faster than eager `cpu_flag` ({k})" for k, v in g16.items())
                        if g16 else "") + ".")
        notes.append(f"- `launch_always` in eager mode at M = {m0}, no adapter active: "
                     + ", ".join(f"{_ms(s[(r.preset, r.tokens, 0.0, 'launch_always')])} ms against "
                                 f"{_ms(s[(r.preset, r.tokens, 0.0, 'cpu_flag')])} ms for `cpu_flag` ({r.preset})"
                                 for r in small.itertuples()) + ".")
    if len(half):
        notes.append(f"- With half the requests active, `sync / cpu_flag` is "
                     f"{half.ratio.min():.2f}x–{half.ratio.max():.2f}x.")
    notes += _guards_warmup_lines(rec, folder, bool(sessions), MIN_PAIRED_REPS)
    return "\n".join(lines + notes)


def _guards_warmup_lines(rec, folder: Path, checked: bool, min_reps: int) -> list[str]:
    """The warm-up drops and the unstable points, per session; for the archived recording what the
    check would have said (its figures above are as recorded)."""
    from lora_moe_lab.instruments.analysers.recordings import load_guards as _load

    w = rec.warmup() if checked else _load(rec.paths[0], check_warmup=True).warmup()
    lab = (lambda r: f"{r.session}: " if checked and rec.sessions[1:] else "")  # noqa: E731
    drops = "; ".join(f"{lab(r)}{_guards_where(r)}, first {r.dropped} of {r.reps}"
                      for r in w[w.dropped > 0].itertuples())
    unst = "; ".join(f"{lab(r)}{_guards_where(r)} ({r.reps} repetitions)"
                     for r in w[w.status == "unstable"].itertuples())
    if not checked:
        return [f"- The warm-up check (`stats.drop_warmup`, at least {min_reps} stable repetitions), applied to this "
                "recording afterwards, would drop leading drift at " + (drops or "no point")
                + " and finds " + (f"these points unstable: {unst}" if unst else "no point unstable")
                + ". The figures above use every repetition as recorded."]
    return ["- Warm-up drift dropped (the same leading repetitions from every arm; the rows stay in the file): "
            + (drops or "none") + ".",
            "- Unstable, not averaged (an arm never settled within the repetitions allowed): " + (unst or "none") + "."]


def traces_block() -> str:
    d = pd.read_csv(DATA / "traces" / "traces_summary.csv")
    meta = normalize_meta(json.loads((DATA / "traces" / "traces_summary.meta.json").read_text()))
    e = d[d["mode"] == "eager"].set_index(["guard", "M"])  # the columns are per forward already
    g = d[d["mode"] == "graph"].set_index(["guard", "M"])
    per = e["n_syncs"]
    tmeta = DATA / "traces" / "qwen3-30b-a3b_sync_eager_M16.meta.json"
    layers = json.loads(tmeta.read_text())["params"]["num_layers"]
    others = [k for k in e.index.get_level_values("guard").unique() if k != "sync"]
    after_others = e.loc[others, "idle_after_sync_ns"].max()
    lines = [f"Per forward, from the profiler traces in `data/traces/` ({label(meta)}): {layers} layers of "
             "qwen3-30b-a3b, two forwards per trace.", "",
             f"- `sync` makes {per[('sync', 16)]:.0f} syncs per forward over {layers} layers; "
             + " and ".join(f"`{k}`" for k in others) + f" make {e.loc[others, 'n_syncs'].max():.0f}.",
             "- GPU idle right after the syncs: "
             + ", ".join(f"{e.loc[('sync', m), 'idle_after_sync_ns'] / 1e6:.2f} ms "
                         f"per forward at M = {m}" for m in sorted(e.loc["sync"].index))
             + ("; none with the other guards." if after_others == 0 else
                f"; at most {after_others / 1e6:.2f} ms with the other guards."),
             "- GPU utilisation inside the forward at M = 4096: "
             + ", ".join(f"{e.loc[(k, 4096), 'gpu_util']:.2f} with `{k}`" for k in ("sync", "cpu_flag"))
             + (f", {g['gpu_util'].xs(4096, level='M').max():.2f} under graph replay." if len(g) else ".")]
    return "\n".join(lines)


def kernels_block() -> str:
    d = pd.read_csv(DATA / "kernels" / "kernels.csv")
    meta = normalize_meta(json.loads((DATA / "kernels" / "kernels.meta.json").read_text()))
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
    p = pd.read_csv(f)
    Ms = sorted(p.M.unique())
    head = "| figures from elsewhere, qwen3-30b-a3b (µs) | " + " | ".join(f"M={m}" for m in Ms) + " |"
    out = ["Figures from elsewhere, not measured by this lab's scripts (`data/kernels/peers_carried.csv`): a "
           "side-by-side run on an H200, CUDA-graph replay, bf16, rank 32, 4 adapters all enabled, top-8 of 128, "
           "identical inputs, carried from the issue that asked for this comparison (issue 22):", "",
           head, "| --- |" + " ---: |" * len(Ms)]
    names = {"vllm_fused_moe_lora": "vLLM fused MoE-LoRA, one-shot", "sglang_two_kernel": "SGLang two-kernel path"}
    for (e, op), g in p.groupby(["engine", "op"], sort=False):
        v = g.set_index("M").time_us
        out.append(f"| {names.get(e, e)}, {op} delta | " + " | ".join(f"{v[m]:g}" if m in v else "" for m in Ms) + " |")
    return out


def _decode_lines() -> list[str]:
    """Issue 13: the decode path without alignment, the deltas' bandwidth, LoRA's share of a layer
    against its byte floor, the all-disabled exit against its floors, the fused-epilogue experiment,
    the differential over the decode tiles. Round 3's last run, `expand_run7`, is the recording of the
    code as it is (the table's tiles: check, deltas, exit floors, the layer paired, the path); the fused
    epilogue and the decode differential come from round 2 (`fused_run*`)."""
    from lora_moe_lab.kernels.configs import DECODE_MAX_PAIRS  # the bound the code uses now
    kd = DATA / "kernels"
    from lora_moe_lab.instruments.analysers.recordings import (CANONICAL_KERNEL_RUN, DIFFERENTIAL_GLOB, FUSED_RUN,
                                                               load_kernel_run)
    run = load_kernel_run(CANONICAL_KERNEL_RUN)
    m3 = run.meta
    f1 = pd.read_csv(kd / f"{FUSED_RUN}_kernels_fused.csv")
    f1 = f1[f1.M.notna()].astype({"M": int})  # the rows of random cases carry no M
    path = run.section("path").set_index(["preset", "M"])
    Ms = sorted(path.loc["qwen3-30b-a3b"].index)
    rows = ["| whole LoRA path of a layer (µs) | " + " | ".join(f"M={m}" for m in Ms) + " |",
            "| --- |" + " ---: |" * len(Ms)]
    for pre in ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4"):
        q = path.loc[pre]
        rows.append(f"| {pre}: today → decode path (ratio) | " + " | ".join(
            f"{q.loc[m, 'today']:.1f} → {q.loc[m, 'decode']:.1f} ({q.loc[m, 'ratio']:.2f})" for m in Ms) + " |")
    dis = run.section("disabled")
    fl1 = run.section("floor")
    sw = run.section("sweep").set_index(["preset", "M", "op"])
    sf = run.share_floor().set_index(["preset", "M"])
    lay = run.section("layer_paired")
    big = sorted(sf.loc["qwen3-30b-a3b"].index)
    share = ["| LoRA all active, share of the layer | " + " | ".join(f"M={m}" for m in big) + " |",
             "| --- |" + " ---: |" * len(big)]
    for pre in ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4"):
        share.append(f"| {pre}: measured [10–90 %] / byte floor | " + " | ".join(
            f"+{100 * sf.loc[(pre, m), 'lora_share']:.1f} % [{100 * sf.loc[(pre, m), 'lora_share_p10']:.1f}–"
            f"{100 * sf.loc[(pre, m), 'lora_share_p90']:.1f}] / {100 * sf.loc[(pre, m), 'floor_share']:.0f} %"
            for m in big) + " |")
    fk = f1[f1.section == "fused"]
    fl = f1[(f1.section == "layer") & (f1.lora_variant == "fused")].set_index(["preset", "M"])
    diffs = [pd.read_csv(f) for f in sorted(kd.glob(DIFFERENTIAL_GLOB))]
    dd = pd.concat([d[d.section == "diff"] for d in diffs])
    tiles = sorted(set().union(*(json.loads(t) for t in dd.table_tiles)))
    chk = run.section("check")
    short = lambda pre: pre.replace("qwen3-30b-a3b", "qwen3")  # noqa: E731
    bw = lambda op: sw.xs(op, level="op").bw_frac  # noqa: E731
    d8 = sw.loc[("qwen3-30b-a3b", 8192, "down")]
    return ["", f"**Decode path without alignment** (`kernels/lora_decode.py`; "
                f"`data/kernels/{CANONICAL_KERNEL_RUN}_*`, "
            f"{label(m3)}): the two deltas straight from `topk_ids` and the per-token row mapping, no alignment "
            "kernels, against today's alignment + aligned gate_up + down deltas. Same inputs, graph replay, rank "
            f"32, 4 adapters, every token with one. The layer takes this path for M·top_k ≤ {DECODE_MAX_PAIRS} "
            "pairs:", ""] + rows + [
        "", f"- Decode differential (`fused_run2_seed*`): {int(dd.cases.sum())} random cases against float64, "
            f"{int(dd.failures.sum())} failures, over every tile the table uses ({', '.join(tiles)}). Aligned "
            f"kernel with the table's tiles on both presets' shapes (`{CANONICAL_KERNEL_RUN}`): {len(chk)} checks, "
            f"{int((~chk.ok.astype(bool)).sum())} failures.",
        f"- All adapters disabled against an empty kernel of the same grid and arguments: decode path "
        f"{dis.decode_ratio.min():.2f}–{dis.decode_ratio.max():.2f}x, aligned kernel "
        f"{dis.aligned_ratio.min():.2f}–{dis.aligned_ratio.max():.2f}x (down delta, M = 1..64; both deltas at M = 1, "
        f"8, 64: "
        f"decode {fl1.decode_ratio.min():.2f}–{fl1.decode_ratio.max():.2f}x, aligned {fl1.aligned_ratio.min():.2f}–"
        f"{fl1.aligned_ratio.max():.2f}x). A same-grid kernel that only loads one "
        f"device flag and exits (`kernels/empty.py:flag_exit_kernel`) already costs {fl1.decode_flag_ratio.min():.2f}–"
        f"{fl1.decode_flag_ratio.max():.2f}x (decode grid) and {fl1.aligned_flag_ratio.min():.2f}–"
        f"{fl1.aligned_flag_ratio.max():.2f}x (aligned grid): one round trip to memory is the floor of any exit "
        "decided from device data.",
        f"- Aligned deltas at M = {min(big)}–{max(big)} (the table's tiles, expand loop pipelined by hand where it "
        f"won, a register cap where 4 programs/SM paid): gate_up {100 * bw('gate_up').min():.0f}–"
        f"{100 * bw('gate_up').max():.0f} % of copy bandwidth, down {100 * bw('down').min():.0f}–"
        f"{100 * bw('down').max():.0f} %; the down delta of qwen3-30b-a3b at M=8192 {d8.time_us:.0f} µs.",
        "", "LoRA's share of one MoE layer (same run; the base layer, the layer with all 4 adapters "
            "active and every token using one, and with none active, each captured once and replayed interleaved "
            f"{int(lay.reps.iloc[0])} times; the share per round, median and 10–90 % interval) next to its byte "
            f"floor: the "
            "bytes both deltas must move (each used adapter-expert's A and B once, x once, the output read and "
            "written; the deltas' rows of the same run at the same M) at the measured copy bandwidth, over the base "
            "layer's time:",
        ""] + share + [
        "", "- Delta fused into the base GEMM's epilogue (`kernels/fused_moe_lora_epilogue.py`, an experiment, not "
            f"used by the layer; `{FUSED_RUN}_*`): fused GEMM / (base GEMM + separate delta) "
        f"{fk.ratio.min():.2f}–{fk.ratio.max():.2f}x over {len(fk)} (preset, op, M) points, M ≤ {fk.M.max()}; "
        "in the layer with both deltas fused, LoRA all active costs " + "; ".join(
            f"{short(pre)} M="
            + ", ".join(f"{m} +{100 * fl.loc[(pre, m), 'lora_share']:.0f} %" for m in (1, 1024, 16384))
            for pre in ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")) + "."]


def _tp1_busy_sentence() -> str:
    """What the TP=1 traces say about the kernels' busy time under `sync` vs `cpu_flag` (one
    profiled forward each, no adapter in use)."""
    from lora_moe_lab.instruments.analysers import trace

    busy = {}
    for g in ("sync", "cpu_flag"):
        f = sorted((DATA / "production" / "traces").glob(f"*_tp1_*_none_{g}_rank0.json.gz"))
        if not f:
            return ""
        busy[g] = float(trace.forward_metrics(trace.load_trace(f[0])).busy_ns.iloc[0]) / 1e6
    if busy["sync"] >= busy["cpu_flag"]:
        return ""
    return (f" At TP=1 part of the stall is hidden: in the profiled forward the kernels were busy {busy['sync']:.0f} "
            f"ms "
            f"with `sync` against {busy['cpu_flag']:.0f} ms with `cpu_flag` (the same kernels ran faster with bubbles "
            "between them; notebook 06).")


def _ci(est, lo, hi, unit=" %", nd=1) -> str:
    return f"**{est:+.{nd}f}{unit}** [{lo:+.{nd}f}, {hi:+.{nd}f}]"


def signature_block() -> str | None:
    """Production's per-sync signature beside the lab's, in the lab's own regime and in a
    production-like one, with the fix's gain in each, from every recorded session
    (instruments/analysers/production_runs.py: the one loader and combination rule)."""
    from lora_moe_lab.instruments.analysers import production_runs as PR
    from lora_moe_lab.sim import PRODUCTION, PRODUCTION_SIGNATURE as PS

    sess = PR.load_sessions()
    if not sess:
        return None
    sig, head = PR.signature_table(sess), PR.headline(sess)
    names = list(sess)
    first = sess[names[0]]
    m = first.meta
    def card(meta):
        end = meta.get("gpu_state_end") or {}
        g = end or meta.get("gpu_state") or {}
        when = "at the end" if end else "at the start"
        return (f"driver {meta.get('driver', '?')}, SM clock {g.get('clocks_sm', float('nan')):.0f} MHz (max "
                f"{g.get('clocks_max_sm', float('nan')):.0f}), {g.get('power_draw', float('nan')):.0f} W {when}")

    where = "; ".join(f"`{n}`: {label(s.meta)}, {card(s.meta)}"
                      f"{', dirty tree (files the recording does not import)' if s.meta.get('dirty') else ''}"
                      for n, s in sess.items())
    reps = int(first.summary["reps"].min())
    n_s = len(names)
    lines = [
        f"From `data/production/signature_*` ({n_s} device session{'s' if n_s > 1 else ''}: {where}), written by "
        f"`studies/production/record.py`: the decoder, {int(m['params']['layers'])} layers, TP=1, "
        f"{int(first.summary['requests'].iloc[0])} requests × {int(m['params']['input_len'])} tokens, "
        f"260 guard syncs per forward, no adapter in use, `sync` against `cpu_flag`, {reps} interleaved repetitions "
        f"kept per session after the warm-up check. Host-blocked figures: unprofiled (perf_counter around each "
        f"`.item()`, medians over the forwards after the first). GPU idle: profiled steady forwards, for the shape "
        f"only (a profiler slows the host).", "",
        "| | syncs / forward | host blocked / forward (ms) | first sync (ms) | first's share | later syncs, host "
        "blocked: mean / median (µs) | host's lead at a later sync, median (µs) | GPU idle / forward, sync / cpu_flag "
        "(ms, profiled) | fix: input throughput | fix: TTFT |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| production (sgl-project/sglang#25531; TP=4, 128 × 2048) | {PS['syncs_per_forward']:.0f} | "
        f"~{PS['host_blocked_ms_per_forward']:.0f} | ~{PS['first_sync_ms']:.0f} | {100 * PS['first_share']:.0f} % | "
        f"~{PS['later_blocked_mean_us']:.0f} / not published | not published | not published | "
        f"**{PRODUCTION['input_throughput_gain_pct']:+.1f} %** | **{PRODUCTION['ttft_change_pct']:+.1f} %** |"]
    for task in ("default_C16384", "default_C8192", "prodlike_C16384"):
        g = sig[sig.task == task]
        if not len(g):
            continue
        med = g.median(numeric_only=True)
        def sp(c, f="{:.1f}", g=g):  # one session's value, or the two sessions' range
            a, b = f.format(g[c].min()), f.format(g[c].max())
            return a if a == b else f"{a}–{b}"
        h = head[head.task == task].set_index("metric")
        thr, ttft = h.loc["fix_throughput_gain_pct"], h.loc["fix_ttft_change_pct"]
        lines.append(
            f"| {PR.TASK_TITLES[task]} | {med.syncs_per_forward:.0f} | {sp('host_blocked_ms')} | "
            f"{sp('first_blocked_ms', '{:.2f}')} | {sp('first_share', '{:.1%}')} | "
            f"{sp('later_blocked_mean_us', '{:.0f}')} / {sp('later_blocked_median_us', '{:.0f}')} | "
            f"{sp('later_lead_median_us', '{:.0f}')} | {sp('gpu_idle_ms_sync')} / {sp('gpu_idle_ms_cpu_flag')} | "
            f"{_ci(thr.estimate, thr.lo, thr.hi)} | {_ci(ttft.estimate, ttft.lo, ttft.hi)} |")
    lines += ["", "Per session (paired bootstrap, 95 %), and what a reader should take (both sessions: the mean "
              "of the two, the union of their intervals; † where the sessions' intervals do not overlap):", "",
              "| regime | metric | " + " | ".join(f"session {n}" for n in names) + " | reader's figure |",
              "| --- | --- | " + " | ".join("---:" for _ in names) + " | ---: |"]
    titles = {"fix_throughput_gain_pct": "input throughput", "fix_throughput_gain_net_pct":
              "input throughput, the earlier batch's GPU time left out", "fix_ttft_change_pct": "mean TTFT"}
    for r in head.itertuples():
        if r.metric == "fix_throughput_gain_net_pct" and not r.task.startswith("prodlike"):
            continue
        per = " | ".join(_ci(getattr(r, n), getattr(r, f"{n}_lo"), getattr(r, f"{n}_hi")).replace("**", "")
                         if n in head.columns and pd.notna(getattr(r, n, float("nan"))) else "—" for n in names)
        flag = " †" if r.sessions > 1 and r.agree is False else ""
        take = _ci(r.estimate, r.lo, r.hi) + flag if r.sessions > 1 else "one session; the second is pending"
        lines.append(f"| {PR.TASK_TITLES[r.task]} | {titles[r.metric]} | {per} | {take} |")
    d = sig[sig.task == "default_C16384"].median(numeric_only=True)
    p = sig[sig.task == "prodlike_C16384"].median(numeric_only=True)
    if len(sig[sig.task == "prodlike_C16384"]) and len(sig[sig.task == "default_C16384"]):
        lost_d = d.forward_median_ms - d.forward_median_ms_cpu_flag
        lost_p = p.forward_median_ms - p.forward_median_ms_cpu_flag
        thr = head[(head.task == "prodlike_C16384") & (head.metric == "fix_throughput_gain_pct")].iloc[0]
        lines += ["",
            f"- **The lab's own regime is not production's.** Its lean host is far ahead of its GPU: a typical later "
            f"sync finds ~{d.later_lead_median_us:.0f} µs of GPU work queued (profiled) and blocks the host "
            f"{d.later_blocked_median_us:.0f} µs (production: ~{PS['later_blocked_mean_us']:.0f} µs on average), and "
            f"the first sync of a forward only {d.first_blocked_ms:.2f} ms (production: ~{PS['first_sync_ms']:.0f} "
            f"ms): "
            f"it follows the previous forward's last sync, with nothing queued ahead. Averaged over all 260, an "
            f"`.item()` blocks {1e3 * d.host_blocked_ms / 260:.0f} µs here, {1e3 * p.host_blocked_ms / 260:.0f} µs in "
            f"the production-like regime, {1e3 * PS['host_blocked_ms_per_forward'] / 260:.0f} µs in production and "
            f"{PS['gb300_item_us']:.0f} µs on GB300 (sgl-project/sglang#24246; {PS['gb300_item_no_lora_us']:.0f} µs "
            "without LoRA): host-blocked time against host-blocked time.",
            f"- **Production's regime, reproduced.** With {p.host_us_per_layer / 1e3:.2f} ms of engine host work per "
            f"layer (calibrated in the same call so that the later syncs block ~{PS['later_blocked_mean_us']:.0f} µs "
            f"on "
            f"average) and {p.overlap_ms:.0f} ms of an earlier batch queued on the GPU before each forward (an overlap "
            f"scheduler), the lab's trace shows production's signature: {p.host_blocked_ms:.0f} ms blocked per "
            f"forward, "
            f"{p.first_blocked_ms:.1f} ms of it in the first sync ({p.first_share:.0%}), later syncs "
            f"{p.later_blocked_mean_us:.0f} µs on average. The fix then gains {thr.estimate:+.1f} %, "
            f"{'more' if thr.lo > PRODUCTION['input_throughput_gain_pct'] else 'not more'} than production's "
            f"{PRODUCTION['input_throughput_gain_pct']:+.1f} %." + _prodlike_sessions(sig, head),
            f"- **Why the same signature does not give the same gain: host-blocked time is not GPU time lost.** The "
            f"first sync's {p.first_blocked_ms:.0f} ms are spent while the GPU is busy with the earlier batch: they "
            f"cost "
            f"the GPU nothing. A later sync blocks the host only ~{p.later_blocked_mean_us:.0f} µs because the host is "
            f"barely ahead; when it returns, the queue is empty and the GPU waits while the host issues the next "
            f"segment. The fix buys that wait: {lost_p:.0f} ms per forward here ({1e3 * lost_p / 260:.0f} µs per sync; "
            f"unprofiled: the `sync` forward minus the `cpu_flag` one), against {lost_d:.1f} ms "
            f"({1e3 * lost_d / 260:.0f} µs per sync) in the lab's own regime, where the host blocks far longer. "
            "Production published the host-blocked time, not the GPU time its syncs cost, so its signature fixes how "
            "far ahead its host was, not the gain. At this lab's "
            f"{1e3 * lost_p / 260:.0f} µs per sync, production's +{PRODUCTION['input_throughput_gain_pct']:.1f} % "
            f"would "
            f"need a `cpu_flag` forward of {lost_p / (PRODUCTION['input_throughput_gain_pct'] / 100):.0f} ms (the "
            f"lab's: "
            f"{p.forward_median_ms_cpu_flag - p.overlap_ms:.0f} ms of its own work); a TP=4 rank also waits in "
            "all-reduces, which this TP=1 run has not."]
        lines += _profiled_vs_live(lost_d)
        lines += _chunk_sentence(sig)
    return "\n".join(lines)


def _trace_medians(chunk: int, guard: str) -> tuple[float, float, float] | None:
    """(span, busy, idle) ms, medians over the profiled steady forwards of the lab's own regime."""
    from lora_moe_lab.instruments.analysers import trace

    f = sorted((DATA / "production").glob(f"signature_*/traces/*_C{chunk}_gs5.41667_none_{guard}_rank0.json.gz"))
    if not f:
        return None
    m = trace.forward_metrics(trace.load_trace(f[0]))
    m = m[m.forward >= 1]
    return tuple(float(m[c].median()) / 1e6 for c in ("gpu_span_ns", "busy_ns", "idle_ns"))


def _chunk_sentence(sig) -> list[str]:
    """Why half the chunk gains several times more (the lab's own regime)."""
    t = {(c, g): _trace_medians(c, g) for c in (16384, 8192) for g in ("sync", "cpu_flag")}
    if any(v is None for v in t.values()):
        return []
    a = sig[sig.task == "default_C16384"].median(numeric_only=True)
    b = sig[sig.task == "default_C8192"].median(numeric_only=True)
    la, lb = a.forward_median_ms - a.forward_median_ms_cpu_flag, b.forward_median_ms - b.forward_median_ms_cpu_flag
    ra = t[16384, "cpu_flag"][1] - t[16384, "sync"][1]
    rb = t[8192, "cpu_flag"][1] - t[8192, "sync"][1]
    return [f"- **Why C=8192 gains more than C=16384.** The bubbles do not shrink with the chunk: the profiled `sync` "
            f"forward idles {t[16384, 'sync'][2]:.0f} ms at C=16384 and {t[8192, 'sync'][2]:.0f} ms at C=8192 (the "
            f"host's re-issue after each of the 260 drains does not depend on the tokens), while the `cpu_flag` "
            f"forward "
            f"halves ({a.forward_median_ms_cpu_flag:.0f} → {b.forward_median_ms_cpu_flag:.0f} ms, unprofiled). And "
            f"the power-cap rebate (the same kernels busy less under `sync`) is {ra:.1f} ms at C=16384 and {rb:.1f} ms "
            f"at C=8192: the unprofiled loss per forward is {la:.1f} ms against {lb:.1f} ms."]


def _prodlike_sessions(sig, head) -> str:
    """When the production-like sessions disagree: what differed between them."""
    h = head[(head.task == "prodlike_C16384") & (head.metric == "fix_throughput_gain_pct")]
    g = sig[sig.task == "prodlike_C16384"].sort_values("session")
    if not len(h) or h.iloc[0].sessions < 2 or h.iloc[0].agree is not False or len(g) < 2:
        return ""
    a, b = g.iloc[0], g.iloc[-1]
    return (f" The two sessions disagree (†): each calibrated its own host work from its own lean-regime syncs "
            f"({a.host_us_per_layer / 1e3:.2f} and {b.host_us_per_layer / 1e3:.2f} ms per layer). With more host work "
            f"`cpu_flag` itself is more host-bound (GPU idle {a.gpu_idle_ms_cpu_flag:.0f} against "
            f"{b.gpu_idle_ms_cpu_flag:.0f} ms per forward, profiled) and the fix gains less: where the host is barely "
            "ahead, the gain moves fast with the host's speed. The reader's figure is the union of both.")


def _profiled_vs_live(lost_live_ms: float) -> list[str]:
    """The lab's own regime: the profiled steady forwards' GPU span and busy time per guard against
    the unprofiled time lost (why a profiled run is never the timing)."""
    from lora_moe_lab.instruments.analysers import trace

    got = {}
    for g in ("sync", "cpu_flag"):
        f = sorted((DATA / "production").glob(f"signature_*/traces/*_C16384_gs5.41667_none_{g}_rank0.json.gz"))
        if not f:
            return []
        m = trace.forward_metrics(trace.load_trace(f[0]))
        m = m[m.forward >= 1]
        got[g] = (float(m.gpu_span_ns.median()) / 1e6, float(m.busy_ns.median()) / 1e6)
    (sp_s, bu_s), (sp_c, bu_c) = got["sync"], got["cpu_flag"]
    return [f"- **A profiled forward is a picture, not a timing.** In the lab's own regime the profiled `sync` forward "
            f"spans {sp_s - sp_c:.0f} ms more GPU time than the `cpu_flag` one ({sp_s:.0f} against {sp_c:.0f} ms), "
            f"the unprofiled forwards differ by {lost_live_ms:.1f} ms: the profiler's host overhead sits exactly where "
            f"the bubble is, in the host's re-issue after each sync. And the same kernels were busy {bu_c - bu_s:.0f} "
            f"ms "
            f"less with `sync` ({bu_s:.0f} against {bu_c:.0f} ms), which hides part of the stall. "
            + _clock_sentence()]


def _clock_sentence() -> str:
    """Why the same kernels ran faster under `sync`: the card's clocks and power while each guard's
    timed prefills ran (sessions with a clock log)."""
    from lora_moe_lab.instruments.analysers import production_runs as PR

    for n, s in PR.load_sessions().items():
        c = PR.clocks_by_guard(s)
        if not len(c):
            continue
        c = c[c.task == "default_C16384"].set_index("guard")
        if not {"sync", "cpu_flag"} <= set(c.index):
            continue
        y, f = c.loc["sync"], c.loc["cpu_flag"]
        return (f"The card's own reading says why (session {n}, nvidia-smi every 100 ms during the timed prefills): "
                f"under `cpu_flag` it drew {f.power_w:.0f} W of its "
                f"{s.meta.get('gpu_state', {}).get('power_limit', 700):.0f} W "
                f"limit, its software power cap held the clocks down in {f.power_capped_share:.0%} of the samples and "
                f"the "
                f"SM clock ran at {f.sm_mhz:.0f} MHz (median); under `sync`, with bubbles, {y.power_w:.0f} W, capped "
                f"in "
                f"{y.power_capped_share:.0%} of the samples, at {y.sm_mhz:.0f} MHz: the bubbles let the power "
                f"controller "
                "hold a higher clock, so the same kernels run faster.")
    return "(Why: a hypothesis about clocks and power until a session with a clock log backs it.)"


def production_block() -> str | None:
    """The first production-setting recording (data/production/*.summary.csv, 2026-11-30; the only
    TP=2 measurement), with what it is: one session, 5 repetitions, a percentile spread."""
    from lora_moe_lab.sim import PRODUCTION

    files = sorted((DATA / "production").glob("*.summary.csv"))
    if not files:
        return None
    d = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    meta_file = files[0].with_name(files[0].name.replace(".summary.csv", ".meta.json"))
    meta = normalize_meta(json.loads(meta_file.read_text()))
    reps = int(d.reps.min())
    lines = [f"The first recording (`data/production/*.csv`, {label(meta)}; the only TP=2 measurement: no two-GPU "
             f"machine was lent for a rerun): {int(d.layers.iloc[0])} layers, {int(d.requests.iloc[0])} requests × "
             f"{int(d.input_len.iloc[0])} tokens in chunks of {int(d.chunk.iloc[0])}, bf16, **one session, {reps} "
             f"repetitions**; the brackets are the 2.5–97.5 percentiles of the paired per-repetition changes, a spread "
             f"of {reps} values, not a confidence interval. Its TP=1 row was rerun above with 13 repetitions.", "",
             "| TP | syncs per forward | adapters in use | input tokens/s, sync → cpu_flag | throughput change "
             "| mean TTFT (ms), sync → cpu_flag | TTFT change |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for k, g in d.groupby(["tp", "guard_sites", "adapters"], sort=True):
        g = g.set_index("guard")
        if not {"sync", "cpu_flag"} <= set(g.index):
            continue
        sy, cf = g.loc["sync"], g.loc["cpu_flag"]
        lines.append(
            f"| {k[0]} | {sy.syncs_per_forward:.0f} | {'none' if k[2] == 'none' else 'half'} "
            f"| {sy.input_tok_per_s:,.0f} → {cf.input_tok_per_s:,.0f} "
            f"| {sy.fix_throughput_gain_pct:+.1f} % [{sy.fix_throughput_gain_pct_lo:+.1f}, "
            f"{sy.fix_throughput_gain_pct_hi:+.1f}] "
            f"| {sy.ttft_mean_ms:,.0f} → {cf.ttft_mean_ms:,.0f} "
            f"| {sy.fix_ttft_change_pct:+.1f} % [{sy.fix_ttft_change_pct_lo:+.1f}, {sy.fix_ttft_change_pct_hi:+.1f}] |")
    lines.append(f"| production, TP=4 | {PRODUCTION['syncs_per_forward']:.0f} | none | | "
                 f"**{PRODUCTION['input_throughput_gain_pct']:+.1f} %** | | **{PRODUCTION['ttft_change_pct']:+.1f} "
                 f"%** |")
    la = d[d.guard == "launch_always"]
    if len(la):
        lines += ["", f"`launch_always` stays within {la.fix_throughput_gain_pct.abs().max():.1f} % of `cpu_flag` "
                      "in throughput at every TP size and adapter mix."]
    lines += ["", "Per-rank NCCL all-reduce time per guard (the spin sgl-project/sglang#24262 saw cut by ~68 %) is "
                  "measured by `instruments.analysers.signature.nccl_us` on a TP trace; it has not been recorded: "
                  "the TP=2 replication waits for a two-GPU machine."]
    return "\n".join(lines)


def replay_block() -> str | None:
    """The trace-driven what-if (sim/replay.py): held-out predictions of one guard's forward from a
    profiled forward of the other, against the unprofiled measurement (data/replay/validation.csv)."""
    f = DATA / "replay" / "validation.csv"
    if not f.exists():
        return None
    d = pd.read_csv(f)
    meta = normalize_meta(json.loads(f.with_suffix(".meta.json").read_text()))
    titles = {"dec": "decoder", "moe": "MoE model"}
    cfg = {"default_C16384": "own regime, C=16384", "default_C8192": "own regime, C=8192",
           "prodlike_C16384": "production-like, C=16384", "tp1_mix_C16384": "TP=1, adapters mix, C=16384",
           "tp2_none_C16384": "TP=2, C=16384", "tp2_mix_C16384": "TP=2, adapters mix, C=16384",
           "tp2_none_C16384_gs1": "TP=2, C=16384, 48 syncs"}
    lines = [f"A profiled forward as a host/device dependency graph (`lora_moe_lab/sim/replay.py`, after Daydream: "
             f"Zhu, Phanishayee and Pekhimenko, USENIX ATC 2020), transformed (`sim/replay_transforms.py`: remove or "
             f"add the guard's syncs, scale host time, one graph launch, early-exit launches, collectives) and "
             f"replayed. Every recorded forward replays to itself exactly. Held out (`studies/replay/record.py`, "
             f"{label(meta)}): the `cpu_flag` forward predicted from a profiled `sync` forward and the reverse, "
             f"against the unprofiled measurement of the target; one host factor per source trace "
             f"(the profiler slows the host), fitted on the source's own unprofiled forward, never the target's. "
             f"**{int(d.passed.sum())} of {len(d)} pass** (within ±5 % or inside the measured interval); without "
             f"the host factor {int(d.raw_passed.sum())} of {len(d)}. Measured: two sessions (their mean; the union "
             f"of their 95 % intervals), or, for the first recording's points (sessions = 1: adapters `mix`, TP=2), "
             f"one session of 5 repetitions (the median; the 2.5–97.5 percentiles of the repetitions).", "",
             "| model | configuration | from → predicted | predicted (ms) | measured (ms) [interval] | sessions | "
             "error | error without the host factor |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in d.itertuples():
        c = cfg.get(str(r.config), f"M={r.config}, 48 layers (8-layer trace tiled)")
        lines.append(f"| {titles.get(r.model, r.model)} | {c} | `{r.source}` → `{r.target}` | {r.predicted_ms:.1f} | "
                     f"{r.measured_ms:.1f} [{r.measured_lo:.1f}, {r.measured_hi:.1f}] | {r.sessions} | "
                     f"{r.err_pct:+.1f} % | {r.raw_err_pct:+.1f} % |")
    w = d.loc[d.err_pct.abs().idxmax()]
    wc = cfg.get(str(w.config), f"M={w.config}")
    tp2 = d[d.config.astype(str).str.startswith("tp2")]
    t2s = tp2[tp2.target == "sync"]
    why = ("host factor {a:.2f}: above 1, so it absorbs kernels that ran at other clocks in the 8-layer profiled "
           "forward than in the 48-layer timed one; " if w.model == "moe" and w.alpha > 1 else "")
    lines += ["", f"- Worst: {titles.get(w.model, w.model)} {wc}, `{w.source}` → `{w.target}`, {w.err_pct:+.1f} % "
                  f"({'' if w.passed else 'a miss: ' + str(w.cause) + '; '}{why.format(a=w.alpha)}"
                  f"{w.raw_err_pct:+.1f} % without the host factor).",
              "- The `sync` → `cpu_flag` predictions of the lab's own regime run about 2 % low: the graph keeps the "
              "`sync` run's kernel durations, and those kernels ran at higher clocks (the power cap, above)."]
    if len(tp2):
        inside = " (inside the repetitions' range, not ±5 %)"
        low = ", ".join(f"{r.err_pct:+.1f} %" + (inside if r.by == "interval" else "") for r in t2s.itertuples())
        lines.append(f"- TP=2 ({len(tp2)} points, {int(tp2.passed.sum())} pass): one rank replayed (rank 0), each "
                     f"all-reduce set to the collective's own time (per collective the shorter of the two ranks' "
                     f"kernels, ~244 µs); the first chunk of the traced prefill replayed as the 16-chunk prefill. "
                     f"`cpu_flag` → `sync` runs low ({low}): one rank "
                     f"cannot show the other rank's lateness at the all-reduce after each sync.")
    lines.append("- Not yet: the queue simulator below is not yet retired in its favour (TP=4: the prediction below, "
                 "from one GPU running a rank's shapes).")
    return "\n".join(lines)


def simulator_block() -> str | None:
    d = DATA / "simulator"
    if not (d / "simulator_fit.json").exists():
        return None
    from lora_moe_lab import sim

    # the queue model's TP=4 extrapolation is not shown: the one TP=4 figure is the tp4 block's prediction
    paras = sim.readme_block(d).split("\n\n")
    return "\n\n".join(p for p in paras if not p.startswith("Extrapolated to production"))


def simulator_check_block() -> str | None:
    """The queue model against the decoder measured at TP=2 with one guard sync per layer."""
    from lora_moe_lab import sim
    from lora_moe_lab.sim import PRODUCTION
    from lora_moe_lab.sim.tp import rank_shape

    f = DATA / "production" / "tp2_C16384_gs1.summary.csv"
    if not f.exists() or not (DATA / "simulator" / "simulator_fit.json").exists():
        return None
    m = pd.read_csv(f).set_index("guard").loc["sync"]
    params = sim.load_calibration().params
    x = sim.extrapolate(params, preset=rank_shape(2), tp=2, chunks=(int(m.chunk),), active=0.0,
                        guards=("sync", "cpu_flag"))
    c = sim.compare_production(x).set_index("metric")["predicted"]
    return (f"Checked against the measurement: at the measured TP=2 setting with one guard sync per layer "
            f"({m.syncs_per_forward:.0f} per forward, chunks of {int(m.chunk)}, no adapter in use) the queue model "
            f"predicts {c['input_throughput_gain_pct']:+.1f} % input throughput and {c['ttft_change_pct']:+.1f} % "
            f"TTFT; "
            f"the decoder measured {m.fix_throughput_gain_pct:+.1f} % [{m.fix_throughput_gain_pct_lo:+.1f}, "
            f"{m.fix_throughput_gain_pct_hi:+.1f}] and {m.fix_ttft_change_pct:+.1f} % "
            f"(`data/production/tp2_C16384_gs1.summary.csv`). The model holds the MoE blocks only: it has no "
            f"attention to dilute the stall, and it holds {m.syncs_per_forward:.0f} syncs per forward where production "
            f"made {PRODUCTION['syncs_per_forward']:.0f}: its own TP=4 extrapolation is no validation of production's "
            f"{PRODUCTION['input_throughput_gain_pct']:+.1f} % (notebook 05).")


def setup_block() -> str | None:
    f = DATA / "setup" / "setup_time.json"
    if not f.exists():
        return None
    d = json.loads(f.read_text())
    return (f"Set-up time, measured by `python3 studies/setup/record.py` (a fresh clone and `make venv` with "
            f"pip's cache off, {d['runs']} runs on this {d['cores']}-core CI-sized machine, commit {d['commit']}): "
            f"median {d['median_s']:.0f} s (min {d['min_s']:.0f}, max {d['max_s']:.0f}). It installs torch, triton, "
            f"the "
            "notebook tools and the browser test's driver in one go; the first `make run` or `make test` pays it once.")


def _graphs_regression(rec) -> str:
    """The cells where a strategy is slower than one_graph, on both models: never hidden."""
    worst = []
    for model in ("moe", "decoder"):
        t = rec.table(model).set_index("strategy")
        for v, r in t.drop(index="one_graph", errors="ignore").iterrows():
            for c in (c for c in t.columns if c.startswith("M=")):
                if r[c] > 1.02:
                    worst.append(f"`{v}` {c} on the {'MoE model' if model == 'moe' else 'decoder'}: "
                                 f"{(r[c] - 1) * 100:+.1f} %")
    if not worst:
        return "- No strategy is more than 2 % slower than `one_graph` anywhere."
    return ("- Slower than `one_graph` by more than 2 %: " + "; ".join(worst) + ". One adapter compacted onto "
            "one LoRA row changes the aligned kernel's tiles (the table was tuned for 4 rows); forcing BLOCK_M 16 "
            "or split_n 1 on that row did not remove it at M=512 (`data/kernels/expand_run10`, notebook 03), and the "
            "cause is not "
            "found.")


def graphs_block() -> str | None:
    from lora_moe_lab.instruments.analysers.recordings import load_graph_strategies

    try:
        rec = load_graph_strategies()
    except FileNotFoundError:
        return None
    t = rec.table("moe").set_index("strategy")
    cols = [c for c in t.columns if c.startswith("M=")]
    head = "| strategy | graphs | capture (s) | graph pool (MiB) | " + " | ".join(cols) + " |"
    lines = [head, "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in cols) + " |"]
    for v, r in t.iterrows():
        cells = ["1 (baseline)" if v == "one_graph" else f"{(r[c] - 1) * 100:+.1f} %" for c in cols]
        lines.append(f"| `{v}` | {int(r['graphs'])} | {r['capture_s']:.2f} | {r['pool_mib']:.0f} | "
                     + " | ".join(cells) + " |")
    sw = rec.switches
    return (f"Three ways to put LoRA under CUDA graphs (`model/graph_strategies.py`), recorded by "
            f"`studies/graphs/record.py` into `data/graphs/` ({rec.label}) on the 48-layer qwen3-30b-a3b MoE model, "
            f"bf16, 4 adapter slots of rank 32: graphs for decode (1 to 64 requests) and prefill (512, 2048 tokens), "
            f"capture time (kernels compiled first), the private graph pool's memory, and one whole step (pick, "
            f"upload, replay) relative to `one_graph` (one graph with the LoRA kernels always inside; it relies on the "
            f"`launch_always` guard's early exit), paired medians of {int(rec.summary().n.min())} interleaved "
            f"repetitions (the decoder's table and the intervals: notebook 03).\n\n" + "\n".join(lines) + "\n\n"
            f"- Every replay after adapter switches equals the eager run of the same graph bit for bit "
            f"({int(sw.bit_exact_vs_same_graph_eager.sum())} of {len(sw)}); a batch larger than every graph gets a "
            f"named `NoGraphFits` error (or runs eagerly with `fallback=\"eager\"`).\n"
            f"- The no-LoRA graphs save a few percent of a decode step when no adapter is active; the price is 2x "
            f"(`lora_split`) and 4x (`per_active_count`) the graphs to capture, pick and keep correct.\n"
            + _graphs_regression(rec))


def _tp4_figures():
    from lora_moe_lab.sim import tp_emulation as E

    sessions = E.load_sessions()
    if not sessions:
        return None
    return sessions, E.tp2_validation(sessions), E.tp4_prediction(sessions), E.allreduce_cost()


def _gain(r, fmt="{:+.1f}") -> str:
    return f"{fmt.format(r.estimate)} % [{fmt.format(r.lo)}, {fmt.format(r.hi)}]"


def _clock_note(sessions) -> str:
    logged = {n: s.clocks for n, s in sessions.items() if s.clocks is not None and len(s.clocks)}
    if not logged:
        return "No session logged the SM clock."
    parts = [f"{n}: SM clock {c.sm_mhz.min():.0f}–{c.sm_mhz.max():.0f} MHz, power up to {c.power_w.max():.0f} W"
             for n, c in logged.items()]
    return ("Clocks (`clocks.csv`, every 100 ms): " + "; ".join(parts) +
            " (the H200's cap is 700 W: at rank shapes no power-cap rebate).")


def lab_headline_block() -> str | None:
    """One line: the fix's gain on one H200 at TP=1 in both regimes (every session, one rule)."""
    from lora_moe_lab.instruments.analysers import production_runs as PR

    sess = PR.load_sessions()
    if not sess:
        return None
    h = PR.headline(sess)
    h = h[h.metric == "fix_throughput_gain_pct"].set_index("task")
    if not {"default_C16384", "prodlike_C16384"} <= set(h.index):
        return None
    sig = PR.signature_table(sess)
    pl = sig[sig.task == "prodlike_C16384"]
    blocked = (f" ({pl.host_blocked_ms.mean():.0f} ms of host time blocked per forward, "
               f"{pl.first_blocked_ms.mean():.0f}"
               f" ms of it in the first sync)" if len(pl) else "")
    return (f"One H200, TP=1, 260 syncs per forward, {len(sess)} device sessions: the fix gains "
            f"{_gain(h.loc['prodlike_C16384'])} input throughput in a production-like regime{blocked}, and "
            f"{_gain(h.loc['default_C16384'])} in the lab's own lean-host regime (C=16384; 95 % paired bootstrap, "
            f"the union over sessions). `docs/results.md`, blocks signature and production.")


TP4_HEADLINE_TASK = "tp4_prodlike_C16384"  # production's regime and the lab's headline chunk


def tp4_headline_block() -> str | None:
    f = _tp4_figures()
    if f is None:
        return None
    sessions, v, p, _ = f
    from lora_moe_lab.sim import PRODUCTION

    r = p[(p.task == TP4_HEADLINE_TASK) & (p.metric == "fix_throughput_gain_pct")]
    if not len(r):
        return None
    r = r.iloc[0]
    per = ", ".join(f"{r[s]:+.1f}" for s in sessions if s in r and pd.notna(r[s]))
    return (f"TP=4, **predicted** on one H200 (one rank's shapes, each all-reduce replaced by its measured time; "
            f"the method passed {int(v.passed.sum())} of {len(v)} points of its TP=2 check): the fix gains "
            f"{_gain(r)} input throughput in the production-like regime at C=16384 (sessions {per}"
            f"{'' if r.agree else ', which disagree'}); production measured "
            f"{PRODUCTION['input_throughput_gain_pct']:+.1f} % at TP=4. `docs/results.md`, block tp4.")


def tp4_block() -> str | None:
    f = _tp4_figures()
    if f is None:
        return None
    sessions, v, p, cost = f
    names = " and ".join(sessions)
    lines = [f"**Predicted, not measured** (`data/tp_emulation/`, `studies/tp_emulation/record.py`, "
             f"`lora_moe_lab/sim/tp_emulation.py`; sessions {names}, each on a freshly started H200). One GPU runs "
             f"one rank's shapes (a 1/TP share of heads and expert intermediate; `model/tp.py: EmulatedTPGroup`), and "
             f"each all-reduce is a GPU spin of the time NCCL took for those bytes on two H200s: {cost.bus_gbps:.1f} "
             f"GB/s of bus bandwidth, the {cost.source}, carried to TP=4 by the ring's 2(n-1)/n. 48 layers, bf16, no "
             f"adapter in use, `sync` against `cpu_flag`, 12 interleaved repetitions after a warm-up prefill, "
             f"unprofiled. Forward times: the median chunk with its order-statistic 95 % interval; gains: paired "
             f"bootstrap 95 %; across sessions, their mean and the union of their intervals.", "",
             "The check first: TP=2 emulated against TP=2 measured on two GPUs (`data/production/tp2_*`, one "
             "session of 5 repetitions, 2.5–97.5 percentiles). A point passes within ±5 % or inside the "
             "measurement's interval.", "",
             "| point | emulated, per session | emulated | measured | error | passes |", "| --- | --- | ---: | ---: | "
                                                                                         "---: | --- |"]
    for r in v.itertuples():
        per = " / ".join(f"{getattr(r, 'emulated_' + s):.1f}" for s in sessions
                         if hasattr(r, "emulated_" + s) and pd.notna(getattr(r, "emulated_" + s)))
        lo_hi = f" [{r.emulated_lo:.1f}, {r.emulated_hi:.1f}]" if pd.notna(r.emulated_lo) else ""
        lines.append(f"| {r.point} | {per or '—'} | {r.emulated:.1f}{lo_hi} | {r.measured:.1f} "
                     f"[{r.measured_lo:.1f}, {r.measured_hi:.1f}] | {r.err_pct:+.1f} | "
                     f"{'yes' if r.passed else '**no**'} |")
    from lora_moe_lab.config import get_shape
    from lora_moe_lab.model.tp import tp_shape

    r4 = tp_shape(get_shape("qwen3-30b-a3b"), 4)
    lines += ["", f"Then TP=4 (`qwen3-30b-a3b` at TP=4 rank shapes: expert intermediate {r4.intermediate}, "
                  f"{r4.num_heads} query heads, {r4.num_kv_heads} KV head(s)), 64 requests × 2048 tokens:", "",
              "| regime, chunk | the fix: input throughput | the fix: TTFT | sessions | agree |",
              "| --- | ---: | ---: | --- | --- |"]
    titles = {"tp4_default": "lab's own (lean host)", "tp4_prodlike": "production-like"}
    for task, g in p.groupby("task", sort=False):
        g = g.set_index("metric")
        thr, tt = g.loc["fix_throughput_gain_pct"], g.loc["fix_ttft_change_pct"]
        head, c = task.rsplit("_C", 1)
        per = ", ".join(f"{thr[s]:+.1f}" for s in sessions if s in thr and pd.notna(thr[s]))
        lines.append(f"| {titles.get(head, head)}, C={c} | {_gain(thr)} | {_gain(tt)} | {per} | "
                     f"{'yes' if thr.agree else '**no**'} |")
    lines += ["", "Why the sessions disagree under `sync`: the `sync` forward is host-bound after every sync, so "
                  "it follows the host's speed, which differs from machine to machine. The lean-host `cpu_flag` "
                  "forward at C=8192 shows it alone: one machine's host kept ahead of the GPU, the other's did "
                  "not (its per-repetition forwards scatter), while with 70 ms of earlier work queued ahead "
                  "(production-like) both sessions give the same `cpu_flag` forward. " + _clock_note(sessions) +
                  " What the emulation leaves out: another rank's host stall arriving late at a collective, "
                  "and NCCL's own choice of algorithm at four ranks."]
    return "\n".join(lines)


def kernels_base_block() -> str:
    """Issue 24: the base MoE GEMM's tuned tables against the rules (this lab's runs, paired) and
    against vLLM's tuned kernel (carried figures, direct and bridged), with the ncu counters."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    run = bg.load_base_run()
    v = bg.versus_peers()  # through the latest session that timed the carried run's own kernel
    ses = bg.base_sessions().set_index(["preset", "op", "M"])
    Ms = sorted(v.M.unique())
    out = [f"The base GEMM (`kernels/fused_moe.py`) with the tuned tile tables (`kernels/tile_tables/`, written by "
           f"`studies/kernels/record_base.py`, `data/kernels/{run.name}_*`, {run.label}): bf16, CUDA-graph replay, "
           "top-8 of 128, alignment outside the timed region. Gain = the rules' kernel (the tiles before the "
           "tables, predicate-free loads) over the table's, paired medians of 20 interleaved repetitions, "
           "percentile bootstrap 95 %; with more than one device session, the mean and the union of the sessions' "
           "intervals. vLLM's tuned `fused_moe_kernel` is carried (`data/kernels/peers_base_carried.csv`: another "
           "run, not this lab's script): direct = vLLM / ours; bridged = (vLLM / this lab's kernel in that same "
           "run) x (that kernel / the table's, this run).", "",
           "| preset, GEMM | " + " | ".join(f"M={m}" for m in Ms) + " |", "| --- |" + " ---: |" * len(Ms)]
    for (pre, op), g in v.groupby(["preset", "op"], sort=False):
        g = g.set_index("M")
        out.append(f"| {pre} {op}: table (µs, {v.run.iloc[0]}) | "
                   + " | ".join(f"{g.loc[m, 'table_us']:.1f}" for m in Ms) + " |")
        gs = ses.sort_index().loc[(pre, op)]
        out.append("| gain over the rules | " + " | ".join(
            f"{gs.loc[m, 'gain']:.2f}× [{gs.loc[m, 'lo']:.2f}, {gs.loc[m, 'hi']:.2f}]"
            + ("" if gs.loc[m, "agree"] else " (sessions disagree)") for m in Ms) + " |")
        out.append("| vs vLLM tuned: direct / bridged | " + " | ".join(
            f"{g.loc[m, 'direct']:.2f} / {g.loc[m, 'bridged']:.2f}" for m in Ms) + " |")
    n1, n115 = int(v.ge_1.sum()), int(v[v.M >= 1024].ge_1_15.sum())
    short = ", ".join(f"{r.preset} {r.op} M={r.M}" for r in v[~v.ge_1].itertuples())
    out += ["", f"- At least as fast as vLLM's tuned kernel by both ratios at {n1} of {len(v)} points; "
                f"≥ 1.15× at {n115} of {len(v[v.M >= 1024])} points with M ≥ 1024. Short of 1.0: {short}.",
            f"- Sessions: {ses.sessions.max()} of the gain over the rules. The vLLM figures are one carried run; "
            f"the bridge ({v.run.iloc[0]}, arm `{v.bridge_arm.iloc[0]}`) times "
            + ("the kernel that run measured" if v.bridge_arm.iloc[0] == "rules_masked" else
               "the rules' tiles with the predicate-free loads, not quite the kernel that run measured")
            + f", and it moved by {100 * (v.lab_now_us / v.lab_then_us - 1).abs().max():.0f} % at most between the two "
            "runs: the reason the bridged ratio is given beside the direct one."]
    nc = bg.load_counters()
    if nc is not None:
        q = nc[(nc.preset == "qwen3-30b-a3b") & (nc.M == 8192)].set_index(["op", "arm"])

        def c(op, arm, col):
            return q.loc[(op, arm), col]

        out += [
                f"- Counters (ncu, qwen3-30b-a3b, M=8192, one launch each): tensor pipe busy "
                f"{c('base_gate_up', 'table', 'tensor_pipe_pct'):.0f} % (table tile, TMA weights) against "
                f"{c('base_gate_up', 'table_masked', 'tensor_pipe_pct'):.0f} % (same tile, predicated pointer loads) "
                f"and {c('base_gate_up', 'rules', 'tensor_pipe_pct'):.0f} % (the rules' tile) in gate_up; DRAM "
                f"{c('base_gate_up', 'table', 'dram_pct_peak'):.0f} % of peak: at large M the GEMM is bound by "
                "feeding the tensor cores, not by memory. The LoRA down delta moves "
                f"{c('lora_down', 'table', 'dram_bytes_over_floor'):.2f}× its byte floor at "
                f"{c('lora_down', 'table', 'dram_pct_peak'):.0f} % of DRAM peak, top stall "
                f"`{c('lora_down', 'table', 'top_stall')}`, occupancy "
                f"{c('lora_down', 'table', 'achieved_occupancy_pct'):.0f} %: no wasted bytes from its scattered "
                "`out` rows; what limits it is the loads in flight per warp (below: the pipelined expand moved "
                "DRAM throughput with the bytes and the occupancy unchanged). The gate_up delta's x, "
                "gathered once per pair, costs no DRAM bytes "
                f"({c('lora_gate_up', 'table', 'dram_bytes_over_floor'):.2f}× "
                "a floor that counts x once): the repeats hit L2."]
        out += ["", _counters_table(bg)]
    out += ["", _persist_lines(bg), "", _stages_lines(bg)]
    return "\n".join(out)


def _persist_lines(bg) -> str:
    """The persistent / early-gather / sub-block builds the tables took, per round of persist sessions: paired ratios
    in every session of the round."""
    intro = {0: "two device sessions (603effa), 20 interleaved paired repetitions each",
             1: "persist_s3 and persist_s4 ran in one device session (15 and 20 repetitions) and the tables took "
                "their picks; persist_s5 (20) ran on a fresh machine against the tables before that",
             2: "two fresh machines (b58590e), 20 repetitions each, with one more stage, BLOCK_K 128, half the "
                "BLOCK_N and half-height sub-blocks beside the round-2 arms, at M = 1 and 16 too"}
    lines = []
    for i, names in enumerate(bg.PERSIST_ROUNDS):
        p = bg.persist_sessions(names)
        if i == 1:  # does the fresh machine's session change what the first two adopted?
            picked = lambda q: set(map(tuple, q[q.adopted][["preset", "op", "M", "arm"]].values.tolist()))
            same = picked(bg.persist_sessions(names[:2])) == picked(p)
            intro[1] += ", and " + ("takes the same builds at the same points" if same else "changes the picks")
        took = p[p.adopted].sort_values(["preset", "op", "M"])
        lines += ["" if lines else None,
                  f"Round {i + 1} of the table's tile against "
                  + ("persistent and early-gather", "persistent, early-gather and sub-block",
                     "persistent, early-gather, sub-block, look-ahead and half-tile")[min(i, 2)]
                  + " builds (`--sections persist`, "
                  + ", ".join(f"`data/kernels/{n}_*`" for n in names) + f": {intro.get(i, '')}; percentile "
                  "bootstrap 95 %). The tables took an arm only where its interval lay below 0.99 in every session of "
                  "the round, free of drift (`studies/kernels/record_base.py --adopt-persist`); arm / the table's tile "
                  "before:", "",
                  "| preset | GEMM | M | build | " + " | ".join(names) + " |",
                  "| --- | --- | ---: | --- |" + " ---: |" * len(names)]
        for r in took.itertuples():
            lines.append(f"| {r.preset} | {r.op} | {r.M} | `{getattr(r, 'tile_' + names[-1])}` | " + " | ".join(
                f"{getattr(r, 'r_' + n):.3f} [{getattr(r, 'lo_' + n):.3f}, {getattr(r, 'hi_' + n):.3f}]"
                for n in names) + " |")
    return "\n".join(x for x in lines if x is not None)


def _stages_lines(bg) -> str:
    """The LoRA down delta: the hand prefetch against Triton's pipelined expand, two sessions, with counters."""
    st = bg.stages_sessions()
    ses = list(dict.fromkeys(st.session))
    Ms = sorted(st.M.unique())
    lines = ["The LoRA down delta with Triton's pipelined expand (`expand_stages` 3, `configs.lora_down_config`) "
             "against the hand prefetch it replaced (`pf2`): µs and the share of the measured copy bandwidth, "
             "sweep medians of graph replays (not paired), in " + ", ".join(f"`{x}`" for x in ses) + ". The layer "
             "takes it at every M but 512, where the register cap of 128 beat both (M = 64 and 128: `stages_s3` "
             "only). The share of the copy moves with each session's measured copy bandwidth (4.1-4.2 TB/s), "
             "the µs do not:", "",
             "| preset | session | " + " | ".join(f"M={m}" for m in Ms) + " |", "| --- | --- |" + " ---: |" * len(Ms)]
    for (pre, se), g in st.groupby(["preset", "session"]):
        g = g.set_index("M")
        lines.append(f"| {pre} | {se} | " + " | ".join(
            f"{g.loc[m, 'pf2_us']:.1f} → {g.loc[m, 'xs3_us']:.1f} ({100 * g.loc[m, 'pf2_of_copy']:.0f} → "
            f"{100 * g.loc[m, 'xs3_of_copy']:.0f} %)" if m in g.index else "" for m in Ms) + " |")
    old, new = bg.load_counters(bg.NCU_REPEAT_RUN), bg.load_counters(bg.NCU_NOW_RUN)
    key = ["preset", "op", "M", "arm"]
    m = old.merge(new, on=key, suffixes=("_o", "_n"))
    m = m[(m.op == "lora_down") & (m.M == 8192)]
    lines += ["", "- Counters of the down delta at M=8192 before and after (ncu, `" + bg.NCU_REPEAT_RUN + "` → `"
              + bg.NCU_NOW_RUN + "`): " + "; ".join(
                  f"{r.preset}: DRAM {r.dram_pct_peak_o:.0f} → {r.dram_pct_peak_n:.0f} % of peak, bytes / floor "
                  f"{r.dram_bytes_over_floor_o:.2f} → {r.dram_bytes_over_floor_n:.2f}, occupancy "
                  f"{r.achieved_occupancy_pct_o:.0f} → {r.achieved_occupancy_pct_n:.0f} %, registers "
                  f"{r.registers_o:.0f} → {r.registers_n:.0f}, `{r.top_stall_n}` stall per instruction "
                  f"{r.top_stall_ratio_o:.2f} → {r.top_stall_ratio_n:.2f}" for r in m.itertuples())
              + ". The same bytes at the same occupancy in less time, with fewer cycles waiting on a load: the "
              "`out` tiles stream through shared memory, several in flight per program, where the hand prefetch "
              "held one in registers."]
    return "\n".join(lines)


def _counters_table(bg) -> str:
    """Every kernel the layer runs, at its representative sizes, with its counters (issue 24, deliverable 4)."""
    k = bg.kernel_counters()
    cs = bg.counter_sessions()
    lines = [f"Counters per kernel as the layer runs it (ncu, one profiled launch each, `data/kernels/{bg.NCU_NOW_RUN}_"
             "kernels_base_ncu.csv`; `of copy`: DRAM bytes per second over the measured device-to-device copy, "
             f"{json_copy_gbps():.0f} GB/s; durations under ncu are the counted launch's, not timings; a kernel that "
             "mostly reads can pass 100 %, since the copy both reads and writes):", "",
             "| preset | kernel | GEMM | M | µs | DRAM % of peak | of copy | bytes / floor | occupancy % | L2 hit % "
             "| registers | top stall |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| --- |"]
    for r in k.itertuples():
        kind = "base GEMM" if r.path == "base GEMM" else ("LoRA decode" if "decode" in r.kernel else "LoRA aligned")
        lines.append(f"| {r.preset} | {kind} | {r.gemm} | {r.M} | {r.duration_us:.1f} | {r.dram_pct_peak:.0f} | "
                     f"{100 * r.of_copy:.0f} % | {r.dram_bytes_over_floor:.2f} | {r.achieved_occupancy_pct:.0f} | "
                     f"{r.l2_hit_pct:.0f} | {r.registers:.0f} | `{r.top_stall}` |")
    same = cs[~cs.op.str.startswith("lora_down")]
    a, b = bg.BASE_RUN, bg.NCU_RUN
    d_pct = (same[f"dram_pct_peak_{b}"] - same[f"dram_pct_peak_{a}"]).abs().max()
    d_floor = (same[f"dram_bytes_over_floor_{b}"] - same[f"dram_bytes_over_floor_{a}"]).abs().max()
    lines += ["", f"- Two ncu sessions ({a}, {b}) counted {len(cs)} launches alike: DRAM % of peak "
                  f"within {d_pct:.1f} points and bytes / floor within {d_floor:.3f}"
                  " where the launch was the same; the LoRA down delta at M=8192 was not: "
                  f"{bg.BASE_RUN} launched it with the default LoRA config, {bg.NCU_RUN} with the layer's "
                  "(`configs.lora_down_config`), and the counted "
                  "launch went from "
                  + ", ".join(f"{r[f'duration_us_{a}']:.0f} to {r[f'duration_us_{b}']:.0f} µs ({r.preset})"
                              for _, r in cs[cs.op == "lora_down"].iterrows()) + "."]
    rep, c = bg.counter_sessions(b, bg.NCU_REPEAT_RUN), bg.NCU_REPEAT_RUN
    lines.append(f"- A second device session counted the same {len(rep)} launches ({c}, every row of the table above): "
                 f"DRAM % of peak within {(rep[f'dram_pct_peak_{c}'] - rep[f'dram_pct_peak_{b}']).abs().max():.1f} "
                 "points, bytes / floor within "
                 f"{(rep[f'dram_bytes_over_floor_{c}'] - rep[f'dram_bytes_over_floor_{b}']).abs().max():.3f}, the "
                 f"counted launch's duration {rep.duration_ratio.min():.3f}–{rep.duration_ratio.max():.3f}× "
                 f"(`analysers.base_gemm.counter_sessions('{b}', '{c}')`).")
    n, r = bg.NCU_NOW_RUN, bg.NCU_NOW_REPEAT_RUN
    now = bg.counter_sessions(n, r)
    lines.append(f"- The table's own counters ({n}, today's kernels) were counted again in another device session "
                 f"({r}, {len(now)} launches): DRAM % of peak within "
                 f"{(now[f'dram_pct_peak_{r}'] - now[f'dram_pct_peak_{n}']).abs().max():.1f} points, bytes / floor "
                 f"within {(now[f'dram_bytes_over_floor_{r}'] - now[f'dram_bytes_over_floor_{n}']).abs().max():.3f}, "
                 f"the counted launch's duration {now.duration_ratio.min():.3f}–{now.duration_ratio.max():.3f}×.")
    return "\n".join(lines)


def json_copy_gbps() -> float:
    return json.loads((DATA / "kernels" / "kernels.meta.json").read_text())["copy_gbps"]


def kernels_fold_block() -> str:
    """Issue 24: the LoRA path folded into the base GEMM against the separate deltas (this lab's run,
    paired), the layer's build, LoRA's share of the two GEMMs and of the layer, the sessions, the
    differential and the counters."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    run = bg.load_fold_run()
    t, sh = bg.fold_table(run), bg.gemm_share(run).set_index(["preset", "M"])
    lay, ses = bg.fold_layer(run), bg.fold_sessions()
    rnd, pre = bg.fold_check()
    Ms = sorted(t.M.unique())

    def ci(g, m, col, f=".2f"):
        return f"{g.loc[m, col]:{f}} [{g.loc[m, col + '_lo']:{f}}, {g.loc[m, col + '_hi']:{f}}]"

    out = [f"The folded LoRA path (`kernels/fused_moe_lora_folded.py`: a shrink kernel, then the base GEMM with the "
           "expand as extra K iterations) against the base GEMM + the separate delta "
           f"(`studies/kernels/record_fold.py`, `data/kernels/{run.name}_*`, {run.label}): bf16, rank 32, 4 adapters "
           "all live, every token with one, CUDA-graph replay, 20 interleaved paired repetitions, percentile "
           "bootstrap 95 %. `folded`: the base alignment, all LoRA rows side by side in the shrink, the expand's "
           "operands through TMA. `rows_ptr`, the layer's build (`configs.FOLDED_ORDER_BY_ROW`): the alignment "
           "ordered by LoRA row inside each expert, the per-row shrink, pointer loads in the expand.", "",
           "| preset, GEMM | " + " | ".join(f"M={m}" for m in Ms) + " |", "| --- |" + " ---: |" * len(Ms)]
    for (p_, op), g in t.groupby(["preset", "op"], sort=False):
        g = g.set_index("M")
        out.append(f"| {p_} {op}: base GEMM (µs) | " + " | ".join(f"{g.loc[m, 'base_us']:.1f}" for m in Ms) + " |")
        out.append("| delta: separate / folded / rows_ptr (µs) | " + " | ".join(
            f"{g.loc[m, 'delta_separate_us']:.1f} / {g.loc[m, 'delta_folded_us']:.1f} / "
            f"{g.loc[m, 'delta_rows_ptr_us']:.1f}" for m in Ms) + " |")
        out.append("| folded / separate | " + " | ".join(ci(g, m, "folded_over_separate") for m in Ms) + " |")
        out.append("| rows_ptr / separate | " + " | ".join(ci(g, m, "rows_ptr_over_separate") for m in Ms) + " |")
        out.append("| rows_ptr GEMM, all disabled / base | " + " | ".join(
            f"{g.loc[m, 'gemm_rows_off_over_base']:.2f}" + ("" if g.loc[m, "stable"] else " (unstable)") for m in Ms)
            + " |")
    for p_ in t.preset.unique():
        out.append(f"| {p_}: LoRA's share of the two GEMMs, separate / folded | " + " | ".join(
            f"{100 * sh.loc[(p_, m), 'separate_share']:.0f} / {100 * sh.loc[(p_, m), 'folded_share']:.0f} %"
            for m in Ms) + " |")
    LM = sorted(lay.M.unique())
    out += ["", "LoRA's share of one whole MoE layer (router, alignment, both GEMMs, SiLU, top-k sum; graph replay; "
                "median of the paired per-round shares, bootstrap 95 %), all adapters live unless named:", "",
            "| preset, LoRA path | " + " | ".join(f"M={m}" for m in LM) + " |", "| --- |" + " ---: |" * len(LM)]
    for p_, g in lay.groupby("preset", sort=False):
        g = g.set_index("M")
        for nm, what in (("separate_all", "separate deltas"), ("folded_all", "both GEMMs folded"),
                         ("folded_none", "both folded, every adapter disabled"),
                         ("down_folded", "down GEMM folded"), ("picked_all", "the table's pick")):
            if g[f"{nm}_share_pct"].notna().all():
                out.append(f"| {p_}: {what} | " + " | ".join(f"{ci(g, m, f'{nm}_share_pct', '.1f')} %" for m in LM)
                           + " |")
    wins = int((t.folded_over_separate_hi < 1.0).sum())
    rwins = t[t.rows_ptr_over_separate_hi < 1.0]
    c = bg.fold_counters().set_index(["preset", "op", "arm"])
    q, q4 = "qwen3-30b-a3b", "qwen3-30b-a3b-tp4"
    two = ses[ses.sessions.map(len) > 1]
    out += ["", f"- `folded` is faster than the separate deltas at {wins} of {len(t)} points; the layer's build "
                f"at {len(rwins)}: " + (", ".join(f"{r.preset} {r.op} M={r.M}" for r in rwins.itertuples()) or "none")
            + ". " + _fold_layer_verdict(lay),
            f"- Device sessions ({', '.join(bg.FOLD_SESSIONS)}): {len(two)} figures recorded in more than one, "
            f"{int(two.agree.sum())} with overlapping intervals: one session's bootstrap interval is narrower than "
            "the spread between sessions, so the honest range of a figure is the union over the sessions "
            "(`analysers.base_gemm.fold_sessions()`, per figure). Spread between sessions, median and largest: "
            + "; ".join(
                f"{fig} {g.spread.median():.3f} and {g.spread.max():.3f} ({g.loc[g.spread.idxmax(), 'preset']} "
                f"{g.loc[g.spread.idxmax(), 'op']} M={g.loc[g.spread.idxmax(), 'M']})"
                for fig, g in two.groupby("figure", sort=False)) + ".",
            "- Correct against float64: " + ", ".join(
                f"{int(r.cases)} random cases of the {'folded GEMM' if r.op == 'random_folded' else 'base GEMM builds'}"
                f" ({int(r.failures)} failures)" for r in rnd.itertuples())
            + f", {len(pre)} cases of the folded path at the presets' shapes "
            f"({int((~pre.ok.astype(bool)).sum())} failures); rows without a live adapter bit for bit the plain "
            f"GEMM's (`data/kernels/{bg.FOLD_CHECK_RUN}_*`, section check).",
            f"- Counters (ncu, M=8192, one launch each, `data/kernels/{bg.FOLD_NCU_RUN}_kernels_fold_ncu.csv`): "
            "registers per thread, plain → folded GEMM, "
            f"{c.loc[(q, 'plain_gate_up', 'plain'), 'registers']:.0f} → "
            f"{c.loc[(q, 'folded_gate_up', 'folded_ptr'), 'registers']:.0f} (qwen3 gate_up), "
            f"{c.loc[(q4, 'plain_gate_up', 'plain'), 'registers']:.0f} → "
            f"{c.loc[(q4, 'folded_gate_up', 'folded_ptr'), 'registers']:.0f} (TP=4 gate_up, achieved occupancy "
            f"{c.loc[(q4, 'plain_gate_up', 'plain'), 'achieved_occupancy_pct']:.0f} → "
            f"{c.loc[(q4, 'folded_gate_up', 'folded_ptr'), 'achieved_occupancy_pct']:.0f} %). The TMA expand: "
            f"{c.loc[(q, 'folded_gate_up', 'folded'), 'registers']:.0f} registers against "
            f"{c.loc[(q, 'folded_gate_up', 'folded_ptr'), 'registers']:.0f} for pointer loads, with "
            f"{c.loc[(q, 'folded_gate_up', 'folded'), 'instructions'] / c.loc[(q, 'folded_gate_up', 'folded_ptr'), 'instructions']:.2f}× "  # noqa: E501
            "the instructions (qwen3 gate_up). The per-row shrink: "
            f"{c.loc[(q, 'shrink_gate_up', 'folded_rows'), 'registers']:.0f} registers against "
            f"{c.loc[(q, 'shrink_gate_up', 'folded'), 'registers']:.0f}, DRAM bytes "
            f"{c.loc[(q, 'shrink_gate_up', 'folded_rows'), 'dram_bytes_over_floor']:.2f}× its floor against "
            f"{c.loc[(q, 'shrink_gate_up', 'folded'), 'dram_bytes_over_floor']:.2f}× (x read once per row present). "
            "docs/kernels.md reads them."]
    return "\n".join(out)


def _fold_layer_verdict(lay) -> str:
    """Why the layer's table folds what it folds, from the layer section's arms and the committed table."""
    from lora_moe_lab.kernels import configs
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    table = ", ".join(f"{op} at buckets {sorted(b)}" for op, b in configs.FOLDED_LORA_TOKENS.items() if b) or "nothing"
    if lay.down_folded_over_separate.isna().all():
        return (f"`kernels/configs.py: FOLDED_LORA_TOKENS` folds {table}; this run did not time the layer with "
                "the down GEMM alone folded.")
    ses = bg.fold_sessions(bg.FOLD_LAYER_SESSIONS)
    dn = ses[ses.figure == "down_folded_over_separate"]
    w = dn[dn.hi < 1.0]
    return ("In the layer, the down GEMM alone folded over the separate deltas (the alignment ordered by LoRA row "
            f"in Triton; sessions {', '.join(bg.FOLD_LAYER_SESSIONS)}, mean and union of the 95 % intervals): "
            + ", ".join(f"{r.preset} M={r.M} {r.estimate:.3f} [{r.lo:.3f}, {r.hi:.3f}]" for r in dn.itertuples())
            + f"; faster in every session at {len(w)} of {len(dn)} sizes: the rows build folds nowhere. "
            f"`kernels/configs.py: FOLDED_LORA_TOKENS` now folds {table} with the packed build (block kernels-packed), "
            "so these sessions' `picked_all` (the table of their day: nothing folded) is not the layer as committed.")


def _runs_of_cases(chk) -> str:
    """'1000 random cases in each of 2 runs' (one run: '1000 random cases'), from `packed_check()`'s rows."""
    n = sorted(set(int(c) for c in chk.cases))
    per = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    return f"{per} random cases" + (f" in each of {len(chk)} runs" if len(chk) > 1 else "")


def kernels_fold_headline_block() -> str:
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.kernels import configs

    ses, chk = bg.packed_sessions(), bg.packed_check()
    cl = bg.committed_layer()
    big = cl[cl.M >= 1024]
    dn = ses[(ses.op == "down") & (ses.M >= 128)]
    dn = dn[dn.figure == dn.M.map(lambda m: "packed_slot_over_separate" if configs.token_bucket(int(m))
                                  in configs.PACKED_PER_SLOT_TOKENS else "packed_over_separate")]
    n = len(bg.PACKED_SESSIONS)
    return ("LoRA packed into the base GEMM (`kernels/fused_moe_lora_packed.py`: a shrink kernel writes each pair's "
            "rank-R result in its adapter slot's columns, the base GEMM adds them as TMA-fed extra K iterations on its "
            f"own tile table): correct ({_runs_of_cases(chk)} on the H200, {int(chk.failures.sum())} "
            f"failures). The down GEMM with it is {dn.lo.min():.2f}–{dn.hi.max():.2f}× the separate delta at "
            f"M ≥ 128 ({n} sessions, union of the 95 % intervals); the layer folds {_folds_text()}. At the committed "
            f"table ({', '.join(big.session.unique())}) LoRA's share of the layer at M ≥ 1024 is "
            + ", ".join(f"{p_} {g.all_lo.min():.1f}–{g.all_hi.max():.1f} % (separate deltas "
                        f"{g.separate_lo.min():.1f}–{g.separate_hi.max():.1f} %)"
                        for p_, g in big.groupby("preset", sort=False))
            + f", still above the issue's 12 % and 20 %; the down GEMM takes the wide build at {_wide_text()}; "
            f"{_wide_gate_up_text()}. `docs/results.md`, block kernels-packed. {_share_floor_clause()}")


def _share_floor_clause() -> str:
    """The share goals against LoRA's floor and against a leaner base layer (block kernels-share)."""
    from lora_moe_lab.instruments.analysers import floors as fl

    s, lb = fl.share_floors(), fl.lean_base_shares()
    at = s[s.M == 1024]
    return ("At M = 1024 the share goals ask for " + f"{at.goal_of_floor.min():.2f}–{at.goal_of_floor.max():.2f}× "
            "LoRA's floor, the least time its adapters' bytes and FLOPs take: out of any kernel's reach. The lab's "
            "base layer spends " + ", ".join(f"{g.torch_parts_pct.min():.0f}–{g.torch_parts_pct.max():.0f} % ({p_})"
                                        for p_, g in lb.groupby("preset", sort=False))
            + " of its kernel time in torch parts an engine fuses (an fp32 router, SiLU and mul, the top-k sum); "
            "with those at their floors the same LoRA time is " + ", ".join(
                f"{g.lean_share_pct.min():.1f}–{g.lean_share_pct.max():.1f} % ({p_})"
                for p_, g in lb.groupby("preset", sort=False)) + " of the layer: block kernels-share.")


def _wide_gate_up_text() -> str:
    """gate_up's wide build per block: where the layer takes it and what it measured (analysers.base_gemm)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.kernels import configs

    sp = bg.ratio_spread(bg.wide_gate_up_trials(), bg.WIDE_GU_SESSIONS)
    q = sp[(sp.preset == "qwen3-30b-a3b") & (sp.M >= 4096)]
    path = q[q.figure == "path_wide_blk_w1_over_committed"]
    lay = bg.layer_tables(tuple(n for n, _ in bg.WIDE_GU_LAYER))
    lay = lay[(lay.figure == "picked_all_over_prev") & (lay.preset == "qwen3-30b-a3b") & (lay.M >= 8192)]
    c = bg.shrink_order_counters()
    byt = c.set_index("arm").dram_bytes_over_floor
    exp, slot = byt[byt.index.str.endswith("_expert")], byt[byt.index.str.endswith("_slot")]
    ol = bg.layer_tables(tuple(n for n, _ in bg.ORDER_LAYER))
    ol = ol[(ol.figure == "picked_all_over_prev") & (ol.preset == "qwen3-30b-a3b") & (ol.M >= 4096)]
    return (f"qwen3-30b-a3b's gate_up takes its wide build per block at {sorted(configs.WIDE_GATE_UP_TOKENS)} (each "
            f"pair's u past K in its token's row, each tile walking only its block's slots): "
            f"{path.lo.min():.2f}–{path.hi.max():.2f}× the packed path ({', '.join(bg.WIDE_GU_SESSIONS)}), the layer "
            f"{lay.lo.min():.3f}–{lay.hi.max():.3f}× at M ≥ 8192 ({', '.join(n for n, _ in bg.WIDE_GU_LAYER)}); its "
            f"shrink takes its blocks slot by slot: DRAM bytes {exp.min():.2f} → {slot.max():.2f}× the floor "
            f"({', '.join(bg.ORDER_NCU_RUNS)}), the layer {ol.value.min():.3f}–{ol.value.max():.3f}× at qwen3 "
            f"M ≥ 4096 ({', '.join(n for n, _ in bg.ORDER_LAYER)}); {_down_window_text()}")


def _down_window_text() -> str:
    """down's window in the headline: where the layer takes it and the layer's figure there."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.kernels import configs

    lay = bg.layer_tables(tuple(n for n, _ in bg.WINDOW_LAYER))
    lay = lay[(lay.figure == "picked_all_over_prev") & lay.M.isin(configs.WIDE_DOWN_WINDOW_TOKENS)]
    return (f"the down GEMM walks a window of two slots' columns at {sorted(configs.WIDE_DOWN_WINDOW_TOKENS)}: the "
            "layer " + ", ".join(f"{g.lo.min():.3f}–{g.hi.max():.3f}× ({p_})" for p_, g in lay.groupby(
                "preset", sort=False)) + f" ({', '.join(n for n, _ in bg.WINDOW_LAYER)})")


def _wide_text() -> str:
    """Where the down GEMM takes the wide build and what it measured (analysers.base_gemm.wide_*)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.kernels import configs

    sp = bg.ratio_spread(bg.wide_trials(), bg.WIDE_SESSIONS)
    big = sp[sp.M >= 4096]
    path = big[big.figure == big.M.map(lambda m: "path_wide_w1_over_committed" if configs.token_bucket(int(m))
                                       in configs.PACKED_SHRINK_TOKENS else "path_wide_over_committed")]
    off = sp[sp.figure == "off_wide_over_base"]
    chk = bg.wide_check()
    return (f"the token buckets {sorted(configs.WIDE_DOWN_TOKENS)} (`moe_gemm_lora_wide`: u and B_packed as columns "
            f"past K of its own x and w, walked by the plain GEMM's loop): {path.lo.min():.2f}–{path.hi.max():.2f}× "
            f"the packed path at M ≥ 4096, its GEMM with every adapter disabled {off.lo.min():.2f}–"
            f"{off.hi.max():.2f}× the plain GEMM ({', '.join(bg.WIDE_SESSIONS)}; {_runs_of_cases(chk)}, "
            f"{int(chk.failures.sum())} failures)")


def _folds_text() -> str:
    """Where the layer folds: per op (FOLDED_LORA_TOKENS), then per GEMM shape (FOLDED_LORA_SHAPE_TOKENS)."""
    from lora_moe_lab.kernels import configs

    out = [f"{op} at the token buckets {sorted(b)}" for op, b in configs.FOLDED_LORA_TOKENS.items() if b]
    out += [f"{op} of shape N={n}, K={k} also at {sorted(b)}" for (op, n, k), b in
            configs.FOLDED_LORA_SHAPE_TOKENS.items() if b]
    return ", ".join(out)


def kernels_packed_block() -> str:
    """Issue 24: the packed build against the separate deltas (kernels, both sessions), the layer as committed, the
    disabled cost, the differential and the counters (analysers/base_gemm.py: packed_*)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.kernels import configs

    ses, chk, c = bg.packed_sessions(), bg.packed_check(), bg.packed_counters()
    cl = bg.committed_layer()
    out = ["The packed LoRA path (`kernels/fused_moe_lora_packed.py`; `configs.FOLD_BUILD = \"packed\"`) against "
           "today's separate delta with its LoRA alignment, per GEMM: the GEMM with its shrink over the base GEMM + "
           "the separate delta (paired ratios, 20 rounds, percentile bootstrap 95 %, the mean over "
           f"{', '.join(bg.PACKED_SESSIONS)} and the union of their intervals). `packed`: one expand dot over every "
           "slot on the plain alignment; `per slot`: one dot per slot on the alignment ordered by LoRA row (its extra "
           "alignment time included); `GEMM off`: the packed GEMM with nothing live over the plain GEMM.", "",
           "| preset | op | M | packed / separate | per slot / separate | GEMM off / base |",
           "| --- | --- | --- | --- | --- | --- |"]
    piv = {f: ses[ses.figure == f].set_index(["preset", "op", "M"]) for f in
           ("packed_over_separate", "packed_slot_over_separate", "gemm_packed_off_over_base")}
    for key in piv["packed_over_separate"].index:
        cells = [f"{piv[f].loc[key, 'estimate']:.3f} [{piv[f].loc[key, 'lo']:.3f}, {piv[f].loc[key, 'hi']:.3f}]"
                 for f in piv]
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    out += ["", "The layer (one MoE layer, CUDA-graph replay) at the committed table, in each session that ran it "
            f"({', '.join(f'{n}: `{a}_*`' for n, a in bg.COMMITTED_LAYER)}): LoRA's share of the layer in % "
            "(paired, bootstrap 95 %).", "",
            "| session | preset | M | separate deltas | as committed | committed, every adapter disabled |",
            "| --- | --- | --- | --- | --- | --- |"]

    def ci(r, col, f=".1f"):
        return f"{getattr(r, col):{f}} [{getattr(r, col + '_lo'):{f}}, {getattr(r, col + '_hi'):{f}}]"

    for r in cl.itertuples():
        out.append(f"| {r.session} | {r.preset} | {r.M} | {ci(r, 'separate')} | {ci(r, 'all')} | {ci(r, 'none')} |")
    g = c.set_index(["preset", "op", "arm"])
    cnt = []
    for pre in dict.fromkeys(c.preset):
        for op in ("gate_up", "down"):
            pl, pk, sh = (g.loc[(pre, f"{k}_{op}", a)] for k, a in (("plain", "plain"), ("folded", "packed"),
                                                                     ("shrink", "packed")))
            cnt.append(f"{pre} {op}: plain GEMM {pl.duration_us:.0f} µs at {pl.registers:.0f} registers, packed GEMM "
                       f"{pk.duration_us:.0f} µs at {pk.registers:.0f}, occupancy {pl.achieved_occupancy_pct:.0f} → "
                       f"{pk.achieved_occupancy_pct:.0f} %; shrink {sh.duration_us:.0f} µs, DRAM bytes "
                       f"{sh.dram_bytes_over_floor:.2f}× its floor, top stall {sh.top_stall}")
    out += ["", f"- The table folds {_folds_text()} (`configs.FOLDED_LORA_TOKENS`, `FOLDED_LORA_SHAPE_TOKENS`; one "
            f"dot per slot at the buckets {sorted(configs.PACKED_PER_SLOT_TOKENS)}, the shrink's and the expand's "
            f"options per bucket in `PACKED_SHRINK_TOKENS` and `PACKED_EXPAND_TOKENS`); "
            "`analysers.base_gemm.packed_choice()` re-derives where the per-op build the layer takes beat the "
            "separate delta on both presets in every session, and a test holds the per-op table to it.",
            f"- Correct against float64 on the H200: {_runs_of_cases(chk)} of the packed build "
            f"({int(chk.failures.sum())} failures, worst relative error {chk.worst.max():.1e}; dense and per slot, "
            "plain and ordered alignment, persistent grids over sub-blocks; win_s4c on also every shrink option: "
            "slot windows, both slices, a register cap; exp_s1c and exp_s2c also the expand without a loop, its L2 "
            "prefetch and two slots per dot), rows without a live adapter bit for bit the plain GEMM's "
            f"(`data/kernels/{'_*`, `'.join(chk.run)}_*`); the presets' shapes at M = 1..8192 in fold_s12c's log.",
            "- Counters (ncu, M=8192, one launch each, `data/kernels/fold_s12_kernels_fold_ncu.csv`, beside "
            f"{bg.NCU_NOW_RUN}'s plain GEMM): " + "; ".join(cnt) + "."]
    return "\n".join(out + [""] + _wide_lines() + [""] + _wide_gate_up_lines() + [""] + _slot_order_lines() + [""]
                     + _down_window_lines())


def _slot_order_lines() -> list[str]:
    """gate_up's shrink slot by slot: the shrink alone per mapping (given order, with its kernel), the counters, the
    gate_up path and the layer with it (analysers.base_gemm.shrink_order_*, ORDER_*)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    names = bg.ORDER_SESSIONS
    sp = bg.ratio_spread(bg.shrink_order_trials(), names)
    paid = bg.shrink_order_trials(names[-1:])
    out = ["gate_up's W1S shrink with its blocks slot by slot (`lora_shrink_packed(slot_order=True)`, the order by "
           "`align.slot_major_order`), the shrink alone at qwen3-30b-a3b's gate_up, each arm a CUDA graph, over the "
           f"same shrink in the alignment's block order (mean of {', '.join(names)} and the union of their 95 % "
           f"intervals; with its order kernel: {names[-1]}, paired 95 %). `random`: each token's adapter drawn at "
           "random; `requests`: 8 requests of contiguous tokens, one adapter each.", "",
           "| M | random, order given | requests, order given | random, with its kernel | requests, with its kernel |",
           "| --- | --- | --- | --- | --- |"]
    for M, g in sp.groupby("M", sort=True):
        r = {f: g[g.figure == f].iloc[0] for f in g.figure}
        p_ = {f: paid[(paid.M == M) & (paid.figure == f)].iloc[0] for f in
              ("random_slot_paid_over_expert", "requests_slot_paid_over_expert")}
        cells = [f"{sum(r[f][n] for n in names) / len(names):.3f} [{r[f].lo:.3f}, {r[f].hi:.3f}]"
                 for f in ("random_slot_over_expert", "requests_slot_over_expert")]
        cells += [f"{v.value:.3f} [{v.lo:.3f}, {v.hi:.3f}]" for v in p_.values()]
        out.append(f"| {M} | " + " | ".join(cells) + " |")
    c = bg.shrink_order_counters()
    out += ["", "Counters (ncu, M = 8192, one launch each, " + ", ".join(bg.ORDER_NCU_RUNS) + "): " + "; ".join(
        f"{r.session} {r.arm} {r.duration_us:.0f} µs, DRAM bytes {r.dram_bytes_over_floor:.2f}x the floor, L2 hit "
        f"{r.l2_hit_pct:.0f} %" for r in c.itertuples()) + "."]
    wg = bg.ratio_spread(bg.wide_gate_up_trials(bg.ORDER_PATH_SESSIONS), bg.ORDER_PATH_SESSIONS)
    w = wg[(wg.figure == "path_wide_blk_w1o_over_w1") & (wg.preset == "qwen3-30b-a3b")]
    out += ["", f"qwen3's gate_up path with it over the path without ({', '.join(bg.ORDER_PATH_SESSIONS)}, the union): "
            + "; ".join(f"M={int(r.M)} {r.lo:.3f}–{r.hi:.3f}" for r in w.itertuples()) + "."]
    lay = bg.layer_tables(tuple(n for n, _ in bg.ORDER_LAYER))
    lay = lay[(lay.preset == "qwen3-30b-a3b") & (lay.M >= 4096)]
    out += ["", "The layer at the committed tables over the same tables with the shrink in block order "
            f"({', '.join(n for n, _ in bg.ORDER_LAYER)}), qwen3-30b-a3b: " + "; ".join(
                f"M={int(M)} " + ", ".join(f"{r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]" for r in g[
                    g.figure == "picked_all_over_prev"].itertuples()) + " (disabled " + ", ".join(
                    f"{r.value:.3f}" for r in g[g.figure == "picked_none_over_prev"].itertuples()) + ")"
                for M, g in lay.groupby("M", sort=True)) + "."]
    return out


def _down_window_lines() -> list[str]:
    """down's window of two slots: the path with it, how often it held, and the layer (base_gemm.down_window,
    WINDOW_LAYER)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.kernels import configs

    d = bg.down_window()
    out = ["The down GEMM's wide build in a window of two slots' columns (`moe_gemm_lora_wide(window=)`, `Tail.win`: "
           "each pair's u written shifted to its block's window, w's tail read from the same shift through TMA, one "
           "trip count per launch, all C where a block's live slots spill over), the path over the layer's path "
           "without it on the same ordered alignment (" + ", ".join(bg.WINDOW_SESSIONS) + ", paired 95 %), and the "
           "share of the timed sets whose every block fit a window:", "",
           "| preset | M | window held | path with it / without | disabled / the plain GEMM |",
           "| --- | ---: | ---: | --- | --- |"]
    for r in d.itertuples():
        out.append(f"| {r.preset} | {r.M} | {r.win_held:.0%} | {r.path_wide_win_over_ordc:.3f} "
                   f"[{r.path_wide_win_over_ordc_lo:.3f}, {r.path_wide_win_over_ordc_hi:.3f}] | "
                   f"{r.path_wide_win_off_over_base:.3f} [{r.path_wide_win_off_over_base_lo:.3f}, "
                   f"{r.path_wide_win_off_over_base_hi:.3f}] |")
    lay = bg.layer_tables(tuple(n for n, _ in bg.WINDOW_LAYER))
    lay = lay[(lay.M >= 8192) & (lay.figure == "picked_all_over_prev")]
    out += ["", f"The layer takes it at {sorted(configs.WIDE_DOWN_WINDOW_TOKENS)}. The layer with it over the same "
            f"tables without ({', '.join(n for n, _ in bg.WINDOW_LAYER)}; lay_s9 also ran it at 8192): " + "; ".join(
                f"{p_} M={int(M)} " + ", ".join(f"{r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]" for r in g.itertuples())
                for (p_, M), g in lay.groupby(["preset", "M"], sort=False))
            + "."]
    return out


def _wide_gate_up_lines() -> list[str]:
    """gate_up's wide build: per point over its sessions, the path over the committed packed path and over the
    separate delta, its GEMM alone and disabled; the layer with it; the counters (analysers.base_gemm)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    names = bg.WIDE_GU_SESSIONS
    sp = bg.ratio_spread(bg.wide_gate_up_trials(), names).set_index(["figure", "preset", "M"])
    figs = ("path_wide_over_committed", "path_wide_blk_over_committed", "path_wide_blk_w1_over_committed",
            "gemm_wide_blk_over_base", "path_wide_blk_off_over_base", "path_committed_off_over_base")
    out = ["gate_up's wide build (`moe_gemm_lora_wide(gather=True)`: each pair's u in the columns K + j·C of its "
           "token's row, the GEMM's row pointers jump there between two K steps; `per_block`: each tile walks only "
           "its block's slots' columns of its own slice) against the layer's committed packed path, end to end with "
           f"their alignment's extra time (mean of {', '.join(names)} and the union of their 95 % intervals). "
           "`all C`: every tile over every slot's columns of both slices; `blk`: per block, on the ordered alignment, "
           "with the committed shrink at M; `blk W1S`: with the W1S shrink (the layer's); `GEMM blk / plain`: the "
           "GEMM alone over the plain GEMM on the same alignment; `off`: every adapter disabled, the path over the "
           "plain GEMM.", "",
           "| preset | M | all C / packed | blk / packed | blk W1S / packed | GEMM blk / plain | blk off / plain "
           "| packed off / plain |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    out += _spread_rows(sp, figs, names)
    t = bg.wide_gate_up_trials(names[-1:])
    sep = t[t.figure == "path_wide_blk_w1_over_separate"]
    out += ["", f"Over the separate delta ({names[-1]}, paired 95 %), blk W1S: " + "; ".join(
        f"{r.preset} M={int(r.M)} {r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]" for r in sep.itertuples()) + "."]
    lay = bg.layer_tables(tuple(n for n, _ in bg.WIDE_GU_LAYER))
    lay = lay[(lay.figure == "picked_all_over_prev") & (lay.M >= 1024)]
    out += ["", "The layer at the committed tables over the tables before gate_up's wide build (`picked_all_over_prev`,"
            f" {', '.join(n for n, _ in bg.WIDE_GU_LAYER)}; lay_s3 ran qwen3 M = 4096 before its fold there): "
            + "; ".join(f"{p_} M={int(M)} " + ", ".join(f"{r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]"
                                                         for r in g.itertuples())
                        for (p_, M), g in lay.groupby(["preset", "M"], sort=False)) + "."]
    c = bg.wide_gate_up_counters().set_index(["preset", "op", "arm"])
    out.append("\nCounters (ncu, M = 8192, one launch each, `data/kernels/wg_n1_*`, `wg_n2_*`), gate_up's GEMM: "
               + "; ".join(f"{pre} " + ", ".join(
                   f"{arm} {c.loc[(pre, 'folded_gate_up', arm)].duration_us:.0f} µs (tensor pipe "
                   f"{c.loc[(pre, 'folded_gate_up', arm)].tensor_pipe_pct:.0f} %)"
                   for arm in ("packed_slot_w1s", "wide_both", "wide_blk"))
                   for pre in dict.fromkeys(c.index.get_level_values(0))) + ".")
    return out


def _spread_rows(sp, figs, names) -> list[str]:
    """Table rows per (preset, M) of a `ratio_spread` indexed by (figure, preset, M): each figure's mean over the
    sessions `names` and the union of their intervals."""
    rows = []
    for pre, M in sp.loc[figs[0]].index:
        cells = [f"{sum(r[n] for n in names) / len(names):.3f} [{r.lo:.3f}, {r.hi:.3f}]"
                 for r in (sp.loc[(f, pre, M)] for f in figs)]
        rows.append(f"| {pre} | {M} | " + " | ".join(cells) + " |")
    return rows


def _wide_lines() -> list[str]:
    """The down GEMM's wide build: the path and the disabled GEMM per point over both sessions, the layer with it
    over the layer without it, the counters (analysers.base_gemm.wide_*)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    sp = bg.ratio_spread(bg.wide_trials(), bg.WIDE_SESSIONS).set_index(["figure", "preset", "M"])
    figs = ("path_wide_over_committed", "path_wide_w1_over_committed", "off_wide_over_base",
            "path_committed_off_over_base")
    out = ["The down GEMM's wide build (`moe_gemm_lora_wide`: the shrink writes u into the columns past K of the "
           "down GEMM's own input rows, w2 carries B_packed in its columns past K, and the plain GEMM's K loop walks "
           "them when the shrink says an adapter is live) against the layer's committed packed path, both end to end "
           f"with their alignment's extra time (mean of {', '.join(bg.WIDE_SESSIONS)} and the union of their 95 % "
           "intervals). `W1S`: on the ordered alignment with the committed W1S shrink; `off`: every adapter disabled, "
           "the GEMM alone (wide) or the path (packed) over the plain GEMM.", "",
           "| preset | M | wide / packed | wide W1S / packed | wide GEMM off / plain | packed path off / plain |",
           "| --- | --- | --- | --- | --- | --- |"]
    out += _spread_rows(sp, figs, bg.WIDE_SESSIONS)
    lay = bg.wide_layer()
    out += ["", "The layer at the committed tables over the same tables without the wide build (`picked_all_over_prev`,"
            f" {', '.join(n for n, _ in bg.WIDE_LAYER)}): "
            + "; ".join(f"{p_} M={int(M)} " + ", ".join(f"{r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]"
                                                         for r in g.itertuples())
                        for (p_, M), g in lay[lay.M >= 1024].groupby(["preset", "M"], sort=False)) + "."]
    c = bg.wide_counters().set_index(["preset", "op", "arm"])
    out.append("\nCounters (ncu, M = 8192, one launch each, `data/kernels/wide_s1_kernels_fold_ncu.csv`): "
               + "; ".join(f"{pre} down GEMM wide {c.loc[(pre, 'folded_down', 'wide')].duration_us:.0f} µs, tensor "
                           f"pipe {c.loc[(pre, 'folded_down', 'wide')].tensor_pipe_pct:.0f} %, top stall "
                           f"`{c.loc[(pre, 'folded_down', 'wide')].top_stall}` against packed "
                           f"{c.loc[(pre, 'folded_down', 'packed_slot_w1s')].duration_us:.0f} µs, "
                           f"{c.loc[(pre, 'folded_down', 'packed_slot_w1s')].tensor_pipe_pct:.0f} %, "
                           f"`{c.loc[(pre, 'folded_down', 'packed_slot_w1s')].top_stall}`"
                           for pre in dict.fromkeys(c.index.get_level_values(0))) + ".")
    return out


FLOOR_NAME = {"bytes": "byte", "flops": "FLOP"}  # floors.gemm_floor's `bound` in a sentence


def kernels_floors_block() -> str:
    """Issue 24: the H200's ceilings, each base GEMM point against its roofline floor and what the 1.15x goal
    demands of it, and the down delta's narrower tiles with their counters (analysers/floors.py)."""
    from lora_moe_lab.instruments.analysers import base_gemm as bg
    from lora_moe_lab.instruments.analysers import floors as fl

    from lora_moe_lab.config import get_shape

    c = fl.ceilings()
    tp4_k = get_shape("qwen3-30b-a3b-tp4").intermediate  # the down GEMM's K
    vs = bg.peer_sessions()
    gfs = [fl.goal_floors(v, c) for v in vs]
    g = gfs[-1].set_index(["preset", "op", "M"])
    (c0, c1), (m0, m1) = c["copy_range"], c["matmul_range"]
    out = [f"Ceilings measured on the H200 ({', '.join(f'`{r}`' for r in c['runs'])}; `harness.copy_bandwidth`, "
           f"`harness.matmul_rate`): device-to-device copy {c0 / 1e3:.2f}–{c1 / 1e3:.2f} TB/s (bytes read + written), "
           f"bf16 8192³ cuBLAS product {m0:.0f}–{m1:.0f} TFLOP/s on random data. A GEMM's floor is the larger of its "
           "bytes (the used "
           "experts' weights, its input and its output, once each) over the highest copy figure and its FLOPs over "
           "the highest matmul figure (`analysers/floors.py`); `of floor` = floor / time, 1.0 at the roofline. "
           "Times: the table's kernel in " + " and ".join(f"`{v.run.iloc[0]}`" for v in vs) + ", vLLM's tuned "
           "kernel carried (one run). `goal` = what a kernel 1.15× faster than vLLM's would need:", "",
           "| preset | GEMM | M | bound | floor (µs) | table, of floor | vLLM, of floor | goal, of floor |",
           "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for key, r in g.iterrows():
        ours = " / ".join(f"{x.set_index(['preset', 'op', 'M']).loc[key, 'ours_of_floor']:.2f}" for x in gfs)
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {r.bound} | {r.floor_us:.1f} | {ours} | "
                   f"{r.vllm_of_floor:.2f} | {r.goal_of_floor:.2f} |")
    hard = g[g.goal_of_floor >= 0.95]
    out += ["", "- " + ("; ".join(f"{k[0]} {k[1]} at M={k[2]}: the goal needs {100 * r.goal_of_floor:.1f} % of its "
                                  f"{FLOOR_NAME[r.bound]} floor" for k, r in hard.iterrows())
                        + ": that is " + ("the copy engine's own bandwidth" if (hard.bound == "bytes").all() else
                                          "the ceilings themselves") + ", beyond what any tile table reaches. "
                        if len(hard) else "")
            + f"Elsewhere the goal needs {100 * g[g.goal_of_floor < 0.95].goal_of_floor.min():.0f}–"
            f"{100 * g[g.goal_of_floor < 0.95].goal_of_floor.max():.0f} % of the floor: reachable in principle. "
            "The most headroom: TP=4 down at M ≥ 4096 ("
            + ", ".join(f"{100 * r.ours_of_floor:.0f} %" for k, r in g.iterrows()
                        if k[0].endswith("tp4") and k[1] == "down" and k[2] >= 4096)
            + f" of its byte floor), with K = {tp4_k} the shortest loop of the four GEMMs."]
    k = bg.load_counters()
    k = k[(k.M == 8192) & (k.arm == "table") & k.op.str.startswith("base_")]
    td = k[(k.preset == "qwen3-30b-a3b-tp4") & (k.op == "base_down")].iloc[0]
    out.append(f"- What the counters (ncu, `{bg.NCU_NOW_RUN}`, the table's tile at M = 8192) show of the gap to the "
               "floor: " + "; ".join(
                   f"{r.preset} {r.op.removeprefix('base_')}: DRAM {r.dram_pct_peak:.0f} % of peak, tensor pipe "
                   f"{r.tensor_pipe_pct:.0f} %, occupancy {r.achieved_occupancy_pct:.0f} % ({r.registers:.0f} "
                   f"registers), top stall `{r.top_stall}`" for r in k.itertuples())
               + ".")
    before, after = bg.SUBBLOCK_NCU_RUNS
    old, sub = bg.load_counters(before), bg.load_counters(after)
    od = old[(old.M == 8192) & (old.arm == "table") & (old.op == "base_down") & (old.preset == td.preset)].iloc[0]
    td = sub[(sub.M == 8192) & (sub.arm == "table") & (sub.op == "base_down") & (sub.preset == td.preset)].iloc[0]
    if od.tile != td.tile:  # the sub-block build the tables took at TP=4 down (docs/kernels.md)
        out.append(f"- TP=4 down, before and after the sub-block build (`{before}` → `{after}`, M = 8192): "
                   f"`{od.tile}` kept neither DRAM ({od.dram_pct_peak:.0f} % of peak) "
                   f"nor the tensor pipe ({od.tensor_pipe_pct:.0f} %) busy, with one program of 8 warps per SM at "
                   f"{od.registers:.0f} registers ({od.achieved_occupancy_pct:.0f} % occupancy) and top stall "
                   f"`{od.top_stall}`, a fixed-latency dependency: {tp4_k // 64} BLOCK_K steps per tile (K = {tp4_k}) "
                   f"leave little independent work per warp. `{td.tile}` splits each 128-row block of the alignment "
                   f"into two of 64 rows: {td.registers:.0f} registers, two programs per SM "
                   f"({td.achieved_occupancy_pct:.0f} % occupancy), DRAM {td.dram_pct_peak:.0f} % of peak, tensor "
                   f"pipe {td.tensor_pipe_pct:.0f} %, top stall `{td.top_stall}` (waiting on loads) at the same bytes "
                   f"({od.dram_bytes_over_floor:.2f} → {td.dram_bytes_over_floor:.2f}× the floor): the second program "
                   "hides the latency the first waited on. It is still at about half its byte floor and DRAM is half "
                   "busy, so its warps now wait on load latency, not on bandwidth. Round 3 put more programs, each "
                   "with its loads, on an SM (64 x 128 sub-blocks at 3 per SM, 32 x 128 at 4): both lost, 1.07-1.08x "
                   "and 1.55-1.64x the table in persist_s7 and persist_s8.")
    out.append(_balance_base_line(bg))
    d = fl.down_candidates()
    ses = list(dict.fromkeys(d.session))
    d["tile"] = d.config.str.replace(r"^bm\d+/", "", regex=True).str.replace("split1/w4/s3/", "")
    Ms = sorted(d.M.unique())
    out += ["", "The LoRA down delta's narrower tiles (`record_expand.py --candidates down`, " + " and ".join(
        f"`{x}`" for x in ses) + ": two device sessions, sweep medians of 15 graph replays, not paired): candidate / "
        "the table's tile (`bn128/bk64/pps4/xs3`, BLOCK_M 16 at M = 1024, 64 above), one figure per session. The "
        "hypothesis was more programs per SM, so more `out` bytes in flight:", "",
        "| preset | candidate | " + " | ".join(f"M={m}" for m in Ms) + " |", "| --- | --- |" + " ---: |" * len(Ms)]
    for (pre, tile), g in d[~d.table.astype(bool)].groupby(["preset", "tile"], sort=False):
        g = g.set_index(["M", "session"]).over_table
        out.append(f"| {pre} | `{tile}` | " + " | ".join(" / ".join(f"{g[(m, x)]:.3f}" for x in ses) for m in Ms)
                   + " |")
    won = d[~d.table.astype(bool)].groupby(["preset", "M", "tile"]).over_table.agg(["max", "min"])
    won = won[won["max"] < 1.0]
    tb = d[d.table.astype(bool)]
    o = fl.occupancy_test()
    lo, hi = 100 * tb[tb.M <= 4096].bw_frac.min(), 100 * tb[tb.M <= 4096].bw_frac.max()
    below = ", ".join(f"{p} M={m} `{cf}` ({r['min']:.3f}–{r['max']:.3f})" for (p, m, cf), r in won.iterrows())
    gain = f"of {100 * (1 - won['min'].min()):.0f} % or less " if len(won) else ""
    out += ["", f"- Below the table in both sessions: {below or 'none'}. The table's tile stays: a gain {gain}in an "
            "unpaired sweep is below the bar the tables use (a paired interval under 0.99 in two "
            f"sessions). The table itself reaches {lo:.0f}–{hi:.0f} % of the copy bandwidth at M = 1024–4096 over both "
            "sessions: the goal of 85 % is not met.",
            f"- Counters (ncu, `{fl.DOWN_NCU_RUN}`, one launch each, durations under ncu are not timings): BLOCK_N 64 "
            "at 3 programs per SM raised achieved occupancy and lowered DRAM throughput at the same bytes: "
            + "; ".join(f"{r.preset} M={r.M}: occupancy {r.achieved_occupancy_pct_table:.0f} → "
                        f"{r.achieved_occupancy_pct_narrow:.0f} %, DRAM {r.dram_pct_peak_table:.0f} → "
                        f"{r.dram_pct_peak_narrow:.0f} % of peak, bytes / floor {r.dram_bytes_over_floor_table:.2f} → "
                        f"{r.dram_bytes_over_floor_narrow:.2f}, `{r.top_stall_table}` per issue "
                        f"{r.top_stall_ratio_table:.2f} → {r.top_stall_ratio_narrow:.2f}" for r in o.itertuples())
            + ". So the programs per SM are not what limits the delta. BLOCK_N 64 with 4 stages (2 programs per SM) "
            "counts like the table (DRAM " + ", ".join(f"{r.dram_pct_peak_deep:.0f} %" for r in o.itertuples())
            + "): a hypothesis the counters allow, not yet tested alone, is that what matters is how far ahead in time "
            "each program loads (stages times the time per expand step), not how many programs or bytes are resident."]
    return "\n".join(out)


def _balance_base_line(bg) -> str:
    """The SMs' balance (ncu: average over busiest SM's active cycles) of the base GEMMs at M = 1024, and what the
    half-tile arms that were to even it out did (persist round 3)."""
    k = bg.load_counters()
    k = k[(k.M == 1024) & (k.arm == "table") & k.op.str.startswith("base_")]
    g = k[(k.preset == "qwen3-30b-a3b-tp4") & (k.op == "base_gate_up")].iloc[0]
    p = bg.persist_sessions(bg.PERSIST_ROUNDS[-1])
    names = bg.PERSIST_ROUNDS[-1]

    def ratios(preset, op, arm):
        r = p[(p.preset == preset) & (p.op == op) & (p.M == 1024) & (p.arm == arm)].iloc[0]
        got = [(n, getattr(r, "r_" + n)) for n in names if getattr(r, "r_" + n) == getattr(r, "r_" + n)]
        return " and ".join(f"{v:.3f}" for _, v in got) + (f" ({got[0][0]} only)" if len(got) == 1 else "")
    took = p[p.adopted & (p.M == 1) & (p.preset == "qwen3-30b-a3b-tp4") & (p.op == "gate_up")].iloc[0]
    small = [getattr(took, "r_" + n) for n in names]
    return (f"- The SMs' balance at M = 1024 (ncu `{bg.NCU_NOW_RUN}`: the average SM's active cycles over the busiest "
            "SM's): " + "; ".join(f"{r.preset} {r.op.removeprefix('base_')} {r.sm_busy_avg_over_max:.2f}"
                                  for r in k.itertuples())
            + f". TP=4 gate_up, at {g.dram_bytes_over_floor:.2f}× its byte floor's bytes and {g.dram_pct_peak:.0f} % "
            f"of DRAM peak, leaves the average SM idle for the last {100 * (1 - g.sm_busy_avg_over_max):.0f} % of the "
            "span: its ~190 blocks × 3 tiles of 128 columns come to ~4.3 tiles per SM. "
            "Halving the tile to even the tail out lost (round 3, " + " and ".join(names) + "): half the BLOCK_N "
            f"{ratios('qwen3-30b-a3b-tp4', 'gate_up', 'n_half')}× the table (x read twice as often), half-height "
            f"sub-blocks {ratios('qwen3-30b-a3b-tp4', 'gate_up', 'm_half')}× (the weights read twice as often from "
            f"L2). What round 3 did take at small M: TP=4 gate_up at M = 1 with `{getattr(took, 'tile_' + names[-1])}` "
            f"(half the BLOCK_N: twice the programs over the 8 experts' weights), {min(small):.2f}–{max(small):.2f}×.")


def kernels_base_headline_block() -> str:
    from lora_moe_lab.instruments.analysers import base_gemm as bg

    vs = bg.peer_sessions()  # the same tables in each device session, oldest first

    def each(f):
        return " and ".join(f(v) for v in vs)
    return (f"Base MoE GEMM with tuned tile tables and TMA weight loads, {len(vs)} device sessions at today's tables "
            f"({', '.join(v.run.iloc[0] for v in vs)}): at M ≥ 1024, "
            + each(lambda v: f"{v[v.M >= 1024].direct.min():.2f}–{v[v.M >= 1024].direct.max():.2f}×")
            + " vLLM's tuned kernel (carried figures; bridged "
            + each(lambda v: f"{v[v.M >= 1024].bridged.min():.2f}–{v[v.M >= 1024].bridged.max():.2f}×")
            + f"), ≥ 1.0× by both ratios at {each(lambda v: str(int(v.ge_1.sum())))} of {len(vs[-1])} points, "
            f"≥ 1.15× at {each(lambda v: str(int(v[v.M >= 1024].ge_1_15.sum())))} of {int((vs[-1].M >= 1024).sum())} "
            f"with M ≥ 1024. `docs/results.md`, block kernels-base. {_floors_clause(bg, vs)}")


def kernels_share_block() -> str:
    """Issue 24's share goals against LoRA's floor with the deltas folded (floors.share_floors), the layer's kernels
    one by one without and with the adapters (floors.layer_parts, profiled), and the share against a base layer
    whose torch parts ran at their floors (floors.lean_base_shares)."""
    from lora_moe_lab.instruments.analysers import floors as fl

    from lora_moe_lab.instruments.analysers import base_gemm as bg

    s, p, lb = fl.share_floors(), fl.layer_parts(), fl.lean_base_shares()
    sp = fl.share_floors(bg.PARTS_LAYER)  # the live layer at the tables the parts ran
    ses, pses, pls = list(dict.fromkeys(s.session)), list(dict.fromkeys(p.session)), list(dict.fromkeys(sp.session))
    out = ["LoRA's share of the layer against its floor (`analysers/floors.py`: `lora_floor`, `share_floors`; the "
           "layer sessions " + " and ".join(f"`{x}`" for x in ses) + ", every token on one of 4 adapters of "
           "rank 32). The floor is the least time LoRA can add with the deltas folded as issue 24 asks: each "
           "shrink its own kernel (the used adapter-experts' A once, its input once, u once), each expand extra K "
           "steps of the base GEMM (the used B and u once, its FLOPs on top of the GEMM's), each kernel at the larger "
           "of its bytes over the copy ceiling and its FLOPs over the matmul ceiling, summed. `weights` is the used A "
           "and B alone at the copy ceiling. `goal / floor` = the floor over the time the goal allows: above 1.0 no "
           "kernel meets the goal. One figure per session:", "",
           "| preset | M | base layer (µs) | share, measured [95 %] | floor | weights | goal | goal / floor | "
           "measured / floor |", "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (preset, M), g in s.groupby(["preset", "M"], sort=False):
        def each(f, g=g):
            return " / ".join(f(r) for r in g.itertuples())
        goal = g.goal_pct.iloc[0]
        out.append(f"| {preset} | {M} | {each(lambda r: f'{r.base_us:.0f}')} | "
                   + each(lambda r: f"{r.share_pct:.1f} [{r.share_pct_lo:.1f}, {r.share_pct_hi:.1f}] %")
                   + f" | {each(lambda r: f'{r.floor_share_pct:.1f} %')} | {g.weights_share_pct.mean():.1f} % | "
                   + ("—" if goal != goal or goal is None else f"{goal:.0f} %") + " | "
                   + ("—" if goal != goal or goal is None else each(lambda r: f"{r.goal_of_floor:.2f}")) + " | "
                   + each(lambda r: f"{r.added_over_floor:.2f}") + " |")
    at = s[s.M == 1024].groupby("preset").goal_of_floor
    big = s[s.M >= 4096]
    out += ["", "- At M = 1024 the goals ask for " + ", ".join(
        f"{x.min():.2f}–{x.max():.2f}× ({pr})" for pr, x in at) + " of the floor: less time than the adapters' own "
        "bytes and FLOPs take at the H200's ceilings. No kernel meets them there; the goals are reachable in "
        f"principle only from M = 4096, where they need {100 * big.goal_of_floor.min():.0f}–"
        f"{100 * big.goal_of_floor.max():.0f} % of the floor and the committed kernels run "
        f"{big.added_over_floor.min():.1f}–{big.added_over_floor.max():.1f}× it."]
    parts = ["GEMM gate_up", "GEMM down", "router (fp32, torch)", "SiLU and mul (torch)", "top-k sum (torch)",
             "alignment"]
    last = p[p.session == pses[-1]]
    busy = p[p.part == fl.BUSY].set_index(["session", "preset", "M"])
    out += ["", "The layer's kernels one by one (`studies/kernels/record_parts.py`: each arm's CUDA graph replayed 20 "
            "times under torch.profiler, every kernel's GPU time from CUPTI's records, medians per forward; "
            + " and ".join(f"`{x}`" for x in pses) + " on two machines). Profiled, so attributions beside the live "
            "figures, not in their place. The base layer (µs per forward, " + f"`{pses[-1]}`" + "; all kernels in "
            "both sessions):", "",
            "| preset | M | all kernels | " + " | ".join(parts) + " | GEMMs, of all |",
            "| --- | ---: | ---: |" + " ---: |" * (len(parts) + 1)]
    for (preset, M), g in last.groupby(["preset", "M"], sort=False):
        g = g.set_index("part")
        tot = " / ".join(f"{busy.loc[(x, preset, M), 'base_us']:.0f}" for x in pses)
        gm = g.base_us[g.index.str.startswith("GEMM")].sum()
        out.append(f"| {preset} | {M} | {tot} | " + " | ".join(f"{g.base_us.get(n, 0.0):.1f}" for n in parts)
                   + f" | {100 * gm / g.base_us[fl.BUSY]:.0f} % |")
    lparts = ["GEMM gate_up", "GEMM down", "LoRA shrink", "LoRA slot order", "LoRA separate delta", "alignment",
              "router (fp32, torch)"]
    out += ["", "What LoRA adds, kernel by kernel (µs per forward, " + f"`{pses[-1]}`" + "; the sum in both sessions "
            "beside the live paired figure at the same tables, the mean of " + " and ".join(f"`{x}`" for x in pls)
            + ", before down's window), and the floor of each op's LoRA work (`lora_floor`: shrink + expand):", "",
            "| preset | M | added, profiled | added, live | " + " | ".join(lparts) + " | floor gate_up | floor down |",
            "| --- | ---: | ---: | ---: |" + " ---: |" * (len(lparts) + 2)]
    live = sp.groupby(["preset", "M"]).mean(numeric_only=True)
    for (preset, M), g in last.groupby(["preset", "M"], sort=False):
        g, lv = g.set_index("part"), live.loc[(preset, M)]
        tot = " / ".join(f"{busy.loc[(x, preset, M), 'added_us']:.0f}" for x in pses)
        out.append(f"| {preset} | {M} | {tot} | {lv.added_us:.0f} | "
                   + " | ".join(f"{g.added_us.get(n, 0.0):+.1f}" for n in lparts)
                   + f" | {lv.gate_up_shrink_us + lv.gate_up_expand_us:.1f} | "
                   f"{lv.down_shrink_us + lv.down_expand_us:.1f} |")
    t16 = last[(last.preset == "qwen3-30b-a3b-tp4") & (last.M == 16384)].set_index("part").added_us
    l16 = live.loc[("qwen3-30b-a3b-tp4", 16384)]
    q16 = last[(last.preset == "qwen3-30b-a3b") & (last.M == 16384)].set_index("part").added_us
    qf = live.loc[("qwen3-30b-a3b", 16384)]
    out += ["", f"- TP=4 at M = 16384: gate_up's separate delta adds {t16['LoRA separate delta']:.0f} µs against a "
            f"floor of {l16.gate_up_shrink_us + l16.gate_up_expand_us:.0f}; down's wide build adds "
            f"{t16['GEMM down']:.0f} µs to the base GEMM and {t16['LoRA shrink']:.0f} µs of shrink against a floor of "
            f"{l16.down_shrink_us + l16.down_expand_us:.0f}: its tail walks every adapter's 32 columns (128) for "
            f"every row, where a row needs 32. qwen3 at M = 16384: the two shrinks add {q16['LoRA shrink']:.0f} µs "
            f"against {qf.gate_up_shrink_us + qf.down_shrink_us:.0f} µs of shrink floor.",
            "- The router reads x from the wide buffer's strided view where gate_up takes the wide build, and its "
            "float copy of x then runs torch's strided kernel: " + ", ".join(
                f"{r.added_us:+.1f} µs at M = {r.M}" for r in last[(last.part == "router (fp32, torch)")
                                                                  & (last.preset == "qwen3-30b-a3b")
                                                                  & (last.M >= 4096)].itertuples())
            + " (qwen3). A cost of the wide build outside its kernels, counted nowhere before.",
            "", "LoRA's share against a leaner base (`lean_base_shares`): the base layer with its router, SiLU-and-mul "
            "and top-k sum at their floors (`torch_part_floors`: a bf16 router product, SiLU-and-mul as one kernel, "
            "the sum's bytes once), the parts an engine runs as fused kernels. A bound computed from measured parts, "
            "not a measurement of such a layer:", "",
            "| preset | M | torch parts (µs, of all kernels) | their floors (µs) | base layer, live → lean (µs) | "
            "share, live → lean |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in lb.itertuples():
        out.append(f"| {r.preset} | {r.M} | {r.torch_parts_us:.0f} ({r.torch_parts_pct:.0f} %) | "
                   f"{r.torch_floors_us:.0f} | {r.base_us:.0f} → {r.lean_base_us:.0f} | {r.share_pct:.1f} → "
                   f"{r.lean_share_pct:.1f} % |")
    out += ["", "- The lab's base layer runs its router in fp32 on CUDA cores (cuBLAS `ffma`), SiLU and mul as two "
            "torch kernels and the top-k sum as a torch reduction: " + ", ".join(
                f"{lb[lb.preset == pr].torch_parts_pct.min():.0f}–{lb[lb.preset == pr].torch_parts_pct.max():.0f} % "
                f"({pr})" for pr in lb.preset.unique()) + " of its kernel time. Those parts dilute LoRA's share: "
            "against the leaner base the same LoRA time is " + ", ".join(
                f"{lb[lb.preset == pr].lean_share_pct.min():.1f}–{lb[lb.preset == pr].lean_share_pct.max():.1f} % "
                f"({pr})" for pr in lb.preset.unique()) + " of the layer."]
    return "\n".join(out)


def _floors_clause(bg, vs) -> str:
    from lora_moe_lab.instruments.analysers import floors as fl

    g = fl.goal_floors(vs[-1], fl.ceilings())
    w = g.loc[g.goal_of_floor.idxmax()]
    return (f"Against the H200's own ceilings, 1.15× vLLM at {w.preset} {w.op} M={w.M} would need "
            f"{100 * w.goal_of_floor:.1f} % of that GEMM's {FLOOR_NAME[w.bound]} floor (ours: "
            f"{100 * w.ours_of_floor:.1f} %): block kernels-floors.")


BLOCKS = {"setup": setup_block, "guards": guards_block, "traces": traces_block, "kernels": kernels_block,
          "signature": signature_block, "production": production_block, "replay": replay_block,
          "simulator": simulator_block, "simulator-check": simulator_check_block,
          "graphs": graphs_block, "tp4": tp4_block, "tp4-headline": tp4_headline_block,
          "lab-headline": lab_headline_block, "kernels-base": kernels_base_block,
          "kernels-base-headline": kernels_base_headline_block, "kernels-fold": kernels_fold_block,
          "kernels-fold-headline": kernels_fold_headline_block, "kernels-floors": kernels_floors_block,
          "kernels-share": kernels_share_block,
          "kernels-packed": kernels_packed_block}


def pending_note(name: str) -> str:
    folder = BLOCK_DATA.get(name)
    where = f"`data/{folder}/`" if folder else "data/"
    why = "is not recorded yet" if folder and not (DATA / folder).exists() else "has no generator in readme_tables yet"
    return f"*(`{name}`: {where} {why}; this block fills when it does)*"


def render(text: str) -> str:
    for name in list(BLOCKS) + [n for n in BLOCK_DATA if n not in BLOCKS]:
        pat = re.compile(rf"(<!-- begin:{name} -->)(.*?)(<!-- end:{name} -->)", re.S)
        m = pat.search(text)
        if not m:
            continue
        folder = BLOCK_DATA.get(name)
        if name not in BLOCKS or (folder and not (DATA / folder).exists()):
            body = pending_note(name)
            print(f"note: block {name}: {body}", file=sys.stderr)
        else:
            body = BLOCKS[name]()
            if body is None:
                body = f"*(no recording in data/ yet for `{name}`)*"
        one_line = "\n" not in m.group(2)  # an inline slot stays on its line
        sep = "" if one_line else "\n"
        text = pat.sub(lambda mm: mm.group(1) + sep + body + sep + mm.group(3), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md differs from what data/ says")
    a = ap.parse_args(argv)
    stale = 0
    for f in FILES:
        old = f.read_text()
        new = render(old)
        name = f.relative_to(ROOT)
        if a.check:
            if new != old:
                print(f"{name} is out of date with data/: run python scripts/readme_tables.py")
                stale += 1
            else:
                print(f"{name} agrees with data/")
        else:
            f.write_text(new)
            print(name, "rewritten" if new != old else "unchanged")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
