"""Regenerate the README's figures from data/: every number in README.md sits between a pair of
markers `<!-- begin:NAME -->` ... `<!-- end:NAME -->` and is written here from a recording.

    python scripts/readme_tables.py           # rewrite the blocks in README.md
    python scripts/readme_tables.py --check   # exit 1 if README.md is not what data/ says (a test runs this)

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lora_moe_lab.instruments.recordings import load_guards  # noqa: E402
from lora_moe_lab.provenance import DATA, label, normalize_meta  # noqa: E402

README = ROOT / "README.md"


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
                        f"{st.get('clocks_mem', float('nan')):.0f} MHz, power {st.get('power_draw', float('nan')):.0f} of "
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
            how.setdefault(f"{q['warmup']} untimed warm-up rounds of every arm and at least {q['warmup_s']:g} s of them, "
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
    from lora_moe_lab.instruments.recordings import GUARDS_DIR, session_files
    from lora_moe_lab.instruments.stats import MIN_PAIRED_REPS

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
                "used as recorded. **The two sessions of the new protocol are pending** (`scripts/gpu_side_by_side.py "
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
        lines.append(f"| {r.preset} | {r.tokens} | " + " | ".join(cells) + f" | {ms(k, 'launch_always')} | {ms(k, 'graph')} |")
    ok = p[p.stable]
    half, big = ok[ok.active > 0], ok[(ok.active == 0) & (ok.tokens >= 1024)]
    small = ok[(ok.active == 0) & (ok.tokens == p.tokens.min())]
    notes = [""]
    if two:
        dis = p[p.stable & (p.sessions > 1) & ~(p.agree & p.agree_ratio)]
        notes.append(f"- † Between the sessions: {int((p.stable & (p.sessions > 1) & p.agree & p.agree_ratio).sum())} of "
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
        notes.append(f"- With half the requests active, `sync / cpu_flag` is {half.ratio.min():.2f}x–{half.ratio.max():.2f}x.")
    notes += _guards_warmup_lines(rec, folder, bool(sessions), MIN_PAIRED_REPS)
    return "\n".join(lines + notes)


def _guards_warmup_lines(rec, folder: Path, checked: bool, min_reps: int) -> list[str]:
    """The warm-up drops and the unstable points, per session; for the archived recording what the
    check would have said (its figures above are as recorded)."""
    from lora_moe_lab.instruments.recordings import load_guards as _load

    w = rec.warmup() if checked else _load(rec.paths[0], check_warmup=True).warmup()
    lab = (lambda r: f"{r.session}: " if checked and rec.sessions[1:] else "")  # noqa: E731
    drops = "; ".join(f"{lab(r)}{_guards_where(r)}, first {r.dropped} of {r.reps}" for r in w[w.dropped > 0].itertuples())
    unst = "; ".join(f"{lab(r)}{_guards_where(r)} ({r.reps} repetitions)" for r in w[w.status == "unstable"].itertuples())
    if not checked:
        return [f"- The warm-up check (`stats.drop_warmup`, at least {min_reps} stable repetitions), applied to this "
                "recording afterwards, would drop leading drift at " + (drops or "no point")
                + " and finds " + (f"these points unstable: {unst}" if unst else "no point unstable")
                + ". The figures above use every repetition as recorded."]
    return [f"- Warm-up drift dropped (the same leading repetitions from every arm; the rows stay in the file): "
            + (drops or "none") + ".",
            "- Unstable, not averaged (an arm never settled within the repetitions allowed): " + (unst or "none") + "."]


def traces_block() -> str:
    d = pd.read_csv(DATA / "traces" / "traces_summary.csv")
    meta = normalize_meta(json.loads((DATA / "traces" / "traces_summary.meta.json").read_text()))
    e = d[d["mode"] == "eager"].set_index(["guard", "M"])  # the columns are per forward already
    g = d[d["mode"] == "graph"].set_index(["guard", "M"])
    per = e["n_syncs"]
    layers = json.loads((DATA / "traces" / "qwen3-30b-a3b_sync_eager_M16.meta.json").read_text())["params"]["num_layers"]
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
    meta = normalize_meta(json.loads((DATA / "kernels" / "kernels_meta.json").read_text()))
    k = d[d.section == "lora_gate_up"].drop_duplicates(["preset", "M"], keep="last").set_index(["preset", "M"])
    dis = d[d.section == "disabled"]
    Ms = sorted(k.loc["qwen3-30b-a3b"].index)
    head = "| M | " + " | ".join(str(m) for m in Ms) + " |"
    rows = [head, "| --- |" + " ---: |" * len(Ms)]
    q = k.loc["qwen3-30b-a3b"]
    rows.append("| qwen3-30b-a3b, ours (µs) | " + " | ".join(f"{q.loc[m, 'time_us']:.1f}" for m in Ms) + " |")
    rows.append("| target (µs) | " + " | ".join(f"{q.loc[m, 'target_us']:.0f}" for m in Ms) + " |")
    rows.append("| speed-up | " + " | ".join(f"{q.loc[m, 'speedup']:.1f}x" for m in Ms) + " |")
    rows.append("| share of measured copy bandwidth | " + " | ".join(f"{100 * q.loc[m, 'bw_frac']:.0f} %" for m in Ms) + " |")
    t = k.loc["qwen3-30b-a3b-tp4"]
    rows.append("| qwen3-30b-a3b-tp4, ours (µs) / target | "
                + " | ".join(f"{t.loc[m, 'time_us']:.1f} / {t.loc[m, 'target_us']:.0f}" for m in Ms) + " |")
    return "\n".join([f"From `data/kernels/kernels.csv` ({label(meta)}): the gate_up LoRA delta, both slices, "
                      f"rank {meta.get('rank', 32)}, {meta.get('slots', 4)} adapters all enabled, one request per "
                      "token, top-8 of 128, bf16, timed as CUDA-graph replay. The target row is a production "
                      "engine's Triton kernel on the same inputs on the same GPU.", ""] + rows + [
        "", f"- All adapters disabled, a LoRA launch costs {dis.time_us.min():.2f}–{dis.time_us.max():.2f} µs "
            f"against {dis.empty_kernel_us.min():.2f}–{dis.empty_kernel_us.max():.2f} µs for an empty Triton "
            "kernel: the persistent grid exits after one round of metadata loads."] + _decode_lines())


def _decode_lines() -> list[str]:
    """Issue 13: the decode path without alignment, the deltas' bandwidth, LoRA's share of a layer
    against its byte floor, the all-disabled exit against its floors, the fused-epilogue experiment,
    the differential over the decode tiles. Round 3's last run, `expand_run7`, is the recording of the
    code as it is (the table's tiles: check, deltas, exit floors, the layer paired, the path); the fused
    epilogue and the decode differential come from round 2 (`fused_run*`)."""
    from lora_moe_lab.kernels.configs import DECODE_MAX_PAIRS  # the bound the code uses now
    kd = DATA / "kernels"
    from lora_moe_lab.instruments.recordings import load_kernel_run
    run = load_kernel_run("expand_run7")
    m3 = run.meta
    f1 = pd.read_csv(kd / "fused_run1_kernels_fused.csv")
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
    diffs = [pd.read_csv(f) for f in sorted(kd.glob("fused_run2_seed*_kernels_fused.csv"))]
    dd = pd.concat([d[d.section == "diff"] for d in diffs])
    tiles = sorted(set().union(*(json.loads(t) for t in dd.table_tiles)))
    chk = run.section("check")
    short = lambda pre: pre.replace("qwen3-30b-a3b", "qwen3")  # noqa: E731
    bw = lambda op: sw.xs(op, level="op").bw_frac  # noqa: E731
    d8 = sw.loc[("qwen3-30b-a3b", 8192, "down")]
    return ["", f"**Decode path without alignment** (`kernels/lora_decode.py`; `data/kernels/expand_run7_*`, "
            f"{label(m3)}): the two deltas straight from `topk_ids` and the per-token row mapping, no alignment "
            "kernels, against today's alignment + aligned gate_up + down deltas. Same inputs, graph replay, rank "
            f"32, 4 adapters, every token with one. The layer takes this path for M·top_k ≤ {DECODE_MAX_PAIRS} "
            "pairs:", ""] + rows + [
        "", f"- Decode differential (`fused_run2_seed*`): {int(dd.cases.sum())} random cases against float64, "
            f"{int(dd.failures.sum())} failures, over every tile the table uses ({', '.join(tiles)}). Aligned "
            f"kernel with the table's tiles on both presets' shapes (`expand_run7`): {len(chk)} checks, "
            f"{int((~chk.ok.astype(bool)).sum())} failures.",
        f"- All adapters disabled against an empty kernel of the same grid and arguments: decode path "
        f"{dis.decode_ratio.min():.2f}–{dis.decode_ratio.max():.2f}x, aligned kernel "
        f"{dis.aligned_ratio.min():.2f}–{dis.aligned_ratio.max():.2f}x (down delta, M = 1..64; both deltas at M = 1, 8, 64: "
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
            f"{int(lay.reps.iloc[0])} times; the share per round, median and 10–90 % interval) next to its byte floor: the "
            "bytes both deltas must move (each used adapter-expert's A and B once, x once, the output read and "
            "written; the deltas' rows of the same run at the same M) at the measured copy bandwidth, over the base layer's time:",
        ""] + share + [
        "", "- Delta fused into the base GEMM's epilogue (`kernels/fused_moe_lora_epilogue.py`, an experiment, not "
            "used by the layer; `fused_run1_*`): fused GEMM / (base GEMM + separate delta) "
        f"{fk.ratio.min():.2f}–{fk.ratio.max():.2f}x over {len(fk)} (preset, op, M) points, M ≤ {fk.M.max()}; "
        "in the layer with both deltas fused, LoRA all active costs " + "; ".join(
            f"{short(pre)} M=" + ", ".join(f"{m} +{100 * fl.loc[(pre, m), 'lora_share']:.0f} %" for m in (1, 1024, 16384))
            for pre in ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")) + "."]


def _tp1_busy_sentence() -> str:
    """What the TP=1 traces say about the kernels' busy time under `sync` vs `cpu_flag` (one
    profiled forward each, no adapter in use)."""
    from lora_moe_lab.instruments import trace

    busy = {}
    for g in ("sync", "cpu_flag"):
        f = sorted((DATA / "production" / "traces").glob(f"*_tp1_*_none_{g}_rank0.json.gz"))
        if not f:
            return ""
        busy[g] = float(trace.forward_metrics(trace.load_trace(f[0])).busy_ns.iloc[0]) / 1e6
    if busy["sync"] >= busy["cpu_flag"]:
        return ""
    return (f" At TP=1 part of the stall is hidden: in the profiled forward the kernels were busy {busy['sync']:.0f} ms "
            f"with `sync` against {busy['cpu_flag']:.0f} ms with `cpu_flag` (the same kernels ran faster with bubbles "
            "between them; notebook 06).")


def production_block() -> str | None:
    """The decoder's chunked prefill per TP size (data/production/*.summary.csv) beside production's
    figures, and the TP=4 extrapolation from each measured TP size (sim/tp.py)."""
    from lora_moe_lab.sim import PRODUCTION, production_forward_ms
    from lora_moe_lab.sim.tp import extrapolate_tp

    files = sorted((DATA / "production").glob("*.summary.csv"))
    if not files:
        return None
    d = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    metas = {normalize_meta(json.loads(f.with_name(f.name.replace(".summary.csv", ".meta.json")).read_text()))
             .get("commit") for f in files}
    meta = normalize_meta(json.loads(files[0].with_name(files[0].name.replace(".summary.csv", ".meta.json")).read_text()))
    reps = int(d.reps.min())
    lines = [f"From `data/production/` ({label(meta)}{'' if len(metas) == 1 else ', several commits'}): "
             f"{int(d.layers.iloc[0])} layers, {int(d.requests.iloc[0])} requests × {int(d.input_len.iloc[0])} tokens "
             f"in chunks of {int(d.chunk.iloc[0])}, bf16, {reps} interleaved repetitions; changes are those of "
             "`cpu_flag` against `sync`, paired per repetition, with the 2.5–97.5 percentile range of the "
             "repetitions.", "",
             "| TP | syncs per forward | adapters in use | input tokens/s, sync → cpu_flag | throughput change "
             "| mean TTFT (ms), sync → cpu_flag | TTFT change | GPU idle per forward (ms), sync / cpu_flag |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, g in d.groupby(["tp", "guard_sites", "adapters"], sort=True):
        g = g.set_index("guard")
        if not {"sync", "cpu_flag"} <= set(g.index):
            continue
        sy, cf = g.loc["sync"], g.loc["cpu_flag"]
        lines.append(
            f"| {k[0]} | {sy.syncs_per_forward:.0f} | {'none' if k[2] == 'none' else 'half'} "
            f"| {sy.input_tok_per_s:,.0f} → {cf.input_tok_per_s:,.0f} "
            f"| **{sy.fix_throughput_gain_pct:+.1f} %** [{sy.fix_throughput_gain_pct_lo:+.1f}, {sy.fix_throughput_gain_pct_hi:+.1f}] "
            f"| {sy.ttft_mean_ms:,.0f} → {cf.ttft_mean_ms:,.0f} "
            f"| **{sy.fix_ttft_change_pct:+.1f} %** [{sy.fix_ttft_change_pct_lo:+.1f}, {sy.fix_ttft_change_pct_hi:+.1f}] "
            f"| {sy.gpu_idle_ms:.1f} / {cf.gpu_idle_ms:.1f} |")
    lines.append(f"| production, TP=4 | {PRODUCTION['syncs_per_forward']:.0f} | none | | "
                 f"**{PRODUCTION['input_throughput_gain_pct']:+.1f} %** | | **{PRODUCTION['ttft_change_pct']:+.1f} %** | |")
    la = d[d.guard == "launch_always"]
    if len(la):
        lines += ["", f"`launch_always` stays within {la.fix_throughput_gain_pct.abs().max():.1f} % of `cpu_flag` "
                      "in throughput at every TP size and adapter mix."]
    t2 = d[(d.tp == 2) & (d.guard_sites > 1) & (d.adapters == "none")].set_index("guard")
    if {"sync", "cpu_flag"} <= set(t2.index):
        F, S = t2.loc["cpu_flag", "forward_median_ms"], t2.loc["sync", "forward_median_ms"]
        n = t2.loc["sync", "syncs_per_forward"]
        f_prod = production_forward_ms()
        more = t2.loc["sync", "fix_throughput_gain_pct"] > PRODUCTION["input_throughput_gain_pct"]
        lines += ["", f"Why TP=2 gains {'more' if more else 'less'} than production: here one forward (one chunk) takes {F:.0f} ms with "
                      f"`cpu_flag` and {S:.0f} ms with `sync`, {S - F:.0f} ms of stall over {n:.0f} syncs "
                      f"({1e3 * (S - F) / n:.0f} µs each). Production lost {PRODUCTION['stall_ms_per_forward']:.0f} ms "
                      f"per forward ({PRODUCTION['stall_us_per_sync']:.0f} µs per sync) for its "
                      f"{PRODUCTION['input_throughput_gain_pct']:+.1f} %, which implies about {f_prod:.0f} ms of "
                      f"forward without the stall: its stall was {PRODUCTION['stall_ms_per_forward'] / (S - F):.1f}x "
                      f"ours but its forward {f_prod / F:.1f}x longer, so the same syncs were a "
                      f"{'smaller' if PRODUCTION['stall_ms_per_forward'] / f_prod < (S - F) / F else 'larger'} share."
                      + _tp1_busy_sentence()]
    ex = extrapolate_tp(d)
    ex = ex[(ex.guard_sites > 1) & (ex.adapters == "none")]
    if len(ex):
        lines += ["", "TP=4 **extrapolated, not measured** (no 4-GPU machine was lent): each measured TP size's "
                      "`cpu_flag` forward time and time lost per sync, scaled to a TP=4 rank's shapes by the fitted "
                      "queue model (`lora_moe_lab/sim/tp.py`): "
                  + "; ".join(f"from TP={r.source_tp}: {r.throughput_gain_pct:+.1f} % throughput, "
                              f"{r.ttft_change_pct:+.1f} % TTFT" for r in ex.itertuples())
                  + ". A TP=4 rank has half a TP=2 rank's work per forward and the same syncs, so the share of "
                    "the stall grows; production's heavier forward is why it saw less."]
    return "\n".join(lines)


def simulator_block() -> str | None:
    d = DATA / "simulator"
    if not (d / "simulator_fit.json").exists():
        return None
    from lora_moe_lab import sim

    return sim.readme_block(d)


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
            f"predicts {c['input_throughput_gain_pct']:+.1f} % input throughput and {c['ttft_change_pct']:+.1f} % TTFT; "
            f"the decoder measured {m.fix_throughput_gain_pct:+.1f} % [{m.fix_throughput_gain_pct_lo:+.1f}, "
            f"{m.fix_throughput_gain_pct_hi:+.1f}] and {m.fix_ttft_change_pct:+.1f} % "
            f"(`data/production/tp2_C16384_gs1.summary.csv`). The model holds the MoE blocks only: it has no "
            f"attention to dilute the stall: beside production's {PRODUCTION['input_throughput_gain_pct']:+.1f} % its "
            f"own extrapolation above is made with {m.syncs_per_forward:.0f} syncs per forward, not production's "
            f"{PRODUCTION['syncs_per_forward']:.0f}, so an agreement there is no validation.")


def setup_block() -> str | None:
    f = DATA / "setup" / "setup_time.json"
    if not f.exists():
        return None
    d = json.loads(f.read_text())
    return (f"Set-up time, measured by `python3 scripts/measure_setup.py` (a fresh clone and `make venv` with "
            f"pip's cache off, {d['runs']} runs on this {d['cores']}-core CI-sized machine, commit {d['commit']}): "
            f"median {d['median_s']:.0f} s (min {d['min_s']:.0f}, max {d['max_s']:.0f}). It installs torch, triton, the "
            "notebook tools and the browser test's driver in one go; the first `make run` or `make test` pays it once.")


def graphs_block() -> str | None:
    from lora_moe_lab.instruments.recordings import load_graph_strategies

    try:
        rec = load_graph_strategies()
    except FileNotFoundError:
        return None
    t = rec.table("moe").set_index("strategy")
    cols = [c for c in t.columns if c.startswith("M=")]
    head = "| strategy | graphs | capture (s) | graph pool (MiB) | " + " | ".join(cols) + " |"
    lines = [head, "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in cols) + " |"]
    for v, r in t.iterrows():
        cells = ["1 (baseline)" if v == "launch_always" else f"{(r[c] - 1) * 100:+.1f} %" for c in cols]
        lines.append(f"| `{v}` | {int(r['graphs'])} | {r['capture_s']:.2f} | {r['pool_mib']:.0f} | " + " | ".join(cells) + " |")
    sw = rec.switches
    return (f"Three ways to put LoRA under CUDA graphs (`model/graph_strategies.py`), recorded by "
            f"`scripts/gpu_graphs.py` into `data/graphs/` ({rec.label}) on the 48-layer qwen3-30b-a3b MoE model, "
            f"bf16, 4 adapter slots of rank 32: graphs for decode (1 to 64 requests) and prefill (512, 2048 tokens), "
            f"capture time (kernels compiled first), the private graph pool's memory, and one whole step (pick, "
            f"upload, replay) relative to `launch_always`, paired medians of {int(rec.summary().n.min())} interleaved "
            f"repetitions (the decoder's table and the intervals: notebook 03).\n\n" + "\n".join(lines) + "\n\n"
            f"- Every replay after adapter switches equals the eager run of the same graph bit for bit "
            f"({int(sw.bit_exact_vs_same_graph_eager.sum())} of {len(sw)}); a batch larger than every graph gets a "
            f"named `NoGraphFits` error (or runs eagerly with `fallback=\"eager\"`).\n"
            f"- The no-LoRA graphs save a few percent of a decode step when no adapter is active; the price is 2x "
            f"(`lora_split`) and 4x (`per_active_count`) the graphs to capture, pick and keep correct.")


BLOCKS = {"setup": setup_block, "guards": guards_block, "traces": traces_block, "kernels": kernels_block,
          "production": production_block, "simulator": simulator_block, "simulator-check": simulator_check_block,
          "graphs": graphs_block}


def render(text: str) -> str:
    for name, fn in BLOCKS.items():
        pat = re.compile(rf"(<!-- begin:{name} -->).*?(<!-- end:{name} -->)", re.S)
        if not pat.search(text):
            continue
        body = fn()
        if body is None:
            body = f"*(no recording in data/ yet for `{name}`)*"
        text = pat.sub(lambda m: m.group(1) + "\n" + body + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md differs from what data/ says")
    a = ap.parse_args(argv)
    old = README.read_text()
    new = render(old)
    if a.check:
        if new != old:
            print("README.md is out of date with data/: run python scripts/readme_tables.py")
            return 1
        print("README.md agrees with data/")
        return 0
    README.write_text(new)
    print("README.md", "rewritten" if new != old else "unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
