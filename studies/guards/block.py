"""The guards study's block (scripts/readme_tables.py collects `BLOCKS`): the guard end to end, from
data/guards/: the sessions pooled, one session, or the archived recording (tests/test_readme_guards.py holds the
three states)."""
from __future__ import annotations

from pathlib import Path

from lora_moe_lab.instruments.analysers.recordings import load_guards
from studies._render import ROOT, _ms


def _guards_ci(e: float, lo: float, hi: float, nd: int = 0, unit: str = "") -> str:
    """'125 [-34, 266]' (or '1.17x [0.98, 1.30]'); an unstable point says so instead of a number."""
    if e != e:  # NaN: an unstable point, not averaged
        return "unstable, not averaged"
    f = f"{{:.{nd}f}}{unit}"
    return f"{f.format(e)} [{f.format(lo)}, {f.format(hi)}]"


def _guards_where(r) -> str:
    return f"{r.preset} M = {int(r.tokens)}" + (", half active" if r.active else "")


def _guards_protocol(rec) -> str:
    """How each session timed a point (its recorded parameters), and which ran from a dirty tree (the cards' clocks
    and power at the start and the end are in each session's meta.json)."""
    dirty = [f"`{x}`" for x, m in rec.session_meta.items() if m.get("dirty")]
    how = {}
    for x, m in rec.session_meta.items():
        q = m.get("params", {})
        if "max_reps" in q:
            how.setdefault(f"{q['warmup']} untimed warm-up rounds (at least {q['warmup_s']:g} s), then "
                           f"{q['reps']} timed repetitions, up to {q['max_reps']} until every arm settled",
                           []).append(f"`{x}`")
    if len(how) == 1:
        proto = f"Per point, {next(iter(how))}"
    else:
        proto = "Per point, " + "; ".join(f"{', '.join(v)}: {k}" for k, v in how.items())
    tree = f" Dirty tree: {', '.join(dirty)}." if dirty else ""
    return f"{proto}.{tree}" if how else tree.strip()


def _threshold(paired) -> int | None:
    """The smallest recorded M from which every interval of the time lost per sync lies above zero (None: none)."""
    lo = paired.groupby("tokens")["us_per_sync_lo95"].min().sort_index()
    ok = (lo > 0)[::-1].cummin()[::-1]
    return int(ok[ok].index.min()) if ok.any() else None


def guards_block(folder: Path | None = None) -> str:
    """The guard end to end, from data/guards/: the two sessions pooled (their spread beside the
    within-session interval), one session (the second pending), or, while none is recorded, the
    archived recording of 2026-11-30, which predates the warm-up check."""
    from lora_moe_lab.instruments.analysers.recordings import guards_dir, session_files
    from lora_moe_lab.instruments.analysers.stats import MIN_PAIRED_REPS

    folder = Path(folder) if folder is not None else guards_dir()
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
                f"{int(p.n.min())} interleaved repetitions per point after 3 untimed calls per guard, used as "
                "recorded. **The two sessions of the new protocol are pending** (`studies/guards/record.py "
                "--session s1`, then `--session s2` on another machine).")
    else:
        n_s = "one session; the second is pending" if len(sessions) == 1 else f"{len(sessions)} device sessions"
        head = f"From `{rel(folder)}/`, {n_s} ({rec.label}). " + _guards_protocol(rec)
    lines = [head + f" {layers} MoE layers, bf16, Triton, {requests} requests, no adapter active, the guards and a "
             "graph replay interleaved. Times: medians of the kept repetitions; `sync / cpu_flag` (ratio of the "
             f"medians) and the lost time per sync (median paired difference over the {int(p.syncs.max())} syncs): "
             "**paired bootstrap, 95 %** (10,000 resamples)"
             + ("; across sessions the take is their mean with the union of their intervals "
                "(`stats.between_sessions`). The ms columns are pooled medians of both sessions' repetitions, so "
                "the take of `sync / cpu_flag` (the mean of each session's own ratio) need not equal their "
                "quotient." if len(sessions) > 1 else "."), ""]
    two = len(sessions) > 1
    if two:
        cols = ["sync (ms)", "cpu_flag (ms)", "sync / cpu_flag (ratio of medians), take [between sessions]",
                "**lost per sync (µs), take** [between sessions]", "launch_always (ms)", "graph replay (ms)"]
    else:
        cols = ["n kept", "sync (ms)", "cpu_flag (ms)", "sync / cpu_flag [paired bootstrap, 95 %]",
                "lost per sync (µs) [paired bootstrap, 95 %]", "launch_always (ms)", "graph replay (ms)"]
    lines += ["| preset | M (tokens) | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    ms = lambda k, v: "" if (k + (v,)) not in s.index or s[k + (v,)] != s[k + (v,)] else _ms(s[k + (v,)])  # noqa: E731
    for r in p[p.active == 0].itertuples():
        k = (r.preset, r.tokens, r.active)
        ratio = _guards_ci(r.ratio, r.ratio_lo95, r.ratio_hi95, 2).replace(" [", "x [", 1)
        take = _guards_ci(r.us_per_sync, r.us_per_sync_lo95, r.us_per_sync_hi95)
        if two:
            if r.stable and r.sessions < len(sessions):
                take += f" ({r.session} only)"
            elif r.stable and not r.agree:
                take += " †"
            cells = [ms(k, "sync"), ms(k, "cpu_flag"), ratio, f"**{take}**"]
        else:
            cells = [str(int(r.n)) if r.stable else "0", ms(k, "sync"), ms(k, "cpu_flag"), ratio, take]
        lines.append(f"| {r.preset} | {r.tokens} | " + " | ".join(cells) + f" | {ms(k, 'launch_always')} | "
                                                                           f"{ms(k, 'graph')} |")
    ok = p[p.stable]
    half = ok[ok.active > 0]
    small = ok[(ok.active == 0) & (ok.tokens == p.tokens.min())]
    notes = [""]
    if two:
        dis = p[p.stable & (p.sessions > 1) & ~(p.agree & p.agree_ratio)]
        notes.append(f"- † {int((p.stable & (p.sessions > 1) & p.agree & p.agree_ratio).sum())} of "
                     f"{int((p.stable & (p.sessions > 1)).sum())} points agree between the sessions on both figures"
                     + ("." if dis.empty else "; they disagree at " + "; ".join(
                         f"{_guards_where(r)} ("
                         + ", ".join(f"{x} " + _guards_ci(*per.loc[(x, r.preset, r.tokens, r.active),
                                                                    ["us_per_sync", "us_per_sync_lo95",
                                                                     "us_per_sync_hi95"]])
                                     for x in sessions) + " µs)" for r in dis.itertuples())
                        + ", where the take spans both intervals."))
    idle, every = _threshold(ok[ok.active == 0]), _threshold(ok)
    if idle is not None:
        big = ok[(ok.active == 0) & (ok.tokens >= idle)]
        top = big.loc[big.us_per_sync.idxmax()]
        notes.append(f"- With no adapter active, from M = {idle} up every interval lies above zero: "
                     f"{big.us_per_sync.min():.0f}–{big.us_per_sync.max():.0f} µs lost (medians) "
                     f"per sync, most at M = {int(top.tokens)} ({top.preset}, {top.ratio:.2f}x)"
                     + ("." if every == idle else f"; over every adapter mix, half active included (the threshold "
                        f"notebook 01 checks), from M = {every} up." if every is not None else
                        "; over every adapter mix some interval reaches below zero at every M."))
    if len(small):
        m0 = int(small.tokens.iloc[0])
        g16 = {r.preset: s[(r.preset, r.tokens, 0.0, "cpu_flag")] / s[(r.preset, r.tokens, 0.0, "graph")]
               for r in small.itertuples() if (r.preset, r.tokens, 0.0, "graph") in s.index}
        gone = p[(p.active == 0) & (p.tokens == m0) & ~p.stable]
        notes.append(f"- At M = {m0} the forward is host-bound ("
                     + ", ".join([f"{r.preset} {_guards_ci(r.us_per_sync, r.us_per_sync_lo95, r.us_per_sync_hi95)} µs"
                                  for r in small.itertuples()] + [f"{r.preset} unstable" for r in gone.itertuples()])
                     + ")" + ("; a graph replay is "
                              + ", ".join(f"{v:.1f}x ({k})" for k, v in g16.items()) + " faster than eager `cpu_flag`"
                              if g16 else "")
                     + "; eager `launch_always` pays for its launches ("
                     + ", ".join(f"{_ms(s[(r.preset, r.tokens, 0.0, 'launch_always')])} against "
                                 f"{_ms(s[(r.preset, r.tokens, 0.0, 'cpu_flag')])} ms"
                                 for r in small.itertuples()) + ").")
    if len(half):
        notes.append(f"- Half the requests active: `sync / cpu_flag` {half.ratio.min():.2f}x–{half.ratio.max():.2f}x.")
    notes += _guards_warmup_lines(rec, folder, bool(sessions), MIN_PAIRED_REPS)
    return "\n".join(lines + notes)


def _guards_warmup_lines(rec, folder: Path, checked: bool, min_reps: int) -> list[str]:
    """The warm-up drops and the unstable points, per session; for the archived recording what the
    check would have said (its figures above are as recorded)."""
    from lora_moe_lab.instruments.analysers.recordings import load_guards as _load

    w = rec.warmup() if checked else _load(rec.paths[0], check_warmup=True).warmup()
    lab = (lambda r: f"{r.session}: " if checked and rec.sessions[1:] else "")  # noqa: E731

    def listed(rows, fmt):  # "s1: a; b; s2: c": each session named once, before its first point
        out, last = [], None
        for r in rows:
            out.append(("" if lab(r) == last else lab(r)) + fmt(r))
            last = lab(r)
        return "; ".join(out)

    dw = w[w.dropped > 0]
    drops = listed(dw.itertuples(), lambda r: f"{_guards_where(r)}, first {r.dropped} of {r.reps}")
    if checked and len(dw) > 4:  # many: counted per session (each point's drop is in the file and its meta.json)
        drops = (f"at {len(dw)} points (" + ", ".join(f"{x} {n}" for x, n in dw.groupby("session").size().items())
                 + f"), the first {dw.dropped.min()}–{dw.dropped.max()} of {dw.reps.min()}–{dw.reps.max()}")
    unst = listed(w[w.status == "unstable"].itertuples(), lambda r: f"{_guards_where(r)} ({r.reps} repetitions)")
    if not checked:
        return [f"- The warm-up check (`stats.drop_warmup`, at least {min_reps} stable repetitions), applied to this "
                "recording afterwards, would drop leading drift at " + (drops or "no point")
                + " and finds " + (f"these points unstable: {unst}" if unst else "no point unstable")
                + ". The figures above use every repetition as recorded."]
    return ["- Warm-up drift dropped (leading repetitions, from every arm; the rows stay in the file): "
            + (drops or "none") + ". Unstable, not averaged: " + (unst or "none") + "."]


BLOCKS = {"guards": guards_block}
