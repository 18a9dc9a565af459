"""The GPU check anyone with a GPU can run: the whole pytest suite, then every notebook live with
notebooks/params/gpu.yaml, and a log with metadata in data/gpu_tests/ (data/gpu_tests/README.md).

    make gpu-check                                   # with the venv (or: make gpu-check PY=python3)
    PYTHONPATH=. python3 scripts/gpu_check.py --what tests        # only the pytest suite
    PYTHONPATH=. python3 scripts/gpu_check.py --what notebooks    # only the notebooks
    PYTHONPATH=. python3 scripts/gpu_check.py --wheels .whl --out $OUT    # notebook packages from wheels first
    ... --what notebooks --merge data/gpu_tests/gpu_check_<commit>.json  # add to the tests' log of that commit

Writes gpu_check_<commit>.log (readable) and gpu_check_<commit>.json (the same figures) in --out:
commit, date, GPU, driver, torch/triton/CUDA versions; pytest's passed/failed/skipped counts, in
all and per test file, with every failure named; per notebook its status, seconds, executed size
(the 1 MB rule) and the lines its `lesson` cells printed. Running `--what tests` and then
`--what notebooks` at one commit fills one log: each part replaces its own section. A tree copied
without .git names its commit through GIT_COMMIT (and GIT_DIRTY=0/1), as every recording does.
Exit status: 0 when nothing failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_PACKAGES = ["papermill", "ipykernel", "nbformat", "nbclient", "nbconvert", "ipywidgets", "plotly"]
NEEDED = {"pytest": "pytest", "pytest_timeout": "pytest-timeout", "hypothesis": "hypothesis", "torch": "torch",
          "triton": "triton", "papermill": "papermill", "nbconvert": "nbconvert", "ipykernel": "ipykernel",
          "ipywidgets": "ipywidgets", "plotly": "plotly", "yaml": "pyyaml", "scipy": "scipy"}
LIMIT_BYTES = 1_000_000


def say(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def install_wheels(folder: str) -> None:
    """The GPU machine has no network: install the notebook packages from a folder of wheels."""
    say(f"installing {', '.join(NB_PACKAGES)} from {folder} (no index) ...")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", folder,
                        *NB_PACKAGES], capture_output=True, text=True)
    if r.returncode:
        say(f"wheel install failed (the notebooks will fail): {r.stderr.strip().splitlines()[-1:]}")
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "python3"],
                   capture_output=True, text=True)


def missing_modules() -> list[str]:
    import importlib.util

    return [pkg for mod, pkg in NEEDED.items() if importlib.util.find_spec(mod) is None]


def run_tests(build: Path, extra: list[str], timeout: int) -> dict:
    """pytest over the whole suite; counts from its JUnit XML, per test file and in all."""
    xml = build / "pytest.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *extra]
    say("pytest: " + " ".join(cmd[1:]))
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:  # the counts below are then those of the XML, if any
        raw = e.stdout or ""
        out, rc = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw), f"timeout after {timeout} s"
    res = dict(seconds=round(time.time() - t0, 1), returncode=rc, tail=out.strip().splitlines()[-40:],
               scope=f"pytest {' '.join(extra)}" if extra else "whole suite", **junit_counts(xml))
    if isinstance(rc, str):  # killed at the timeout: no XML, so the counts are not a result
        res.update(incomplete=True, seen_failed=progress_failures(res["tail"]))
    say(f"pytest: {res['passed']} passed, {res['failed']} failed, {res['errors']} errors, {res['skipped']} skipped "
        f"in {res['seconds']:.0f} s")
    return res


def progress_failures(tail: list[str]) -> int:
    """F and E marks in pytest's -q progress lines (those ending in '[ NN%]', and a last partial one)."""
    marks = [ln for ln in tail if ln and set(ln.split(" [")[0]) <= set(".FEsxX")]
    return sum(ln.split(" [")[0].count("F") + ln.split(" [")[0].count("E") for ln in marks)


def junit_counts(xml: Path) -> dict:
    """passed / failed / errors / skipped in all and per test file, and the failures' names."""
    tot = dict(passed=0, failed=0, errors=0, skipped=0)
    per, failures = {}, []
    if not xml.exists():
        return dict(tot, per_file={}, failures=["no JUnit XML: pytest did not finish"])
    for case in ET.parse(xml).getroot().iter("testcase"):
        f = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"  # xunit2 has no file
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                if kind in ("failed", "errors"):
                    failures.append(
                        f"{case.get('classname')}::{case.get('name')}: "
                        f"{(child.get('message') or '').splitlines()[0][:200] if child.get('message') else ''}")
        tot[kind] += 1
        per.setdefault(f, dict(passed=0, failed=0, errors=0, skipped=0))[kind] += 1
    return dict(tot, per_file=per, failures=failures)


def lesson_lines(executed: Path) -> list[str]:
    """The text the notebook's `lesson` cells printed (its live check of the lesson), or their error."""
    try:
        cells = json.loads(executed.read_text())["cells"]
    except (OSError, ValueError):
        return []
    lines = []
    for c in cells:
        if "lesson" not in c.get("metadata", {}).get("tags", []):
            continue
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                lines += [l for l in "".join(o["text"]).splitlines() if l.strip()]
            elif o.get("output_type") == "error":
                lines.append(f"ERROR {o.get('ename')}: {str(o.get('evalue'))[:400]}")
    return lines


def run_notebooks(build: Path, only: list[str] | None) -> dict:
    from lora_moe_lab.nb import runner

    nbs = runner.notebooks(only)
    say(f"notebooks live with notebooks/params/gpu.yaml: {', '.join(p.stem for p in nbs)}")
    t0 = time.time()
    recs = runner.run_all(nbs, build, "gpu", keep_going=True)
    try:
        runner.html_report([build / p.name for p in nbs if (build / p.name).exists()], build)
    except Exception as e:  # noqa: BLE001 - the report is a convenience here; the check is the notebooks
        say(f"HTML report failed: {type(e).__name__}: {e}")
    for r in recs:
        r["within_1MB"] = 0 < r["bytes"] <= LIMIT_BYTES
        r["lesson"] = lesson_lines(build / f"{r['notebook']}.ipynb")
    return dict(seconds=round(time.time() - t0, 1), notebooks=recs,
                passed=sum(r["status"] == "passed" for r in recs), failed=sum(r["status"] != "passed" for r in recs),
                over_1MB=[r["notebook"] for r in recs if not r["within_1MB"]])


def write_log(out: Path, doc: dict) -> Path:
    m = doc["meta"]
    L = [f"GPU check at commit {m.get('commit') or '?'}{' (dirty tree)' if m.get('dirty') else ''}, {m.get('date')}",
         f"GPU {m.get('gpu')}, driver {m.get('driver') or '?'}, CUDA {m.get('cuda') or '?'}, torch {m.get('torch')}, "
         f"triton {m.get('triton')}, python {m.get('python')}", f"command: {doc['command']}", ""]
    t = doc.get("tests")
    if t:
        L += [f"== pytest ({t.get('scope', 'whole suite')}): {t['passed']} passed, {t['failed']} failed, "
              f"{t['errors']} errors, "
              f"{t['skipped']} skipped in {t['seconds']:.0f} s (exit {t['returncode']})"]
        L += [f"  {f}: " + ", ".join(f"{v} {k}" for k, v in c.items() if v) for f, c in sorted(t["per_file"].items())]
        L += ["  FAILED " + f for f in t["failures"]]
        if t.get("incomplete"):
            L += [f"  DID NOT FINISH ({t['returncode']}): the counts above are not a result; "
                  f"{t['seen_failed']} failure mark(s) in the progress lines, unnamed (no JUnit XML)"]
        L += ["", "-- pytest's last lines:"] + t["tail"] + [""]
    n = doc.get("notebooks")
    if n:
        L += [f"== notebooks live (notebooks/params/gpu.yaml): {n['passed']} passed, {n['failed']} failed in "
              f"{n['seconds']:.0f} s; over 1 MB: {', '.join(n['over_1MB']) or 'none'}"]
        for r in n["notebooks"]:
            L += [f"  {r['notebook']}: {r['status']}, {r['seconds']:.0f} s, executed {r['bytes'] / 1e3:.0f} kB"
                  f"{'' if r['within_1MB'] else ' (OVER 1 MB)'}" + (f"; {r['error']}" if r["error"] else "")]
            L += [f"    | {l}" for l in r["lesson"]]
    total = ((t["failed"] + t["errors"] + (max(1, t["seen_failed"]) if t.get("incomplete") else 0) if t else 0)
             + (n["failed"] + len(n["over_1MB"]) if n else 0))
    L += ["", f"== {'0 failed' if not total else f'{total} FAILED'}"
          + ("" if t and n
             else f" (this log holds only: {', '.join(k for k in ('tests', 'notebooks') if doc.get(k))})")]
    name = f"gpu_check_{(m.get('commit') or 'unknown')[:7]}"
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    log = out / f"{name}.log"
    log.write_text("\n".join(L) + "\n")
    return log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=["all", "tests", "notebooks"], default="all", help="what to run (default: all)")
    ap.add_argument("--out", default=str(ROOT / "data" / "gpu_tests"), help="folder of the log and its JSON "
                    "(default: data/gpu_tests)")
    ap.add_argument("--build", default=str(ROOT / "build" / "gpu_check"), help="executed notebooks, the HTML "
                    "report, pytest's XML (default: build/gpu_check)")
    ap.add_argument("--wheels", default=None, help="install the notebook packages from this folder of wheels first "
                    "(a machine without network), e.g. .whl")
    ap.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 01 04 (default: all)")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. '-x' (default: none)")
    ap.add_argument("--test-timeout", type=int, default=480, help="seconds for the whole pytest run (default: 480)")
    ap.add_argument("--merge", default=None, help="an earlier gpu_check_<commit>.json of the same commit whose other "
                    "part (tests or notebooks) this run's log keeps (default: the one in --out, if any)")
    ap.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to try the script; the log says cpu)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if a.wheels:
        install_wheels(a.wheels)
    miss = missing_modules()
    if miss:
        say(f"missing packages: {', '.join(miss)} (install them, or pass --wheels DIR); the parts that need them fail")
    import torch

    from lora_moe_lab.provenance import metadata

    if not torch.cuda.is_available() and not a.allow_cpu:
        say("no CUDA GPU here: this is the GPU check (pass --allow-cpu to try it anyway)")
        return 2
    out, build = Path(a.out), Path(a.build)
    out.mkdir(parents=True, exist_ok=True)
    build.mkdir(parents=True, exist_ok=True)
    meta = metadata()
    say(f"commit {meta.get('commit') or '? (set GIT_COMMIT)'}, {meta['gpu']}, driver {meta.get('driver') or '?'}, "
        f"torch {meta['torch']}, triton {meta['triton']}")
    prev = Path(a.merge) if a.merge else out / f"gpu_check_{(meta.get('commit') or 'unknown')[:7]}.json"
    doc = json.loads(prev.read_text()) if prev.exists() and a.what != "all" else {}
    if doc and doc.get("meta", {}).get("commit") != meta.get("commit"):
        say(f"{prev} is of commit {doc.get('meta', {}).get('commit')}, not this one: not merged")
        doc = {}
    doc.update(meta=meta, command=" ".join([Path(sys.executable).name] + sys.argv), missing=miss)
    if a.what in ("all", "tests"):
        doc["tests"] = run_tests(build, a.pytest_args.split(), a.test_timeout)
    if a.what in ("all", "notebooks"):
        doc["notebooks"] = run_notebooks(build / "notebooks", a.only)
    log = write_log(out, doc)
    say(f"log: {log}")
    print(log.read_text().splitlines()[-1])
    t, n = doc.get("tests") or {}, doc.get("notebooks") or {}
    return 1 if (t.get("failed") or t.get("errors") or t.get("incomplete") or n.get("failed")
                 or n.get("over_1MB")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
