"""Guards measured side by side: the honest sync/cpu_flag ratio.

    PYTHONPATH=. python3 scripts/gpu_side_by_side.py --out DIR   -> DIR/h200_guards.csv (+ .meta.json)

The canonical guards recording (data/guards/, read through instruments/recordings.py): one CSV row
per repetition, so every figure can carry its spread and paired differences.

A sweep that times one guard after another lets slow drifts of the host (clock, other processes,
the allocator) land on one guard and not the other. Here every repetition runs the three guards
back to back in a rotating order, each from an idle GPU (instruments.timing.time_interleaved), so
each ratio compares forwards measured within milliseconds of each other. 48 distinct layers, bf16,
Triton backend, 8 requests per batch; active = share of requests with an adapter. A CUDA-graph
replay of the same forward (captured once, any guard) is timed in the same rotation.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lora_moe_lab.instruments.timing import time_interleaved  # noqa: E402
from lora_moe_lab.model.graphs import CapturedForward  # noqa: E402
from lora_moe_lab.model.guards import count_guard_syncs, guard_names  # noqa: E402
from lora_moe_lab.model.lab import LabCache, split_tokens  # noqa: E402
from lora_moe_lab.provenance import DATA, META_KEYS, metadata  # noqa: E402

from lora_moe_lab.instruments.recordings import SAMPLE_COLUMNS  # noqa: E402


def measure(lab, M: int, act: float, a) -> tuple[dict, dict]:
    """Timings and guard syncs per forward of every guard and of the graph replay, for one (M, active)."""
    R = a.requests
    adapters = ["bench" if i < round(act * R) else None for i in range(R)]
    counts = split_tokens(M, R)
    batch, tensors = lab.make_batch(adapters, counts)
    x = lab.random_input(M)
    fns = {g: (lambda g=g: lab.model(x, batch, tensors, guard=g)) for g in guard_names()}
    cap = CapturedForward(lab, counts, guard="cpu_flag")
    cap.load_batch(x, adapters)
    fns["graph"] = cap.graph.replay
    syncs = {}
    for name, fn in fns.items():  # warm-up (Triton compiles here), counting the guard's syncs
        with count_guard_syncs() as c:
            for _ in range(a.warmup):
                fn()
        syncs[name] = c.count // a.warmup
    return time_interleaved(fns, reps=a.reps), syncs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DATA / "guards"))
    ap.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "qwen3-30b-a3b-tp4"])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 1024, 4096, 16384])
    ap.add_argument("--active", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    meta = metadata(params=vars(a))
    path = os.path.join(a.out, "h200_guards.csv")
    with open(path.replace(".csv", ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    row_meta = {k: meta[k] for k in META_KEYS}
    labs = LabCache()  # one 48-layer model on the GPU at a time
    t_start = time.time()
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SAMPLE_COLUMNS + list(row_meta))
        w.writeheader()
        for preset in a.presets:
            lab = labs.get(adapter=("bench", 16), preset=preset, num_layers=a.layers, dtype="bfloat16",
                           max_loras=4, max_rank=16)
            for M in a.tokens:
                for act in a.active:
                    times, syncs = measure(lab, M, act, a)
                    for n, t in times.items():
                        graph = n == "graph"  # a replay of the cpu_flag capture: every guard records the same
                        for rep, us in enumerate(t.samples_us):
                            w.writerow(dict(preset=preset, layers=a.layers, tokens=M, active=act, variant=n,
                                            guard="cpu_flag" if graph else n, mode="graph" if graph else "eager",
                                            rep=rep, us=us, syncs_per_forward=syncs[n], **row_meta))
                    f.flush()
                    med = {n: t.median_us / 1e3 for n, t in times.items()}
                    print(f"{preset:18s} M={M:6d} active={act:.1f}  "
                          + "  ".join(f"{n}={v:8.2f}ms" for n, v in med.items())
                          + f"  sync/cpu_flag={med['sync'] / med['cpu_flag']:.3f}  t={time.time() - t_start:.0f}s",
                          flush=True)
    labs.free()
    from lora_moe_lab.instruments.recordings import load_guards

    p = load_guards(path).paired("sync", "cpu_flag")
    print(p[["preset", "tokens", "active", "ratio", "lost_us", "lost_lo95_us", "lost_hi95_us", "us_per_sync"]]
          .round(3).to_string(index=False))


if __name__ == "__main__":
    main()
