"""Under CI=true a test may not skip for want of something the project's own install provides (pyproject.toml's
test, notebooks and browser extras; .ci/run installs Debian's chromium or fails): green must mean these tests ran.
The root conftest's report hooks call `fail_required_skip`; tests/test_required_deps.py imports it from here, by a
name no other module on sys.path shares (a bare `import conftest` can resolve to another tree's conftest)."""
import os

REQUIRED = ("transformers", "peft", "ruff", "chromium", "playwright", "jupyterlab", "ipywidgets")
_MISSING = ("could not import", "no module named", "not installed", "not found")


def required_missing(reason: str) -> str | None:
    """The required dependency a skip reason says is missing, or None."""
    low = reason.lower()
    if not any(m in low for m in _MISSING):
        return None
    return next((name for name in REQUIRED if name in low), None)


def fail_required_skip(report) -> None:
    """Under CI=true, a report skipped because a required dependency is missing becomes a failure naming it."""
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    name = required_missing(reason)
    if name is not None:
        report.outcome = "failed"
        report.longrepr = (f"CI=true: {name} is required (the project's install provides it) but is missing, and "
                           f"the test would have skipped: {reason}")
