"""Build notebooks/NN_*.ipynb from their readable sources notebooks/src/NN_*.py (percent format).

    # %% [markdown]          a markdown cell (lines start with '# ')
    # %% tags=["parameters"] a code cell with tags
    # %%                     a code cell

The .ipynb files are committed without outputs; tests/nb/test_notebooks.py checks they match
(`--check`: exit 1, writing nothing, when one is out of date).
"""
import argparse
import json
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
HDR = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")


def build(src: Path) -> nbformat.NotebookNode:
    cells, cur = [], None
    for line in src.read_text().splitlines():
        m = HDR.match(line)
        if m:
            cur = {"md": bool(m["md"]), "tags": json.loads(m["tags"]) if m["tags"] else [], "lines": []}
            cells.append(cur)
        elif cur is not None:
            cur["lines"].append(line)
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for i, c in enumerate(cells):
        text = "\n".join(c["lines"]).strip("\n")
        if c["md"]:
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines())
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell(text)
        cell.id = f"{src.stem[:2]}-{i:02d}"
        if c["tags"]:
            cell.metadata["tags"] = c["tags"]
        nb.cells.append(cell)
    return nb


def main(check: bool = False) -> int:
    bad = []
    for src in sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")):
        dst = ROOT / "notebooks" / (src.stem + ".ipynb")
        text = nbformat.writes(build(src)) + "\n"
        if check:
            if not dst.exists() or dst.read_text() != text:
                bad.append(dst.name)
        else:
            dst.write_text(text)
    if bad:
        print("out of date (run python scripts/build_notebooks.py):", ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a notebook is out of date")
    raise SystemExit(main(check=ap.parse_args().check))
