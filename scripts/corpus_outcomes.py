"""Classify every case of the bad-input corpus by its outcome, from what each case actually caught.

    python scripts/corpus_outcomes.py   # run the corpus files, print the table, write it into docs/recordings.md

Each corpus test runs under a small pytest plugin that records, per case, every exception a `pytest.raises` block
caught (its type and message) and every argparse refusal (`parser.error`'s message). A case is then:
  * `named, with where`: every error it caught names a file (a path), a row, line, header or meta, or a parameter
    (`--flag`, `name=`, `name must`, a quoted name, or the words "parameter"/"argument");
  * `named, no where`: an error was caught whose message names none of these;
  * `handled`: it caught no error (the case checks a correct result, a refusal by exit code in a child process, a
    repaired file).
A case that fails is counted as failing (a silent result or a crash would fail its test). The rules are textual:
they read messages, they do not judge them; the per-case list (`--list`) shows what each case caught.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/instruments/analysers/test_recording_corpus.py", "tests/model/test_identity_and_params.py",
         "tests/nb/test_bad_parameters.py", "tests/instruments/recorders/test_write_faults.py",
         "tests/nb/test_launcher.py", "tests/test_record_cli_faults.py",
         "tests/instruments/recorders/test_study_writes.py", "tests/model/test_lora_bad_input.py",
         "tests/instruments/analysers/test_read_path_corpus.py"]
WHERE = re.compile(r"(/|\\|\.(csv|json|ipynb|py|log|gz|yaml|txt)\b|\brow\b|\brows?\s+\d|\bline\s+\d|"
                   r"\bheader\b|\bmeta\b|"
                   r"--[a-z][a-z-]+|\b[a-z_][a-z0-9_]*\s*=|\b[a-z_][a-z0-9_]*\s+must\b|['\"`][\w.-]+['\"`]|"
                   r"\bparameter\b|\bargument\b)", re.I)
MARK_BEGIN, MARK_END = "<!-- begin:corpus-outcomes -->", "<!-- end:corpus-outcomes -->"

PLUGIN = '''
import argparse, json, os
import pytest
from _pytest import raises as _r

_LOG = os.environ["CORPUS_OUTCOMES_LOG"]
_cur = {"id": None, "caught": []}
_exit = _r.RaisesExc.__exit__

def _patched(self, exc_type, exc_val, tb):
    ok = _exit(self, exc_type, exc_val, tb)
    if ok and exc_val is not None and _cur["id"] is not None:
        msg = str(exc_val) if not isinstance(exc_val, SystemExit) else ""
        _cur["caught"].append([type(exc_val).__name__, msg[:500]])
    return ok

_r.RaisesExc.__exit__ = _patched
_error = argparse.ArgumentParser.error

def _perror(self, message):
    if _cur["id"] is not None:
        _cur["caught"].append(["argparse", message[:500]])
    return _error(self, message)

argparse.ArgumentParser.error = _perror

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _cur["id"], _cur["caught"] = item.nodeid, []
    yield

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    if rep.when == "call":
        with open(_LOG, "a") as f:
            f.write(json.dumps({"id": item.nodeid, "outcome": rep.outcome, "caught": _cur["caught"]}) + "\\n")
        _cur["id"] = None
'''


def classify(case: dict) -> str:
    if case["outcome"] != "passed":
        return case["outcome"]
    errs = [m for t, m in case["caught"] if not (t == "SystemExit" and not m)]
    exits = [1 for t, m in case["caught"] if t == "SystemExit" and not m]
    if not errs:
        return "handled" if not exits else "named, no where"
    return "named, with where" if all(WHERE.search(m) for m in errs) else "named, no where"


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "corpus_outcomes_plugin.py").write_text(PLUGIN)
        log = Path(d) / "log.jsonl"
        env = {**__import__("os").environ, "CORPUS_OUTCOMES_LOG": str(log),
               "PYTHONPATH": f"{d}:{ROOT}"}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "corpus_outcomes_plugin", "-p", "no:cacheprovider",
                        "-p", "no:xdist", *[f for f in FILES if (ROOT / f).exists()]], cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL)
        return [json.loads(l) for l in log.read_text().splitlines()]


def table(cases: list[dict]) -> str:
    kinds = ["named, with where", "named, no where", "handled", "failed", "skipped"]
    by = {}
    for c in cases:
        f = c["id"].split("::")[0]
        by.setdefault(f, {k: 0 for k in kinds})[classify(c)] += 1
    tot = {k: sum(v[k] for v in by.values()) for k in kinds}
    lines = ["| file | cases | " + " | ".join(kinds) + " |", "| --- " * (len(kinds) + 2) + "|"]
    for f, v in sorted(by.items()):
        lines.append(f"| `{f}` | {sum(v.values())} | " + " | ".join(str(v[k]) for k in kinds) + " |")
    lines.append(f"| all | {sum(tot.values())} | " + " | ".join(str(tot[k]) for k in kinds) + " |")
    named = tot["named, with where"] + tot["named, no where"]
    share = 100 * tot["named, with where"] / named if named else float("nan")
    return "\n".join(lines) + (f"\n\nOf the {named} cases that end in an error, {tot['named, with where']} "
                               f"({share:.1f} %) name the file, row or parameter.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print every case with its class and what it caught")
    a = ap.parse_args(argv)
    cases = run()
    if a.list:
        for c in cases:
            print(classify(c), c["id"], c["caught"][:2])
    t = table(cases)
    print(t)
    doc = ROOT / "docs" / "recordings.md"
    text = doc.read_text()
    if MARK_BEGIN in text:
        head, rest = text.split(MARK_BEGIN, 1)
        text = head + MARK_BEGIN + "\n" + t + "\n" + MARK_END + rest.split(MARK_END, 1)[1]
        doc.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
