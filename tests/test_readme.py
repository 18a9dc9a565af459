"""The figures of README.md and docs/results.md are what data/ says: scripts/readme_tables.py
regenerates every block between its markers (each written by a study's studies/<name>/block.py), and this
test fails when either has drifted from the recordings. The README stays a front door: short, the quick
start on the first screen."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_figures_equal_the_recordings():  # the drift check: in every run, CI's too
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_block_is_filled():
    readme, results = (ROOT / "README.md").read_text(), (ROOT / "docs" / "results.md").read_text()
    for text in (readme, results):
        assert "no recording in data/ yet" not in text
    assert "<!-- begin:setup -->" in readme and "<!-- begin:lab-headline -->" in readme
    for name in ("signature", "guards", "production", "traces", "graphs", "replay", "simulator",
                 "simulator-check", "tp4", "tp4-headline",
                 "probe"):  # the kernels' blocks are in studies/kernels/README.md
        assert f"<!-- begin:{name} -->" in results and f"<!-- end:{name} -->" in results, name


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 120
    assert any("make run" in line for line in lines[:25]) and any("make test" in line for line in lines[:25])
    text = "\n".join(lines) + (ROOT / "docs" / "results.md").read_text()
    for extrapolation in ("+14.3 %", "+15.1 %", "+33.8 %"):  # the TP=4 figure is the tp4 block's prediction
        assert extrapolation not in text


def test_a_block_without_its_generator_or_data_gets_a_note(monkeypatch):
    from helpers import load_script

    rt = load_script("readme_tables")
    monkeypatch.setitem(rt.BLOCK_DATA, "nogen", "absent_folder")
    out = rt.render("a\n<!-- begin:nogen -->\nstale text\n<!-- end:nogen -->\n")
    assert "stale text" not in out and "`nogen`" in out and "not recorded yet" in out


def test_a_marker_no_study_generates_gets_a_note_not_its_old_text():
    from helpers import load_script

    rt = load_script("readme_tables")
    out = rt.render("a\n<!-- begin:no-such-block -->\nstale 1.36\n<!-- end:no-such-block -->\n")
    assert "stale" not in out and "`no-such-block`" in out and "no block.py generator" in out


def test_the_one_tp4_figure_is_labelled_predicted():
    from studies.tp_emulation.block import tp4_headline_block

    line = tp4_headline_block()
    if line is None:
        pytest.skip("no data/tp_emulation sessions")
    assert "**predicted**" in line and "TP=2 check" in line


def test_the_readme_api_example_runs():
    text = (ROOT / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split("\n")[:2]
    assert first == "True" and second.split()[0] == "4"  # the flag, and 4 syncs for 4 layers
