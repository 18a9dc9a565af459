"""ruff (config in pyproject.toml: E, F, W, line length 120) finds nothing in the package, the scripts and the
tests. Skipped where ruff is not installed (the GPU machine may lack it)."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["lora_moe_lab", "scripts", "tests", "studies", "conftest.py"]


def _ruff() -> list[str] | None:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    return [exe] if exe else None


def test_ruff_finds_nothing():
    cmd = _ruff()
    if cmd is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' or pip install ruff)")
    r = subprocess.run(cmd + ["check", "--no-cache", *PATHS], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"ruff check {' '.join(PATHS)} found problems:\n{r.stdout}{r.stderr}", pytrace=False)
