"""The probe study's block (scripts/readme_tables.py collects `BLOCKS`): the relation gain(lead) and its
leave-one-session-out check, from data/probe/ and data/production/ (studies/probe/read.py)."""
from __future__ import annotations

from lora_moe_lab.instruments.analysers import host_lead as H
from lora_moe_lab.instruments.analysers import stats as S

BLOCK_DATA = {"probe": "probe"}


def lean_range(gpu: str | None = None) -> tuple[float, float, int]:
    """The lean-host gain over the recorded sessions (of one GPU model, or all): (lowest median, highest median,
    sessions)."""
    from studies.probe import read

    p = read.points()
    lean = p[(p["host_us_per_layer"] == 0) & ((p["gpu"] == gpu) if gpu else True)]
    return float(lean["measured_gain_pct"].min()), float(lean["measured_gain_pct"].max()), len(lean)


def lean_gpus() -> list[str]:
    from studies.probe import read

    p = read.points()
    return sorted(p.loc[p["host_us_per_layer"] == 0, "gpu"].unique(), reverse=True)


def _rows(v) -> list[str]:
    out = ["| session | GPU | lead (µs) | predicted | measured [95 %] | error (pp) |",
           "|---|---|---:|---:|---:|---:|"]
    for _, r in v.iterrows():
        p = r["predicted_gain_pct"]
        pred = "not fitted" if p != p else f"{p:+.1f} %"
        err = "" if r["error_pp"] != r["error_pp"] else f"{r['error_pp']:+.1f}"
        out.append(f"| {r['session']} | {str(r['gpu']).replace('NVIDIA ', '')} | {r['lead_us']:.0f} | "
                   f"{pred} | {r['measured_gain_pct']:+.1f} % [{r['measured_gain_pct_lo']:+.1f}, "
                   f"{r['measured_gain_pct_hi']:+.1f}] | {err} |")
    return out


def _tally(v) -> str:
    ok, err = v["error_pp"].abs() <= H.GOAL_PP, v["error_pp"].abs()
    mean = v["error_pp"].mean()
    return f"{int(ok.sum())} of {len(v)} within ±{H.GOAL_PP:g} pp (largest {err.max():.1f}, mean {mean:+.1f})"


def probe_block() -> str | None:
    from studies.probe import read

    pts = read.points()
    if pts.empty:
        return None
    v, rel, sav = read.validation(), H.fit(pts), H.fit_saving(pts)
    gpus = sorted(str(g).replace("NVIDIA ", "") for g in pts["gpu"].unique())
    by_gpu = v[(v["left_out"] == "gpu") & (v["relation"] == "saving")]
    sav_s = v[(v["left_out"] == "session") & (v["relation"] == "saving")]
    lead_s = v[(v["left_out"] == "session") & (v["relation"] == "lead")]
    lines = [
        f"{len(pts)} points ({', '.join(gpus)}): each a session's lean-host prefill (64 × 2048 tokens, C=16384, "
        "no adapter, the layers the card holds) or the same with 2000 µs of host work per layer. Gain: median of "
        "the paired repetitions, paired-bootstrap 95 % interval.", "",
        f"- **saving** (the probe's): {sav.describe()}; T is timed before the prediction. The per-sync saving is "
        "the host's, so it carries across GPU models.",
        f"- **lead**: {rel.describe()}; within one GPU model only.", "",
        f"Each GPU model predicted from the other models' points (saving): {_tally(by_gpu)}; goal ±3 pp:", "",
        *_rows(by_gpu), "",
        f"Each session left out of its own fit: saving {_tally(sav_s)}; lead {_tally(lead_s)}.", ""]
    lines += [f"Lean-host gain per GPU model over its sessions ({S.RUNS_METHOD}); later sessions against the "
              "interval of those before them:", ""]
    for gpu in lean_gpus():
        lean = pts[(pts["host_us_per_layer"] == 0) & (pts["gpu"] == gpu)].sort_values("date")
        g, name = lean["measured_gain_pct"].to_numpy(float), str(gpu).replace("NVIDIA ", "")
        if len(g) < 3:
            lines.append(f"- {name}: {len(g)} sessions ({', '.join(f'{v:+.1f} %' for v in g)}): an interval over "
                         "runs needs 3 or more")
            continue
        m, lo, hi = S.between_runs(g)
        nxt = S.next_run_check(g)
        check = (f"{sum(r['inside'] for r in nxt)} of {len(nxt)} later sessions inside the interval before them"
                 if nxt else "no later session to test it yet")
        lines.append(f"- {name}: {m:+.1f} % [{lo:+.1f}, {hi:+.1f}] over {len(g)} sessions; {check}")
    lines.append("")
    hw = pts[pts["host_us_per_layer"] > 0]
    if len(hw):
        lo, hi = hw["lead_us"].min(), hw["lead_us"].max()
        g0, g1 = hw["measured_gain_pct"].min(), hw["measured_gain_pct"].max()
        lines += [f"With host work the lead falls to {lo:.0f}-{hi:.0f} µs and the gain rises to {g0:+.1f} to "
                  f"{g1:+.1f} %."]
    return "\n".join(lines)


BLOCKS = {"probe": probe_block}
