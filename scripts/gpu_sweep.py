"""The H200 reproduction sweep: the per-layer guard sync at full depth, two model shapes.

    PYTHONPATH=. python3 scripts/gpu_sweep.py --out DIR        # (scripts/gpu_run.sh sweep)
    -> DIR/h200_sweep.csv        one tidy row per measurement (lora_moe_lab.instruments.bench schema)
       DIR/h200_sweep.meta.json  GPU, torch, triton, CUDA, commit, date, the sweep specs
    (one median per row; the canonical guards recording, with every repetition kept, is
    scripts/gpu_side_by_side.py -> data/guards/. An earlier run of this sweep is retired to
    data/archive/sweep_2026-11-29/.)

What it measures (bf16, Triton backend, 48 distinct MoE layers, 8 requests per batch):
  eager: presets qwen3-30b-a3b and qwen3-30b-a3b-tp4 x M in {16, 128, 1024, 4096, 16384}
         x guard in {sync, cpu_flag, launch_always} x active fraction {0, 0.5}       (60 rows)
  graph: CUDA-graph replay, cpu_flag and launch_always, M in {128, 4096}, active {0, 0.5}
                                                                                      (16 rows)
Each row: 1 untimed forward that counts the guard's syncs, 3 warm-up forwards, 10 timed
forwards (CUDA events, each from an idle GPU); median, p10, p90.

Same data from the CLI (two calls per preset, the second with --resume):
    python -m lora_moe_lab.instruments.bench sweep --preset qwen3-30b-a3b qwen3-30b-a3b-tp4 --layers 48 \
        --tokens 16 128 1024 4096 16384 --guards sync cpu_flag launch_always --active 0 0.5 \
        --mode eager --warmup 3 --reps 10 --out build/sweep/h200_sweep.csv
    python -m lora_moe_lab.instruments.bench sweep --preset qwen3-30b-a3b qwen3-30b-a3b-tp4 --layers 48 \
        --tokens 128 4096 --guards cpu_flag launch_always --active 0 0.5 --mode graph \
        --warmup 3 --reps 10 --out build/sweep/h200_sweep.csv --resume
(the script also keeps one model per preset for both sweeps instead of building it twice).

Expected time on one H200: building a 48-layer qwen3-30b-a3b (~58 GB of bf16 expert weights,
random on the GPU) takes seconds; Triton compiles once per kernel config; the largest rows
(M = 16384, ~60 TFLOP per forward at full width) take ~0.1-0.2 s per forward, 14 forwards each.
About 2-4 minutes in all; --max-minutes (default 6.5) stops starting new rows after that, keeping
every finished row (run again with --resume to finish). Needs ~70 GB of GPU memory.

On a machine without a GPU, --quick runs the same pipeline on the tiny preset (eager only).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from lora_moe_lab import runtime  # noqa: E402
from lora_moe_lab.instruments.bench import SweepSpec, clean, run_sweep, time_lost_per_sync  # noqa: E402
from lora_moe_lab.model.lab import LabCache, build_lab  # noqa: E402
from lora_moe_lab.provenance import DATA, metadata  # noqa: E402

PRESETS = ["qwen3-30b-a3b", "qwen3-30b-a3b-tp4"]
TOKENS = [16, 128, 1024, 4096, 16384]
GRAPH_TOKENS = [128, 4096]


def timed_build(**kw):
    """build_lab, saying how long it took (48 layers of random bf16 weights are made on the GPU)."""
    t0 = time.perf_counter()
    lab = build_lab(**kw)
    runtime.synchronize()
    print(f"built {kw['preset']} x {kw['num_layers']} layers in {time.perf_counter() - t0:.1f} s", flush=True)
    return lab


def prewarm(preset: str, rank: int) -> None:
    """Compile the Triton kernels for every config the launch tables pick (one binary per config)."""
    if not runtime.has_cuda():
        return
    from lora_moe_lab.ops.triton_backend import warmup

    t0 = time.perf_counter()
    try:
        n = warmup(preset, torch.bfloat16, max_loras=4, max_rank=rank)
    except Exception as e:  # noqa: BLE001 - the rows' own warm-up compiles what is missing
        print(f"triton warm-up failed ({type(e).__name__}: {e}); compiling during the first rows", flush=True)
        return
    print(f"triton warm-up for {preset}: {n} launches in {time.perf_counter() - t0:.1f} s", flush=True)


def wide_table(df: pd.DataFrame) -> pd.DataFrame:
    """One line per (preset, M, active): median ms per guard and mode, sync/cpu_flag, us lost per sync."""
    d = clean(df)
    d = d.assign(col=d["mode"].map({"eager": "", "graph": "graph:"}) + d["guard"], ms=d["median_us"] / 1e3)
    idx = ["preset", "tokens", "active"]
    w = d.pivot_table(index=idx, columns="col", values="ms", aggfunc="last")
    order = [c for c in ["sync", "cpu_flag", "launch_always", "graph:cpu_flag", "graph:launch_always"] if c in w]
    w = w[order]
    lost = time_lost_per_sync(d)
    lost = lost[lost["mode"] == "eager"].set_index(idx)[["syncs", "ratio", "us_per_sync"]]
    w = w.join(lost, how="left").reset_index()
    w["preset"] = w["preset"].str.replace("qwen3-30b-", "", regex=False)
    return w.rename(columns={"tokens": "M", "ratio": "sync/cpu_flag"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DATA.parent / "build" / "sweep"), help="output directory (default build/sweep)")
    ap.add_argument("--name", default="h200_sweep", help="file stem (default h200_sweep)")
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--tokens", nargs="+", type=int, default=TOKENS)
    ap.add_argument("--graph-tokens", nargs="*", type=int, default=GRAPH_TOKENS)
    ap.add_argument("--active", nargs="+", type=float, default=[0.0, 0.5])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-minutes", type=float, default=6.5, help="stop starting rows after this long")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in the CSV")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: tiny preset, 2 layers, 2 sizes")
    ap.add_argument("--no-fit", action="store_true", help="skip the cost-model fit printed at the end")
    a = ap.parse_args(argv)
    if a.quick:
        a.presets, a.layers, a.tokens, a.graph_tokens, a.reps, a.warmup = ["tiny"], 2, [16, 64], [16], 2, 1
    out = Path(a.out) / f"{a.name}.csv"
    if out.exists() and not a.resume:
        ap.error(f"{out} exists: pass --resume to keep its rows, or choose another --out/--name")
    t_start = time.perf_counter()
    budget = 60 * a.max_minutes
    m = metadata()
    print(f"{m['gpu']} | torch {m['torch']} | triton {m['triton']} | cuda {m['cuda']} | commit {m['commit'][:12]}",
          flush=True)
    if not runtime.has_cuda():
        print("no CUDA GPU: eager rows only, wall-clock timing (graph rows need a GPU)")

    def on_row(row, i):
        ms = f"{float(row['median_us']) / 1e3:9.3f} ms" if row["median_us"] != "" else f"ERROR {row['error']}"
        print(f"  {row['preset']:18s} M={int(row['tokens']):6d} {row['guard']:13s} a={float(row['active']):.1f} "
              f"{row['mode']:5s} {ms} syncs={row['syncs_per_forward']} t={time.perf_counter() - t_start:6.1f}s",
              flush=True)

    # run_sweep frees its models when it returns; this cache outlives it, so the eager and the graph
    # sweep of one preset share one model (one 58 GB model on the GPU at a time).
    keep = LabCache(timed_build)
    common = dict(layers=[a.layers], active=a.active, ranks=[a.rank], warmup=a.warmup, reps=a.reps)
    df = None
    for preset in a.presets:
        left = budget - (time.perf_counter() - t_start)
        if left <= 0:
            print(f"time budget spent: {preset} not measured (run again with --resume)")
            break
        prewarm(preset, a.rank)
        specs = [SweepSpec(presets=[preset], tokens=a.tokens, guards=["sync", "cpu_flag", "launch_always"],
                           modes=["eager"], **common)]
        if runtime.has_cuda() and a.graph_tokens:
            specs.append(SweepSpec(presets=[preset], tokens=a.graph_tokens, guards=["cpu_flag", "launch_always"],
                                   modes=["graph"], **common))
        for spec in specs:
            left = budget - (time.perf_counter() - t_start)
            df = run_sweep(spec, out, resume=True, progress=False, on_row=on_row, build=keep.get,
                           max_seconds=max(left, 0))
        keep.free()
    if df is None:
        return 1
    total = time.perf_counter() - t_start
    print(f"\n{len(df)} rows in {out} ({int(df['error'].notna().sum())} with errors), {total:.0f} s")
    if not a.no_fit and budget - total > 45:
        try:
            from lora_moe_lab import sim

            f = sim.fit(df)
            p = f.params
            print(f"cost-model fit ({f.rows} rows, rms log err {f.rms_log_error:.3f}): launch {p.launch_us:.2f} us, "
                  f"sync {p.sync_us:.1f} us, graph launch {p.graph_launch_us:.1f} us, kernel {p.kernel_us:.2f} us, "
                  f"{p.tflops:.0f} TFLOP/s, {p.tbps:.2f} TB/s")
            print(sim.validate(df, p).summary.round(1).to_string(index=False))
        except Exception as e:  # noqa: BLE001 - the measurement is what matters here
            print(f"fit skipped: {type(e).__name__}: {e}")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        print("\nmedian forward time (ms); sync/cpu_flag = eager ratio; us_per_sync = (t_sync - t_cpu_flag) / syncs")
        print(wide_table(df).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
