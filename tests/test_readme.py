"""The README's figures are what data/ says: scripts/readme_tables.py regenerates every block
between its markers, and this test fails when README.md has drifted from the recordings."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_figures_equal_the_recordings():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_block_is_filled():
    text = (ROOT / "README.md").read_text()
    assert "no recording in data/ yet" not in text
    for name in ("setup", "guards", "production", "traces", "kernels", "simulator", "simulator-check"):
        assert f"<!-- begin:{name} -->" in text and f"<!-- end:{name} -->" in text, name


def test_the_readme_api_example_runs():
    text = (ROOT / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split("\n")[:2]
    assert first == "True" and second.split()[0] == "4"  # the flag, and 4 syncs for 4 layers
