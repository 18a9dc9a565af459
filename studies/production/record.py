"""Record production's trace signature and the fix's gain in two regimes, in one device call.

    PYTHONPATH=. GIT_COMMIT=<sha> GIT_DIRTY=0 python3 studies/production/record.py --session s1 --out $OUT
    PYTHONPATH=. python3 studies/production/record.py --smoke --out /tmp/sig      # CPU: tiny, seconds

The Qwen3-30B-A3B-shaped decoder (48 layers, bf16, Triton, 260 guard syncs per forward, no
adapter in use: production's case) prefills R requests x 2048 tokens in chunks, `sync` against
`cpu_flag`, interleaved repetitions (instruments/recorders/prefill.py). Tasks, in priority order:

  default_C16384   this lab's own regime: a lean host (no engine costs)
  prodlike_C16384  production's regime: engine host work per layer, calibrated in this call so
                   the later syncs block the host ~116 us on average (production: ~30 ms over 259
                   syncs), and 70 ms of an earlier batch's GPU work queued before each forward
                   (overlap scheduling; production's first sync: ~70 ms)
  default_C8192    the lab's regime at half the chunk

Per task: rows (CSV), summary (warm-up drift check, order-statistic / paired-bootstrap 95 %
intervals), the per-sync signature of two profiled steady forwards per guard (.signature.csv,
.syncs.csv) and their trimmed traces. Everything returns as $OUT/signature_<session>.tar.gz.
Another session (another machine, another call) with another --session label is the rerun.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.recorders import prefill as P
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.clocks import ClockLog
from lora_moe_lab.instruments.recorders.harness import pack_session, session_parser
from lora_moe_lab.provenance import metadata
from lora_moe_lab.sim import PRODUCTION_SIGNATURE as PS

GS_PROD = 260 / 48
TARGET_LATER_US = PS["later_blocked_mean_us"]  # ~30 ms over production's other 259 syncs
GUARDS = ["sync", "cpu_flag"]


def calibrate(lab, plan, names, smoke=False) -> dict:
    """The engine host work that brings the later syncs to production's ~116 us. A target below the forward's floor
    (round trips of back-to-back syncs) is an error, except in --smoke (the tiny model, a test of the pipeline), where
    a GPU shared with other work can raise the floor above it: then no host work is added, and the calibration says
    why (`unreachable`)."""
    try:
        return P.calibrate_host_work(lab, plan, names, TARGET_LATER_US)
    except ValueError as exc:
        if not smoke:
            raise
        return dict(host_us_per_point=0.0, host_us_per_layer=0.0, target_later_us=TARGET_LATER_US,
                    unreachable=str(exc))


def write_task(work: Path, name: str, df: pd.DataFrame, summary: pd.DataFrame, sigs: dict | None = None,
               session: str | None = None) -> list:
    """A task's tables, each whole (temp file + os.replace: tables.write_table): rows, summary, and the
    profiled forwards' signature and syncs. Their seals go into the session's meta.json (seal_session)."""
    paths = [tables.write_table(work / f"{name}.csv", df, replace=True, seal_it=False),
             tables.write_table(work / f"{name}.summary.csv", summary, replace=True, seal_it=False)]
    for part, suffix in (("forwards", ".signature.csv"), ("syncs", ".syncs.csv")):
        if (sigs or {}).get(part):
            t = pd.concat(sigs[part], ignore_index=True).assign(session=session, task=name)
            paths.append(tables.write_table(work / f"{name}{suffix}", t, replace=True, seal_it=False))
    return paths


def seal_session(work: Path, meta: dict, open_logs=()) -> dict:
    """meta["files"]: the seal of every table of the session folder (not those still being written:
    the clock log until it is closed); pack_session then writes meta.json with them (atomically)."""
    meta["files"] = tables.seal_files(work, skip=tuple(Path(f).name for f in open_logs))
    return meta


def run_task(name, lab, plan, names, costs, reps, work: Path, deadline, session, traces=True) -> pd.DataFrame:
    d = P.PrefillDriver(lab, plan, P.request_adapters(plan.requests, "none", names), costs=costs)
    key = dict(preset=lab.shape.name, layers=lab.shape.num_layers, tp=1, requests=plan.requests,
               input_len=plan.input_len, chunk=plan.chunk, guard_sites=GS_PROD)
    sigs: dict = {}
    (work / "traces").mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    rows = P.measure({"none": d}, GUARDS, reps, key=key, trace_dir=work / "traces" if traces else None,
                     deadline=deadline,
                     progress=False, signatures=sigs, warmup_reps=1)
    df = pd.DataFrame(rows, columns=P.COLUMNS).assign(session=session, task=name)
    s = P.summarize(df).assign(session=session, task=name)
    write_task(work, name, df, s, sigs, session=session)
    print(f"== {name}: {len(df) // len(GUARDS)} reps in {time.monotonic() - t:.0f} s", flush=True)
    return s


def main(argv=None) -> int:
    ap = session_parser(__doc__, "build/signature", reps=13, minutes=7.0,
                        tasks=["default_C16384", "prodlike_C16384", "default_C8192"])
    ap.add_argument("--requests", type=int, default=64, help="requests of 2048 tokens (default 64)")
    ap.add_argument("--overlap-ms", type=float, default=PS["first_sync_ms"])
    ap.add_argument("--no-traces", action="store_true", help="profile, but write no trace files (a rerun)")
    ap.add_argument("--overwrite", action="store_true", help="record a session whose folder holds tables again")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + 60 * a.minutes
    out = Path(a.out)
    work = out / f"signature_{a.session}"
    try:
        tables.claim_session(work, a.overwrite)
    except tables.TableError as e:
        ap.error(str(e))
    work.mkdir(parents=True, exist_ok=True)
    # None: the preset's 48 layers, or as many as the card holds (lora_moe_lab/model/sizing.py)
    preset, layers, L, scale = ("tiny", 2, 8, 1 / 1000) if a.smoke else ("qwen3-30b-a3b", None, 2048, 1.0)
    reps = max(a.reps, 10) if not a.smoke else 12
    lab = P.build(preset, layers, max_loras=4, max_rank=16, dtype="auto", device="auto", backend="auto", seed=0,
                  guard_sites=GS_PROD)
    names = P.load_adapters(lab, 2, 16)
    params = {k: v for k, v in vars(a).items() if k != "out"}  # no machine paths in data/
    meta = metadata(params=dict(params, preset=preset, **lab.sizing.meta(), input_len=L, guards=GUARDS,
                                guard_sites=GS_PROD, target_later_us=TARGET_LATER_US, adapters="none"))
    cal = None
    clocks = ClockLog(work / "clocks.csv")
    for task in a.tasks:
        regime, c = task.split("_C")
        chunk = 16 * int(c) // 16384 if a.smoke else int(c)  # smoke: 2 or 1 requests per chunk
        plan = P.make_plan(a.requests if not a.smoke else 8, L, max(chunk, L))
        if regime == "prodlike":
            cal = cal or calibrate(lab, plan, names, smoke=a.smoke)
            print(f"calibration: {json.dumps(cal)}", flush=True)
            costs = P.EngineCosts(host_us_per_layer=cal["host_us_per_layer"], overlap_ms=a.overlap_ms * scale)
        else:
            costs = P.EngineCosts()
        if time.monotonic() > deadline:
            print(f"SKIP {task}: past the deadline", flush=True)
            continue
        s = run_task(task, lab, plan, names, costs, reps, work, deadline, a.session, traces=not a.no_traces)
        cols = ["guard", "reps", "warmup_dropped", "input_tok_per_s", "fix_throughput_gain_pct",
                "fix_throughput_gain_pct_lo", "fix_throughput_gain_pct_hi", "fix_throughput_gain_net_pct",
                "fix_ttft_change_pct", "first_blocked_ms", "later_blocked_median_us", "later_blocked_mean_us",
                "host_blocked_ms", "gpu_idle_ms"]
        print(s[cols].to_string(index=False, float_format="{:.2f}".format), flush=True)
        # after every task: a killed call still returns what it measured (sealed)
        pack_session(work, out, f"signature_{a.session}", seal_session(work, meta, [clocks.path]), t0, calibration=cal)
    clocks.close()
    pack_session(work, out, f"signature_{a.session}", seal_session(work, meta), t0, calibration=cal)
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
