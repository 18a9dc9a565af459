"""One GPU call: host-sync checks of the whole forward and CUDA-graph capture/replay checks.

    PYTHONPATH=. python3 studies/graphs/record_checks.py --out DIR

(1) 0 host syncs per forward for cpu_flag and launch_always at M = 1, 16, 1024, 16384 inside a
    region where torch's sync debug mode is "error" (alignment and batch upload included);
    the sync guard must raise there (it syncs once per layer, by design).
(2) CUDA graph: capture a whole forward under capture mode, replay it with the adapter set
    switched in place (none -> some -> all -> none), compare with eager each time.
(3) The sync guard captured WITHOUT the capture-mode rule fails; report outer error + inner cause.
(4) Replay vs eager time at M=16 and M=4096, 48 layers.
Writes checks.json + graph_timing.csv + meta.json under DIR, prints a table last.
"""
from __future__ import annotations

import argparse
import os

import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.timing import time_device
from lora_moe_lab.model import graphs
from lora_moe_lab.model.lab import LabCache, split_tokens
from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors
from lora_moe_lab.provenance import META_KEYS, metadata
from lora_moe_lab.ops.reference import rel


def sync_checks(lab, Ms, rows):
    names = sorted(lab.pool.loaded())
    for M in Ms:
        R = min(M, 8)
        counts = split_tokens(M, R)
        adapters = [names[i % len(names)] if i % 2 == 0 else None for i in range(R)]
        x = lab.random_input(M, seed=M)
        batch = LoRABatchInfo.build(lab.pool, adapters, counts)
        for guard in ("cpu_flag", "launch_always", "sync"):
            t = LoRABatchTensors.from_batch(batch, lab.device)
            lab.model(x, batch, t, guard=guard)  # warm-up: compile kernels, fill allocator caches
            torch.cuda.synchronize()
            err = None
            try:
                with runtime.sync_debug_mode("error"):
                    t = LoRABatchTensors.from_batch(batch, lab.device)  # batch upload inside the region too
                    lab.model(x, batch, t, guard=guard)
            except RuntimeError as e:
                err = str(e).splitlines()[0]
            torch.cuda.synchronize()
            ok = (err is None) if guard != "sync" else (err is not None)
            rows.append(dict(check="no_host_sync", M=M, guard=guard, ok=ok, detail=err or "0 syncs"))
            print(rows[-1], flush=True)


def graph_checks(lab, rows):
    names = sorted(lab.pool.loaded())
    counts = [4] * 4
    for guard in ("sync", "cpu_flag", "launch_always"):
        cap = graphs.CapturedForward(lab, counts, guard=guard)
        for label, adapters in [("none", [None] * 4), ("some", [names[0], None, names[1], None]),
                                ("all", [names[i % len(names)] for i in range(4)]), ("none again", [None] * 4)]:
            x = lab.random_input(16, seed=len(label))
            y = cap.replay(x, adapters).clone()
            b, t = lab.make_batch(adapters, counts)
            ye = lab.model(x, b, t, guard="cpu_flag")
            e = rel(y, ye)
            rows.append(dict(check="graph_replay_equals_eager", guard=guard, adapters=label, rel_err=e,
                             ok=e < 1e-6, detail=f"rel err {e:.2e}"))
            print(rows[-1], flush=True)
    ok = graphs.try_capture(lab, counts, "sync", use_capture_mode=True)
    rows.append(dict(check="sync_guard_captures_with_rule", ok=ok is None, detail=str(ok)))
    print(rows[-1], flush=True)


def capture_failure_check(lab, rows):
    """Last in the process: a failed capture leaves CUDA state behind."""
    fail = graphs.try_capture(lab, [4] * 4, "sync", use_capture_mode=False)
    rows.append(dict(check="sync_guard_fails_in_capture_without_rule",
                     ok=fail is not None and "capturing" in fail.inner,
                     detail=str(fail)))
    print(rows[-1], flush=True)


def median_ms(fn) -> float:
    """Median of 20 repetitions (instruments.recorders.timing: CUDA events, each from an idle GPU), in ms."""
    return time_device(fn, warmup=3, reps=20).median_us / 1e3


def replay_vs_eager(lab, out_rows):
    names = sorted(lab.pool.loaded())
    for M in (16, 4096):
        R = 16
        counts = [M // R] * R
        adapters = [names[i % len(names)] if i % 2 else None for i in range(R)]
        x = lab.random_input(M)
        b, t = lab.make_batch(adapters, counts)
        for guard in ("sync", "cpu_flag", "launch_always"):
            eager = median_ms(lambda: lab.model(x, b, t, guard=guard))
            row = dict(M=M, layers=len(lab.model.layers), guard=guard, mode="eager", median_ms=eager)
            out_rows.append(row)
            print(row, flush=True)
        cap = graphs.CapturedForward(lab, counts, guard="launch_always")
        cap.load_batch(x, adapters)
        rep = median_ms(cap.graph.replay)
        row = dict(M=M, layers=len(lab.model.layers), guard="any (captured)", mode="graph", median_ms=rep)
        out_rows.append(row)
        print(row, flush=True)
        del cap
        torch.cuda.empty_cache()


def write(out, rows, timing, meta, replace=True) -> None:
    """checks.json (meta and checks, temp file + os.replace), then graph_timing.csv (the same way, each row
    with the provenance columns) and its seal in checks.json's "files" (tables.write_table)."""
    tables.write_json_atomic(os.path.join(out, "checks.json"), dict(meta=meta, checks=rows), default=str)
    timing = [{**r, **{k: meta[k] for k in META_KEYS}} for r in timing]
    tables.write_table(os.path.join(out, "graph_timing.csv"), timing, meta_path=os.path.join(out, "checks.json"),
                       replace=replace)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--overwrite", action="store_true", help="replace the recording already at --out")
    a = ap.parse_args(argv)
    try:  # before any model is built
        tables.claim(os.path.join(a.out, "graph_timing.csv"), overwrite=a.overwrite)
    except tables.TableError as e:
        ap.error(str(e))
    os.makedirs(a.out, exist_ok=True)
    rows, timing = [], []
    labs = LabCache()  # one model at a time: the 48-layer one needs most of the GPU's memory

    def lab_with(layers, ranks):
        lab = labs.get(preset=a.preset, num_layers=layers, dtype="bfloat16", max_loras=4, max_rank=16)
        for i, r in enumerate(ranks):
            lab.pool.load(f"a{i}", rank=r)
        return lab

    small = lab_with(2, (8, 16, 4))
    sync_checks(small, (1, 16, 1024, 16384), rows)
    graph_checks(small, rows)
    del small
    replay_vs_eager(lab_with(a.layers, (8, 16)), timing)
    capture_failure_check(lab_with(2, (8,)), rows)  # a fresh 2-layer model: the big one is freed first
    labs.free()
    meta = metadata(params={k: v for k, v in vars(a).items() if k != "overwrite"})
    write(a.out, rows, timing, meta)
    print("\n%-42s %-14s %-6s %s" % ("check", "guard", "M", "ok"))
    for r in rows:
        print("%-42s %-14s %-6s %s" % (r["check"], r.get("guard", ""), r.get("M", r.get("adapters", "")), r["ok"]))
    for r in timing:
        print(f"M={r['M']:<6} {r['guard']:<16} {r['mode']:<6} {r['median_ms']:.3f} ms")
    print("ALL OK" if all(r["ok"] for r in rows) else "SOME CHECKS FAILED")


if __name__ == "__main__":
    main()
