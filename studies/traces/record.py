"""Record small torch-profiler traces of the mini MoE model on a GPU, for the notebooks and tests.

    PYTHONPATH=. python3 studies/traces/record.py --out DIR          # then copy DIR/* to data/traces/

For each size M (decode-like 16 tokens, prefill-like 4096) and guard (sync, cpu_flag,
launch_always): an eager forward, and (cpu_flag, launch_always) a CUDA-graph replay of the whole
forward (lora_moe_lab.model.graphs; a `sync` guard cannot be captured). Each trace keeps
2 forwards (warm-up excluded), gzipped (< 1 MB), and writes:

    DIR/<preset>_<guard>_<mode>_M<m>.json.gz     chrome trace (opens in ui.perfetto.dev)
    DIR/<preset>_<guard>_<mode>_M<m>.meta.json   GPU, torch, triton, commit, date, params
    DIR/traces_summary.csv                       per trace: mean per-forward metrics
and prints a compact table last. Also checks the sync tools on the real device: syncs counted by
torch's sync debug mode per eager forward, and whether a checked region passes.
Runs on a CPU-only machine too (eager only, no GPU lanes) for a smoke test: --preset tiny.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import pandas as pd
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import profiling, syncs
from lora_moe_lab.instruments.analysers import trace
from lora_moe_lab.model.graphs import CapturedForward
from lora_moe_lab.model.lab import build_lab, split_tokens
from lora_moe_lab.provenance import metadata

MAX_BYTES = 1_000_000


def sync_tool_check(fn, guard: str) -> dict:
    """Count device syncs of one forward with torch's sync debug mode, and try a checked region."""
    with syncs.count_syncs(profiler=runtime.has_cuda()) as rep:
        fn()
    runtime.synchronize()
    try:
        with syncs.checked_region():
            fn()
        checked = "pass"
    except syncs.HostSyncError as e:
        checked = f"raised at {e.site}"
    runtime.synchronize()
    return {"debug_mode_syncs": rep.count, "debug_mode_sites": ";".join(sorted(rep.sites)),
            "profiler_syncs": rep.profiler_count, "profiler_dtoh": len(rep.dtoh_records),
            "guard_syncs": rep.guard_count, "checked_region": checked,
            "device_observable": rep.device_observable}


def record(lab, args, M: int, guard: str, mode: str, out_dir: str) -> dict:
    R = min(args.requests, M)
    counts = split_tokens(M, R)
    names = sorted(lab.pool.loaded())
    adapters = [names[(i // 2) % len(names)] if i % 2 == 0 else None for i in range(R)]  # half active
    x = lab.random_input(M, seed=M)
    batch, tensors = lab.make_batch(adapters=adapters, token_counts=counts)
    cg = None
    if mode == "eager":
        def fn():
            return lab.model(x, batch, tensors, guard=guard)
    else:
        cg = CapturedForward(lab, counts, guard=guard)
        cg.load_batch(x, adapters)  # in place, before profiling: the trace holds replays only
        fn = cg.replay
    runtime.synchronize()
    checks = sync_tool_check(fn, guard) if mode == "eager" else {}
    stem = f"{args.preset}_{guard}_{mode}_M{M}"
    path = os.path.join(out_dir, stem + ".json.gz")
    params = dict(preset=args.preset, num_layers=args.layers, guard=guard, mode=mode, M=M,
                  requests=R, token_counts=counts, adapters=adapters, max_loras=args.max_loras,
                  max_rank=args.rank, dtype=args.dtype, backend=args.backend,
                  n_warmup=args.warmup, n_active=args.active, kept_forwards=args.keep,
                  cuda_sync_events=profiling.sync_events_config() is not None)
    t0 = time.perf_counter()
    t = profiling.profile_forwards(fn, n_warmup=args.warmup, n_active=args.active, path=path,
                                   labels=params, keep_forwards=args.keep)
    wall = time.perf_counter() - t0
    params["dropped"] = []
    if os.path.getsize(path) > MAX_BYTES:  # too big: drop the aten ops (unused by the metrics)
        trace.export_perfetto(t, path, drop_cats=("cpu_op", "python_function"))
        t = trace.load_trace(path)
        params["dropped"] = ["cpu_op", "python_function"]
    keep = args.keep
    while os.path.getsize(path) > MAX_BYTES and keep > 1:  # still too big: fewer forwards
        keep -= 1
        trace.export_perfetto(t, path, forwards=keep)
        t = trace.load_trace(path)
        params["kept_forwards"] = keep
    meta = metadata(params)
    with open(os.path.join(out_dir, stem + ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    row = {"file": os.path.basename(path), "guard": guard, "mode": mode, "M": M,
           "bytes": os.path.getsize(path), "profile_wall_s": round(wall, 2), **trace.summarize(t),
           **checks}
    if checks and runtime.has_cuda():  # three views of the same syncs should agree
        row["syncs_agree"] = (row["n_syncs"] == checks["debug_mode_syncs"] == checks["profiler_syncs"])
    del cg
    return row


def compact_table(df: pd.DataFrame) -> pd.DataFrame:
    """The summary as a short table: per-forward means, times in us."""
    def col(name, scale=1.0, nd=1):
        if name not in df:
            return None
        return (df[name] / scale).round(nd)

    return pd.DataFrame({
        "guard": df["guard"], "mode": df["mode"], "M": df["M"],
        "syncs/fwd": col("n_syncs", 1, 1), "dbg_syncs": df.get("debug_mode_syncs"),
        "span_us": col("gpu_span_ns", 1e3), "busy_us": col("busy_ns", 1e3),
        "idle_sync_us": col("idle_after_sync_ns", 1e3),
        "idle_host_us": col("idle_host_launch_wait_ns", 1e3),
        "idle_k2k_us": col("idle_kernel_to_kernel_ns", 1e3), "util": col("gpu_util", 1, 3),
        "qmax": df.get("max_queue_depth"), "kB": col("bytes", 1e3, 0),
        "checked": df.get("checked_region"), "agree": df.get("syncs_agree"),
    })


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 4096])
    p.add_argument("--guards", nargs="+", default=["sync", "cpu_flag", "launch_always"])
    p.add_argument("--modes", nargs="+", default=["eager", "graph"])
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on a GPU, float32 on CPU")
    p.add_argument("--backend", default="auto")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--keep", type=int, default=2, help="forwards kept in each trace")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    args.dtype = runtime.resolve_dtype(args.dtype)  # recorded in every trace's params
    lab = build_lab(preset=args.preset, num_layers=args.layers, max_loras=args.max_loras,
                    max_rank=args.rank, dtype=args.dtype, device="auto", backend=args.backend, seed=0)
    lab.pool.load("a0", rank=args.rank)
    lab.pool.load("a1", rank=max(1, args.rank // 2))
    rows = []
    with torch.no_grad():
        for M in args.tokens:
            for guard in args.guards:
                for mode in args.modes:
                    if mode == "graph" and (guard == "sync" or not runtime.has_cuda()):
                        continue  # a sync cannot be captured; graphs need CUDA
                    label = f"{guard}/{mode}/M{M}"
                    try:
                        rows.append(record(lab, args, M, guard, mode, args.out))
                        print(f"recorded {label}", flush=True)
                    except Exception as e:  # keep going: one failure should not lose the rest
                        print(f"FAILED {label}: {type(e).__name__}: {e}", flush=True)
                        rows.append({"guard": guard, "mode": mode, "M": M, "error": f"{type(e).__name__}: {e}"})
                    gc.collect()
                    if runtime.has_cuda():
                        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(args.out, "traces_summary.csv"), index=False)
    with open(os.path.join(args.out, "traces_summary.meta.json"), "w") as f:
        json.dump(metadata(vars(args)), f, indent=1)
    print(f"\n{metadata()['gpu']}  {args.preset} x{args.layers} layers  ->  {args.out}")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(compact_table(df).to_string(index=False))
    if "error" in df and df["error"].notna().any():
        print("\nerrors:\n" + "\n".join(df.loc[df["error"].notna(), "error"].astype(str)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
