"""scripts/gpu_check.py without a GPU: JUnit counts per file, the lesson lines of an executed
notebook, one log filled by two parts, the refusal to run on a CPU, `make gpu-check`'s python."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
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
    assert log.name == "gpu_check_abc1234.log" and "this log holds only: tests" in log.read_text()
    nbs = dict(seconds=5.0, passed=1, failed=0, over_1MB=[], notebooks=[dict(
        notebook="01_x", status="passed", seconds=5.0, bytes=2000, within_1MB=True, error="", lesson=["M=4096: ok"])])
    doc = json.loads((tmp_path / "gpu_check_abc1234.json").read_text())
    doc["notebooks"] = nbs
    text = gc.write_log(tmp_path, doc).read_text()
    assert ("driver 570.1" in text and "5 passed" in text and "    | M=4096: ok" in text
            and text.endswith("== 0 failed\n"))


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
