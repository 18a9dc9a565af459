"""What a newcomer reads first holds together: every path the prose names exists, the README points at the
newest GPU-check log, its Headline stays short and free of session codes, every notebook stays small and
the executed-notebook index describes each one. Reads text only: no model, no notebook run."""
import os
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
    """The checkout's files; the walk never enters the venv, build outputs or git's store (tens of thousands of
    files a reader never names)."""
    skip = {".git", ".venv", "build", "__pycache__", "node_modules", ".pytest_cache", ".hypothesis"}
    out = []
    for here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip]
        rel = Path(here).relative_to(ROOT)
        out += [(rel / f).as_posix() for f in files]
    return out


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


# --- one figure, one value: what the docs state twice agrees with its source ------------------------------------
# Each figure below was once stated two ways (issue: "figures that disagree without saying why"); the tests read
# it from its source (the recording, or the generated block that test_readme.py holds to the recording) and
# require every mention to be that value.
NOTEBOOK_SOURCES = (sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                    + sorted((ROOT / "notebooks" / "src").glob("*.py")))
EVERY_TEXT = PROSE + NOTEBOOK_SOURCES + sorted((ROOT / "lora_moe_lab").rglob("*.py"))
# the old statements: the LoRA share as a range of medians at full precision beside the range of interval bounds,
# "about 13.5 %", and the slot-ordered shrink's bytes as 1.73 in one place and 1.74 in another
RETIRED = ("12.7–21.6", "12.97–21.44", "12.97 %", "21.44 %", "about 13.5 %", "1.74× the floor",
           "1.73–1.74× the floor", "a dozen hidden-sync", "shows a dozen", "a dozen shapes", "the dozen shapes")


def _text(p: Path) -> str:
    return p.read_text(errors="replace")


def test_no_retired_figure_comes_back():
    found = [f"{p.relative_to(ROOT)}: {s!r}" for p in EVERY_TEXT for s in RETIRED if s in _text(p)]
    assert not found, "a figure stated another way than its source:\n" + "\n".join(found)


def test_the_paired_slowdown_and_the_ratio_of_medians_are_the_recordings():
    from lora_moe_lab.instruments.analysers.recordings import load_guards

    p = load_guards().paired("sync", "cpu_flag")
    row = p[(p.active == 0) & (p.preset == "qwen3-30b-a3b") & (p.tokens == 1024)].iloc[0]
    slowdown, ratio = f"{1 + row.lost_us / row.t_baseline_us:.2f}", f"{row.ratio:.2f}"
    readme = " ".join(_text(ROOT / "README.md").split())
    assert f"{ratio} there against {slowdown}" not in readme  # no figure by hand (tests/test_prose_numbers.py)
    guards_row = _results_row("qwen3-30b-a3b", "1024")
    assert guards_row[4].startswith(f"{ratio}x ["), guards_row  # the take: the mean of the sessions' ratios
    assert "each session's [ratio of medians](docs/glossary.md#ratio-of-medians), averaged over the sessions" in readme


def test_the_readme_figure_draws_the_paired_slowdown_by_that_name():
    from helpers import load_script

    fig = load_script("make_readme_figures").ratio_figure()
    assert fig.data and all(t.name.startswith("paired slowdown, ") for t in fig.data), [t.name for t in fig.data]
    assert "paired slowdown" in fig.layout.yaxis.title.text
    readme = _text(ROOT / "README.md")
    alt = re.search(r"!\[([^\]]*)\]\(docs/guard_ratio\.png\)", readme)
    assert alt and "paired slowdown" in alt.group(1), "the README picture's alt text names what it draws"
    assert "[paired slowdown](docs/glossary.md#paired-slowdown)" in readme


def test_the_hidden_sync_patterns_are_counted_once():
    from lora_moe_lab.instruments.recorders import hidden_syncs

    words = {12: "twelve", 13: "thirteen", 14: "fourteen", 15: "fifteen"}
    n = words[len(hidden_syncs.PATTERNS)]
    for f, phrase in (("README.md", f"a sync audit of {n} hidden-sync patterns"),
                      ("docs/sync_audit.md", f"Notebook 07 shows {n}."),
                      ("studies/README.md", f"| `hidden_syncs` | {n} hidden-sync patterns"),
                      ("notebooks/src/07_hidden_syncs.py", f"then {n} shapes the bug takes")):
        assert phrase in _text(ROOT / f), (f, phrase)


def test_the_slot_ordered_shrink_bytes_are_the_counters():
    import pandas as pd

    c = pd.read_csv(ROOT / "data" / "kernels" / "shrink_order_ncu.csv")
    c = c[c.session.isin(["ord_n1", "ord_n2"])]
    slot, expert = c[c.arm.str.endswith("_slot")], c[c.arm.str.endswith("_expert")]
    b = slot.dram_bytes_over_floor
    assert b.median() < expert.dram_bytes_over_floor.median()  # studies/kernels/README.md: "down toward the floor"
    # the package's docstring and plan cite the medians
    packed = _text(ROOT / "lora_moe_lab" / "kernels" / "fused_moe_lora_packed.py")
    assert f"{expert.dram_bytes_over_floor.median():.2f} -> {b.median():.2f}x the floor" in " ".join(packed.split())


def _results_row(*labels: str) -> list[str]:
    head = "| " + " | ".join(labels) + " |"
    row = next(line for line in _text(ROOT / "docs" / "results.md").splitlines() if line.startswith(head))
    return [c.strip() for c in row.strip("|").split("|")]


def test_the_gpu_tests_readme_says_which_logs_it_keeps():
    text = _text(ROOT / "data" / "gpu_tests" / "README.md")
    logs = (ROOT / "data" / "gpu_tests").glob("gpu_check_*.log")
    commits = {re.match(r"gpu_check_([0-9a-f]{7})", p.name).group(1) for p in logs}
    if len(commits) > 1:
        assert "Only the latest check" not in text, "the folder keeps the checks of several commits"
    assert all(c in text for c in commits)


# --- links: every relative link resolves, to a file and to its anchor --------------------------------------------
ANCHOR_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(md: Path) -> set[str]:
    text = _text(md)
    ids = set(re.findall(r'<a id="([^"]+)"', text))
    for h in re.findall(r"^#{1,6} (.+)$", text, re.M):  # GitHub's heading slugs
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def test_every_relative_link_and_its_anchor_resolve():
    bad = []
    for f in [p for p in PROSE if p.suffix == ".md"]:
        for target in ANCHOR_LINK.findall(_text(f)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{f.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{f.relative_to(ROOT)}: {target} (no such anchor)")
    assert not bad, "\n".join(bad)


GLOSSARY_LINKS = {"docs/design.md": ("guard", "host-device-sync", "bubble", "slot", "host-time-blocked", "host-lead",
                                     "paired", "interval", "device-session", "union-over-sessions", "m"),
                  "studies/kernels/README.md": ("m", "paired", "interval", "union-over-sessions", "device-session",
                                                "tma", "shrink-expand", "builds", "slot", "roofline-floor")}


@pytest.mark.parametrize("page", sorted(GLOSSARY_LINKS))
def test_the_pages_link_the_glossary_terms_they_use(page):
    f = ROOT / page
    rel = Path("../" * (len(Path(page).parts) - 1) + "docs/glossary.md").as_posix()
    rel = "glossary.md" if page.startswith("docs/") else rel
    missing = [t for t in GLOSSARY_LINKS[page] if f"]({rel}#{t})" not in _text(f)]
    assert not missing, f"{page} uses these glossary terms without linking them: {missing}"


def test_the_gpu_check_recipe_is_the_one_in_use(capsys):
    """scripts/gpu_check.py's docstring gives the three calls that wrote the kept logs, with flags its parser has,
    and the Makefile's targets run them."""
    from helpers import load_script

    gc = load_script("gpu_check")
    doc = gc.__doc__.replace("\\\n", " ")
    tests_call = ('python3 scripts/gpu_check.py --wheels .whl --out $OUT/gc --build /tmp/gc --what tests '
                  '--pytest-args "-n 14 --dist load"')
    nb_call = "python3 scripts/gpu_check.py --out $OUT/nb --build /tmp/gcn --what notebooks"
    assert tests_call in " ".join(doc.split()) and nb_call in doc and "make gpu-probe" in doc
    with pytest.raises(SystemExit):
        gc.main(["--help"])
    options = set(re.findall(r"(--[a-z][a-z-]+)", capsys.readouterr().out))
    used = set(re.findall(r"(--[a-z][a-z-]+)", tests_call + nb_call))
    assert used <= options, used - options
    make = _text(ROOT / "Makefile")
    assert re.search(r"^gpu-check:\n\t.*scripts/gpu_check\.py \$\(GPU_CHECK_ARGS\)", make, re.M)
    assert re.search(r"^gpu-probe:\n\t.*-m lora_moe_lab\.instruments\.recorders\.probe", make, re.M)
    # a kept log was written by each call (its third line: the command, with the machine's own $OUT)
    ran = {re.sub(r"--out \S*/(gc|nb) ", r"--out $OUT/\1 ", _text(p).splitlines()[2]).replace("'", '"')
           for p in (ROOT / "data" / "gpu_tests").glob("gpu_check_*.log")}
    assert f"command: {tests_call}" in ran and f"command: {nb_call}" in ran, ran
