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
    out = ["| session | GPU | host | lead (µs) | predicted | measured [95 % interval] | error (pp) |",
           "|---|---|---|---:|---:|---:|---:|"]
    for _, r in v.iterrows():
        p = r["predicted_gain_pct"]
        pred = "not fitted" if p != p else f"{p:+.1f} %"
        err = "" if r["error_pp"] != r["error_pp"] else f"{r['error_pp']:+.1f}"
        out.append(f"| {r['session']} | {str(r['gpu']).replace('NVIDIA ', '')} | {r['host']} | {r['lead_us']:.0f} | "
                   f"{pred} | {r['measured_gain_pct']:+.1f} % [{r['measured_gain_pct_lo']:+.1f}, "
                   f"{r['measured_gain_pct_hi']:+.1f}] | {err} |")
    return out


def _tally(v) -> str:
    ok, err = v["error_pp"].abs() <= H.GOAL_PP, v["error_pp"].abs()
    return (f"{int(ok.sum())} of {len(v)} within ±{H.GOAL_PP:g} pp (largest error {err.max():.1f} pp, mean signed "
            f"error {v['error_pp'].mean():+.1f} pp)")


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
        f"Two relations over every recorded point ({len(pts)} points, GPU models: {', '.join(gpus)}). A point is "
        "one session's lean-host prefill (64 requests × 2048 tokens, C=16384, no adapter, the layers the card "
        "holds), or the same with engine host work added per layer (2000 µs: a stand-in for a slower host). Lead: "
        "the median host time blocked in the later syncs of a `sync` forward. Gain: the fix's input throughput "
        "over `sync`'s, median of the paired repetitions with its paired-bootstrap 95 % interval.", "",
        f"- **saving** (the probe's): {sav.describe()}. T is the `sync` forward the probe times before it "
        "predicts; the per-sync saving is the host's, so it carries from one GPU model to another.",
        f"- **lead**: {rel.describe()}; it holds within one GPU model and cannot be fitted from another (one "
        "model's leads span too little for a slope).", "",
        f"Each GPU model predicted from the other models' points only (saving relation): {_tally(by_gpu)}; "
        "goal ±3 pp (data/probe/validation.csv):", "", *_rows(by_gpu), "",
        f"Each session left out of its own fit: the saving relation {_tally(sav_s)}; the lead relation "
        f"{_tally(lead_s)}.", ""]
    lines += ["Each GPU model's lean-host gain over its sessions, each an independent run on a freshly started "
              f"machine ({S.RUNS_METHOD}), and whether each later session landed inside the interval of the "
              "sessions recorded before it:", ""]
    for gpu in lean_gpus():
        lean = pts[(pts["host_us_per_layer"] == 0) & (pts["gpu"] == gpu)].sort_values("date")
        g, name = lean["measured_gain_pct"].to_numpy(float), str(gpu).replace("NVIDIA ", "")
        if len(g) < 3:
            lines.append(f"- {name}: {len(g)} sessions ({', '.join(f'{v:+.1f} %' for v in g)}): an interval over "
                         "runs needs 3 or more")
            continue
        m, lo, hi = S.between_runs(g)
        nxt = S.next_run_check(g)
        lines.append(f"- {name}: {m:+.1f} % [{lo:+.1f}, {hi:+.1f}] over {len(g)} sessions; "
                     f"{sum(r['inside'] for r in nxt)} of {len(nxt)} later sessions inside the interval before them")
    lines.append("")
    hw = pts[pts["host_us_per_layer"] > 0]
    if len(hw):
        lo, hi = hw["lead_us"].min(), hw["lead_us"].max()
        g0, g1 = hw["measured_gain_pct"].min(), hw["measured_gain_pct"].max()
        lines += [f"With host work added the lead falls to {lo:.0f}-{hi:.0f} µs "
                  f"and the gain rises to {g0:+.1f} to {g1:+.1f} % "
                  "(medians): the same direction as between machines."]
    return "\n".join(lines)


BLOCKS = {"probe": probe_block}
