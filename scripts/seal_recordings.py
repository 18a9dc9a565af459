"""Seal every canonical CSV under data/: store {"rows", "sha256"} of each file in its metadata, so that a reader
(lora_moe_lab.instruments.analysers.schemas.read_csv) refuses a file cut, appended to or edited since.

    python scripts/seal_recordings.py            # check each file against its kind's schema, then seal it
    python scripts/seal_recordings.py --check    # exit 1 if a file's seal is missing or disagrees (writes nothing)
    python scripts/seal_recordings.py --new-meta # also seal a CSV that has no metadata file, in a new one
                                                 # (<name>.meta.json, its kind's rule) holding its seal alone

The files are those of the declared kinds (schemas.KINDS[...].files and schemas.FILE_KINDS[...].files: the profiler
traces and the catalog, sealed by size and hash; globs under data/). The seal goes where the
kind says (schemas.meta_path: `<name>.meta.json`, a session folder's `meta.json`, a table's `<section>.meta.json`)
under meta["files"][<file name>]; only that key is added, nothing else in the metadata or the CSV changes, so no
figure moves. A CSV whose metadata file does not exist is not sealed unless --new-meta is given (then a metadata
file holding nothing but {"files": {<name>: seal}} is created where its kind says; no provenance is made up):
without it the file is listed as unsealed, and its schema is still checked on every read. A file that fails its
schema is not sealed: the run lists it and exits 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from lora_moe_lab.instruments.analysers import schemas as S  # noqa: E402


def canonical(data: Path) -> list[tuple[Path, str]]:
    """(file, kind) of every recording in `data`: the tables (S.KINDS) and the other files (S.FILE_KINDS)."""
    out = []
    for k in [*S.KINDS.values(), *S.FILE_KINDS.values()]:
        for g in k.files:
            out += [(f, k.name) for f in sorted(data.glob(g)) if f.is_file()]
    return out


def _check(f: Path, kind: str) -> None:
    """The file read as its reader reads it (the seal required), or, before sealing, its content checked."""
    if kind in S.FILE_KINDS:
        S.check_seal(f, f.read_bytes(), meta=S.file_meta_path(f), sealed=True)
    else:
        S.read_csv(f, kind, sealed=True, low_memory=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="the data folder (default: this checkout's)")
    ap.add_argument("--check", action="store_true", help="only check: exit 1 if a seal is missing or disagrees")
    ap.add_argument("--new-meta", action="store_true",
                    help="seal a CSV that has no metadata file too, in a new one that holds its seal alone")
    a = ap.parse_args(argv)
    bad, unsealed, sealed = [], [], 0
    for f, kind in canonical(a.data):
        rel = f.relative_to(a.data)
        mp = S.file_meta_path(f) if kind in S.FILE_KINDS else S.meta_path(f, kind)
        try:
            if a.check:
                _check(f, kind)
                continue
            if kind in S.KINDS:
                S.validate(__import__("pandas").read_csv(f, low_memory=False), kind, f)
        except S.RecordingError as e:
            bad.append(str(e))
            continue
        if not mp.is_file() and not a.new_meta:
            unsealed.append(rel)
            continue
        S.write_seal(f, mp)  # a missing metadata file is created holding the seal alone
        sealed += 1
        print(f"sealed {rel} ({kind}) in {mp.relative_to(a.data)}")
    for u in unsealed:
        print(f"unsealed (no metadata file): {u}" if not a.check else f"no seal: {u}")
    for b in bad:
        print(f"refused: {b}", file=sys.stderr)
    if not a.check:
        print(f"{sealed} sealed, {len(unsealed)} without metadata, {len(bad)} refused")
    return 1 if bad or (a.check and unsealed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
