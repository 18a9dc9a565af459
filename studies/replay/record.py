"""Validate the replay engine (sim/replay.py) held out: predict `cpu_flag` from a profiled `sync` forward
and the reverse, and compare with the UNPROFILED measurement of the target configuration.

    python studies/replay/record.py          # writes data/replay/validation.csv + .meta.json
    python studies/replay/record.py --simulator   # and data/replay/simulator_vs_replay.csv + .meta.json:
                                               # the queue simulator beside the replay (sim/whatif.py)

Per point: the source trace's steady forward (forward 1) as a graph; the 8-layer MoE traces tiled to 48
layers. One host factor per source trace (the profiler slows the host), fitted so that the replayed
SOURCE matches the source's own unprofiled measurement (same guard and configuration: what an engineer
has before the change; the target's measurement never enters). Where the source replay does not
depend on the host (a GPU-bound cpu_flag forward: the factor cannot be identified), the factor of the
`sync` trace of another configuration of the same model is used (named in `alpha_from`). The guard added
to a cpu_flag graph comes from the sync trace of another configuration (`template_from`). Then the
transformation (remove_syncs / add_syncs) and a replay as the measurement ran: a chunked prefill of
requests*input_len/chunk forwards from an idle GPU (median per forward), or one forward from an idle
GPU (the MoE guards recording). Pass: within +-5 % of the two sessions' mean, or inside the union of
the sessions' 95 % intervals where that is wider.

The first recording's points (data/production/traces, studies/production/record_tp.py at fb530be; FIRST): the
decoder at TP=1 with adapter mode `mix`, and at TP=2 (gs 260/48 in modes none and mix, gs 1/48 in mode
none), C=16384. Same recipe, with what those traces hold: one profiled forward each, the FIRST chunk of
a prefill from an idle GPU (forward 0), replayed as a 128 x 2048-token chunked prefill (16 forwards
from an idle GPU, median per forward, as the existing points replay their steady forward); measured in
one session of 5 repetitions (`sessions` = 1; the interval is the 2.5-97.5 percentiles of the
repetitions, not a confidence interval). The factor and the guard template come from another mode or
guard_sites of the same recording and TP (FIRST_OTHER). TP=2, chosen before the measured values were
read: one rank is replayed, rank 0 (the later rank in the sync traces: its all-reduce kernels run near
their own time, 244-247 us median against 405-462 us on rank 1, so its timeline holds the least of
the other rank's wait). The factor is fitted on rank 0's graph as traced (its measured sync forward
holds the all-reduce waits that the traced kernels hold). For the prediction every all-reduce kernel is
set to the collective's own time (scale_collectives(ns=)): per collective the shorter of the two ranks'
kernels in the source guard's traces, the median over the forward's collectives (~244 us, against 246
us in data/tp_emulation/allreduce.json, from the cpu_flag traces: not used, being the target's). Left
out: `sync` predicted from `cpu_flag` at TP=2 is one rank with no second host, so the other rank's
lateness at each all-reduce after a sync (the wait that makes a sync trace's all-reduce kernels longer)
is not in the prediction: it under-predicts by that wait, reported as the miss's cause.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lora_moe_lab.instruments.analysers import production_runs, recordings, schemas, stats
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.provenance import DATA, metadata
from lora_moe_lab.sim import replay as R
from lora_moe_lab.sim import replay_transforms as X

ROOT = Path(__file__).resolve().parents[2]

OUT = DATA / "replay"
SIG = DATA / "production" / "signature_s1" / "traces"
MOE = DATA / "traces"
TOL = 0.05
DEC = {"default_C16384": "qwen3-30b-a3b_L48_tp1_C16384_gs5.41667_none_{g}_rank0.json.gz",
       "prodlike_C16384": "qwen3-30b-a3b_L48_tp1_C16384_gs5.41667_h7333.17_f0_o70_none_{g}_rank0.json.gz",
       "default_C8192": "qwen3-30b-a3b_L48_tp1_C8192_gs5.41667_none_{g}_rank0.json.gz"}
# the other configuration of the same model a factor or a guard template may come from (never the target's)
DEC_OTHER = {"default_C16384": "default_C8192", "default_C8192": "default_C16384", "prodlike_C16384": "default_C16384"}
MOE_FILE = "qwen3-30b-a3b_{g}_eager_M{m}.json.gz"
MOE_OTHER = {16: 4096, 4096: 16}
SPIN_NS = 500_000  # host gaps longer than this are the engine's calibrated busy-wait (not slowed by a profiler)
# the first recording (studies/production/record_tp.py, commit fb530be): config -> (measurement file, tp, adapter mode,
# trace pattern); one profiled forward (the first chunk) per guard, mode and rank; one session of 5 repetitions
PROD = DATA / "production"
FIRST = {"tp1_mix_C16384": ("tp1_C16384_gs5.42", 1, "mix", "qwen3-30b-a3b_L48_tp1_C16384_gs5.41667_mix_{g}_rank{r}"),
         "tp1_none_C16384": ("tp1_C16384_gs5.42", 1, "none", "qwen3-30b-a3b_L48_tp1_C16384_gs5.41667_none_{g}_rank{r}"),
         "tp2_none_C16384": ("tp2_C16384_gs5.42", 2, "none", "qwen3-30b-a3b_L48_tp2_C16384_gs5.41667_none_{g}_rank{r}"),
         "tp2_mix_C16384": ("tp2_C16384_gs5.42", 2, "mix", "qwen3-30b-a3b_L48_tp2_C16384_gs5.41667_mix_{g}_rank{r}"),
         "tp2_none_C16384_gs1": ("tp2_C16384_gs1", 2, "none", "qwen3-30b-a3b_L48_tp2_C16384_gs1_none_{g}_rank{r}")}
# the held-out points among them (tp1_none_C16384 is the signature sessions' point: here only a factor / template)
FIRST_POINTS = ("tp1_mix_C16384", "tp2_none_C16384", "tp2_mix_C16384", "tp2_none_C16384_gs1")
FIRST_OTHER = {"tp1_mix_C16384": "tp1_none_C16384", "tp1_none_C16384": "tp1_mix_C16384",
               "tp2_none_C16384": "tp2_mix_C16384", "tp2_mix_C16384": "tp2_none_C16384",
               "tp2_none_C16384_gs1": "tp2_none_C16384"}
REPLAYED_RANK = 0


def first_trace(cfg: str, guard: str, rank: int = REPLAYED_RANK) -> Path:
    return PROD / "traces" / (FIRST[cfg][3].format(g=guard, r=rank) + ".json.gz")


def first_measured() -> tuple[dict, dict]:
    """(config, guard) -> [(forward_median_ms, lo, hi)] (one session: 2.5-97.5 percentiles of its 5 repetitions),
    and config -> forwards per prefill (requests x input_len / chunk)."""
    out, steps = {}, {}
    for cfg, (f, tp, mode, _) in FIRST.items():
        s = schemas.read_csv(PROD / f"{f}.summary.csv", "prefill_summary")
        s = s[(s["adapters"] == mode) & (s["tp"] == tp)]
        for r in s.itertuples():
            out[(cfg, r.guard)] = [(r.forward_median_ms, r.forward_median_ms_lo, r.forward_median_ms_hi)]
            steps[cfg] = int(r.requests * r.input_len // r.chunk)
    return out, steps


def collective_ns(cfg: str, guard: str) -> int:
    """A collective's own time at TP=2 from the source guard's two rank traces: per all-reduce, the shorter of
    the two ranks' kernels (the later rank waits least), the median over the forward's collectives."""
    k = []
    for r in (0, 1):
        g = R.build_graph(first_trace(cfg, guard, r), forward=0)
        k.append(g.kern["dur"][g.kern["nccl"]])
    if len(k[0]) != len(k[1]) or not len(k[0]):
        raise R.GraphError(f"{cfg} {guard}: the ranks' traces hold {len(k[0])} and {len(k[1])} collectives")
    return int(np.median(np.minimum(k[0], k[1])))


def fit_alpha(g: R.Graph, target_ms: float, steps: int) -> tuple[float, bool]:
    """The host factor that makes the replayed graph match target_ms; (nan, False) when the replay
    barely depends on it (changes < 0.5 % between factors 0.3 and 1)."""
    f = lambda a: R.replay(X.scale_host(g, a, calls=True, below_ns=SPIN_NS), steps=steps, init="idle").forward_ms  # noqa: E731
    lo, hi = 0.3, 1.5
    if abs(f(lo) - f(1.0)) < 0.005 * f(1.0):
        return float("nan"), False
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target_ms else (lo, mid)
    a = (lo + hi) / 2
    if a < 0.31 or a > 1.49:  # at a bound: the host cannot explain the gap (the kernels do)
        return float("nan"), False
    return a, True


def decoder_measured(sessions) -> dict:
    out = {}
    for name, s in sessions.items():
        for r in s.summary.itertuples():
            out.setdefault((r.task, r.guard), []).append((r.forward_median_ms, r.forward_median_ms_lo,
                                                          r.forward_median_ms_hi))
    return out


def moe_measured(rec) -> dict:
    d = rec.samples
    d = d[(d["preset"] == "qwen3-30b-a3b") & (d["mode"] == "eager") & (d["active"] == 0.5)
          & (d["status"] == "ok") & (~d["warmup_drift"].astype(bool))]
    out = {}
    for (m, guard, sess), x in d.groupby(["tokens", "guard", "session"]):
        med, lo, hi = stats.median_ci(x["us"].to_numpy() / 1e3)
        out.setdefault((int(m), guard), []).append((med, lo, hi))
    return out


def judge(pred: float, per: list) -> dict:
    b = stats.between_sessions(*per)  # one session: its own figure; several: the union of the intervals
    est, lo, hi = b["estimate"], b["lo"], b["hi"]
    err = pred / est - 1
    within = lo <= pred <= hi
    return dict(measured_ms=est, measured_lo=lo, measured_hi=hi, sessions=len(per), err_pct=100 * err,
                passed=bool(abs(err) <= TOL or within),
                by=("±5 %" if abs(err) <= TOL else "interval" if within else ""))


def main() -> pd.DataFrame:
    t0 = time.perf_counter()
    sessions = production_runs.load_sessions()
    dm = decoder_measured(sessions)
    mm = moe_measured(recordings.load_guards())
    graphs, rows, repro = {}, [], []

    def graph(path):
        if path not in graphs:
            graphs[path] = R.build_graph(path, forward=1)
        return graphs[path]

    steps_of = {task: int(64 * 2048 / int(task.split("_C")[1])) for task in DEC}
    # 1. the source factors (self), per trace
    alpha = {}
    for task, pat in DEC.items():
        for g_ in ("sync", "cpu_flag"):
            src = graph(SIG / pat.format(g=g_))
            meas = np.mean([v[0] for v in dm[(task, g_)]])
            alpha[("dec", task, g_)] = fit_alpha(src, meas, steps_of[task])
    for m in MOE_OTHER:
        for g_ in ("sync", "cpu_flag"):
            src = X.tile_layers(graph(MOE / MOE_FILE.format(g=g_, m=m)), 6)
            alpha[("moe", m, g_)] = fit_alpha(src, np.mean([v[0] for v in mm[(m, g_)]]), 1)
    fm, fsteps = first_measured()

    def fgraph(cfg, g_):  # the first recording's traces: one forward, the first chunk
        p = first_trace(cfg, g_)
        if p not in graphs:
            graphs[p] = R.build_graph(p, forward=0)
        return graphs[p]

    for cfg in FIRST:  # fitted on rank 0's graph as traced (at TP=2 with its all-reduce waits, as measured)
        for g_ in ("sync", "cpu_flag"):
            alpha[("dec", cfg, g_)] = fit_alpha(fgraph(cfg, g_), fm[(cfg, g_)][0][0], fsteps[cfg])

    def point(model, cfg, src_guard, dst_guard, src, tpl_graph, steps, other, measured, coll_ns=None):
        """coll_ns: at TP=2, every all-reduce kernel set to this (the collective's own time) before the change."""
        a, ok = alpha[(model, cfg, src_guard)]
        a_from = f"{cfg} {src_guard} (self)"
        if not ok:
            a, ok2 = alpha[(model, other, "sync")]
            a_from = f"{other} sync (cross)"
        variants = {}
        for label, fac in (("raw", 1.0), ("calibrated", a)):
            gg = X.scale_host(src, fac, calls=True, below_ns=SPIN_NS)
            gg = X.scale_collectives(gg, ns=coll_ns) if coll_ns is not None else gg
            tg = X.scale_host(tpl_graph, fac, calls=True, below_ns=SPIN_NS) if tpl_graph is not None else None
            out = X.remove_syncs(gg) if dst_guard == "cpu_flag" else X.add_syncs(gg, X.guard_template(tg))
            variants[label] = R.replay(out, steps=steps, init="idle").forward_ms
        src_pred = R.replay(X.scale_host(src, a, calls=True, below_ns=SPIN_NS), steps=steps, init="idle").forward_ms
        j = judge(variants["calibrated"], measured[(cfg, dst_guard)])
        jr = judge(variants["raw"], measured[(cfg, dst_guard)])
        rows.append(dict(model=model, config=str(cfg), source=src_guard, target=dst_guard,
                         predicted_ms=variants["calibrated"],
                         **j, raw_predicted_ms=variants["raw"], raw_err_pct=jr["err_pct"], raw_passed=jr["passed"],
                         alpha=a, alpha_from=a_from, source_replayed_ms=src_pred,
                         source_measured_ms=float(np.mean([v[0] for v in measured[(cfg, src_guard)]])),
                         template_from=f"{other} sync" if dst_guard == "sync" else "", steps=steps,
                         source_trace=str(src.meta.get("source", "")).replace(str(ROOT) + "/", "")))

    for task, pat in DEC.items():
        other = DEC_OTHER[task]
        for sg, dg in (("sync", "cpu_flag"), ("cpu_flag", "sync")):
            src = graph(SIG / pat.format(g=sg))
            tpl = graph(SIG / DEC[other].format(g="sync")) if dg == "sync" else None
            point("dec", task, sg, dg, src, tpl, steps_of[task], other, dm)
    for m, other in MOE_OTHER.items():
        for sg, dg in (("sync", "cpu_flag"), ("cpu_flag", "sync")):
            src = X.tile_layers(graph(MOE / MOE_FILE.format(g=sg, m=m)), 6)
            tpl = graph(MOE / MOE_FILE.format(g="sync", m=other)) if dg == "sync" else None
            point("moe", m, sg, dg, src, tpl, 1, other, mm)
    coll = {}
    for cfg in FIRST_POINTS:
        other = FIRST_OTHER[cfg]
        for sg, dg in (("sync", "cpu_flag"), ("cpu_flag", "sync")):
            tpl = fgraph(other, "sync") if dg == "sync" else None
            ns = collective_ns(cfg, sg) if FIRST[cfg][1] == 2 else None
            if ns is not None:
                coll[f"{cfg} {sg}"] = ns
            point("dec", cfg, sg, dg, fgraph(cfg, sg), tpl, fsteps[cfg], other, fm, coll_ns=ns)
    df = pd.DataFrame(rows)
    df["cause"] = [cause(r) for r in df.itertuples()]
    # reproduction of every recorded trace and the replay speed
    for p in (sorted(SIG.glob("*.json.gz")) + sorted(MOE.glob("*.json.gz"))
              + sorted((DATA / "production" / "traces").glob("*.json.gz"))):
        t = R._tables(p)[0]
        for f in range(len(t.forwards)):
            g = R.build_graph(t, forward=f)
            s = time.perf_counter()
            r = R.replay(g)
            dt = time.perf_counter() - s
            repro.append(dict(trace=p.name, forward=f, host_calls=g.n_host, kernels=g.n_kernels, syncs=g.n_syncs,
                              traced_ms=g.traced_ms, replayed_ms=float(r.step_ms[0]),
                              err_pct=100 * (r.step_ns[0] / g.traced_ns - 1), replay_s=dt))
    rp = pd.DataFrame(repro)
    OUT.mkdir(parents=True, exist_ok=True)
    # each table whole (temp file + rename), its metadata, then its seal (recorders/tables.py)
    tables.write_text_atomic(OUT / "validation.csv", df.to_csv(index=False, float_format="%.4f"))
    tables.write_text_atomic(OUT / "reproduction.csv", rp.to_csv(index=False, float_format="%.4f"))
    meta = metadata(dict(tolerance=TOL, spin_ns=SPIN_NS, method=__doc__.strip(), points=len(df),
                         replayed_rank=REPLAYED_RANK, collective_own_ns=coll,
                         passed=int(df["passed"].sum()), raw_passed=int(df["raw_passed"].sum()),
                         reproduction_max_abs_err_pct=float(rp["err_pct"].abs().max()),
                         replay_max_s=float(rp["replay_s"].max()), seconds=time.perf_counter() - t0))
    for name in ("validation", "reproduction"):
        tables.write_json_atomic(OUT / f"{name}.meta.json", meta)
        tables.seal(OUT / f"{name}.csv", OUT / f"{name}.meta.json")
    return df


def cause(r) -> str:
    """Which part of the replay is off, for a miss (and for a pass, what it leaned on)."""
    if r.passed:
        return ""
    if str(r.config).startswith("tp2") and r.target == "sync" and r.err_pct < 0:
        return ("too fast: one rank replayed (rank 0) with no second host: the other rank's lateness at each "
                "all-reduce after a sync (the wait in a sync trace's all-reduce kernels) is left out")
    if r.target == "cpu_flag" and r.err_pct < 0:
        return ("too fast: the fixed graph keeps the sync run's kernel durations, and the card clocked higher "
                "under sync "
                "(1950 against 1860 MHz at the 700 W cap, signature_s2/clocks.csv): the same kernels ran ~4 % longer "
                "under cpu_flag")
    if r.target == "sync" and r.err_pct > 0:
        return ("too slow: host re-issue after each sync too long (the profiled host work or the guard template's "
                "sync return)")
    if r.target == "sync":
        return ("too fast: the bubble after each sync is under-predicted (host work after a sync, or the "
                "template's sync return)")
    return "too slow: host work left in the fixed graph (the calibrated factor) or kernels run slower in the sync trace"


def simulator_vs_replay() -> pd.DataFrame:
    """The queue simulator beside the replay on the same points (sim/whatif.py: simulator_vs_replay)."""
    from lora_moe_lab.sim import whatif

    t0 = time.perf_counter()
    d = whatif.simulator_vs_replay()
    tables.write_text_atomic(OUT / "simulator_vs_replay.csv", d.to_csv(index=False, float_format="%.4f"))
    meta = metadata(dict(tolerance=TOL, method=whatif.simulator_vs_replay.__doc__.strip(), points=len(d),
                         agree=int(d["agrees"].sum()), compared=int(d["simulator_ms"].notna().sum()),
                         simulator_fit="data/simulator/simulator_fit.json",
                         replay_validation="data/replay/validation.csv",
                         seconds=time.perf_counter() - t0))
    tables.write_json_atomic(OUT / "simulator_vs_replay.meta.json", meta)
    tables.seal(OUT / "simulator_vs_replay.csv", OUT / "simulator_vs_replay.meta.json")
    return d


if __name__ == "__main__":
    pd.set_option("display.width", 250)
    if "--simulator" in sys.argv[1:]:
        s = simulator_vs_replay()
        print(s[["model", "config", "guard", "mode", "layers", "quantity", "replay_ms", "simulator_ms",
                 "sim_vs_replay_pct", "agrees", "measured_ms"]].round(3).to_string())
        print(f"the simulator agrees with the replay (±5 %) at {int(s['agrees'].sum())} of "
              f"{int(s['simulator_ms'].notna().sum())} points")
        sys.exit(0)
    d = main()
    print(d[["model", "config", "source", "target", "predicted_ms", "measured_ms", "measured_lo", "measured_hi",
             "err_pct", "passed", "raw_err_pct", "alpha", "alpha_from"]].to_string())
    print(f"{int(d['passed'].sum())} of {len(d)} passed")
