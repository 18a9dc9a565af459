"""The kernels study's tidy tables in data/kernels/: one long table per section, a row per measurement.

    data/kernels/<section>.csv        every session's rows, `session` first, then the session's commit, gpu, date,
                                      torch and triton (from its metadata), then the rows' own columns
    data/kernels/<section>_ncu.csv    the sessions' Nsight Compute counters (one profiled launch a row), likewise
    data/kernels/<section>.meta.json  {"sessions": {session: metadata}, "columns": {session: [its columns]},
                                       "ncu_columns": {session: [its counters' columns]}}

    rows("kernels_fold", "fold_s10")          # that session's rows, exactly as its own CSV read (same columns, dtypes)
    rows("kernels_base", "base_s10", ncu=True)
    meta("kernels_fold", "fold_s10")          # its metadata (provenance.normalize_meta not applied)
    sessions("kernels_fold")                  # the sessions in the order they were appended

A session is appended once, from the folder a recording script wrote (`<section>.csv`, `<section>.meta.json`,
`<section>_ncu.csv` where present):

    python -m studies.kernels.tidy DIR --section kernels_fold --session fold_s17   # or the scripts' --session

Every cell is kept as its text, so a session's rows read back exactly as the recording's own file did.
"""
from __future__ import annotations

import argparse
import copy
import io
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA

KERNELS = DATA / "kernels"
PROVENANCE = ("commit", "gpu", "date", "torch", "triton")  # meta keys copied onto every row of a session


def _dir(path) -> Path:
    return Path(path) if path is not None else KERNELS


@lru_cache(maxsize=64)
def _text_table(f: str, mtime: float) -> pd.DataFrame:
    """The table as text, checked (schemas.read_csv: its seal in <section>.meta.json, the kernel_tidy schema, or
    kernel_resources' for that table: its own key)."""
    kind = "kernel_resources" if Path(f).name == "kernel_resources.csv" else "kernel_tidy"
    return schemas.read_csv(f, kind, dtype=str, keep_default_na=False)


@lru_cache(maxsize=64)
def _meta_file(f: str, mtime: float) -> dict:
    return schemas.read_json(f)


def _table_file(section: str, path, ncu: bool) -> Path:
    return _dir(path) / f"{section}{'_ncu' if ncu else ''}.csv"


def section_meta(section: str, path=None) -> dict:
    """The section's whole meta file ({"sessions", "columns", "ncu_columns"}); empty parts when absent."""
    f = _dir(path) / f"{section}.meta.json"
    m = _meta_file(str(f), f.stat().st_mtime) if f.exists() else {}
    return {"sessions": m.get("sessions", {}), "columns": m.get("columns", {}), "ncu_columns": m.get("ncu_columns", {})}


def sessions(section: str, path=None, ncu: bool = False) -> list[str]:
    """The sessions with rows in the section's table (or its counters), in the order they were appended."""
    return list(section_meta(section, path)["ncu_columns" if ncu else "columns"])


def has(section: str, name: str, path=None, ncu: bool = False) -> bool:
    return name in section_meta(section, path)["ncu_columns" if ncu else "columns"]


def rows(section: str, name: str, path=None, ncu: bool = False) -> pd.DataFrame:
    """Session `name`'s rows of the section (its counters with ncu=True), parsed as its own CSV was: its columns in
    its order, pandas' dtypes inferred from its cells alone."""
    cols = section_meta(section, path)["ncu_columns" if ncu else "columns"].get(name)
    f = _table_file(section, path, ncu)
    if cols is None or not f.exists():
        what = "counters" if ncu else "rows"
        raise FileNotFoundError(f"no {what} of session {name!r} in {f}: record it with the study's script "
                                f"(studies/kernels/record_*.py --session {name})")
    t = _text_table(str(f), f.stat().st_mtime)
    sub = t.loc[t["session"] == name, cols]
    return pd.read_csv(io.StringIO(sub.to_csv(index=False)))


def meta(section: str, name: str, path=None) -> dict:
    m = section_meta(section, path)["sessions"]
    if name not in m:
        raise FileNotFoundError(f"no metadata of session {name!r} in {_dir(path) / (section + '.meta.json')}")
    return copy.deepcopy(m[name])


def _write_atomic(f: Path, write) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=f".{f.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            write(fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, f)
    except BaseException:
        os.unlink(tmp)
        raise


def _append_rows(f: Path, name: str, new: pd.DataFrame, prov: dict) -> None:
    new = new.copy()
    for k in reversed(PROVENANCE):
        if k not in new.columns:
            new.insert(0, k, str(prov.get(k, "")) if prov.get(k) is not None else "")
    new.insert(0, "session", name)
    old = pd.read_csv(f, dtype=str, keep_default_na=False) if f.exists() else None
    t = new if old is None else pd.concat([old, new], ignore_index=True).fillna("")
    _write_atomic(f, lambda fh: t.to_csv(fh, index=False))


def append(section: str, name: str, rows_csv=None, meta_json=None, ncu_csv=None, path=None,
           replace: bool = False) -> None:
    """Add session `name` to the section's tables: its rows (a recording's CSV), its metadata, its counters (each
    optional; a session may have counters only). Each file is rewritten through a temporary file and os.replace.
    A session already in a table is refused unless `replace`."""
    d = _dir(path)
    mf = d / f"{section}.meta.json"
    m = schemas.read_json(mf) if mf.exists() else {}
    m.setdefault("sessions", {}), m.setdefault("columns", {}), m.setdefault("ncu_columns", {})
    run_meta = schemas.read_json(meta_json) if meta_json is not None else m["sessions"].get(name, {})
    if isinstance(run_meta, dict) and "files" in run_meta:  # the run's own seals: its CSVs, not this table
        run_meta = {k: v for k, v in run_meta.items() if k != "files"}
    for src, ncu in ((rows_csv, False), (ncu_csv, True)):
        if src is None:
            continue
        key = "ncu_columns" if ncu else "columns"
        f = _table_file(section, d, ncu)
        if name in m[key]:
            if not replace:
                raise ValueError(f"session {name!r} is already in {f} (pass replace=True / --replace)")
            old = pd.read_csv(f, dtype=str, keep_default_na=False)
            old = old[old["session"] != name]
            _write_atomic(f, lambda fh, old=old: old.to_csv(fh, index=False))
        new = pd.read_csv(src, dtype=str, keep_default_na=False)
        _append_rows(f, name, new, run_meta)
        m[key][name] = list(new.columns)
        m.setdefault("files", {})[f.name] = schemas.seal(f)  # the table as now written (schemas: the seal)
    if meta_json is not None:
        m["sessions"][name] = run_meta
    _write_atomic(mf, lambda fh: (json.dump(m, fh, indent=1), fh.write("\n")))


def append_dir(out_dir, section: str, name: str, path=None, replace: bool = False) -> None:
    """append() from the folder a recording script wrote: <section>.csv, .meta.json and _ncu.csv, where present."""
    o = Path(out_dir)
    got = {k: (o / f"{section}{suf}") for k, suf in (("rows_csv", ".csv"), ("meta_json", ".meta.json"),
                                                      ("ncu_csv", "_ncu.csv"))}
    got = {k: f for k, f in got.items() if f.exists()}
    if not got:
        raise FileNotFoundError(f"{o} holds none of {section}.csv, {section}.meta.json, {section}_ncu.csv")
    append(section, name, path=path, replace=replace, **got)


def session_args(ap, section: str) -> None:
    """A recording script's --session / --data: with --session, its run is appended to the tidy tables at the end."""
    ap.add_argument("--session", help=f"append this run to data/kernels/{section}*.csv as this session (e.g. "
                                      f"{section.split('_')[-1][:4]}_s17); without it the run stays in --out only")
    ap.add_argument("--data", default=str(KERNELS), help="the tidy tables' folder (default data/kernels)")


def append_if_asked(args, section: str, ncu_only: bool = False) -> None:
    """After a run: append --out's files to the tables as --session, when given (ncu_only: the parsed counters)."""
    if not getattr(args, "session", None):
        return
    if ncu_only:
        append(section, args.session, ncu_csv=Path(args.out) / f"{section}_ncu.csv", path=args.data)
    else:
        append_dir(args.out, section, args.session, args.data)
    print(f"appended {args.session} to {args.data}/{section}*", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="the folder a recording script wrote (its --out)")
    ap.add_argument("--section", required=True, help="e.g. kernels_fold, kernels_base, kernels_expand, shrink_order")
    ap.add_argument("--session", required=True, help="the session's label, e.g. fold_s17")
    ap.add_argument("--data", default=str(KERNELS), help="the tables' folder (default data/kernels)")
    ap.add_argument("--replace", action="store_true", help="replace a session already in the tables")
    a = ap.parse_args(argv)
    append_dir(a.out_dir, a.section, a.session, a.data, a.replace)
    print(f"appended {a.session} to {a.data}/{a.section}*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
