"""Every figure a reader sees comes from data: a number in prose (README.md, docs/, data/*/README.md,
studies/*/README.md and the notebooks' markdown cells, read from their sources notebooks/src/*.py) sits inside
a rendered block (`<!-- begin:NAME -->` ... `<!-- end:NAME -->`, written by scripts/readme_tables.py from the
studies' block.py), in a code span or code block (a command, a parameter, a unit), in a link's target, or is a
structural constant named in STRUCTURAL below. Anything else is a hand-typed figure that drifts from the
recordings: this test names its file, line and token. Fix it at its source: a block from data, or a sentence
without the number."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_POW2 = "|".join(str(2 ** k) for k in range(1, 17))
# token pattern (the whole token must match) -> why it is not a measurement
STRUCTURAL = {
    r"([0-9]|10)(-[a-z]+)?": "a small count or ordinal (steps, parts, sessions), a limit such as a 10-minute call",
    r"0[1-7]": "a notebook's number (notebooks/NN_*.ipynb)",
    rf"(M|C|N|K|BM|BN|BK)?=?(rank-)?({_POW2})(-[a-z]+)?": "a power of two: a shape, tile, rank or token count chosen",
    r"48(-layer)?|260|260/48|5\.42|128|top-8|24|768|192|w13|w2": "the model's structure: 48 layers, 128 experts, "
        "top-8 routing, intermediate 768 (192 a TP=4 rank), weights w13/w2; production's 260 guard sites; the "
        "smallest card, 24 GB",
    r"95|2\.5|97\.5": "the interval's level and its percentiles",
    r"TP=[1248]|tp[1248]": "a tensor-parallel degree",
    r"H[12]00s?|80GB|HBM3|sm_90|L2|A100": "a GPU's name",
    r"[Qq]wen3[A-Za-z0-9.-]*|Qwen3\.5-35B(-A3B)?": "a model's name",
    r"((b?f|fp|float|int|tf|bfloat)(16|32|64|8)/?)+|non-bf16": "a dtype",
    r"s[1-9]|[a-z]+_s\d+[a-z]?|python3|0-d|1-d|2-d|[23]D|2-core|W1S|O\(1\)|top-\d|p50|tp[14]-[a-z]+|tp1_[a-z]+":
        "a session label, a block or file's name, a program, a tensor's rank",
    r"(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}": "a commit (7 or more hex digits)",
    r"\d{4}-\d{2}-\d{2}": "a recording's date",
    r"([\w.-]+/)?[\w.-]+#\d+": "a pull request, quoted beside its repository",
    r"\d+\.\d+\.\d+": "a version",
    r"\de-\d+(-level)?": "a tolerance the tests use (ops/reference.py)",
    r"10,000": "the bootstrap's resamples (instruments/analysers/stats.py)",
    r"(19|20)\d\d|1/n": "a cited paper's year; a share written as a fraction",
    r"[-−]1": "the sentinel -1 (no adapter, no slot)",
}
# A paragraph quoting a pull request (owner/repo#N, sglang#N) may quote that source's own figures beside it: an
# external constant, not the lab's measurement.
EXTERNAL = re.compile(r"[\w.-]+#\d{3,}")
_ALLOWED = re.compile("|".join(f"(?:{p})" for p in STRUCTURAL))

_BLOCK = re.compile(r"<!-- begin:([\w-]+) -->.*?<!-- end:\1 -->", re.S)
_FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.S | re.M)
_INDENTED = re.compile(r"(?<=\n\n)(?: {4}.*(?:\n|$))+")  # an indented code block after a blank line
_SCRUB = [_BLOCK, _FENCE, _INDENTED, re.compile(r"<!--.*?-->", re.S), re.compile(r"<a [^>]*></a>"),
          re.compile(r"`[^`]+`"), re.compile(r"\]\([^)\n]*\)"), re.compile(r"https?://\S+"),
          re.compile(r"^ *\d+\. ", re.M)]
_TOKEN = re.compile(r"[^\s]*\d[^\s]*")
_RANGE = re.compile(r"(?<=\d)[–-](?=[+−-]?\d)")  # 1–4, 2.5–97.5: each end is a figure
_TRIM = "()[]{},;:.*_\"'!?—–"


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group(0))  # keeps line numbers


def scrub(text: str) -> str:
    """The prose a reader reads as figures: blocks, code, comments, anchors, link targets and list numbers blanked."""
    for pat in _SCRUB:
        text = pat.sub(_blank, text)
    return text


def notebook_markdown(src: Path) -> str:
    """A notebook source's markdown cells (notebooks/src, percent format), other lines blanked."""
    out, md = [], False
    for line in src.read_text().splitlines():
        if line.startswith("# %%"):
            md = "[markdown]" in line
            out.append("")
        else:
            out.append(re.sub(r"^# ?", "", line) if md else "")
    return "\n".join(out)


def prose_files() -> list[Path]:
    md = ([ROOT / "README.md", ROOT / "studies" / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
          + sorted(ROOT.glob("data/*/README.md")) + sorted(ROOT.glob("studies/*/README.md")))
    return md + sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def _allowed(tok: str) -> bool:
    t = tok.strip(_TRIM).removesuffix("'s").removesuffix("×").removesuffix("%").strip(_TRIM).lstrip("~±")
    return not t or bool(_ALLOWED.fullmatch(t))


def stray_figures(text: str) -> list[tuple[int, str]]:
    """(line, token) of every number outside a block that no STRUCTURAL pattern allows."""
    found = []
    raws, cited, para = text.splitlines(), set(), []
    for i, raw in enumerate(raws + [""], 1):  # the paragraphs (runs of non-blank lines) that cite a source
        if raw.strip():
            para.append(i)
        else:
            cited |= set(para) if any(EXTERNAL.search(raws[j - 1]) for j in para) else set()
            para = []
    for i, line in enumerate(scrub(text).splitlines(), 1):
        if i in cited:
            continue
        for tok in _TOKEN.findall(line):
            if not all(_allowed(part) for part in ([tok] if _allowed(tok) else _RANGE.split(tok))):
                found.append((i, tok))
    return found


def test_every_figure_in_prose_is_rendered_from_data():
    bad = []
    for p in prose_files():
        text = notebook_markdown(p) if p.suffix == ".py" else p.read_text()
        bad += [f"{p.relative_to(ROOT)}:{i}: {tok}" for i, tok in stray_figures(text)]
    assert not bad, (f"{len(bad)} figures typed by hand outside a rendered block (a block from data, or drop the "
                     "number; a structural constant goes in STRUCTURAL with its reason):\n" + "\n".join(bad))


def test_the_rule_catches_what_it_is_for():
    caught = ["median 79 s (min 74)", "1.36 there against 1.33", "1837 passed", "the notebooks 190 s",
              "0.84× LoRA-off", "+14.4 % input throughput", "79–148 µs", "2–47 layers",
              "at M = 1000 tokens", "-5 syncs", "took 100 ms", "a 3a step"]
    for line in caught:
        assert stray_figures(line), line
    passed = ["48 layers, 260 syncs per forward", "<!-- begin:x -->79 s<!-- end:x -->", "`timing_reps = 10`",
              "H200 and H100 at TP=4, bf16", "commit b57f449",
              "at 18aa1385324c0d4b56588a4665fec99e2c7dd5ac", "sgl-project/sglang#25531", "M = 4096 tokens",
              "[the log](data/gpu_tests/x_1837.log)", "the 95 % interval", "```\n1.36\n```",
              "+14.4 % input throughput (sgl-project/sglang#25531)", "slots 1–4, -1 for none"]
    for line in passed:
        assert not stray_figures(line), (line, stray_figures(line))
