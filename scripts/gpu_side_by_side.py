"""Guards measured side by side: the honest sync/cpu_flag ratio.

    PYTHONPATH=. python3 scripts/gpu_side_by_side.py --out DIR   -> DIR/h200_side_by_side.csv (+ .meta.json)

A sweep that times one guard after another lets slow drifts of the host (clock, other processes,
the allocator) land on one guard and not the other. Here every repetition runs the three guards
back to back in a rotating order, each from an idle GPU, so each ratio compares forwards measured
within milliseconds of each other. 48 distinct layers, bf16, Triton backend, 8 requests per batch;
active = share of requests with an adapter. A CUDA-graph replay of the same forward (captured
once, any guard) is timed in the same rotation.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lora_moe_lab import graphs  # noqa: E402
from lora_moe_lab.bench import metadata, split_tokens  # noqa: E402
from lora_moe_lab.guards import GUARDS, count_guard_syncs  # noqa: E402
from lora_moe_lab.moe import build_lab  # noqa: E402


def once(fn) -> float:
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3  # us


def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "qwen3-30b-a3b-tp4"])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 1024, 4096, 16384])
    ap.add_argument("--active", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    meta = metadata()
    path = os.path.join(a.out, "h200_side_by_side.csv")
    json.dump({**meta, "params": vars(a)}, open(path.replace(".csv", ".meta.json"), "w"), indent=1)
    cols = ["preset", "layers", "M", "active", "variant", "median_us", "p10_us", "p90_us", "reps", "syncs_per_forward"]
    f = open(path, "w", newline="")
    w = csv.DictWriter(f, fieldnames=cols + list(meta))
    w.writeheader()
    t_start = time.time()
    for preset in a.presets:
        lab = build_lab(preset, num_layers=a.layers, dtype="bfloat16", max_loras=4, max_rank=16)
        lab.pool.load("bench", rank=16)
        for M in a.tokens:
            for act in a.active:
                R = a.requests
                adapters = ["bench" if i < round(act * R) else None for i in range(R)]
                counts = split_tokens(M, R)
                batch, tensors = lab.make_batch(adapters, counts)
                x = lab.random_input(M)
                fns = {g: (lambda g=g: lab.model(x, batch, tensors, guard=g)) for g in GUARDS}
                cap = graphs.CapturedForward(lab, counts, guard="cpu_flag")
                cap.load_batch(x, adapters)
                fns["graph"] = cap.graph.replay
                syncs = {}
                for name, fn in fns.items():
                    with count_guard_syncs() as c:
                        for _ in range(a.warmup):
                            fn()
                    syncs[name] = c.count // a.warmup
                times = {n: [] for n in fns}
                names = list(fns)
                for r in range(a.reps):
                    for n in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
                        times[n].append(once(fns[n]))
                for n, ts in times.items():
                    row = dict(preset=preset, layers=a.layers, M=M, active=act, variant=n, median_us=q(ts, 0.5),
                               p10_us=q(ts, 0.1), p90_us=q(ts, 0.9), reps=len(ts), syncs_per_forward=syncs[n])
                    w.writerow({**row, **meta})
                f.flush()
                med = {n: q(ts, 0.5) / 1e3 for n, ts in times.items()}
                print(f"{preset:18s} M={M:6d} active={act:.1f}  " + "  ".join(f"{n}={v:8.2f}ms" for n, v in med.items())
                      + f"  sync/cpu_flag={med['sync'] / med['cpu_flag']:.3f}  t={time.time() - t_start:.0f}s", flush=True)
                del cap
        del lab
        torch.cuda.empty_cache()
    f.close()
    import pandas as pd

    df = pd.read_csv(path)
    p = df.pivot_table(index=["preset", "M", "active"], columns="variant", values="median_us") / 1e3
    p["sync/cpu_flag"] = p["sync"] / p["cpu_flag"]
    p["us_per_sync"] = (p["sync"] - p["cpu_flag"]) * 1e3 / a.layers
    p["cpu_flag/graph"] = p["cpu_flag"] / p["graph"]
    print(p.round(3).to_string())


if __name__ == "__main__":
    main()
