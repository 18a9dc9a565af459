"""Record production's setting on two H200s in one device call: a chunked prefill of 128 requests
x 2048 input tokens through the 48-layer Qwen3-30B-A3B-shaped decoder, per guard, at TP=1 (one
GPU, full shapes) and TP=2 (torchrun, heads and expert intermediate split over both GPUs).

    python3 studies/production/record_tp.py --stage smoke --out $OUT    # 4 layers, 2 reps, GPU tests (~1 min)
    python3 studies/production/record_tp.py --stage full --out $OUT     # 48 layers, C=16384, 5 reps (~8.5 min)
    python3 studies/production/record_tp.py --stage extra --out $OUT    # C=8192 (not recorded yet)

Each task is one run of `python -m lora_moe_lab.instruments.recorders.prefill` (under torchrun for TP=2):
tidy CSV + .meta.json + .summary.csv in build/production/, one trimmed trace per guard, adapter
mode and rank in build/production/traces/. Everything comes back as $OUT/production.tar.gz (the
device returns at most 8 files) with the log. Tasks run in priority order; one that would not
fit in the time left is skipped and logged, so the call ends well inside its 10 minutes.

guard_sites = 260 / 48 (5.42 guard decisions per layer) gives production's 260 syncs per forward
over 48 layers; guard_sites 1 is this lab's own one decision per layer.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "production"
GS_PROD = 260 / 48

# name, tp, layers, requests, chunk, guard_sites, guards, adapter modes, reps, minutes it needs at least
ALL = ["sync", "cpu_flag", "launch_always"]
STAGES = {
    "smoke": [
        ("smoke_tp1", 1, 4, 16, 16384, GS_PROD, ALL, ["none", "mix"], 2, 0.5),
        ("smoke_tp2", 2, 4, 16, 16384, GS_PROD, ALL, ["none", "mix"], 2, 0.5),
    ],
    "full": [
        # measured in the smoke call: ~3.7 and ~2.7 min; then guard_sites 1 if the time is there
        ("tp1_C16384_gs5.42", 1, 48, 128, 16384, GS_PROD, ALL, ["none", "mix"], 5, 4.0),
        ("tp2_C16384_gs5.42", 2, 48, 128, 16384, GS_PROD, ALL, ["none", "mix"], 5, 3.0),
        ("tp2_C16384_gs1", 2, 48, 128, 16384, 1.0, ["sync", "cpu_flag"], ["none"], 5, 1.2),
        ("tp1_C16384_gs1", 1, 48, 128, 16384, 1.0, ["sync", "cpu_flag"], ["none"], 5, 1.5),
    ],
    "extra": [  # chunk 8192: twice the forwards, each half as long
        ("tp2_C8192_gs5.42", 2, 48, 128, 8192, GS_PROD, ALL, ["none"], 5, 1.5),
        ("tp1_C8192_gs5.42", 1, 48, 128, 8192, GS_PROD, ALL, ["none"], 5, 2.5),
    ],
}


def command(name, tp, layers, requests, chunk, gs, guards, modes, reps, minutes_left) -> list[str]:
    cli = ["-m", "lora_moe_lab.instruments.recorders.prefill", "--preset", "qwen3-30b-a3b", "--layers", str(layers),
           "--requests", str(requests), "--input-len", "2048", "--chunk", str(chunk), "--guard-sites", repr(gs),
           "--guards", *guards, "--adapters", *modes, "--reps", str(reps), "--out", str(WORK / f"{name}.csv"),
           "--trace-dir", str(WORK / "traces"), "--max-minutes", f"{minutes_left:.2f}"]
    if tp == 1:
        return [sys.executable, *cli]
    # one process per GPU; the rendezvous stays on this host (no network)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp),
            *cli, "--tp-auto"]


def sh(cmd: str, log) -> None:
    log.write(f"$ {cmd}\n")
    log.flush()
    subprocess.run(cmd, shell=True, stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", choices=sorted(STAGES), required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "build/out"))
    ap.add_argument("--minutes", type=float, default=8.5, help="wall time for this call's tasks")
    a = ap.parse_args()
    t0 = time.monotonic()
    deadline = t0 + 60 * a.minutes
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (WORK / "traces").mkdir(parents=True, exist_ok=True)
    if a.stage != "smoke":  # a warm machine keeps build/: leave the smoke run out of the recording
        for p in [*WORK.glob("smoke_*"), *(WORK / "traces").glob("*_L4_*")]:
            p.unlink()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # NVLink multicast stays off (the machine's rule): keep these set for every child process
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[k] = v
    with open(out / "log.txt", "w") as log:
        sh("nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import torch, triton; print(torch.__version__, "
           "triton.__version__, torch.cuda.device_count())'", log)
        if a.stage == "smoke":  # the prefill tests on the GPU: checked_region with sync debug mode on
            sh(f"{sys.executable} -m pytest -q -x -p no:cacheprovider tests/instruments/recorders/test_prefill.py", log)
        for task in STAGES[a.stage]:
            name, *_, need = task
            left = (deadline - time.monotonic()) / 60
            if left < need:
                log.write(f"SKIP {name}: {left:.1f} min left, needs {need}\n")
                continue
            cmd = command(*task[:-1], minutes_left=max(0.2, left - 0.5 * need))
            log.write(f"\n=== {name} ({left:.1f} min left) ===\n$ {' '.join(cmd)}\n")
            log.flush()
            t = time.monotonic()
            try:
                r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   timeout=max(30.0, deadline - time.monotonic()))
                log.write(f"=== {name}: rc {r.returncode}, {time.monotonic() - t:.0f} s ===\n")
            except subprocess.TimeoutExpired:
                log.write(f"=== {name}: KILLED at the deadline after {time.monotonic() - t:.0f} s ===\n")
            log.flush()
        sizes = sorted((p.stat().st_size, p.name) for p in (WORK / "traces").glob("*.json.gz"))
        log.write(f"traces: {len(sizes)}, largest {sizes[-1] if sizes else None}\n")
        log.write(f"total {time.monotonic() - t0:.0f} s\n")
    with tarfile.open(out / f"production_{a.stage}.tar.gz", "w:gz") as tar:
        tar.add(WORK, arcname="production")
    shutil.copy(out / "log.txt", out / f"log_{a.stage}.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
