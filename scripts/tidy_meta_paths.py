"""Rewrite the machine paths in recorded metadata as repo-relative ones; nothing else changes.

    python scripts/tidy_meta_paths.py          # rewrite data/**/*.json in place
    python scripts/tidy_meta_paths.py --check  # exit 1 if any recorded metadata still names a machine path

Recordings made before `provenance.metadata` wrote repo-relative paths hold the checkout's absolute
path (CHECKOUT below) and the device machine's output folder (DEVICE_OUT). Each path string becomes
what `provenance.repo_relative` records now: "build/production/traces", "$OUT/expand_run7". Only
whole-path string values are touched (never a figure, never a log line).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from lora_moe_lab.provenance import DATA, repo_relative

CHECKOUT = "/work/main"  # where the recordings' checkout lay
DEVICE_OUT = "/root/out"  # the device machine's $OUT


def tidy(obj):
    return repo_relative(obj, root=Path(CHECKOUT), out=DEVICE_OUT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    stale = []
    for f in sorted(DATA.rglob("*.json")):
        old = json.loads(f.read_text())
        new = tidy(old)
        if new != old:
            stale.append(f)
            if not a.check:
                f.write_text(json.dumps(new, indent=1) + "\n")
    for f in stale:
        print(("stale: " if a.check else "rewritten: ") + str(f.relative_to(DATA.parent)))
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
