"""Notebook hygiene and execution: committed without outputs, a `parameters` cell, sources in
sync, every notebook runs under papermill with the CI parameters, bad parameters fail clearly."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NBS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CI_PARAMS = yaml.safe_load((ROOT / "notebooks" / "params" / "ci.yaml").read_text())


def test_there_are_notebooks():
    assert NBS, "no notebooks found"


@pytest.mark.parametrize("nb", NBS, ids=lambda p: p.stem)
def test_committed_clean_with_parameters_cell(nb):
    cells = json.loads(nb.read_text())["cells"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in cells if c["cell_type"] == "code"), \
        f"{nb.name} is committed with outputs"
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells), f"{nb.name}: no parameters cell"
    assert nb.stem in CI_PARAMS, f"{nb.name} has no entry in notebooks/params/ci.yaml"


@pytest.mark.parametrize("nb", NBS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter(nb):
    """papermill reads the parameters cell itself (a line with a second "=", even in its comment, is skipped with a
    warning), so every name the cell assigns must be one papermill sees, and every CI parameter one of them."""
    import ast

    import papermill as pm

    cell = next(c for c in json.loads(nb.read_text())["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    assigned = {t.id for n in ast.parse("".join(cell["source"])).body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}
    seen = set(pm.inspect_notebook(str(nb)))
    assert assigned <= seen, f"{nb.name}: papermill does not read {sorted(assigned - seen)}"
    assert set(CI_PARAMS[nb.stem] or {}) <= seen, f"{nb.name}: ci.yaml passes {sorted(set(CI_PARAMS[nb.stem]) - seen)}"


def test_sources_and_notebooks_in_sync():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _run(nb, params, tmp_path, km=None):
    import papermill as pm

    from lora_moe_lab.nb.runner import kernel_config

    return pm.execute_notebook(str(nb), str(tmp_path / nb.name), parameters=params, cwd=str(nb.parent),
                               kernel_name="python3", progress_bar=False, execution_timeout=900,
                               config=kernel_config(), km=km)  # IPC: no "running over TCP" warning


@pytest.mark.parametrize("nb", [p for p in NBS if p.stem[:2] in ("01", "02", "03", "04")], ids=lambda p: p.stem)
def test_live_lesson_cells_are_tagged(nb):
    """make gpu-check reports what the cells tagged `lesson` printed: each notebook has its check there."""
    cells = json.loads(nb.read_text())["cells"]
    lesson = [c for c in cells if "lesson" in c.get("metadata", {}).get("tags", [])]
    assert lesson and all(c["cell_type"] == "code" for c in lesson), f"{nb.name}: no cell tagged lesson"
    assert any("assert" in "".join(c["source"]) or ".check()" in "".join(c["source"]) for c in lesson), nb.name


@pytest.mark.notebook
@pytest.mark.parametrize("nb", NBS, ids=lambda p: p.stem)
def test_executes_with_ci_params(nb, tmp_path):
    _run(nb, CI_PARAMS[nb.stem], tmp_path)
    out = tmp_path / nb.name
    assert out.stat().st_size < 1_000_000, f"{nb.name} executed is {out.stat().st_size} bytes (limit 1 MB)"
    assert "plotly.js v" not in out.read_text(), f"{nb.name} embeds plotly.js"
    assert not _untitled_axes(out), f"{nb.name}: figures without axis titles {_untitled_axes(out)}"


def _untitled_axes(executed: Path) -> list[str]:
    """Every axis a figure's traces use must have a title: (cell, figure title, axis) of those that do not."""
    bad = []
    for i, cell in enumerate(json.loads(executed.read_text())["cells"]):
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
            if not fig:
                continue
            layout = fig.get("layout", {})
            used = {f"{ax}axis{t.get(ax + 'axis', ax)[1:]}" for t in fig.get("data", [])
                    if t.get("type") not in ("pie", "table") for ax in ("x", "y")}
            bad += [(i, (layout.get("title") or {}).get("text", "")[:40], a) for a in sorted(used)
                    if not ((layout.get(a) or {}).get("title") or {}).get("text")]
    return bad


BAD_PARAMS = [("01_sync_bubble", {"preset": "qwen9"}, "bad notebook parameter preset"),
              ("01_sync_bubble", {"guards": ["sync", "sometimes"]}, "bad notebook parameter guards"),
              ("01_sync_bubble", {"num_layer": 3}, "bad notebook parameter num_layer: unknown"),
              ("02_kernel_early_exit", {"num_tokens": 0}, "bad notebook parameter num_tokens"),
              ("02_kernel_early_exit", {"max_loras": 2}, "bad notebook parameter max_loras"),
              ("03_cuda_graph_capture", {"tokens_per_request": -1}, "bad notebook parameter tokens_per_request"),
              ("04_live_microbenchmarks", {"tokens": 100}, "bad notebook parameter tokens"),
              ("04_live_microbenchmarks", {"guard": "sometimes"}, "bad notebook parameter guards"),
              ("05_scale_model", {"transform": "fix_it"}, "bad notebook parameter transform"),
              ("05_scale_model", {"fit_iters": 100}, "bad notebook parameter fit_iters: unknown"),
              ("06_production_effect", {"chunk": 12}, "bad notebook parameter chunk"),
              ("06_production_effect", {"adapter_modes": ["some"]}, "bad notebook parameter adapter_modes"),
              ("06_production_effect", {"chunks": 16}, "bad notebook parameter chunks: unknown"),
              ("07_hidden_syncs", {"live_reps": 5}, "bad notebook parameter live_reps")]


@pytest.fixture(scope="module")
def parameter_kernel():
    """One kernel (per worker) for the bad-parameter runs: each stops in its notebook's first code cell, at the
    checks after the imports, so a kernel of its own would only repeat the kernel's start and the same imports.
    (The notebooks' full runs, above, each get a fresh kernel.) A kernel that died is started again."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.utils import run_sync

    from lora_moe_lab.nb.runner import kernel_config

    class Shared(AsyncKernelManager):
        clients = []

        def client(self, **kw):  # each run's client, closed after the run (the kernel stays)
            kc = super().client(**kw)
            self.clients.append(kc)
            return kc

    km = Shared(kernel_name="python3", config=kernel_config())

    def close_clients():
        while km.clients:
            km.clients.pop().stop_channels()

    def get():
        close_clients()
        if not run_sync(km.is_alive)():
            run_sync(km.start_kernel)(cwd=str(ROOT / "notebooks"))
        return km

    yield get
    close_clients()
    if km.has_kernel:
        run_sync(km.shutdown_kernel)(now=True)


@pytest.mark.notebook
@pytest.mark.parametrize("stem,params,msg", BAD_PARAMS,
                         ids=lambda v: v if isinstance(v, str) and v[:2].isdigit() else None)
def test_bad_parameter_fails_clearly(stem, params, msg, tmp_path, parameter_kernel):
    import papermill as pm

    nb = ROOT / "notebooks" / f"{stem}.ipynb"
    with pytest.raises(pm.PapermillExecutionError, match=msg):
        _run(nb, {**CI_PARAMS[nb.stem], **params}, tmp_path, km=parameter_kernel())


def test_report_reads_one_local_plotly_js(tmp_path):
    import nbformat
    import plotly.graph_objects as go
    import plotly.io as pio

    from lora_moe_lab.nb.runner import html_report

    nb = nbformat.v4.new_notebook()
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout=dict(xaxis_title="M", yaxis_title="ms"))
    cell = nbformat.v4.new_code_cell("fig")
    fig_json = json.loads(pio.to_json(fig, validate=False))
    cell.outputs = [nbformat.v4.new_output("display_data", data={"application/vnd.plotly.v1+json": fig_json})]
    nb.cells = [cell]
    p = tmp_path / "01_x.ipynb"
    nbformat.write(nb, str(p))
    html_report([p], tmp_path)
    page = (tmp_path / "html" / "01_x.html").read_text()
    assert (tmp_path / "html" / "plotly.min.js").stat().st_size > 1_000_000  # the library, once, beside the pages
    assert '<script src="plotly.min.js"></script>' in page and "Plotly.newPlot" in page
    assert len(page) < 1_500_000 and "plotly.js v" not in page
