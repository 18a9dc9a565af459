"""Regenerate the docs' figures from data/: every number sits between a pair of markers
`<!-- begin:NAME -->` ... `<!-- end:NAME -->` and is written by the block NAME from a recording.

    python scripts/readme_tables.py           # rewrite the blocks in every file that has markers
    python scripts/readme_tables.py --check   # exit 1 if a file is not what data/ says (a test runs this)

The blocks live with their studies: each `studies/<name>/block.py` defines `BLOCKS = {"marker-name": function}`
(a function returns the markdown, or None while nothing is recorded) and, optionally, `BLOCK_DATA` (block -> the
data folder it reads). This driver collects them all, with whatever still sits in its own `BLOCKS`, and renders
README.md, docs/results.md and every studies/*/README.md and data/*/README.md that holds a marker.

Every file is rendered in memory before any is written: a recording that cannot be read (schemas.RecordingError:
cut, appended twice, edited after its seal, foreign) stops the run with exit 2 and a message naming the file and row,
and no output file is touched.

A block whose generator is not written yet, or whose data folder is absent (BLOCK_DATA), gets a
note saying so instead of figures; the run does not fail.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from pathlib import Path

# This checkout's root, from this file's own place. A second checkout run through the venv of the first would
# import the first checkout's package (the editable install names it) and read ITS data/: refused, with the fix.
ROOT = Path(__file__).resolve().parents[1]

import lora_moe_lab.provenance as _prov  # noqa: E402
from lora_moe_lab.instruments.analysers.schemas import RecordingError  # noqa: E402

if Path(_prov.ROOT).resolve() != ROOT:
    raise SystemExit(f"scripts/readme_tables.py of {ROOT} would read the recordings of {_prov.ROOT} "
                     f"(lora_moe_lab was imported from {Path(_prov.__file__).parent}): run it with "
                     f"PYTHONPATH={ROOT}, or from this checkout's own venv")
DATA = _prov.DATA

README = ROOT / "README.md"
BLOCK_DATA: dict[str, str] = {}  # block -> the data folder it reads (the studies' BLOCK_DATA join it below)
BLOCKS: dict = {}  # block -> its generator, for a block not yet moved to its study (the studies' join it below)


def _study_blocks(name: str):
    """studies/<name>/block.py, the study package imported from this checkout (as `studies.<name>`)."""
    if "studies" not in sys.modules:
        spec = importlib.util.spec_from_file_location("studies", ROOT / "studies" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "studies")])
        sys.modules["studies"] = mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return importlib.import_module(f"studies.{name}.block")


def gpu_logs_block() -> str | None:
    """data/gpu_tests/: one row per kept log, its result read from the check's own report (<log>.json, through the
    checked JSON reader) or, for a probe, from the log's `measured:` line."""
    from lora_moe_lab.instruments.analysers.schemas import read_json

    folder = DATA / "gpu_tests"
    rows = []
    for log in sorted(folder.glob("gpu_*.log")):
        rep = log.with_suffix(".json")
        if rep.is_file():
            d = read_json(rep)
            meta = d.get("meta", {})
            cap = meta.get("gpu_cap_gib")
            card = meta.get("gpu", "?") + (f", capped at {cap:g} GiB" if cap else "")
            parts = []
            if "tests" in d:
                s = d["tests"]
                parts.append(f"suite (`{s.get('scope', 'pytest')}`): {s['passed']} passed, "
                             + (f"**{s['failed']} failed**" if s["failed"] else "0 failed")
                             + f", {s['skipped']} skipped, {s['seconds']:.0f} s")
            if "notebooks" in d:
                nbs = d["notebooks"]["notebooks"]
                ok = sum(n["status"] == "passed" for n in nbs)
                bad = [n["notebook"][:2] for n in nbs if n["status"] != "passed"]
                parts.append(f"notebooks: {ok} of {len(nbs)} passed" + (f" ({', '.join(bad)} not)" if bad else "")
                             + f", {d['notebooks']['seconds']:.0f} s")
            rows.append((meta.get("date", ""), f"| `{log.name}` | {meta.get('commit', '?')[:7]} | {card} | "
                                               + "; ".join(parts) + " |"))
        else:
            text = log.read_text(errors="replace").splitlines()
            gpu = next((ln.split("GPU: ", 1)[1] for ln in text if "GPU: " in ln), "?")
            got = next((ln.split(":", 1)[1].strip() for ln in text if ln.startswith("measured:")), None)
            commit = log.stem.split("_")[2]
            cap = re.search(r"_cap(\d+)GiB$", log.stem)
            gpu += f", capped at {cap[1]} GiB" if cap else ""
            rows.append(("", f"| `{log.name}` | {commit} | {gpu} | probe: "
                             + (got.replace("the fix gains ", "measured ") if got else "**no measured line**") + " |"))
    if not rows:
        return None
    return "\n".join(["| log | commit | card | result |", "| --- | --- | --- | --- |"] + [r for _, r in rows])


BLOCKS["gpu-logs"] = gpu_logs_block
BLOCK_DATA["gpu-logs"] = "gpu_tests"

STUDIES = sorted(p.parent.name for p in (ROOT / "studies").glob("*/block.py"))
for _name in STUDIES:
    _mod = _study_blocks(_name)
    BLOCKS.update(_mod.BLOCKS)
    BLOCK_DATA.update(getattr(_mod, "BLOCK_DATA", {}))


def files() -> list[Path]:
    """README.md, docs/results.md, and every study's and data folder's README that holds a marker."""
    more = sorted(ROOT.glob("studies/*/README.md")) + sorted(ROOT.glob("data/*/README.md"))
    return [README, ROOT / "docs" / "results.md"] + [f for f in more if "<!-- begin:" in f.read_text()]


def pending_note(name: str) -> str:
    folder = BLOCK_DATA.get(name)
    where = f"`data/{folder}/`" if folder else "data/"
    why = "is not recorded yet" if folder and not (DATA / folder).exists() else "has no block.py generator yet"
    return f"*(`{name}`: {where} {why}; this block fills when it does)*"


def render(text: str) -> str:
    marked = re.findall(r"<!-- begin:([\w-]+) -->", text)  # a marker no study generates gets the pending note
    for name in dict.fromkeys(list(BLOCKS) + [n for n in BLOCK_DATA if n not in BLOCKS] + marked):
        pat = re.compile(rf"(<!-- begin:{name} -->)(.*?)(<!-- end:{name} -->)", re.S)
        m = pat.search(text)
        if not m:
            continue
        folder = BLOCK_DATA.get(name)
        if name not in BLOCKS or (folder and not (DATA / folder).exists()):
            body = pending_note(name)
            print(f"note: block {name}: {body}", file=sys.stderr)
        else:
            body = BLOCKS[name]()
            if body is None:
                body = f"*(no recording in data/ yet for `{name}`)*"
        one_line = "\n" not in m.group(2)  # an inline slot stays on its line
        sep = "" if one_line else "\n"
        text = pat.sub(lambda mm: mm.group(1) + sep + body + sep + mm.group(3), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a file differs from what data/ says")
    a = ap.parse_args(argv)
    stale = 0
    # every file rendered in memory first: a recording that cannot be read leaves every output as it was
    try:
        done = [(f, f.read_text()) for f in files()]
        done = [(f, old, render(old)) for f, old in done]
    except RecordingError as e:
        print(f"refused: {e}\nnothing was rewritten", file=sys.stderr)
        return 2
    for f, old, new in done:
        name = f.relative_to(ROOT)
        if a.check:
            if new != old:
                print(f"{name} is out of date with data/: run python scripts/readme_tables.py")
                stale += 1
            else:
                print(f"{name} agrees with data/")
        else:
            if new != old:
                f.write_text(new)
            print(name, "rewritten" if new != old else "unchanged")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
