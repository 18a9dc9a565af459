"""The GPU check anyone with a GPU can run: the whole pytest suite, then every notebook live with
notebooks/params/gpu.yaml, and a log with metadata in data/gpu_tests/ (data/gpu_tests/README.md).

    make gpu-check                                   # both parts, one log (the Makefile's target: this script,
                                                     # the venv's python, GPU_CHECK_ARGS passed on)
    python3 scripts/gpu_check.py --what tests        # only the pytest suite
    python3 scripts/gpu_check.py --what notebooks    # only the notebooks

The script puts its checkout on sys.path and PYTHONPATH itself: no PYTHONPATH=. needed. Writes
gpu_check_<commit>.log (readable) and gpu_check_<commit>.json (the same figures) in --out (<commit>: its
first 7 characters): commit, date, GPU, driver, torch/triton/CUDA versions; pytest's passed/failed/skipped
counts, in all and per test file, with every failure named; per notebook its status, seconds, executed size
(the 1 MB rule) and the lines its `lesson` cells printed. A tree copied without .git names its commit through
GIT_COMMIT (and GIT_DIRTY=0/1), as every recording does.

The recipe in use, where a device call is limited to 10 minutes and has no network: three calls (the logs
in data/gpu_tests/ were written so; each log's first lines give its command and its seconds):

    export GIT_COMMIT=<sha> GIT_DIRTY=0     # the same for every call (a tree without .git)
    python3 scripts/gpu_check.py --wheels .whl --out $OUT/gc --build /tmp/gc --what tests \\
        --pytest-args "-n 14 --dist load"
    python3 scripts/gpu_check.py --out $OUT/nb --build /tmp/gcn --what notebooks
    make gpu-probe                          # the probe: host lead, predicted gain, measured gain

--wheels installs the notebook packages from a folder of wheels (pass it to the notebooks call too on a
machine that did not run the first); --build keeps the executed notebooks, HTML report and pytest's XML out of
the tree. Each call writes its own log, renamed by its part in data/gpu_tests/ (gpu_check_<commit>_tests.log,
gpu_check_<commit>_notebooks.log); the probe's output is kept as gpu_probe_<commit>.log.

One log from several calls: give each call the JSON of the call before with --merge PREVIOUS_JSON (without
--merge, a --what tests/notebooks run merges into the JSON of its commit already in --out, if any). Each
`--what tests` run is one pytest part, keyed by its --pytest-args; the log keeps every part (its args,
counts, seconds, exit, whether it finished, where and when it ran), the total over the parts and the
notebooks. A part run again with the same args, or a part that runs every file an earlier one ran, replaces
that one. The log is rewritten after every notebook, so a call that ends midway keeps the notebooks that ran
(the rest are named NOT RUN YET and count as failed); --notebooks-tar brings the executed copies back in one
file.

--merge refuses (exit 2, naming both) a JSON of another commit, or of another dirty state: the parts
must have tested one tree. The parts cover the whole suite when together they run every test file
under tests/ (a part without file arguments does, e.g. "-n 14 --dist load"; so do `--ignore=tests/nb` and
`tests/nb` together); a part that selects tests inside files (-k, -m, --deselect, node ids, --lf ...) counts
for none of them. Otherwise the log says NOT THE WHOLE SUITE and names the files no part ran.
Exit status: 0 when nothing failed (and the pytest parts, if any, are the whole suite); 1 when a
test, a part (did not finish, or exited non-zero with no failure named) or a notebook failed; 2 with
no GPU, or a refused merge; 3 when nothing failed but the pytest parts are not the whole suite (yet).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB_PACKAGES = ["papermill", "ipykernel", "nbformat", "nbclient", "nbconvert", "ipywidgets", "plotly", "pandera"]
NEEDED = {"pytest": "pytest", "pytest_timeout": "pytest-timeout", "hypothesis": "hypothesis", "torch": "torch",
          "triton": "triton", "papermill": "papermill", "nbconvert": "nbconvert", "ipykernel": "ipykernel",
          "ipywidgets": "ipywidgets", "plotly": "plotly", "yaml": "pyyaml", "scipy": "scipy", "pandera": "pandera"}
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
    """pytest over the suite (a part of it with `extra`); counts from its JUnit XML, per test file and in all."""
    xml = build / "pytest.xml"
    xml.unlink(missing_ok=True)  # an earlier part's XML must not count for this one
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", f"--junitxml={xml}", *extra]
    say("pytest: " + " ".join(cmd[1:]))
    t0 = time.time()
    out, rc = run_pytest(cmd, timeout)
    res = dict(seconds=round(time.time() - t0, 1), returncode=rc, tail=out.strip().splitlines()[-40:],
               args=list(extra), scope=scope_of(extra), **junit_counts(xml))
    if isinstance(rc, str):  # stopped at the timeout: the XML, if any, holds only the tests that ran
        res.update(incomplete=True, seen_failed=progress_failures(res["tail"]))
    say(f"pytest: {res['passed']} passed, {res['failed']} failed, {res['errors']} errors, {res['skipped']} skipped "
        f"in {res['seconds']:.0f} s")
    return res


def run_pytest(cmd: list[str], timeout: int, grace: int = 60) -> tuple[str, int | str]:
    """(output, exit code or 'timeout after N s'). At the timeout pytest gets SIGINT, as from Ctrl-C: it stops in the
    running test, names the failures so far and writes the JUnit XML of the tests that ran; killed only if it has
    not stopped `grace` s later (so give a device call timeout + grace)."""
    # its own process group: the signals reach what pytest started too (a notebook's kernel holds the output pipe)
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, preexec_fn=_sigint_reaches_child)
    try:
        return p.communicate(timeout=timeout)[0], p.returncode
    except subprocess.TimeoutExpired:
        _signal_group(p, signal.SIGINT)
        try:
            out = p.communicate(timeout=grace)[0]
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            out = p.communicate()[0]
        return out or "", f"timeout after {timeout} s"


def _sigint_reaches_child():
    """In the child before exec: SIGINT unblocked and at its default. A blocked signal mask and an ignored disposition
    survive exec, so a caller with SIGINT blocked (seen in a pytest-xdist worker on a loaded 2-core machine: the child
    slept through the SIGINT to the end of its test) would hand pytest a SIGINT it never sees."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:  # it ended on its own in between
        pass


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
        if case.get("name") is None:  # the test an interrupt stopped: pytest writes it with no name and no result
            continue
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


def scope_of(args: list[str]) -> str:
    return f"pytest {' '.join(args)}" if args else "whole suite"


# pytest options that select tests inside files (a part with one runs none of its files for sure), and the
# options whose value may come as the next word (so that word is not a path)
SELECTING = {"-k", "-m", "--deselect", "--lf", "--last-failed", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip",
             "--co", "--collect-only", "--collectonly", "--ignore-glob", "--pyargs"}
TAKES_VALUE = {"-k", "-m", "-p", "-W", "-n", "-o", "-c", "-r", "--tb", "--timeout", "--maxfail", "--deselect",
               "--ignore", "--ignore-glob", "--rootdir", "--junitxml", "--junit-xml", "--durations", "--basetemp",
               "--confcutdir", "--import-mode", "--log-level", "--capture", "--color", "--override-ini",
               "--config-file", "--numprocesses", "--dist", "--hypothesis-profile", "--hypothesis-seed",
               "--hypothesis-verbosity", "--timeout-method"}


def suite_files(root: Path = ROOT) -> set[Path]:
    """The suite: every test file pytest collects under tests/ (pyproject's testpaths)."""
    return {f for f in (root / "tests").rglob("*.py") if (f.name.startswith("test_") or f.name.endswith("_test.py"))
            and not any(d.startswith(".") or d == "__pycache__" for d in f.relative_to(root).parts)}


def selection(args: list[str], root: Path = ROOT) -> tuple[set[Path], set[Path], list[str]]:
    """The test files a part's pytest args reach, those of them it runs entirely, and why not all (if so)."""
    paths, nodes, ignores, why = [], [], [], []
    words = iter(args)
    for w in words:
        if w.startswith("-"):
            opt, eq, val = w.partition("=") if w.startswith("--") else (w[:2], "", w[2:])
            if opt in SELECTING and opt not in why:
                why.append(opt)
            if opt in TAKES_VALUE and not eq and not val:
                val = next(words, "")
            if opt == "--ignore":
                ignores.append(Path(os.path.normpath(root / val)))
        elif "::" in w:
            nodes.append(Path(os.path.normpath(root / w.split("::")[0])))
            if "node ids" not in why:
                why.append("node ids")
        else:
            paths.append(Path(os.path.normpath(root / w)))
    if not paths and not nodes:
        paths = [root / "tests"]

    def under(f: Path, bases: list[Path]) -> bool:
        return any(f == b or b in f.parents for b in bases)

    files = {f for f in suite_files(root) if not under(f, ignores)}
    reached = {f for f in files if under(f, paths + nodes)}
    return reached, (set() if why else {f for f in files if under(f, paths)}), why


def test_parts(t: dict) -> list[dict]:
    """The pytest parts of a JSON's "tests" section (one written before there were parts is one part)."""
    if "parts" in t:
        return t["parts"]
    args = t.get("args")
    if args is None:  # older JSON: the args only in the scope
        sc = t.get("scope", "whole suite")
        args = shlex.split(sc[len("pytest "):]) if sc.startswith("pytest ") else []
    return [dict(t, args=args, scope=scope_of(args))]


def add_part(tests: dict | None, new: dict, root: Path = ROOT) -> dict:
    """`tests` with the pytest part `new` added: an earlier part with the same args, or whose every file
    `new` runs, is replaced (named in "replaced")."""
    parts = test_parts(tests) if tests else []
    done = selection(new["args"], root)[1]
    keep, gone = [], list((tests or {}).get("replaced", []))
    for p in parts:
        reached = selection(p["args"], root)[0]
        if p["args"] == new["args"] or (reached and reached <= done):
            gone.append(f"{p['scope']} (by {new['scope']})")
        else:
            keep.append(p)
    return combine(keep + [new], gone, root)


def part_failures(p: dict) -> int:
    """What a part counts as failed: its failures and errors; one that did not finish at least 1; one that
    exited non-zero with nothing failed (a usage error, no test collected, an interrupt) 1."""
    n = p["failed"] + p["errors"]
    if p.get("incomplete"):
        return n + max(1, p.get("seen_failed", 0))
    return n + (1 if p.get("returncode") not in (0, None) and not n else 0)


def combine(parts: list[dict], replaced: list[str] | None = None, root: Path = ROOT) -> dict:
    """The "tests" section: the parts, their total, and whether together they are the whole suite."""
    suite = suite_files(root)
    runs, partial = [], []
    for p in parts:
        reached, done, why = selection(p["args"], root)
        runs.append(done)
        if why:
            partial.append(f"{p['scope']} ({', '.join(why)})")
    done_all = set().union(*runs)
    missing = sorted(f.relative_to(root).as_posix() for f in suite - done_all)
    twice = sorted(f.relative_to(root).as_posix() for f in done_all if sum(f in r for r in runs) > 1)
    per: dict = {}
    for p in parts:
        for f, c in p.get("per_file", {}).items():
            for k, v in c.items():
                per.setdefault(f, dict(passed=0, failed=0, errors=0, skipped=0))[k] += v
    tot = {k: sum(p[k] for p in parts) for k in ("passed", "failed", "errors", "skipped")}
    return dict(tot, seconds=round(sum(p["seconds"] for p in parts), 1), scope=" + ".join(p["scope"] for p in parts),
                returncodes=[p["returncode"] for p in parts], incomplete=any(p.get("incomplete") for p in parts),
                seen_failed=sum(p.get("seen_failed", 0) for p in parts), per_file=per,
                failures=[f for p in parts for f in p["failures"]], parts=parts, replaced=list(replaced or []),
                coverage=dict(whole_suite=bool(suite) and not missing, files=len(suite), missing=missing,
                              partial=partial, in_two_parts=twice))


def short_list(files: list[str], root: Path = ROOT, most: int = 12) -> str:
    """Missing test files; a folder all of whose test files are missing is named once ("tests/nb/")."""
    suite = [f.relative_to(root).as_posix() for f in suite_files(root)]
    gone, names = set(files), []
    for f in sorted(files):
        name, parts = f, f.split("/")
        for i in range(2, len(parts)):  # tests/X/, tests/X/Y/, ...: the highest one missing entirely
            d = "/".join(parts[:i]) + "/"
            if all(s in gone for s in suite if s.startswith(d)):
                name = d
                break
        if name not in names:
            names.append(name)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def tally(doc: dict) -> tuple[int, bool | None]:
    """What failed in all, and whether the pytest parts are the whole suite (None: no tests in this log)."""
    t, n = doc.get("tests"), doc.get("notebooks")
    bad = sum(part_failures(p) for p in test_parts(t)) if t else 0
    bad += n["failed"] + len(n["over_1MB"]) if n else 0
    return bad, (t["coverage"]["whole_suite"] if t else None)


class MergeRefused(Exception):
    pass


def check_same_tree(prev: dict, meta: dict, where: str) -> None:
    """The parts of one log must have tested one tree: the same commit, dirty state and dirty files."""
    pm = prev.get("meta", {})
    a, b = pm.get("commit") or "", meta.get("commit") or ""
    same = bool(a and b) and (a.startswith(b) or b.startswith(a)) and min(len(a), len(b)) >= 7
    if not same or pm.get("dirty") != meta.get("dirty") or pm.get("dirty_files") != meta.get("dirty_files"):
        raise MergeRefused(
            f"refusing to merge: {where} is of commit {a or '? (none recorded)'} (dirty {pm.get('dirty')}"
            f"{', files ' + ' '.join(pm['dirty_files']) if pm.get('dirty_files') else ''}), this run is of commit "
            f"{b or '? (set GIT_COMMIT)'} (dirty {meta.get('dirty')}"
            f"{', files ' + ' '.join(meta['dirty_files']) if meta.get('dirty_files') else ''}): the parts of one log "
            "must test one tree (give every call the same GIT_COMMIT and GIT_DIRTY, or start afresh without --merge)")


def ran(meta: dict, command: str) -> dict:
    """Where and when a part ran, for its line in the log."""
    return dict({k: meta.get(k) for k in ("commit", "dirty", "date", "gpu", "driver")}, command=command)


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


def notebook_summary(recs: list[dict], build: Path, t0: float, pending: list[str]) -> dict:
    """The notebooks' part of the log: per notebook its record, the 1 MB rule and its lesson lines; `pending`:
    the notebooks not run yet (a log written midway, or a run cut short), counted as failed."""
    for r in recs:
        r["within_1MB"] = 0 < r["bytes"] <= LIMIT_BYTES
        r["lesson"] = lesson_lines(build / f"{r['notebook']}.ipynb")
    return dict(seconds=round(time.time() - t0, 1), notebooks=recs, pending=pending,
                passed=sum(r["status"] == "passed" for r in recs),
                failed=sum(r["status"] != "passed" for r in recs) + len(pending),
                over_1MB=[r["notebook"] for r in recs if not r["within_1MB"]])


def run_notebooks(build: Path, only: list[str] | None, after=None) -> dict:
    """Every notebook live with the GPU parameters; after(summary) runs after each one with the notebooks
    still to run as `pending` (main writes the log there, so a device call cut short keeps what ran)."""
    from lora_moe_lab.nb import runner

    nbs = runner.notebooks(only)
    say(f"notebooks live with notebooks/params/gpu.yaml: {', '.join(p.stem for p in nbs)}")
    t0 = time.time()
    names = [p.stem for p in nbs]
    each = None if after is None else (lambda recs: after(notebook_summary(recs, build, t0, names[len(recs):])))
    recs = runner.run_all(nbs, build, "gpu", keep_going=True, on_each=each)
    try:
        runner.html_report([build / p.name for p in nbs if (build / p.name).exists()], build)
    except Exception as e:  # noqa: BLE001 - the report is a convenience here; the check is the notebooks
        say(f"HTML report failed: {type(e).__name__}: {e}")
    return notebook_summary(recs, build, t0, [])


def part_lines(t: dict, label: str = "") -> list[str]:
    """A pytest part in the log: its counts, per test file, its failures, and pytest's last lines."""
    L = [f"== pytest{label} ({t.get('scope', 'whole suite')}): {t['passed']} passed, {t['failed']} failed, "
         f"{t['errors']} errors, {t['skipped']} skipped in {t['seconds']:.0f} s (exit {t['returncode']})"]
    r = t.get("ran")
    if label and r:
        L += [f"  ran {r.get('date')} on {r.get('gpu')}, driver {r.get('driver') or '?'}: {r.get('command')}"]
    L += [f"  {f}: " + ", ".join(f"{v} {k}" for k, v in c.items() if v) for f, c in sorted(t["per_file"].items())]
    L += ["  FAILED " + f for f in t["failures"]]
    if t.get("incomplete"):
        named = "no JUnit XML: pytest did not finish" not in t["failures"]
        L += [f"  DID NOT FINISH ({t['returncode']}): " + (
            "stopped by SIGINT, the counts above are those of the tests that ran before it, failures named"
            if named else f"the counts above are not a result; {t['seen_failed']} failure mark(s) in the "
            "progress lines, unnamed (no JUnit XML)")]
    elif part_failures(t) > t["failed"] + t["errors"]:
        L += [f"  EXIT {t['returncode']} with no failure named (usage error, no test collected, interrupted?): "
              "counted as 1 failure"]
    return L + ["", "-- pytest's last lines:"] + t["tail"] + [""]


def log_stem(m: dict) -> str:
    """gpu_check_<commit>_<GPU>[_cap<GiB>GiB]: every log names the card it ran on, and the memory cap that stood in
    for a smaller card (LORA_MOE_LAB_GPU_GIB) when there was one."""
    gpu = str(m.get("gpu") or "unknown").replace("NVIDIA ", "").replace(" ", "_")
    cap = m.get("gpu_cap_gib")
    return f"gpu_check_{(m.get('commit') or 'unknown')[:7]}_{gpu}" + (f"_cap{cap:g}GiB" if cap else "")


def memory_line(m: dict) -> str:
    cap = m.get("gpu_cap_gib")
    return f"capped at {cap:g} GiB (LORA_MOE_LAB_GPU_GIB), a smaller card's stand-in" if cap else "the whole card"


def write_log(out: Path, doc: dict) -> Path:
    m = doc["meta"]
    L = [f"GPU check at commit {m.get('commit') or '?'}{' (dirty tree)' if m.get('dirty') else ''}, {m.get('date')}",
         f"GPU {m.get('gpu')}, driver {m.get('driver') or '?'}, CUDA {m.get('cuda') or '?'}, torch {m.get('torch')}, "
         f"triton {m.get('triton')}, python {m.get('python')}",
         f"memory: {memory_line(m)}; allocator: {m.get('allocator', '?')}", f"command: {doc['command']}", ""]
    t = doc.get("tests")
    if t:
        t = doc["tests"] = combine(test_parts(t), t.get("replaced"))
        parts, c = t["parts"], t["coverage"]
        for k, p in enumerate(parts, 1):
            L += part_lines(p, f" part {k} of {len(parts)}" if len(parts) > 1 else "")
        if len(parts) > 1:
            L += [f"== pytest, total over the {len(parts)} parts ({t['scope']}): {t['passed']} passed, "
                  f"{t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped in {t['seconds']:.0f} s"
                  + (f"; {sum(map(part_failures, parts))} counted as failed" if sum(map(part_failures, parts))
                     > t["failed"] + t["errors"] else "")]
        L += ["  replaced by a later part: " + r for r in t["replaced"]]
        if not c["whole_suite"]:
            L += [f"  NOT THE WHOLE SUITE: {len(c['missing'])} of the {c['files']} test files were run by no part: "
                  f"{short_list(c['missing'])}"]
        elif len(parts) > 1:
            L += [f"  the parts together are the whole suite ({c['files']} test files)"]
        L += [f"  only some tests of its files (counts for none of them): {s}" for s in c["partial"]]
        if c["in_two_parts"]:
            L += [f"  run by more than one part (counted once per part): {short_list(c['in_two_parts'])}"]
        L += [""] if len(parts) > 1 or not c["whole_suite"] else []
    n = doc.get("notebooks")
    if n:
        L += [f"== notebooks live (notebooks/params/gpu.yaml): {n['passed']} passed, {n['failed']} failed in "
              f"{n['seconds']:.0f} s; over 1 MB: {', '.join(n['over_1MB']) or 'none'}"]
        r = n.get("ran")
        if r and t:
            L += [f"  ran {r.get('date')} on {r.get('gpu')}, driver {r.get('driver') or '?'}: {r.get('command')}"]
        for r in n["notebooks"]:
            L += [f"  {r['notebook']}: {r['status']}, {r['seconds']:.0f} s, executed {r['bytes'] / 1e3:.0f} kB"
                  f"{'' if r['within_1MB'] else ' (OVER 1 MB)'}" + (f"; {r['error']}" if r["error"] else "")]
            L += [f"    | {l}" for l in r["lesson"]]
        if n.get("pending"):
            L += [f"  NOT RUN YET (counted as failed; a log written before they ran): {', '.join(n['pending'])}"]
    bad, whole = tally(doc)
    held = [k for k in ("tests", "notebooks") if doc.get(k)]
    L += ["", f"== {'0 failed' if not bad else f'{bad} FAILED'}"
          + ("" if whole is not False else f", and NOT THE WHOLE SUITE: the pytest parts ({t['scope']}) leave out "
             f"{short_list(t['coverage']['missing'])}")
          + ("" if len(held) == 2 else f" (this log holds only: {', '.join(held)})")]
    name = log_stem(m)
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
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments as one string, e.g. "
                    "\"-n 14 --dist load\" (the whole suite over 14 workers), tests/nb or -x: one pytest part, keyed "
                    "by them (default: none, the whole suite in one process)")
    ap.add_argument("--test-timeout", type=int, default=480,
                    help="seconds for the whole pytest run (default: 480); then SIGINT, and a kill 60 s later if "
                         "pytest has not stopped")
    ap.add_argument("--merge", default=None, metavar="PREVIOUS_JSON", help="the gpu_check_<commit>.json of an "
                    "earlier call at the same commit (and dirty state; else refused, exit 2): this run's log keeps "
                    "its pytest parts and notebooks, and adds or replaces its own (default, except with --what all: "
                    "the one in --out, if any)")
    ap.add_argument("--notebooks-tar", action="store_true", help="also write the executed notebooks as one "
                    "gpu_check_<commit>_notebooks.tar.gz in --out (a device call returns few files; default: off)")
    ap.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to try the script; the log says cpu)")
    argv = list(sys.argv[1:] if argv is None else argv)
    words = []  # "--pytest-args -x" as "--pytest-args=-x": argparse takes a value that starts with '-' for an option
    for w in argv:
        words[-1:] = [f"--pytest-args={w}"] if words[-1:] == ["--pytest-args"] else words[-1:] + [w]
    a = ap.parse_args(words)
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
    from lora_moe_lab import runtime
    meta = dict(metadata(), gpu_cap_gib=runtime.gpu_memory_cap_gib(), allocator=runtime.allocator_settings())
    say(f"commit {meta.get('commit') or '? (set GIT_COMMIT)'}, {meta['gpu']}, driver {meta.get('driver') or '?'}, "
        f"torch {meta['torch']}, triton {meta['triton']}")
    prev = Path(a.merge) if a.merge else out / f"{log_stem(meta)}.json"
    if a.merge and not prev.is_file():
        say(f"ERROR: --merge {prev}: no such file")
        return 2
    doc = json.loads(prev.read_text()) if prev.is_file() and (a.merge or a.what != "all") else {}
    try:
        if doc:
            check_same_tree(doc, meta, str(prev))
    except MergeRefused as e:
        say(f"ERROR: {e}")
        return 2
    if doc:
        had = [f"pytest part ({p['scope']})" for p in test_parts(doc["tests"])] if doc.get("tests") else []
        say(f"merging into {prev}: {', '.join(had + (['notebooks'] if doc.get('notebooks') else []))}")
    command = " ".join([Path(sys.executable).name, "scripts/gpu_check.py", shlex.join(argv)])
    doc.update(meta=meta, command=command, missing=miss)
    if a.what in ("all", "tests"):
        part = dict(run_tests(build, shlex.split(a.pytest_args), a.test_timeout), ran=ran(meta, command))
        doc["tests"] = add_part(doc.get("tests"), part)
    if a.what in ("all", "notebooks"):
        def partial(summary):  # the log after every notebook: a call cut short keeps what ran
            doc["notebooks"] = dict(summary, ran=ran(meta, command))
            write_log(out, doc)

        doc["notebooks"] = dict(run_notebooks(build / "notebooks", a.only, after=partial), ran=ran(meta, command))
        if a.notebooks_tar:
            tar = out / f"{log_stem(meta)}_notebooks.tar.gz"
            with tarfile.open(tar, "w:gz") as tf:
                for r in doc["notebooks"]["notebooks"]:
                    f = build / "notebooks" / f"{r['notebook']}.ipynb"
                    if f.exists():
                        tf.add(f, arcname=f.name)
            say(f"executed notebooks: {tar}")
    log = write_log(out, doc)
    say(f"log: {log}")
    print(log.read_text().splitlines()[-1])
    bad, whole = tally(doc)
    return 1 if bad else 3 if whole is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
