"""The LoRA deltas' random GPU differentials, split over worker processes on one GPU.

    PYTHONPATH=$PWD python3 studies/kernels/differentials.py --out DIR --cases 1000 --jobs 8   # one H200
    python -m studies.kernels.differentials --out /tmp/diff --cases 8 --jobs 2                 # CPU interpreter

Runs `--cases` cases of each differential in `--which`:
  decode   the decode delta (instruments/recorders/kernel_cases.py: differential; record_decode.py's section diff)
  expand   the aligned delta over the expand loop's builds (record_expand.py: random_cases, its section random)
Case i is drawn from its own seed (kernel_cases.case_seed), so the split runs exactly the cases one process would:
worker j of N runs cases j, j + N, ... Most of a case's time is the host's (inputs, the float64 reference, a compile
per new specialization), which is why the cases are spread over processes; the kernels themselves take microseconds.
A worker's exception is a failure of the run, never a lost case: the parent counts the cases each worker returned.

Writes DIR/differentials.csv (a row per differential: cases, failures, bit failures, worst relative error per
dtype, the first failing cases) and its metadata (provenance, the arguments, wall time).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

WHICH = ("decode", "expand")


def _worker(which: str, n_cases: int, seed: int, shard: tuple[int, int]) -> dict:
    """One process's share of a differential: its row (harness.row's dict)."""
    import torch

    from lora_moe_lab import runtime
    from lora_moe_lab.instruments.recorders import harness
    from lora_moe_lab.instruments.recorders import kernel_cases as kc

    dev = runtime.default_device()
    if which == "decode":
        return kc.differential(dev, n_cases, seed, shard)
    from studies.kernels import record_expand as re_

    if dev.type != "cuda":  # the interpreter: float32 (its bf16 is wrong) and small M
        re_.BF = torch.float32
        harness.set_dry()
    return re_.random_cases(dev, n_cases, seed, shard)


def merge(which: str, parts: list[dict]) -> dict:
    """The differential's row over its workers' rows: cases and failures summed, the worst error the largest."""
    out = dict(section=which, cases=sum(p["cases"] for p in parts), failures=sum(p["failures"] for p in parts),
               workers=len(parts))
    if which == "decode":
        worst: dict = {}
        for p in parts:
            for k, v in json.loads(p["worst"]).items():
                worst[k] = max(worst.get(k, 0.0), v)
        out.update(bit_failures="", worst=json.dumps(worst),
                   fail_examples=json.dumps([f for p in parts for f in json.loads(p["fail_examples"])][:5]),
                   variants=json.dumps(sorted({v for p in parts for v in json.loads(p["table_tiles"])})))
    else:
        out.update(bit_failures=sum(p["bit_failures"] for p in parts),
                   worst=json.dumps({parts[0]["dtype"]: max(p["worst"] for p in parts)}), fail_examples="[]",
                   variants=parts[0]["builds"])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=1000, help="cases of each differential (default 1000)")
    ap.add_argument("--jobs", type=int, default=8, help="worker processes (default 8)")
    ap.add_argument("--which", default=",".join(WHICH), help=f"comma-separated, of {WHICH}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    args = ap.parse_args(argv)
    which = [w for w in args.which.split(",") if w]
    bad = [w for w in which if w not in WHICH]
    if bad or not which:
        raise SystemExit(f"--which: {bad or 'nothing'} is not one of {WHICH}")
    if args.cases < 1 or args.jobs < 1:
        raise SystemExit(f"--cases and --jobs must be >= 1, got {args.cases} and {args.jobs}")
    from lora_moe_lab.instruments.recorders.harness import Recorder, log

    Recorder.claim(args.out, "differentials", args.overwrite)
    rows: list[dict] = []
    rec = Recorder("differentials", args.out, params=vars(args), rows=rows)
    ctx = mp.get_context("spawn")  # CUDA in the workers: a forked CUDA context is unusable
    for w in which:
        t0 = time.time()
        with ctx.Pool(args.jobs) as pool:
            parts = pool.starmap(_worker, [(w, args.cases, args.seed, (j, args.jobs)) for j in range(args.jobs)])
        r = merge(w, parts)
        r["wall_s"] = round(time.time() - t0, 1)
        rows.append(r)
        rec.write()  # after each differential: a call killed later keeps it
        log(f"{w}: {r['cases']} cases over {r['workers']} processes, {r['failures']} failures "
            f"(bit: {r['bit_failures']}), worst {r['worst']}, {r['wall_s']} s")
        if r["cases"] != args.cases:
            rec.meta["errors"].append(f"{w}: {r['cases']} cases ran of {args.cases}")
    rec.write()
    if rec.meta["errors"] or any(r["failures"] for r in rows):
        where = os.path.join(args.out, "differentials.csv")
        raise SystemExit(f"differentials: {rec.meta['errors'] or 'failures'} ({where})")


if __name__ == "__main__":
    main()
