"""What a newcomer reads first holds together: every path the prose names exists, the README points at the
newest GPU-check log, its Headline stays short and free of session codes, every notebook stays small and
the executed-notebook index describes each one. Reads text only: no model, no notebook run."""
import re
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from lora_moe_lab.nb import runner

ROOT = Path(__file__).resolve().parents[1]
PROSE = ([ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")) + sorted(ROOT.glob("studies/*/README.md"))
         + sorted(ROOT.glob("data/*/README.md")) + sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")))
EXT = r"(?:py|md|csv|json|ipynb|yaml)"
PATH = re.compile(rf"[A-Za-z0-9_.<>*{{}}$/-]*[A-Za-z0-9_>*}}]\.{EXT}(?![\w.])"  # a file
                  r"|[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/(?![\w.])")  # a folder
BACKTICK = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# outputs and files another part of the project writes: named by the prose, not in a clean checkout
OUTPUTS = ("build/", "out/", ".venv/", ".whl/", "prev/", "/tmp/", "$OUT", "html/", "DIR/")
EXAMPLES = {"notebooks/src/NN_name.py", "file.py", "S1.csv", "S2.csv"}  # placeholders in the prose
EXTERNAL = ("transformers/", "peft/", "torch/", "vllm/", "sglang/")  # inside an installed package
MAX_NOTEBOOK_CELLS = 45


def _tracked() -> list[str]:
    skip = (".git", ".venv", "build", "__pycache__", "node_modules", ".pytest_cache", ".hypothesis")
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if p.is_file() and not any(part in skip for part in p.relative_to(ROOT).parts)]


TRACKED = _tracked()
DIRS = {"/".join(f.split("/")[:i]) + "/" for f in TRACKED for i in range(1, f.count("/") + 1)}


def _exists(name: str, here: Path) -> bool:
    """A path exists relative to the repository, to the file naming it, or as the tail of a repository path
    (`model/guards.py` in the package, `h200_guards_s1.csv` in its data folder)."""
    name = name.strip("./") if name.startswith("./") else name
    if (ROOT / name).exists() or (here.parent / name).exists():
        return True
    tail = name.rstrip("/")
    if name.endswith("/"):
        return any(d == tail + "/" or d.endswith("/" + tail + "/") for d in DIRS)
    return any(f == tail or f.endswith("/" + tail) for f in TRACKED)


def _prose(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".py":  # a notebook source: its markdown cells and comments only
        text = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    return text


def _named_paths(path: Path) -> set[str]:
    text = _prose(path)
    found = set()
    for chunk in BACKTICK.findall(text) + LINK.findall(text):
        if chunk.startswith(("http://", "https://", "mailto:")):
            continue
        for m in PATH.finditer(chunk):
            p = m.group(0)
            if p.startswith((".", "_")) and "/" not in p:  # a suffix like `.meta.json`, `_ncu.csv`
                continue
            found.add(p)
    return found


def _skip(p: str) -> bool:
    return (any(c in p for c in "*<>{}$") or p.startswith(OUTPUTS) or any(o in p for o in OUTPUTS[4:])
            or p in EXAMPLES or p.startswith(("http", "www.") + EXTERNAL))


def test_every_path_the_prose_names_exists():
    missing = []
    for f in PROSE:
        for p in sorted(_named_paths(f)):
            if not _skip(p) and not _exists(p, f):
                missing.append(f"{f.relative_to(ROOT)}: {p}")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


def test_the_path_rule_catches_a_stale_pointer(tmp_path):
    f = tmp_path / "x.md"
    f.write_text("run `scripts/gpu_signature.py`, see [it](docs/results.md#probe) and `studies/<study>/record.py`")
    named = _named_paths(f)
    assert named == {"scripts/gpu_signature.py", "docs/results.md", "studies/<study>/record.py"}, named
    assert not _exists("scripts/gpu_signature.py", f) and _exists("docs/results.md", f)
    assert _skip("studies/<study>/record.py") and _exists("model/guards.py", f) and _exists("data/guards/", f)


def _log_date(log: Path) -> datetime:
    first = log.read_text().splitlines()[0]  # "GPU check at commit f461095, 2026-12-04T01:37:06Z"
    m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", first)
    assert m, f"{log.name}: no date in its first line: {first!r}"
    return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ")


def test_the_readme_names_the_newest_gpu_check_log():
    logs = sorted((ROOT / "data" / "gpu_tests").glob("gpu_check_*.log"))
    if not logs:
        pytest.skip("no GPU-check log in data/gpu_tests/")
    newest = max(logs, key=_log_date)
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"gpu_check_[0-9a-f]{7}[\w-]*\.log", readme))
    assert newest.name in named, f"README.md names {sorted(named)}; the newest log is {newest.name}"
    assert all((ROOT / "data" / "gpu_tests" / n).exists() for n in named), named
    table = (ROOT / "data" / "gpu_tests" / "README.md").read_text()
    assert all(log.name in table for log in logs), "data/gpu_tests/README.md's table lists every log kept"


SESSION_CODE = re.compile(r"\b[a-z]+_s\d+[a-z]?\b|(?<![\w-])s\d{1,2}\b")


def _headline_bullets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## Headline\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md has no Headline section"
    bullets, cur = [], None
    for line in m.group(1).splitlines():
        if line.startswith("- "):
            cur = [line[2:]]
            bullets.append(cur)
        elif cur is not None and line.startswith("  ") and line.strip():
            cur.append(line.strip())
        else:
            cur = None
    return [re.sub(r"<!-- (begin|end):[\w-]+ -->", " ", " ".join(b)) for b in bullets]


def test_the_headline_is_four_short_bullets_without_session_codes():
    bullets = _headline_bullets()
    assert 1 <= len(bullets) <= 4, bullets
    for b in bullets:
        assert len(b.split()) <= 45, f"{len(b.split())} words (at most 45): {b}"
        assert not SESSION_CODE.search(b), f"a session code in the Headline: {SESSION_CODE.search(b).group(0)}: {b}"
    assert "number to quote" in " ".join(bullets).lower()


def test_the_session_code_rule():
    for s in ("`lay_s10`", "wg_s2 says", "session s1 gave", "(s2)"):
        assert SESSION_CODE.search(s), s
    for s in ("sgl-project/sglang#25531", "2 device sessions", "TP=4, Qwen3-30B-A3B", "+14.4 %"):
        assert not SESSION_CODE.search(s), s


NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_is_small_and_described(nb):
    book = nbformat.read(str(nb), as_version=4)
    assert len(book.cells) <= MAX_NOTEBOOK_CELLS, f"{nb.name}: {len(book.cells)} cells"
    title, goal = runner.describe(book)
    assert title and goal, f"{nb.name}: the report's index needs a title and a **Goal.** paragraph"
    shown = runner._inline_md(goal)
    assert not re.search(r"(?<![\w*])\*[^*\s]|\*\*", shown), f"{nb.name}: raw markdown in the index: {shown}"
