"""Time a new user's set-up: a fresh clone of this checkout, then `make venv` (what the first
`make run` or `make test` does) with pip's and uv's caches off, as on a machine that never installed it.

    python3 studies/setup/record.py --runs 3      -> data/setup/setup_time.json

Each run's wall-clock seconds, their median, min and max, and the machine's metadata.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_run() -> float:
    with tempfile.TemporaryDirectory() as d:
        repo = Path(d) / "repo"
        t0 = time.perf_counter()
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        subprocess.run(["make", "venv"], cwd=repo, check=True, capture_output=True,
                       env=dict(os.environ, PIP_NO_CACHE_DIR="1", UV_NO_CACHE="1"))
        return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "setup" / "setup_time.json")
    a = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()  # plain git: this runs before any venv exists
    secs = [one_run() for _ in range(a.runs)]
    doc = dict(what="fresh clone + make venv, pip and uv caches off", runs=a.runs, seconds=[round(s, 1) for s in secs],
               median_s=round(statistics.median(secs), 1), min_s=round(min(secs), 1), max_s=round(max(secs), 1),
               cores=os.cpu_count(), python=platform.python_version(), commit=commit,
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
