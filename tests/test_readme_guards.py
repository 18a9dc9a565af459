"""The README's guards block (studies/guards/block.py: guards_block) in its three states: the
archived recording while no session is recorded, one session (the second pending), two sessions
(the reader's figure, each session's where they disagree, warm-up drops and unstable points
listed). tests/test_readme.py checks that README.md is what data/ says."""
import shutil
from pathlib import Path

import pytest
from guards_synth import write_session
from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    return load_script("studies.guards.block")


def test_archived_recording_says_the_sessions_are_pending(tables, tmp_path):
    for f in (ROOT / "data" / "guards").glob("h200_guards.*"):  # the archive alone: no session file yet
        shutil.copy(f, tmp_path / f.name)
    text = tables.guards_block(tmp_path)
    assert "archived guards recording" in text and "The two sessions of the new protocol are pending" in text
    assert "paired bootstrap, 95 %" in text and "would drop leading drift" in text


def test_one_session_then_two(tables, tmp_path):
    write_session(tmp_path, "s1", lost_per_sync=40.0, seed=1, drift={(16, "sync"): 2, (4096, "cpu_flag"): 9})
    one = tables.guards_block(tmp_path)
    assert "one session; the second is pending" in one
    assert "| preset | M (tokens) | n kept |" in one and "lost per sync (µs) [paired bootstrap, 95 %]" in one
    assert "| tiny | 16 | 14 |" in one  # 2 of 16 dropped as warm-up drift
    assert ("tiny M = 16, first 2 of 16" in one and "Unstable, not averaged" in one
            and "tiny M = 4096 (16 repetitions)" in one)
    assert "| tiny | 4096 | 0 |" in one and "unstable, not averaged" in one
    write_session(tmp_path, "s2", lost_per_sync=60.0, seed=2)
    two = tables.guards_block(tmp_path)
    assert "2 device sessions" in two and "pending" not in two
    assert "they disagree at tiny M = 16 (s1 " in two and ", s2 " in two  # each session's figure where they disagree
    assert "take** [between sessions]" in two and "†" in two and "they disagree at tiny M = 16" in two
    assert "(s2 only)" in two  # M = 4096 was unstable in s1
    assert "s1: tiny M = 16, first 2 of 16" in two
