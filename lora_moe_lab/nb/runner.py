"""`make run` / `make lab`: execute every notebook headless with papermill on the detected device
into build/ (plus an offline HTML report), or start JupyterLab on loopback with a token.

    python -m lora_moe_lab.nb.runner --out build            # all notebooks, params by device
    python -m lora_moe_lab.nb.runner --only 01 --params ci  # one notebook, CI parameters
    python -m lora_moe_lab.nb.runner --lab --port 8888
"""
from __future__ import annotations

import argparse
import html
import os
import secrets
import sys
import time
from pathlib import Path

import yaml

from ..provenance import ROOT

NB_DIR = ROOT / "notebooks"


def notebooks(only: list[str] | None = None) -> list[Path]:
    nbs = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        nbs = [p for p in nbs if any(p.name.startswith(o) for o in only)]
        if not nbs:
            raise SystemExit(f"no notebook matches {only}; have {[p.name for p in sorted(NB_DIR.glob('*.ipynb'))]}")
    return nbs


def params_for(kind: str) -> dict:
    if kind == "auto":
        from .. import runtime
        kind = "gpu" if runtime.has_cuda() else "ci"
    path = NB_DIR / "params" / f"{kind}.yaml"
    if not path.exists():
        raise SystemExit(f"no parameter file {path}")
    return yaml.safe_load(path.read_text()) or {}


def execute(nb: Path, out_dir: Path, params: dict, timeout: int = 1800) -> Path:
    import papermill as pm

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / nb.name
    pm.execute_notebook(str(nb), str(out), parameters=params, cwd=str(NB_DIR), kernel_name="python3",
                        progress_bar=False, execution_timeout=timeout, log_output=False)
    return out


PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _with_plotly_html(nb):
    """A copy of the notebook whose plotly outputs also carry an HTML rendering that draws the
    figure with a page-level plotly.js (nbconvert's HTML does not render the plotly mimetype)."""
    import copy

    import plotly.io as pio

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get(PLOTLY_MIME)
            if fig is not None:
                out["data"]["text/html"] = pio.to_html(dict(fig), include_plotlyjs=False, full_html=False,
                                                       validate=False)
    return nb


def html_report(executed: list[Path], out_dir: Path) -> Path:
    """One HTML page per notebook + an index, all reading ONE local copy of plotly.js that sits
    beside them (readable offline; no page embeds the library)."""
    import nbformat
    import plotly
    from nbconvert import HTMLExporter

    exporter = HTMLExporter()
    exporter.exclude_input_prompt = True
    html_dir = out_dir / "html"
    html_dir.mkdir(parents=True, exist_ok=True)
    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    (html_dir / "plotly.min.js").write_bytes(js.read_bytes())
    links = []
    for p in executed:
        body, _ = exporter.from_notebook_node(_with_plotly_html(nbformat.read(str(p), as_version=4)))
        body = body.replace("<head>", '<head>\n<script src="plotly.min.js"></script>', 1)
        (html_dir / (p.stem + ".html")).write_text(body)
        links.append(f'<li><a href="{p.stem}.html">{html.escape(p.stem)}</a></li>')
    index = html_dir / "index.html"
    index.write_text("<!doctype html><meta charset='utf-8'><title>lora_moe_lab report</title>"
                     "<h1>lora_moe_lab: executed notebooks</h1><ul>" + "".join(links) + "</ul>"
                     f"<p>Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>")
    return index


def lab(port: int) -> None:
    token = os.environ.get("LAB_TOKEN") or secrets.token_hex(16)
    print(f"JupyterLab: http://127.0.0.1:{port}/lab?token={token}", flush=True)
    args = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
            "--allow-root", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={NB_DIR}"]
    os.execv(sys.executable, args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build", help="folder for executed notebooks and the HTML report")
    ap.add_argument("--params", default="auto", help="parameter set: auto (gpu when CUDA, else ci), ci, gpu")
    ap.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 01 03")
    ap.add_argument("--no-html", action="store_true")
    ap.add_argument("--lab", action="store_true", help="start JupyterLab instead")
    ap.add_argument("--port", type=int, default=8888)
    a = ap.parse_args(argv)
    if a.lab:
        lab(a.port)
        return 0
    out = Path(a.out).resolve()
    params = params_for(a.params)
    done = []
    for nb in notebooks(a.only):
        t0 = time.time()
        print(f"running {nb.name} ...", flush=True)
        done.append(execute(nb, out, params.get(nb.stem, {})))
        print(f"  ok in {time.time() - t0:.1f} s -> {done[-1]}")
    if not a.no_html:
        print(f"HTML report: {html_report(done, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
