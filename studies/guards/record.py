"""Guards measured side by side: the canonical guards recording, one device session per file.

    PYTHONPATH=. GIT_COMMIT=<sha> GIT_DIRTY=0 python3 studies/guards/record.py --session s1 --out DIR
        -> DIR/h200_guards_s1.csv (+ .meta.json); another session (another day or machine): --session s2
    python studies/guards/record.py --dry --out /tmp/g      # tiny settings, any machine (CPU: seconds)

One CSV row per repetition, so every figure carries its spread and paired differences; read through
lora_moe_lab/instruments/analysers/recordings.py (load_guards), which pools two sessions.

A sweep that times one guard after another lets slow drifts of the host (clock, other processes,
the allocator) land on one guard and not the other. Here every repetition runs the three guards
(and, on a GPU, a CUDA-graph replay of the same forward, captured once) back to back in a rotating
order, each from an idle device (instruments.recorders.timing.time_once), so each ratio compares forwards
measured within milliseconds of each other. 48 distinct layers, bf16, Triton backend, 8 requests
per batch; active = share of requests with an adapter.

Per point (preset, M, active):
1. warm-up, untimed: --warmup rounds of every arm in the rotating order (Triton compiles here; the
   guard syncs per forward are counted), then more rounds until --warmup-s seconds have passed;
2. --reps timed interleaved repetitions (>= 10);
3. the warm-up check (recordings.warmup_check: stats.drop_warmup on every arm, the largest leading
   drift dropped from all arms so the pairs stay pairs). While an arm has not settled, up to
   --max-reps repetitions are taken in blocks of --extend; a point that never settles is recorded
   with status "unstable" and is not averaged by the reader. Dropped repetitions stay in the file
   (warmup_drift = True).
The metadata (provenance.metadata: GPU, driver, clocks, power, commit, dirty tree) is written first
and rewritten after every point, with each point's warm-up verdict and the card's state after it.
"""
from __future__ import annotations

import argparse
import os
import re
import time

from lora_moe_lab import runtime
from lora_moe_lab.instruments.analysers.recordings import (CHECK_COLUMNS, METHOD_SESSIONS, METHOD_WARMUP,
                                                 SAMPLE_COLUMNS, load_guards, warmup_check)
from lora_moe_lab.instruments.analysers.stats import METHOD_BOOT, METHOD_MEDIAN, MIN_PAIRED_REPS
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.timing import rotated, time_once
from lora_moe_lab.model.guards import count_guard_syncs, guard_names
from lora_moe_lab.model.lab import LabCache, split_tokens
from lora_moe_lab.provenance import DATA, META_KEYS, gpu_state, metadata

DRY = dict(presets=["tiny"], layers=2, tokens=[8, 16], active=[0.0, 0.5], reps=MIN_PAIRED_REPS, warmup=1,
           warmup_s=0.0, max_reps=MIN_PAIRED_REPS + 8, extend=8)
_SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


def gpu_tag(gpu: str) -> str:
    """'NVIDIA H200' -> 'h200' (the file's prefix); 'cpu' on a machine without a GPU."""
    words = [w for w in re.split(r"\s+", gpu.strip()) if w and w.upper() != "NVIDIA"]
    return re.sub(r"[^a-z0-9]", "", words[0].lower()) if words else "gpu"


def short(c) -> str:
    """A warm-up verdict in a few words, for the progress line (the metadata has the whole note)."""
    if not c.stable:
        return f"UNSTABLE over {c.n} reps: " + ", ".join(k for k, v in c.per_arm.items() if v is None)
    return f"dropped {c.dropped} of {c.n} as warm-up drift" if c.dropped else f"{c.n} reps, no drift"


def arms(lab, M: int, act: float, requests: int, cuda: bool) -> tuple[dict, list]:
    """The callables of one point: every guard, eager, and on a GPU the cpu_flag capture's replay;
    and what must stay alive while they run (the capture's static input and batch buffers)."""
    adapters = ["bench" if i < round(act * requests) else None for i in range(requests)]
    counts = split_tokens(M, requests)
    batch, tensors = lab.make_batch(adapters, counts)
    x = lab.random_input(M)
    fns = {g: (lambda g=g: lab.model(x, batch, tensors, guard=g)) for g in guard_names()}
    keep = [x, batch, tensors]
    if cuda:
        from lora_moe_lab.model.graphs import CapturedForward

        cap = CapturedForward(lab, counts, guard="cpu_flag")
        cap.load_batch(x, adapters)
        fns["graph"] = cap.graph.replay  # timed as before: the bare replay
        keep.append(cap)  # its static buffers (input, metadata) must outlive the timing
    return fns, keep


def measure(fns: dict, a, cuda: bool) -> dict:
    """Warm-up, timed interleaved repetitions and the warm-up check of one point."""
    names = list(fns)
    syncs = {n: 0 for n in names}
    t0, rounds = time.perf_counter(), 0
    while rounds < a.warmup or time.perf_counter() - t0 < a.warmup_s:
        for n in rotated(names, rounds):
            if rounds < a.warmup:
                with count_guard_syncs() as c:
                    fns[n]()
                syncs[n] += c.count
            else:
                fns[n]()
        rounds += 1
    runtime.synchronize()
    warm_s = time.perf_counter() - t0
    syncs = {n: v // max(a.warmup, 1) for n, v in syncs.items()}
    us = {n: [] for n in names}
    pos = {n: [] for n in names}
    r, target = 0, a.reps
    while True:
        while r < target:
            for i, n in enumerate(rotated(names, r)):
                us[n].append(time_once(fns[n], cuda)[0])
                pos[n].append(i)
            r += 1
        check = warmup_check(us)
        if check.stable or target >= a.max_reps:
            break
        target = min(target + a.extend, a.max_reps)
    return dict(us=us, position=pos, syncs=syncs, check=check, warmup_rounds=rounds, warmup_s=warm_s)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DATA / "guards"), help="folder for <gpu>_guards_<session>.csv and .meta.json")
    ap.add_argument("--session", default="s1", help="this device session's label (s1, s2, ...): one file each")
    ap.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "qwen3-30b-a3b-tp4"])
    ap.add_argument("--layers", type=int, default=None,
                    help="layers (default: the preset's 48, or as many as the card holds: model/sizing.py)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 1024, 4096, 16384])
    ap.add_argument("--active", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--reps", type=int, default=16,
                    help=f"timed interleaved repetitions per point (>= {MIN_PAIRED_REPS})")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds of every arm before timing (>= 1)")
    ap.add_argument("--warmup-s", type=float, default=1.5, help="... and at least this many seconds of them")
    ap.add_argument("--max-reps", type=int, default=24, help="repetitions at most while an arm has not settled")
    ap.add_argument("--extend", type=int, default=8, help="repetitions added per step while an arm has not settled")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--dry", action="store_true", help="tiny settings for a test on any machine: "
                    + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in DRY.items()))
    ap.add_argument("--force", action="store_true", help="overwrite an existing file of this session")
    a = ap.parse_args(argv)
    if a.dry:
        for k, v in DRY.items():
            setattr(a, k, v)
    if not _SESSION.match(a.session):
        ap.error(f"--session {a.session!r}: letters, digits, '-' and '_' (e.g. s1, s2)")
    if a.reps < MIN_PAIRED_REPS:
        ap.error(f"--reps {a.reps}: the rule is at least {MIN_PAIRED_REPS} paired repetitions kept after the warm-up")
    if a.warmup < 1 or a.warmup_s < 0:
        ap.error("--warmup must be >= 1 and --warmup-s >= 0")
    if a.max_reps < a.reps or a.extend < 1:
        ap.error("--max-reps must be >= --reps and --extend >= 1")
    if not (all(t > 0 for t in a.tokens) and all(0 <= x <= 1 for x in a.active)
            and (a.layers is None or a.layers > 0) and a.requests > 0):
        ap.error("--tokens, --layers and --requests must be positive, --active in [0, 1]")
    return a


def main(argv=None) -> str:
    a = parse(argv)
    cuda = runtime.has_cuda()
    params = {k: v for k, v in vars(a).items() if k not in ("out", "force")}  # no machine paths
    meta = metadata(params=params)
    name = f"{gpu_tag(meta['gpu'])}_guards_{a.session}"
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, name + ".csv")
    if os.path.exists(path) and not a.force:
        raise SystemExit(f"{path} exists: a session is recorded once (--force overwrites, --session names another)")
    meta.update(session=a.session, file=name + ".csv", timer="cuda_events" if cuda else "wall",
                methods=dict(median=METHOD_MEDIAN, paired=METHOD_BOOT, sessions=METHOD_SESSIONS, warmup=METHOD_WARMUP),
                points=[])
    meta_path = os.path.join(a.out, name + ".meta.json")

    def write_meta():  # atomically (temp file + os.replace), keeping the CSV's seal (tables.append_rows)
        old = tables.read_meta(meta_path)
        if "files" in old:
            meta["files"] = old["files"]
        tables.write_json_atomic(meta_path, meta)

    write_meta()
    row_meta = {k: meta[k] for k in META_KEYS}
    labs = LabCache()  # one 48-layer model on the GPU at a time
    t_start = time.time()
    columns = SAMPLE_COLUMNS + CHECK_COLUMNS + list(row_meta)
    if os.path.exists(path):  # --force: start afresh (the file is created at the first point's rows)
        os.unlink(path)
    if True:
        for preset in a.presets:
            lab = labs.get(adapter=("bench", 16), preset=preset, num_layers=a.layers, dtype="auto",
                           max_loras=4, max_rank=16)
            for M in a.tokens:
                for act in a.active:
                    fns, keep = arms(lab, M, act, a.requests, cuda)
                    m = measure(fns, a, cuda)
                    del fns, keep
                    c = m["check"]
                    point_rows = []
                    for n, samples in m["us"].items():
                        graph = n == "graph"  # a replay of the cpu_flag capture: every guard records the same
                        for rep, us in enumerate(samples):
                            point_rows.append(dict(preset=preset, layers=lab.shape.num_layers, tokens=M, active=act,
                                            variant=n,
                                            guard="cpu_flag" if graph else n, mode="graph" if graph else "eager",
                                            rep=rep, us=us, syncs_per_forward=m["syncs"][n], session=a.session,
                                            warmup_drift=rep < c.dropped, status=c.status,
                                            position=m["position"][n][rep], **row_meta))
                    tables.append_rows(path, point_rows, columns, meta_path=meta_path)  # one write + fsync
                    meta["points"].append(dict(preset=preset, tokens=M, active=act, reps=c.n, dropped=c.dropped,
                                               status=c.status, note=c.note, drift_per_arm=c.per_arm,
                                               warmup_rounds=m["warmup_rounds"], warmup_s=round(m["warmup_s"], 3),
                                               gpu_state_after=gpu_state() if cuda else {}))
                    write_meta()
                    med = {n: sorted(v)[len(v) // 2] / 1e3 for n, v in m["us"].items()}
                    print(f"{preset:18s} M={M:6d} active={act:.1f}  "
                          + "  ".join(f"{n}={v:8.2f}ms" for n, v in med.items())
                          + f"  sync/cpu_flag={med['sync'] / med['cpu_flag']:.3f}  [{short(c)}]"
                          + f"  t={time.time() - t_start:.0f}s", flush=True)
    labs.free()
    meta["wall_s"] = round(time.time() - t_start, 1)
    meta["gpu_state_end"] = gpu_state() if cuda else {}
    write_meta()
    rec = load_guards(path)
    p = rec.paired("sync", "cpu_flag")
    print(f"{rec.label}, session {a.session}: {p.n.min()}-{p.n.max()} paired repetitions kept per point; "
          f"{(p.status == 'unstable').sum()} unstable point(s); {meta['wall_s']:.0f} s")
    print(p[["preset", "tokens", "active", "n", "n_dropped", "status", "ratio", "ratio_lo95", "ratio_hi95",
             "us_per_sync", "us_per_sync_lo95", "us_per_sync_hi95"]].round(3).to_string(index=False))
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
