"""Mutation testing of the lesson's core with mutmut (`make mutate`): each module's functions mutated one change at
a time (an operator, a constant, a condition), the module's tests run against each mutant; a mutant the tests do not
fail on survives. The score per module goes to data/mutation/<module>.json with the command, the commit, mutmut's
version and every survivor by name (`mutmut show <name>` in build/mutate/<module>/ prints its diff).

    python scripts/mutate.py                  # every module below
    python scripts/mutate.py guards           # one
    python scripts/mutate.py --list           # the modules, their tests and mutant filters
    python scripts/mutate.py --again guards   # after a test change: re-run the last run's survivors only

mutmut 3 works on a copy (mutants/ beside a setup.cfg): each module runs in its own scratch folder,
build/mutate/<module>/, holding a copy of the package and the tests, with one worker (`--max-children 1`; run it
under `nice -n 10` on a shared machine). Not part of CI (minutes per module).

The score: killed / (killed + survived - equivalent). A timed-out mutant (mutmut's CPU limit: 15 x the tests' own
time + timeout_constant) counts as killed, as mutmut counts it, and is listed apart. A survivor that no test can
tell from the original (an equivalent mutant: the same behaviour by another route, or a change only mutmut's own
call path hides) is listed with its reason in data/mutation/equivalent.json ({module: {mutant: reason}}), copied
into the module's JSON and left out of the denominator; an entry that is no longer a survivor is reported stale.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from lora_moe_lab.instruments.analysers.schemas import read_json  # data/ is read through the checked reader

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "data" / "mutation"

# module -> (file mutated, mutant-name filters (fnmatch; none: every function of the file), the tests that cover it)
_P = "lora_moe_lab.kernels.plan.x_"
_R = "lora_moe_lab.kernels.paths."
_W = "lora_moe_lab.instruments.recorders.audit_watch.x_"
_S = "lora_moe_lab.instruments.analysers.schemas.x_"
MODULES = {
    "guards": ("lora_moe_lab/model/guards.py", [],
               ["tests/model/test_launch_decisions.py", "tests/model/test_guards.py"]),
    "lora_batch": ("lora_moe_lab/model/lora.py", ["lora_moe_lab.model.lora.x\u01c1LoRABatchInfo\u01c1build__mutmut_*"],
                   ["tests/model/test_launch_decisions.py", "tests/model/test_identity_and_params.py",
                    "tests/model/test_lora.py"]),
    # the host-side launch decisions of the LoRA paths: which path, blocks, columns and window, from static shapes
    # (the plan asks the entry's path; each path's rule lives in its module, kernels/paths/)
    "plan": ("lora_moe_lab/kernels/plan.py", [_P + f + "__mutmut_*" for f in ("torch_block_m", "plan")],
             ["tests/kernels/test_plan_decisions.py"]),
    "plan_separate": ("lora_moe_lab/kernels/paths/separate.py",
                      [_R + "separate.x\u01c1SeparatePath\u01c1rule__mutmut_*"],
                      ["tests/kernels/test_plan_decisions.py"]),
    "plan_packed": ("lora_moe_lab/kernels/paths/packed.py", [_R + "packed.x\u01c1PackedPath\u01c1rule__mutmut_*"],
                    ["tests/kernels/test_plan_decisions.py"]),
    "plan_wide": ("lora_moe_lab/kernels/paths/wide.py",
                  [_R + "wide.x_" + f + "__mutmut_*" for f in ("wide_columns", "_window")]
                  + [_R + "wide.x\u01c1WidePath\u01c1rule__mutmut_*"], ["tests/kernels/test_plan_decisions.py"]),
    # the audit's rules: which call would sync on a GPU, with which kind and count (audit_watch's rule table)
    "audit_rules": ("lora_moe_lab/instruments/recorders/audit_watch.py",
                    [_W + f + "__mutmut_*" for f in ("_is_mask", "classify_aten", "_classify_copy_aten", "_tensors",
                                                     "_bool_index", "_list_index", "classify", "_classify_copy")],
                    ["tests/instruments/recorders/test_audit_rules.py",
                     "tests/instruments/recorders/test_audit_classify.py"]),
    # the schema checks: the order of the refusals, the unique key, the seal (_first_failure's wording of a failed
    # check is left to the damage corpora: 154 mutants at 20 s and more each)
    "schemas": ("lora_moe_lab/instruments/analysers/schemas.py",
                [_S + f + "__mutmut_*" for f in ("_at_most", "_unique_failure", "validate", "_key_for", "_rows",
                                                 "_seal_keys", "seal_of", "check_seal")],
                # (test_schema_bounds.py and the damage corpora cover these too, at 20 s and more per mutant)
                ["tests/instruments/analysers/test_schema_checks.py"]),
}
EQUIVALENT = OUT / "equivalent.json"
# mutmut 3.8's exit-code classes (mutmut/stats.py: status_by_exit_code; importing it needs mutmut's config in the cwd)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 35: "suspicious",
          36: "timeout", 37: "caught by type check", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          -11: "segfault", -9: "segfault", 2: "interrupted"}


def _setup(name: str) -> Path:
    path, _, tests = MODULES[name]
    work = ROOT / "build" / "mutate" / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("lora_moe_lab", "tests"):
        shutil.copytree(ROOT / d, work / d, ignore=ignore)
    for f in ("conftest.py", "pyproject.toml"):
        shutil.copy2(ROOT / f, work / f)
    lines = ["[mutmut]", "source_paths=", "    lora_moe_lab/", "only_mutate=", f"    {path}",
             # torch is not fork-safe once its thread pools run: workers fork from a server that has collected the
             # tests (imports, no test run; one thread per pool, OMP_NUM_THREADS=1), not from mutmut's own process
             # (it ran the tests for its stats). A hung worker would read as a timeout: the timeouts are listed.
             "process_isolation=forkserver", "forkserver_warmup=collect",
             "timeout_constant=30", "pytest_add_cli_args_test_selection="] + [f"    {t}" for t in tests]
    lines += ["pytest_add_cli_args=", "    -p", "    no:xdist", "    -p", "    no:cacheprovider", ""]
    (work / "setup.cfg").write_text("\n".join(lines))
    return work


def _mutmut(work: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("mutmut")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's package, not the checkout's
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # one thread per worker: no pool to deadlock after a fork
    return subprocess.run([str(exe), *args], cwd=work, env=env, capture_output=True, text=True)


def _version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "lora_moe_lab", "tests"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("+uncommitted" if dirty else "")


def _equivalent(name: str) -> dict:
    if not EQUIVALENT.is_file():
        return {}
    return read_json(EQUIVALENT).get(name, {})


def _statuses(work: Path, path: str, patterns, r) -> dict:
    meta = work / "mutants" / (path + ".meta")
    if not meta.is_file():
        raise SystemExit(f"mutmut wrote no results for {path}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    if patterns:
        import fnmatch

        codes = {k: v for k, v in codes.items() if any(fnmatch.fnmatch(k, p) for p in patterns)}
    status = {k: ("not run" if v is None else STATUS.get(v, f"suspicious (exit {v})")) for k, v in codes.items()}
    if status and set(status.values()) == {"not run"}:
        raise SystemExit(f"mutmut ran no mutant of {path} (its clean test run failed?):\n{r.stdout[-3000:]}")
    return status


def run(name: str, again: bool = False) -> dict:
    """Every mutant of the module; `again`: only the last run's survivors, equivalents and uncovered mutants, against
    the tests as they are now (the code mutated unchanged: a mutant killed before stays killed), merged into it."""
    path, patterns, tests = MODULES[name]
    commit = _commit()  # the code copied now is what is mutated, whatever the checkout does meanwhile
    prev = read_json(OUT / f"{name}.json") if again else None
    if again:
        redo = sorted(set(prev["survivors"]) | set(prev["equivalent"]) | set(prev["not_covered"]))
        if not redo:
            return prev
        before = {k: "survived" for k in list(prev["survivors"]) + list(prev["equivalent"])}
        before.update({k: "no tests" for k in prev["not_covered"]})
        patterns_run = redo
    else:
        patterns_run = list(patterns)
    work = _setup(name)
    cmd = ["run", "--max-children", "1"] + patterns_run
    r = _mutmut(work, *cmd)
    status = _statuses(work, path, patterns_run if again else patterns, r)
    n = Counter(status.values())
    timeouts = sorted(k for k, s in status.items() if s == "timeout")
    if again:
        n = Counter(prev["counts"]) - Counter(before.values()) + n
        timeouts = sorted(set(prev["timeouts"]) | set(timeouts))
    killed = n["killed"] + n["timeout"]
    survivors = sorted(k for k, s in status.items() if s == "survived")
    listed = _equivalent(name)
    equivalent = {k: listed[k] for k in survivors if k in listed}
    scored = killed + n["survived"] - len(equivalent)
    rec = dict(module=name, file=path, mutants=patterns or "every function of the file", tests=tests,
               command=f"nice -n 10 python scripts/mutate.py {name}  (mutmut {' '.join(cmd[:3])} "
                       f"{'<the filters above>' if patterns else ''} in build/mutate/{name})",
               commit=prev["commit"] if again else commit, mutmut=_version(), date=datetime.date.today().isoformat(),
               score_rule="killed / (killed + survived - equivalent); a timeout counts as killed",
               counts=dict(sorted(n.items())), killed=killed, survived=n["survived"], equivalent_n=len(equivalent),
               score_pct=round(100 * killed / scored, 1) if scored else None,
               survivors=[k for k in survivors if k not in equivalent],
               equivalent=equivalent,
               stale_equivalent=sorted(k for k in listed if k not in equivalent),
               timeouts=timeouts,
               not_covered=sorted(k for k, s in status.items() if s == "no tests"))
    if again:
        rec["rerun"] = dict(commit=commit, mutants=len(redo), command=f"nice -n 10 python scripts/mutate.py --again "
                            f"{name}  (mutmut run --max-children 1 <the last run's survivors, equivalents and "
                            "uncovered mutants>)", why="the tests changed after the full run, the code did not")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: every one)")
    p.add_argument("--list", action="store_true", help="list the modules and exit")
    p.add_argument("--again", action="store_true",
                   help="re-run only the last run's survivors, equivalents and uncovered mutants (tests changed)")
    a = p.parse_args(argv)
    bad = [m for m in a.modules if m not in MODULES]
    if bad:
        p.error(f"unknown module(s) {bad}: choose from {', '.join(MODULES)}")
    if a.list:
        for k, (path, patterns, tests) in MODULES.items():
            print(f"{k}: {path} [{', '.join(patterns) or 'every function'}] <- {', '.join(tests)}")
        return 0
    try:
        _version()
    except Exception:
        print("mutmut is not installed: pip install mutmut", file=sys.stderr)
        return 2
    for name in a.modules or list(MODULES):
        rec = run(name, a.again)
        print(f"{name}: {rec['score_pct']} % killed ({rec['killed']} killed, {rec['survived']} survived, "
              f"{rec['equivalent_n']} of them equivalent; "
              f"{rec['counts']}) -> data/mutation/{name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
