"""TP=4 predicted on one H200: one rank's shapes, each all-reduce replaced by its measured time.

    PYTHONPATH=. python3 studies/tp_emulation/record.py --fit-collectives   # CPU, once: allreduce.json
    PYTHONPATH=. GIT_COMMIT=<sha> GIT_DIRTY=0 python3 studies/tp_emulation/record.py --session s1 --out $OUT
    PYTHONPATH=. python3 studies/tp_emulation/record.py --smoke --out /tmp/emu   # CPU: tiny, seconds

The method and its limits: lora_moe_lab/sim/tp_emulation.py. The Qwen3-30B-A3B-shaped decoder,
48 layers, bf16, Triton, no adapter in use, `sync` against `cpu_flag`, interleaved repetitions
after an untimed warm-up prefill (instruments/recorders/prefill.py), no profiler. Tasks, in order:

  tp2_gs5.42_C16384    the check: a TP=2 rank, 260 syncs per forward, against TP=2 measured on
  tp2_gs1_C16384       two H200s (data/production/tp2_C16384_gs{5.42,1}); 48 syncs per forward
  tp4_default_C16384   the prediction at TP=4 rank shapes, the lab's own regime (a lean host)
  tp4_prodlike_C16384  production's regime: engine host work per layer calibrated in this call so
                       the later syncs block ~116 us, and 70 ms of an earlier batch queued ahead
  tp4_default_C8192, tp4_prodlike_C8192   the same at half the chunk

Writes $OUT/emulation_<session>/ (task CSVs, summaries, meta.json) and its tarball; copy the
folder to data/tp_emulation/. Another session on another machine is the rerun.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from lora_moe_lab.instruments.recorders import prefill as P
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.clocks import ClockLog
from lora_moe_lab.instruments.recorders.harness import pack_session, session_parser
from lora_moe_lab.model import tp as TP
from lora_moe_lab.provenance import DATA, catalog, metadata
from lora_moe_lab.sim import PRODUCTION_SIGNATURE as PS
from lora_moe_lab.sim import tp_emulation as E

GS = {"gs5.42": 260 / 48, "gs1": 1.0}
GUARDS = ["sync", "cpu_flag"]
TASKS = ["tp2_gs5.42_C16384", "tp2_gs1_C16384", "tp4_default_C16384", "tp4_prodlike_C16384",
         "tp4_default_C8192", "tp4_prodlike_C8192"]


def fit_collectives(out: Path | None = None) -> dict:
    """data/tp_emulation/allreduce.json (out None: the catalog's "tp_emulation.allreduce") from the profiled TP=2
    forwards in data/production/traces."""
    out = out or catalog("tp_emulation.allreduce")
    from lora_moe_lab.config import get_shape

    traces = sorted((DATA / "production" / "traces").glob("*_tp2_*rank*.json.gz"))
    cost, info = E.fit_allreduce(traces, hidden=get_shape("qwen3-30b-a3b").hidden)
    doc = dict(bus_gbps=cost.bus_gbps, latency_us=cost.latency_us, source=cost.source, **info,
               meta=metadata(params=dict(traces="data/production/traces/*_tp2_*cpu_flag*")))
    tables.write_json_atomic(out, doc)  # temp file + os.replace (it makes the folder)
    print(f"{out}: {cost.bus_gbps:.1f} GB/s bus bandwidth ({info['median_us']:.1f} us for "
          f"{info['nbytes'] / 2**20:.0f} MiB at TP=2); {cost.source}")
    return doc


def summarize(folder: Path | None = None) -> None:
    """validation.csv (TP=2 emulated vs measured) and prediction.csv (TP=4) from every session (folder None: the
    catalog's "tp_emulation.folder")."""
    folder = folder or catalog("tp_emulation.folder")
    sessions = E.load_sessions(folder)
    v, p = E.tp2_validation(sessions), E.tp4_prediction(sessions)
    meta = metadata(params=dict(sessions=sorted(sessions), pass_pct=E.PASS_PCT,
                                measured={k: str(x.relative_to(DATA.parent)) for k, x in E.tp2_measured().items()},
                                method="sim/tp_emulation.py; intervals: stats.between_sessions of each session's "
                                       "order-statistic (forward) or paired-bootstrap (gain) 95 % interval"))
    write_summaries(folder, v, p, meta)
    print(v.to_string(index=False, float_format="{:.2f}".format))
    print(f"TP=2 check: {int(v['passed'].sum())} of {len(v)} points pass")
    print(p.to_string(index=False, float_format="{:.2f}".format))


def write_summaries(folder: Path, validation: pd.DataFrame, prediction: pd.DataFrame, meta: dict) -> None:
    """validation.csv and prediction.csv, each whole (temp file + os.replace), then its .meta.json and its
    seal there (tables.write_table). They are derived from the sessions: a rerun replaces them, but never
    with a table of another kind (HeaderMismatchError naming the file)."""
    for name, df in (("validation", validation), ("prediction", prediction)):
        tables.write_table(folder / f"{name}.csv", df, meta=meta)


def write_task(work: Path, task: str, df: pd.DataFrame, summary: pd.DataFrame) -> list:
    """A task's rows and summary, each whole (tables.write_table); their seals go into the session's
    meta.json (seal_session, before pack_session writes it)."""
    return [tables.write_table(work / f"{task}.csv", df, replace=True, seal_it=False),
            tables.write_table(work / f"{task}.summary.csv", summary, replace=True, seal_it=False)]


def seal_session(work: Path, meta: dict, open_logs=()) -> dict:
    """meta["files"]: the seals of the session folder's tables (not a log still being written)."""
    meta["files"] = tables.seal_files(work, skip=tuple(Path(f).name for f in open_logs))
    return meta


def parse_task(task: str) -> tuple[int, str, int]:
    """'tp4_prodlike_C8192' -> (4, 'prodlike', 8192); 'tp2_gs1_C16384' -> (2, 'gs1', 16384)."""
    head, c = task.rsplit("_C", 1)
    tp, regime = head.split("_", 1)
    return int(tp.removeprefix("tp")), regime, int(c)


def run_task(task, labs, cost, names, a, work: Path, deadline, cal: dict) -> pd.DataFrame | None:
    size, regime, chunk = parse_task(task)
    size = min(size, 2) if a.smoke else size  # the tiny preset's 2 KV heads split in two at most
    gs = GS.get(regime, GS["gs5.42"])
    lab = labs.get((size, gs))
    if lab is None:
        labs.clear()  # one lab on the GPU at a time (a TP=2 rank's 48 layers hold ~30 GB)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed lab's blocks back before the next one is built
        group = TP.emulated(size, cost)
        lab = labs[size, gs] = P.build(a.preset, a.layers, max_loras=4, max_rank=16, dtype="auto", device="auto",
                                       backend="auto", seed=0, guard_sites=gs, group=group)
        P.load_adapters(lab, 2, 16)
    group = lab.model.tp
    chunk = chunk if not a.smoke else 16 * chunk // 16384
    requests = (a.requests_tp2 if size == 2 else a.requests) if not a.smoke else 8
    plan = P.make_plan(requests, a.input_len, max(chunk, a.input_len))
    costs = P.EngineCosts()
    if regime == "prodlike":
        key = (size, chunk)
        if key not in cal:
            try:
                cal[key] = P.calibrate_host_work(lab, plan, names, PS["later_blocked_mean_us"], group=group)
            except ValueError as e:  # production's target lies below this run's round trips
                if not a.smoke:
                    raise
                # a smoke run shares its GPU with the test suite's other workers, whose kernels can hold every
                # sync's round trip above production's target (gpu_check_4fc992d: 1056 us against 116): the smoke
                # checks the plumbing, so it runs without engine host work and says so
                cal[key] = dict(host_us_per_layer=0.0, not_calibrated=str(e))
            print(f"calibration {task}: {json.dumps(cal[key])}", flush=True)
        costs = P.EngineCosts(host_us_per_layer=cal[key]["host_us_per_layer"],
                              overlap_ms=PS["first_sync_ms"] * (1e-3 if a.smoke else 1.0))
    d = P.PrefillDriver(lab, plan, P.request_adapters(plan.requests, "none", names), costs=costs, group=group)
    key = dict(preset=a.preset, layers=lab.shape.num_layers, tp=size, requests=plan.requests, input_len=plan.input_len,
               chunk=plan.chunk, guard_sites=gs)
    t = time.monotonic()
    n0, us0 = group.collectives, group.collective_us
    # the check's tasks profile two steady forwards per guard first (GPU idle, like with like with
    # the TP=2 traces); their timed rows are unprofiled, as everywhere
    rows = P.measure({"none": d}, GUARDS, a.reps, key=key, profile=size == 2, deadline=deadline, progress=False,
                     warmup_reps=1)
    df = pd.DataFrame(rows, columns=P.COLUMNS).assign(session=a.session, task=task, emulated=True,
                                                      bus_gbps=cost.bus_gbps)
    s = P.summarize(df).assign(session=a.session, task=task)
    write_task(work, task, df, s)
    n = group.collectives - n0
    print(f"== {task}: {len(df) // len(GUARDS)} reps in {time.monotonic() - t:.0f} s; {n} emulated all-reduces, "
          f"{(group.collective_us - us0) / max(n, 1):.1f} us each", flush=True)
    cols = ["guard", "reps", "warmup_dropped", "forward_median_ms", "forward_median_ms_lo", "forward_median_ms_hi",
            "fix_throughput_gain_pct", "fix_throughput_gain_pct_lo", "fix_throughput_gain_pct_hi",
            "fix_ttft_change_pct", "later_blocked_mean_us", "gpu_idle_ms", "gpu_idle_after_sync_ms", "gpu_busy_ms"]
    print(s[[c for c in cols if c in s]].to_string(index=False, float_format="{:.2f}".format), flush=True)
    return s


def _calibration(cal: dict) -> dict:
    return {f"tp{k[0]}_C{k[1]}": v for k, v in cal.items()}


def main(argv=None) -> int:
    ap = session_parser(__doc__, "build/tp_emulation", reps=12, minutes=5.0, tasks=TASKS)
    ap.add_argument("--requests", type=int, default=64, help="requests of 2048 tokens at TP=4 (default 64)")
    ap.add_argument("--requests-tp2", type=int, default=32, help="requests at TP=2, the check (default 32)")
    ap.add_argument("--fit-collectives", action="store_true", help="write data/tp_emulation/allreduce.json and stop")
    ap.add_argument("--summarize", action="store_true",
                    help="CPU: data/tp_emulation/{validation,prediction}.csv from the sessions there, and stop")
    ap.add_argument("--overwrite", action="store_true", help="record a session whose folder holds tables again")
    a = ap.parse_args(argv)
    if a.fit_collectives:
        fit_collectives()
        return 0
    if a.summarize:
        summarize()
        return 0
    for t in a.tasks:
        if t not in TASKS:
            ap.error(f"unknown task {t!r}; choose from {TASKS}")
    # None: the preset's 48 layers, or as many as the card holds (model/sizing.py); rows record what was built
    a.preset, a.layers, a.input_len = ("tiny", 2, 8) if a.smoke else ("qwen3-30b-a3b", None, 2048)
    a.reps = 12 if a.smoke else max(a.reps, 10)
    t0 = time.monotonic()
    deadline = t0 + 60 * a.minutes
    out = Path(a.out)
    work = out / f"emulation_{a.session}"
    try:
        tables.claim_session(work, a.overwrite)
    except tables.TableError as e:
        ap.error(str(e))
    work.mkdir(parents=True, exist_ok=True)
    cost = E.allreduce_cost()
    print(f"all-reduce: {cost.bus_gbps:.1f} GB/s bus bandwidth ({cost.source})", flush=True)
    names = [f"a{i}" for i in range(2)]
    params = {k: v for k, v in vars(a).items() if k != "out"}
    meta = metadata(params=dict(params, guards=GUARDS, adapters="none", bus_gbps=cost.bus_gbps,
                                allreduce_source=cost.source))
    labs, cal = {}, {}
    clocks = ClockLog(work / "clocks.csv")
    for task in a.tasks:
        if time.monotonic() > deadline:
            print(f"SKIP {task}: past the deadline", flush=True)
            continue
        run_task(task, labs, cost, names, a, work, deadline, cal)
        # after every task: a killed call still returns what it measured
        pack_session(work, out, f"emulation_{a.session}", seal_session(work, meta, [clocks.path]), t0,
                     calibration=_calibration(cal))
    clocks.close()
    pack_session(work, out, f"emulation_{a.session}", seal_session(work, meta), t0, calibration=_calibration(cal))
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
