"""Under CI=true a skip for want of a dependency the project's own install provides fails instead, naming it
(tests/ci_skips.py, called by the root conftest's report hooks); other skips, xfails and runs outside CI are left
alone."""
from types import SimpleNamespace

import pytest
from ci_skips import fail_required_skip  # the function the root conftest's report hooks call


def _skipped(reason: str, **kw):
    return SimpleNamespace(skipped=True, outcome="skipped", longrepr=("x.py", 3, f"Skipped: {reason}"), **kw)


@pytest.mark.parametrize("reason,name", [
    ("could not import 'transformers': No module named 'transformers'", "transformers"),
    ("could not import 'peft': No module named 'peft'", "peft"),
    ("ruff is not installed (pip install -e '.[test]' or pip install ruff)", "ruff"),
    ("/usr/bin/chromium not found (CI installs the Debian chromium package)", "chromium"),
    ("the playwright package is not installed (pip install playwright; no browser download needed)", "playwright"),
    ("jupyterlab is not installed", "jupyterlab"),
    ("could not import 'ipywidgets': No module named 'ipywidgets'", "ipywidgets"),
])
def test_a_required_skip_fails_under_ci(monkeypatch, reason, name):
    monkeypatch.setenv("CI", "true")
    rep = _skipped(reason)
    fail_required_skip(rep)
    assert rep.outcome == "failed" and f"CI=true: {name} is required" in rep.longrepr and reason in rep.longrepr
    monkeypatch.delenv("CI")
    rep = _skipped(reason)
    fail_required_skip(rep)  # outside CI a missing extra still skips
    assert rep.outcome == "skipped"


@pytest.mark.parametrize("rep", [
    _skipped("needs a CUDA GPU"),
    _skipped("no recorded traces in data/traces/ (run studies/traces/record.py on a GPU)"),
    _skipped("could not import 'transformers': No module named 'transformers'", wasxfail="an expected failure"),
])
def test_other_skips_stay_skips_under_ci(monkeypatch, rep):
    monkeypatch.setenv("CI", "true")
    fail_required_skip(rep)
    assert rep.outcome == "skipped"


def test_a_passed_report_is_untouched(monkeypatch):
    monkeypatch.setenv("CI", "true")
    rep = SimpleNamespace(skipped=False, outcome="passed", longrepr=None)
    fail_required_skip(rep)
    assert rep.outcome == "passed"
