"""Record what each hidden-sync pattern costs on a GPU (notebook 07, data/hidden_syncs/README.md).

    PYTHONPATH=$PWD python3 studies/hidden_syncs/record.py --session s1 --out $OUT/hidden_syncs  # H200, ~60 s
    python studies/hidden_syncs/record.py --smoke --out /tmp/hs                                # CPU, seconds

Per pattern (lora_moe_lab/instruments/recorders/hidden_syncs.py): the rewrite is checked equal to the original
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
import os
import re
import sys
import time

import pandas as pd

from lora_moe_lab import runtime
from lora_moe_lab.audit import estimate
from lora_moe_lab.instruments.recorders import hidden_syncs as HS
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.analysers import stats
from lora_moe_lab.provenance import metadata


def table_path(out: str, session: str, smoke: bool) -> str:
    return os.path.join(out, f"hidden_syncs_{session}" + ("_smoke" if smoke else "") + ".csv")


def write(path: str, df: pd.DataFrame, meta: dict, replace: bool = False) -> str:
    """The session's table (temp file + os.replace), then its .meta.json, then the table's seal in it
    (tables.write_table): a kill leaves the old pair or a table its seal refuses, never half a table. A
    table of another kind at `path` is refused unless `replace`."""
    tables.write_table(path, df, meta=meta, replace=replace, default=str)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session", default="s1", help="device session name, s1, s2, ... (default s1)")
    ap.add_argument("--out", default=None, help="output folder (default data/hidden_syncs)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, seconds (the test's path)")
    ap.add_argument("--reps", type=int, default=None, help="paired repetitions (default 24; smoke 12)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls per arm (default 4; smoke 1)")
    ap.add_argument("--only", nargs="*", help="pattern names (default: all)")
    ap.add_argument("--overwrite", action="store_true", help="replace this session's table if it exists")
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
    out = a.out or os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "hidden_syncs"
    )
    try:  # before anything is timed: a session is recorded once (--overwrite records it again)
        tables.claim(table_path(out, a.session, a.smoke), overwrite=a.overwrite)
    except tables.TableError as e:
        ap.error(str(e))
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    rows = []
    for name in only:
        t1 = time.time()
        r = HS.measure(name, size, device, reps=reps, warmup=warmup, session=a.session, estimator=estimate)
        rows.append(r)
        print(
            f"{name:18s} occ {r['occurrences']:g}  cost/occ {r['per_occ_us']:.1f} us "
            f"[{r['per_occ_lo_us']:.1f}, {r['per_occ_hi_us']:.1f}]  equal {r['equal']}  "
            f"rewrite syncs {r['rewrite_syncs']:g}  {r['status']}  ({time.time() - t1:.1f} s)",
            flush=True,
        )
    df = pd.DataFrame(rows)
    meta = metadata(
        dict(
            session=a.session,
            smoke=a.smoke,
            reps=reps,
            warmup=warmup,
            size=dataclasses.asdict(size),
            device=device,
            patterns=only,
        )
    )
    df["gpu"] = meta["gpu"]
    meta["seconds"] = round(time.time() - t0, 1)
    path = write(table_path(out, a.session, a.smoke), df, meta, replace=True)  # claimed above
    print(f"wrote {path} and its .meta.json (sealed) in {meta['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
