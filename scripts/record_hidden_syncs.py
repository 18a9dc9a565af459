"""Record what each hidden-sync pattern costs on a GPU (notebook 07, data/hidden_syncs/README.md).

    PYTHONPATH=$PWD python3 scripts/record_hidden_syncs.py --session s1 --out $OUT/hidden_syncs   # H200, ~60 s
    python scripts/record_hidden_syncs.py --smoke --out /tmp/hs                                # CPU, seconds

Per pattern (lora_moe_lab/instruments/hidden_syncs.py): the rewrite is checked equal to the original
and audited sync-free (and, on a GPU, run inside checked_region); the original is audited (its
syncs per forward: the occurrences). Then both forwards are timed interleaved and paired, the
order alternating per repetition, each call's wall time ending with a device sync (a sync's cost
includes the host blocking), after a warm-up; stats.warmup_check drops a leading drift from both
arms (or marks the point unstable: its figures stay NaN). The cost per occurrence is the paired
median difference over the occurrences, with its paired-bootstrap 95 % interval.

Size: M=4096 tokens x H=2048, 8 layers of 2 fp32 matmuls (~8 ms of GPU work per forward on an
H200): the host runs ahead of the GPU, so each sync drains a real queue and the GPU then waits
for the host to issue again (the bubble). Writes hidden_syncs_<session>.csv and .meta.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time

import numpy as np
import pandas as pd
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments import hidden_syncs as HS
from lora_moe_lab.instruments import stats
from lora_moe_lab.instruments.audit import audit
from lora_moe_lab.instruments.syncs import checked_region
from lora_moe_lab.provenance import metadata


def _time(fn, device) -> float:
    t0 = time.perf_counter()
    fn()
    runtime.synchronize(device)  # the forward ends when the GPU is done: a sync's blocking counts
    return (time.perf_counter() - t0) * 1e3


def _audit_row(fn, cuda: bool) -> dict:
    rep = audit(fn, warmup=1, reps=1)
    t = rep.table()
    out = dict(occ_audit=rep.count, kinds=" ".join(sorted(rep.kinds)), sites=" ".join(sorted(rep.sites)))
    if cuda and len(t):
        out.update(audit_host_blocked_us=float(t["host_blocked_us_per_call"].sum()),
                   audit_gpu_idle_us=float(np.nansum(t["gpu_idle_after_us"] * 1.0)),
                   audit_saving_us=float(rep.total_saving_ns / 1e3))
    return out


def record_pattern(name: str, size: HS.Size, device: str, reps: int, warmup: int, session: str) -> dict:
    cuda = device == "cuda"
    case = HS.build(name, size, device)
    same, err = HS.equal(case)
    fix_rep = audit(case.rewrite, warmup=0, reps=1, profile=False)
    checked = True
    if cuda:
        try:
            with checked_region():
                case.rewrite()
        except Exception:  # noqa: BLE001 - recorded: a rewrite that syncs is a finding, not a crash
            checked = False
    row = dict(session=session, pattern=name, kind=case.pattern.kind, equal=same, rel_err=err,
               rewrite_syncs=fix_rep.count, rewrite_checked=checked)
    row.update(_audit_row(case.original, cuda))
    occ = row["occ_audit"]
    arms = {"original": [], "rewrite": []}
    for i in range(warmup + reps):
        order = ("original", "rewrite") if i % 2 == 0 else ("rewrite", "original")
        for arm in order:
            arms[arm].append(_time(case.original if arm == "original" else case.rewrite, device))
    a = np.array(arms["original"][warmup:])
    b = np.array(arms["rewrite"][warmup:])
    wc = stats.warmup_check({"original": a, "rewrite": b}, min_keep=min(stats.MIN_PAIRED_REPS, len(a)))
    row.update(n=len(a) - wc.dropped, dropped=wc.dropped, warmup_note=wc.note, status=wc.status,
               method=stats.METHOD_BOOT, warmup_discarded=warmup)
    nan = dict.fromkeys(["original_ms", "rewrite_ms", "diff_us", "diff_lo_us", "diff_hi_us", "per_occ_us",
                         "per_occ_lo_us", "per_occ_hi_us"], math.nan)
    row.update(nan)
    if wc.stable:
        ak, bk = a[wc.dropped:], b[wc.dropped:]
        d, lo, hi = stats.bootstrap_paired(ak * 1e3, bk * 1e3, "median_diff")  # µs
        row.update(original_ms=float(np.median(ak)), rewrite_ms=float(np.median(bk)), diff_us=d,
                   diff_lo_us=lo, diff_hi_us=hi)
        if occ:
            row.update(per_occ_us=d / occ, per_occ_lo_us=lo / occ, per_occ_hi_us=hi / occ)
    row.update(occurrences=occ, tokens=size.tokens, hidden=size.hidden, layers=size.layers, work=size.work)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session", default="s1", help="device session name, s1, s2, ... (default s1)")
    ap.add_argument("--out", default=None, help="output folder (default data/hidden_syncs)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, seconds (the test's path)")
    ap.add_argument("--reps", type=int, default=None, help="paired repetitions (default 24; smoke 12)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls per arm (default 4; smoke 1)")
    ap.add_argument("--only", nargs="*", help="pattern names (default: all)")
    a = ap.parse_args(argv)
    if not re.fullmatch(r"s\d+", a.session):
        ap.error(f"--session must look like s1, s2, ... (got {a.session!r})")
    if a.smoke:
        device, size = "cpu", HS.Size.smoke()
    else:
        if not runtime.has_cuda():
            ap.error("no CUDA GPU on this machine: run with --smoke for the CPU check")
        device, size = "cuda", HS.Size()
    reps = a.reps or (12 if a.smoke else 24)
    warmup = a.warmup if a.warmup is not None else (1 if a.smoke else 4)
    if reps < stats.MIN_PAIRED_REPS:
        ap.error(f"--reps must be >= {stats.MIN_PAIRED_REPS} (the project's rule for a paired interval)")
    only = a.only or HS.names()
    bad = sorted(set(only) - set(HS.names()))
    if bad:
        ap.error(f"unknown pattern(s) {bad}; choose from {HS.names()}")
    out = a.out or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "hidden_syncs")
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    rows = []
    for name in only:
        t1 = time.time()
        r = record_pattern(name, size, device, reps, warmup, a.session)
        rows.append(r)
        print(f"{name:18s} occ {r['occurrences']:g}  cost/occ {r['per_occ_us']:.1f} us "
              f"[{r['per_occ_lo_us']:.1f}, {r['per_occ_hi_us']:.1f}]  equal {r['equal']}  "
              f"rewrite syncs {r['rewrite_syncs']:g}  {r['status']}  ({time.time() - t1:.1f} s)", flush=True)
    df = pd.DataFrame(rows)
    meta = metadata(dict(session=a.session, smoke=a.smoke, reps=reps, warmup=warmup, size=dataclasses.asdict(size), device=device, patterns=only))
    df["gpu"] = meta["gpu"]
    base = os.path.join(out, f"hidden_syncs_{a.session}" + ("_smoke" if a.smoke else ""))
    df.to_csv(base + ".csv", index=False)
    meta["seconds"] = round(time.time() - t0, 1)
    with open(base + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(f"wrote {base}.csv and .meta.json in {meta['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
