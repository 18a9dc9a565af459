"""The project's prose stays short and is written by topic: at most 20,000 words of markdown in all
(`wc -w` over the tracked .md files, and new ones not yet tracked under studies/, docs/, data/ and the
README), and no .md or .py file (tracked, or new and not ignored) speaks of the project's own work items
or working sessions ("issue 24", "the seventeenth session"): a reader needs the finding, not the diary
that produced it. A device session of a recording is a measurement, named by its label (`--session s2`)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 20_000
ORDINAL = r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|[a-z]+teenth|twenty[a-z-]*)"
DIARY = re.compile(rf"issue [0-9]|{ORDINAL} session", re.I)


def _git_files(*args: str) -> list[Path]:
    r = subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout (a tree copied without .git)")
    return [ROOT / p for p in r.stdout.split("\0") if p]


def _markdown() -> list[Path]:
    tracked = _git_files("*.md")
    new = [p for p in _git_files("--others", "--exclude-standard", "*.md")
           if p.relative_to(ROOT).parts[0] in ("studies", "docs", "data") or p == ROOT / "README.md"]
    return sorted({p for p in tracked + new if p.exists()})


def test_the_prose_fits_in_twenty_thousand_words():
    words = {p.relative_to(ROOT).as_posix(): len(p.read_text(errors="replace").split()) for p in _markdown()}
    total = sum(words.values())
    top = ", ".join(f"{k} {v}" for k, v in sorted(words.items(), key=lambda kv: -kv[1])[:8])
    assert total <= MAX_WORDS, f"{total} words of markdown (at most {MAX_WORDS}); the longest: {top}"


def test_no_file_speaks_of_work_items_or_working_sessions():
    me = Path(__file__).resolve()
    files = sorted({p for p in _git_files("*.md", "*.py") + _git_files("--others", "--exclude-standard", "*.md", "*.py")
                    if p.exists() and p.resolve() != me})
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
             for p in files for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if DIARY.search(line)]
    assert not found, "write by topic, not by work item or session:\n" + "\n".join(found)


def test_the_rule_catches_what_it_is_for():
    for line in ("as issue 24 asks", "Issue 7: the tiles", "the seventeenth session found", "the twenty-fifth session",
                 "a second session on another machine"):
        assert DIARY.search(line), line
    for line in ("two device sessions", "--session s2", "the issue's done-when", "sessions s1 and s2"):
        assert not DIARY.search(line), line
