"""scripts/gpu_check.py without a GPU: JUnit counts per file, the lesson lines of an executed
notebook, one log filled by two parts, the refusal to run on a CPU, `make gpu-check`'s python; the
three-call recipe (two pytest parts and the notebooks, merged with --merge) with pytest faked, the
refusal to merge another commit's JSON, and the verdict on parts that are not the whole suite."""
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def _stem() -> str:
    """The log's name at the fake commit on this machine: it names the card (`cpu` without one)."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return "gpu_check_abc1234_" + gpu.replace("NVIDIA ", "").replace(" ", "_")


STEM = _stem()
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)

XML = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.nb.test_a" name="t1"/>\
<testcase classname="tests.nb.test_a" name="t2"><failure message="assert 1 == 2
more"/></testcase>
<testcase classname="tests.test_b" name="t3"><skipped message="no gpu"/></testcase>
<testcase classname="tests.test_b" name="t4"><error message="boom"/></testcase></testsuite></testsuites>"""


def test_junit_counts_per_file(tmp_path):
    (tmp_path / "x.xml").write_text(XML)
    c = gc.junit_counts(tmp_path / "x.xml")
    assert (c["passed"], c["failed"], c["errors"], c["skipped"]) == (1, 1, 1, 1)
    assert c["per_file"]["tests/nb/test_a.py"] == dict(passed=1, failed=1, errors=0, skipped=0)
    assert (c["failures"][0].startswith("tests.nb.test_a::t2: assert 1 == 2")
            and c["failures"][1] == "tests.test_b::t4: boom")
    assert gc.junit_counts(tmp_path / "none.xml")["failures"] == ["no JUnit XML: pytest did not finish"]


def test_lesson_lines_and_one_log_from_two_parts(tmp_path):
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("v.check()", metadata={"tags": ["lesson"]})
    c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="M=4096: sync 87.6 ms [1.36, 1.41]\n\n"),
                 nbformat.v4.new_output("error", ename="LessonError", evalue="M=16 ...", traceback=[])]
    other = nbformat.v4.new_code_cell("print(1)")
    other.outputs = [nbformat.v4.new_output("stream", name="stdout", text="not a lesson\n")]
    nb.cells = [other, c]
    nbformat.write(nb, str(tmp_path / "01_x.ipynb"))
    assert gc.lesson_lines(tmp_path / "01_x.ipynb") == ["M=4096: sync 87.6 ms [1.36, 1.41]",
                                                        "ERROR LessonError: M=16 ..."]
    meta = dict(commit="abc1234def", date="2026-12-01T10:00:00Z", gpu="NVIDIA H200", driver="570.1", torch="2.11",
                triton="3.6", cuda="13.0", python="3.11")
    tests = dict(passed=5, failed=0, errors=0, skipped=1, seconds=10.0, returncode=0, per_file={}, failures=[], tail=[])
    log = gc.write_log(tmp_path, dict(meta=meta, command="python3 scripts/gpu_check.py --what tests", tests=tests))
    assert log.name == "gpu_check_abc1234_H200.log" and "this log holds only: tests" in log.read_text()
    nbs = dict(seconds=5.0, passed=1, failed=0, over_1MB=[], notebooks=[dict(
        notebook="01_x", status="passed", seconds=5.0, bytes=2000, within_1MB=True, error="", lesson=["M=4096: ok"])])
    doc = json.loads((tmp_path / "gpu_check_abc1234_H200.json").read_text())
    doc["notebooks"] = nbs
    text = gc.write_log(tmp_path, doc).read_text()
    assert ("driver 570.1" in text and "5 passed" in text and "    | M=4096: ok" in text
            and text.endswith("== 0 failed\n"))
    capped = gc.write_log(tmp_path, dict(doc, meta=dict(meta, gpu="NVIDIA H100 80GB HBM3", gpu_cap_gib=24)))
    assert capped.name == "gpu_check_abc1234_H100_80GB_HBM3_cap24GiB.log"  # the card, and the cap standing in
    assert "memory: capped at 24 GiB" in capped.read_text()


def test_refuses_a_cpu_without_allow_cpu():
    import torch

    if torch.cuda.is_available():
        return
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--what", "tests"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no CUDA GPU here" in r.stdout


def test_make_gpu_check_takes_the_python_it_is_given():
    r = subprocess.run(["make", "-n", "gpu-check", "PY=python3", "GPU_CHECK_ARGS=--what tests"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0 and "python3 scripts/gpu_check.py --what tests" in r.stdout and "PYTHONPATH=" in r.stdout


# --- pytest in parts, merged with --merge (pytest and the notebooks faked: their XML and records) ---------------

def case(cls, name, body=""):
    return f'<testcase classname="{cls}" name="{name}">{body}</testcase>'


PART_XML = {  # what the fake pytest reports for each part, by the part's first path
    "tests/nb": [case("tests.nb.test_lessons", "t1"), case("tests.nb.test_report", "t2")],
    "rest": [case("tests.kernels.test_k", "t3"), case("tests.test_lint", "t4"),
             case("tests.sim.test_s", "t5", '<skipped message="no gpu"/>')],
}
NBS = dict(seconds=5.0, passed=1, failed=0, over_1MB=[], notebooks=[dict(
    notebook="01_x", status="passed", seconds=5.0, bytes=2000, within_1MB=True, error="", lesson=["M=4096: ok"])])


@pytest.fixture
def fake_gpu_machine(monkeypatch):
    """main() in-process at commit abc1234def (clean), with pytest and the notebooks faked; `calls` lists the
    pytest command lines; a part whose args include 'tests/nb/test_lessons.py' runs past its timeout."""
    monkeypatch.setenv("GIT_COMMIT", "abc1234def")
    monkeypatch.setenv("GIT_DIRTY", "0")
    monkeypatch.delenv("GIT_DIRTY_FILES", raising=False)
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    calls = []

    def run(cmd, timeout):
        calls.append(cmd)
        if "tests/nb/test_lessons.py" in cmd:  # killed before it wrote an XML
            return "..F.", f"timeout after {timeout} s"
        xml = Path(next(w for w in cmd if w.startswith("--junitxml=")).split("=", 1)[1])
        cases = PART_XML["tests/nb" if "tests/nb" in cmd else "rest"]
        xml.write_text("<testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>")
        return f"{len(cases)} passed\n", 0

    def no_process(*a, **kw):
        raise AssertionError(f"the fake machine runs no other process: {a}")

    monkeypatch.setattr(gc, "run_pytest", run)
    monkeypatch.setattr(gc, "subprocess", types.SimpleNamespace(run=no_process, Popen=no_process,
                                                                TimeoutExpired=subprocess.TimeoutExpired))
    monkeypatch.setattr(gc, "run_notebooks", lambda build, only, after=None: json.loads(json.dumps(NBS)))
    return calls


def gpu_check(tmp_path, out, *args):
    return gc.main(["--allow-cpu", "--out", str(tmp_path / out), "--build", str(tmp_path / "build"), *args])


def test_three_calls_fill_one_log(tmp_path, fake_gpu_machine):
    """The recipe: each call writes to a fresh folder, given the JSON of the call before with --merge."""
    assert gpu_check(tmp_path, "o1", "--what", "tests", "--pytest-args", "--ignore=tests/nb") == 3
    first = (tmp_path / "o1" / f"{STEM}.log").read_text()
    assert "NOT THE WHOLE SUITE" in first.splitlines()[-1] and "leave out tests/nb/ " in first.splitlines()[-1]
    assert gpu_check(tmp_path, "o2", "--what", "tests", "--pytest-args", "tests/nb",
                     "--merge", str(tmp_path / "o1" / f"{STEM}.json")) == 0
    assert gpu_check(tmp_path, "o3", "--what", "notebooks",
                     "--merge", str(tmp_path / "o2" / f"{STEM}.json")) == 0
    assert [c[-1] for c in fake_gpu_machine] == ["--ignore=tests/nb", "tests/nb"]
    doc = json.loads((tmp_path / "o3" / f"{STEM}.json").read_text())
    t = doc["tests"]
    assert [p["args"] for p in t["parts"]] == [["--ignore=tests/nb"], ["tests/nb"]]
    assert [(p["passed"], p["skipped"], p["returncode"], p["ran"]["commit"]) for p in t["parts"]] == [
        (2, 1, 0, "abc1234def"), (2, 0, 0, "abc1234def")]
    assert (t["passed"], t["failed"], t["errors"], t["skipped"]) == (4, 0, 0, 1) and not t["incomplete"]
    assert t["coverage"]["whole_suite"] and not t["coverage"]["missing"] and doc["notebooks"]["passed"] == 1
    text = (tmp_path / "o3" / f"{STEM}.log").read_text()
    assert ("== pytest part 1 of 2 (pytest --ignore=tests/nb): 2 passed" in text
            and "== pytest part 2 of 2 (pytest tests/nb): 2 passed" in text
            and "== pytest, total over the 2 parts (pytest --ignore=tests/nb + pytest tests/nb): 4 passed" in text
            and "the parts together are the whole suite" in text and "    | M=4096: ok" in text
            and "--merge" in text and text.endswith("== 0 failed\n"))


def test_a_part_that_did_not_finish_fails_the_merged_log(tmp_path, fake_gpu_machine):
    assert gpu_check(tmp_path, "o", "--what", "tests", "--pytest-args", "--ignore=tests/nb") == 3
    assert gpu_check(tmp_path, "o", "--what", "tests", "--pytest-args", "tests/nb") == 0  # merged from --out
    assert gpu_check(tmp_path, "o", "--what", "tests", "--pytest-args", "tests/nb/test_lessons.py") == 1
    doc = json.loads((tmp_path / "o" / f"{STEM}.json").read_text())
    assert [p["scope"] for p in doc["tests"]["parts"]] == [
        "pytest --ignore=tests/nb", "pytest tests/nb", "pytest tests/nb/test_lessons.py"]
    assert doc["tests"]["incomplete"] and doc["tests"]["coverage"]["in_two_parts"] == ["tests/nb/test_lessons.py"]
    text = (tmp_path / "o" / f"{STEM}.log").read_text()
    assert "DID NOT FINISH (timeout after 480 s)" in text
    assert text.endswith("== 1 FAILED (this log holds only: tests)\n")
    # the same part run again replaces it; a part that runs all of tests/nb replaces both tests/nb parts
    assert gpu_check(tmp_path, "o", "--what", "tests", "--pytest-args", "-x tests/nb") == 0
    doc = json.loads((tmp_path / "o" / f"{STEM}.json").read_text())
    assert [p["scope"] for p in doc["tests"]["parts"]] == ["pytest --ignore=tests/nb", "pytest -x tests/nb"]
    assert doc["tests"]["replaced"] == ["pytest tests/nb (by pytest -x tests/nb)",
                                        "pytest tests/nb/test_lessons.py (by pytest -x tests/nb)"]


def test_refuses_to_merge_another_commit(tmp_path, fake_gpu_machine, capsys):
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps(dict(meta=dict(commit="1111111aaaa", dirty=False), command="...", notebooks=NBS)))
    assert gpu_check(tmp_path, "o", "--what", "tests", "--merge", str(prev)) == 2
    said = capsys.readouterr().out
    assert ("refusing to merge" in said and "commit 1111111aaaa" in said and "commit abc1234def" in said
            and not fake_gpu_machine and not (tmp_path / "o" / f"{STEM}.json").exists())
    assert gpu_check(tmp_path, "o", "--what", "tests", "--merge", str(tmp_path / "none.json")) == 2
    assert "no such file" in capsys.readouterr().out
    ok = dict(commit="abc1234", dirty=False)  # a short GIT_COMMIT of the same commit merges
    gc.check_same_tree(dict(meta=ok), dict(commit="abc1234def", dirty=False), "prev.json")
    for other in (dict(ok, dirty=True), dict(ok, commit=""), dict(ok, dirty_files=["x.py"])):
        with pytest.raises(gc.MergeRefused, match="refusing to merge: prev.json is of commit"):
            gc.check_same_tree(dict(meta=other), dict(commit="abc1234def", dirty=False), "prev.json")


def part(args, **kw):
    return dict(dict(args=args, scope=gc.scope_of(args), passed=3, failed=0, errors=0, skipped=0, seconds=10.0,
                     returncode=0, per_file={}, failures=[], tail=[]), **kw)


def test_parts_that_are_not_the_whole_suite_fail_the_verdict(tmp_path):
    meta = dict(commit="abc1234def", date="2026-12-01T10:00:00Z", gpu="NVIDIA H200", dirty=False)
    for later, partial in ((["tests/kernels"], None),
                           (["-k", "lessons", "tests/nb"], "pytest -k lessons tests/nb (-k)"),
                           (["tests/nb/test_lessons.py::t"], "pytest tests/nb/test_lessons.py::t (node ids)")):
        t = gc.add_part(gc.add_part(None, part(["--ignore=tests/nb"])), part(later))
        doc = dict(meta=meta, command="...", tests=t, notebooks=NBS)
        assert gc.tally(doc) == (0, False)
        text = gc.write_log(tmp_path, doc).read_text()
        last = text.splitlines()[-1]
        assert last.startswith("== 0 failed, and NOT THE WHOLE SUITE") and last.endswith("leave out tests/nb/")
        nb_files = len(list((Path(__file__).parent / "nb").glob("test_*.py")))  # the files the parts leave out
        assert f"  NOT THE WHOLE SUITE: {nb_files} of the " in text
        assert (partial is None) == ("only some tests of its files" not in text)
        assert partial is None or f"only some tests of its files (counts for none of them): {partial}" in text
    whole = gc.add_part(gc.add_part(None, part(["tests/nb"])), part(["--ignore", "tests/nb", "-p", "no:x"]))
    assert whole["coverage"]["whole_suite"] and gc.tally(dict(tests=whole)) == (0, True)
    assert gc.add_part(None, part([]))["coverage"]["whole_suite"]
    # a part that exited non-zero with nothing failed (a usage error) is a failure; an older JSON's one part
    assert gc.tally(dict(tests=gc.add_part(None, part([], returncode=4)))) == (1, True)
    old = dict(part([]), scope="pytest --ignore=tests/nb")
    del old["args"]
    assert [p["args"] for p in gc.test_parts(old)] == [["--ignore=tests/nb"]]


def test_a_notebook_run_cut_short_keeps_its_log(tmp_path, fake_gpu_machine, monkeypatch):
    """The log is written after every notebook: a device call that ends midway (here: killed after the first
    notebook) leaves the notebooks that ran in the log, and names the rest as not run (counted as failed)."""
    def cut(build, only, after=None):
        done = json.loads(json.dumps(NBS))
        after(dict(done, pending=["02_kernel_early_exit"], failed=done["failed"] + 1))
        raise KeyboardInterrupt  # the call's time limit

    monkeypatch.setattr(gc, "run_notebooks", cut)
    with pytest.raises(KeyboardInterrupt):
        gpu_check(tmp_path, "o", "--what", "notebooks")
    text = (tmp_path / "o" / f"{STEM}.log").read_text()
    assert "    | M=4096: ok" in text and "NOT RUN YET (counted as failed" in text and "02_kernel_early_exit" in text
    assert text.splitlines()[-1].startswith("== 1 FAILED")


def test_notebooks_tar_goes_to_out(tmp_path, fake_gpu_machine):
    assert gpu_check(tmp_path, "o", "--what", "notebooks", "--notebooks-tar") == 0
    assert (tmp_path / "o" / f"{STEM}_notebooks.tar.gz").is_file()


def test_run_notebooks_reports_after_each_with_the_rest_pending(tmp_path, monkeypatch):
    from lora_moe_lab.nb import runner

    nbs = [Path(f"{n}.ipynb") for n in ("01_a", "02_b", "03_c")]
    monkeypatch.setattr(runner, "notebooks", lambda only: nbs)
    monkeypatch.setattr(runner, "execute", lambda nb, out, params, kind: (out / nb.name).write_text('{"cells": []}'))
    monkeypatch.setattr(runner, "html_report", lambda files, out: None)
    seen = []
    got = gc.run_notebooks(tmp_path, None, after=lambda s: seen.append((s["passed"], s["pending"], s["failed"])))
    assert seen == [(1, ["02_b", "03_c"], 2), (2, ["03_c"], 1), (3, [], 0)]
    assert got["passed"] == 3 and got["pending"] == [] and got["failed"] == 0


@pytest.mark.slow
def test_a_pytest_run_past_its_timeout_still_names_its_failures(tmp_path, monkeypatch):
    # at the timeout pytest gets SIGINT: it stops in the running test and writes the XML of those that ran, so a
    # failure before the cut is named (a kill left only an unnamed 'F' in the progress line, 74af83d)
    (tmp_path / "test_cut.py").write_text("import time\n\ndef test_fails():\n    assert 1 == 2\n\n"
                                          "def test_hangs():\n    time.sleep(60)\n\ndef test_never_runs():\n    pass\n")
    monkeypatch.setattr(gc, "ROOT", tmp_path)
    # with SIGINT blocked here, as a loaded xdist worker once had it: a blocked mask survives exec, so the child must
    # unblock it itself (it slept through the signal before)
    import signal
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        t = gc.run_tests(tmp_path, [str(tmp_path / "test_cut.py")], timeout=12)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert t["incomplete"] and t["returncode"] == "timeout after 12 s"
    assert (t["passed"], t["failed"]) == (0, 1) and t["failures"][0].startswith("test_cut::test_fails")
    assert "stopped by SIGINT" in "\n".join(gc.part_lines(t))
