"""Mutation testing of the lesson's core with mutmut (`make mutate`): each module's functions mutated one change at
a time (an operator, a constant, a condition), the module's tests run against each mutant; a mutant the tests do not
fail on survives. The score per module goes to data/mutation/<module>.json with the command, the commit, mutmut's
version and every survivor by name (`mutmut show <name>` in build/mutate/<module>/ prints its diff).

    python scripts/mutate.py                  # every module below
    python scripts/mutate.py guards           # one
    python scripts/mutate.py --list           # the modules, their tests and mutant filters

mutmut 3 works on a copy (mutants/ beside a setup.cfg): each module runs in its own scratch folder,
build/mutate/<module>/, holding a copy of the package and the tests. Not part of CI (minutes per module).
A timed-out mutant (mutmut's CPU limit: 15 x the tests' own time + timeout_constant) counts as killed in the
score, as mutmut counts it, and is listed apart.
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

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "mutation"

# module -> (file mutated, mutant-name filter (fnmatch, None: every function of the file), the tests that cover it)
MODULES = {
    "guards": ("lora_moe_lab/model/guards.py", None,
               ["tests/model/test_launch_decisions.py", "tests/model/test_guards.py"]),
    "lora_batch": ("lora_moe_lab/model/lora.py", "lora_moe_lab.model.lora.x\u01c1LoRABatchInfo\u01c1build__mutmut_*",
                   ["tests/model/test_launch_decisions.py", "tests/model/test_identity_and_params.py",
                    "tests/model/test_lora.py"]),
}
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
             # torch is not fork-safe once its thread pools run: workers fork from a server that imported nothing
             "process_isolation=forkserver", "forkserver_warmup=none",
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


def run(name: str) -> dict:
    path, pattern, tests = MODULES[name]
    commit = _commit()  # the code copied now is what is mutated, whatever the checkout does meanwhile
    work = _setup(name)
    cmd = ["run"] + ([pattern] if pattern else [])
    r = _mutmut(work, *cmd)
    meta = work / "mutants" / (path + ".meta")
    if not meta.is_file():
        raise SystemExit(f"mutmut wrote no results for {path}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    if pattern:
        import fnmatch

        codes = {k: v for k, v in codes.items() if fnmatch.fnmatch(k, pattern)}
    status = {k: ("not run" if v is None else STATUS.get(v, f"suspicious (exit {v})")) for k, v in codes.items()}
    n = Counter(status.values())
    killed = n["killed"] + n["timeout"]
    scored = killed + n["survived"]
    rec = dict(module=name, file=path, mutants=pattern or "every function of the file", tests=tests,
               command=f"python scripts/mutate.py {name}  (mutmut {' '.join(cmd)} in build/mutate/{name})",
               commit=commit, mutmut=_version(), date=datetime.date.today().isoformat(),
               counts=dict(sorted(n.items())), killed=killed, survived=n["survived"],
               score_pct=round(100 * killed / scored, 1) if scored else None,
               survivors=sorted(k for k, s in status.items() if s == "survived"),
               timeouts=sorted(k for k, s in status.items() if s == "timeout"),
               not_covered=sorted(k for k, s in status.items() if s == "no tests"))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help=f"of {', '.join(MODULES)} (default: every one)")
    p.add_argument("--list", action="store_true", help="list the modules and exit")
    a = p.parse_args(argv)
    bad = [m for m in a.modules if m not in MODULES]
    if bad:
        p.error(f"unknown module(s) {bad}: choose from {', '.join(MODULES)}")
    if a.list:
        for k, (path, pattern, tests) in MODULES.items():
            print(f"{k}: {path} [{pattern or 'every function'}] <- {', '.join(tests)}")
        return 0
    try:
        _version()
    except Exception:
        print("mutmut is not installed: pip install mutmut", file=sys.stderr)
        return 2
    for name in a.modules or list(MODULES):
        rec = run(name)
        print(f"{name}: {rec['score_pct']} % killed ({rec['killed']} killed, {rec['survived']} survived; "
              f"{rec['counts']}) -> data/mutation/{name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
