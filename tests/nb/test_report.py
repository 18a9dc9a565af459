"""The offline report (nb/runner.py): what each notebook shows, where and when it ran, nothing
loaded from the network, widgets as a note beside their static snapshot, kernels over IPC."""
import json
import re

import nbformat
import pytest

from lora_moe_lab.nb import runner

NETWORK = [r"<script[^>]+src=[\"']?(https?:)?//", r"<link[^>]+href=[\"']?(https?:)?//", r"import\(\s*[\"']https?://",
           r"url\(\s*[\"']?https?://", r"\.src\s*=\s*[\"']https?://", r"require\.min\.js", r"mathjax"]


def _nb(tmp_path, name="01_demo", error=False):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 01 · A demo\n\n**Goal.** See `cpu_flag` beat **sync**.\n\nMore."),
                nbformat.v4.new_code_cell("panel")]
    fig = {"data": [{"type": "scatter", "x": [1, 2], "y": [3, 4]}],
           "layout": {"title": {"text": "t"}, "xaxis": {"title": {"text": "M"}}, "yaxis": {"title": {"text": "ms"}}}}
    outs = [nbformat.v4.new_output("display_data", data={runner.WIDGET_MIME: {"model_id": "abc", "version_major": 2},
                                                         "text/plain": "VBox(...)"}),
            nbformat.v4.new_output("display_data", data={runner.PLOTLY_MIME: fig})]
    if error:
        outs.append(nbformat.v4.new_output("error", ename="LessonError", evalue="M=4096: sync 62 ms", traceback=[]))
    nb.cells[1].outputs = outs
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    nb.metadata["lora_moe_lab"] = {"device": "NVIDIA H200", "params": "gpu", "commit": "abc1234"}
    nb.metadata["papermill"] = {"start_time": "2026-12-01T10:00:00.5", "duration": 42.0}
    p = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, str(p))
    return p


def test_report_loads_nothing_from_the_network(tmp_path):
    index = runner.html_report([_nb(tmp_path), _nb(tmp_path, "02_demo", error=True)], tmp_path)
    for page in sorted((tmp_path / "html").glob("*.html")):
        text = page.read_text()
        hits = [pat for pat in NETWORK if re.search(pat, text, re.I)]
        assert not hits, f"{page.name} loads from the network: {hits}"
    page = (tmp_path / "html" / "01_demo.html").read_text()
    assert runner.WIDGET_NOTE in page and "widget-view+json" not in page and "Plotly.newPlot" in page
    idx = index.read_text()
    assert "01 · A demo" in idx and "See <code>cpu_flag</code> beat <b>sync</b>." in idx
    assert "NVIDIA H200" in idx and "2026-12-01 10:00:00 UTC" in idx and "42 s" in idx
    assert "ran to the end" in idx and "FAILED: LessonError: M=4096" in idx


def test_describe_reads_title_and_goal():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 09 · X\n\n**Goal.** One\nline.\n\nNot this.")]
    assert runner.describe(nb) == ("09 · X", "One line.")


@pytest.mark.notebook
def test_run_all_keeps_going_records_and_uses_ipc(tmp_path, capfd):
    good, bad = tmp_path / "91_ok.ipynb", tmp_path / "92_fails.ipynb"
    for p, src in ((good, "print('fine')"), (bad, "raise ValueError('on purpose')")):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(src)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, str(p))
    out = tmp_path / "out"
    recs = runner.run_all([good, bad], out, "ci", keep_going=True)
    assert [r["status"] for r in recs] == ["passed", "failed"] and "on purpose" in recs[1]["error"]
    assert json.loads((out / "run.json").read_text()) == recs and recs[0]["bytes"] > 0
    assert nbformat.read(str(out / good.name), as_version=4).metadata["lora_moe_lab"]["params"] == "ci"
    assert "without encryption" not in capfd.readouterr().err
    with pytest.raises(Exception, match="on purpose"):
        runner.run_all([bad], tmp_path / "out2", "ci")


def test_kernel_sockets_live_in_a_folder_of_this_process_only():
    # jupyter_client's default IPC path, kernel-ipc-N in the working directory, is shared by every run in the same
    # folder: two runs at once (pytest-xdist on the H200, b657583) could pick the same N and a kernel failed to start
    import os

    ip = runner.kernel_config().KernelManager.ip
    assert os.path.isabs(ip) and os.path.isdir(os.path.dirname(ip)) and not ip.startswith(str(runner.NB_DIR))
    assert runner.kernel_config().KernelManager.ip == ip  # one folder per process, reused by its notebooks
    assert len(ip) + len("-100") < 100  # a Unix socket path's limit is about 107 bytes
