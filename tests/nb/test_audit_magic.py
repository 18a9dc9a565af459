"""%sync_audit / %%sync_audit (nb/audit_magic.py) driven through a real IPython shell, on a tiny forward
with known syncs: x[x > 1] (a boolean mask: 1 shape) and .item() (1 item)."""
import sys
import traceback

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from lora_moe_lab.nb import audit_magic as M

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LINE = M.CPU_LINE if DEV == "cpu" else M.GPU_LINE
SETUP = f"""
import torch
x = torch.arange(4., device="{DEV}")
calls = 0
def f():
    global calls
    calls += 1
    return x[x > 1].sum().item()
def g():
    raise KeyError("from g")
"""


@pytest.fixture(scope="module")
def shell():
    hooks = sys.displayhook, sys.excepthook
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "lora_moe_lab.audit")
    yield ip
    InteractiveShell.clear_instance()
    sys.displayhook, sys.excepthook = hooks


@pytest.fixture
def ip(shell, monkeypatch):
    shown = []
    monkeypatch.setattr(M, "display", shown.append)  # what the magic displays, not rendered
    shell.shown = shown
    assert shell.run_cell(SETUP).success
    return shell


def test_line_magic_returns_the_report_and_shows_table_and_timeline(ip, capsys):
    r = ip.run_cell("rep = %sync_audit f()")
    assert r.success, r.error_in_exec
    rep = ip.user_ns["rep"]
    assert dict(rep.kinds) == {"shape": 1, "item": 1} and rep.count == 2
    assert rep.timed_on == ("CPU" if DEV == "cpu" else "GPU")
    assert ip.user_ns["calls"] == (2 if DEV == "cpu" else 3)  # one warm-up, one audited (+ one profiled)
    out = capsys.readouterr().out
    assert LINE in out and "2 sync(s) per call" in out
    table, fig = ip.shown
    assert isinstance(table, pd.DataFrame) and set(table["kind"]) == {"shape", "item"}
    assert isinstance(fig, go.Figure) and fig.layout.xaxis.title.text


def test_cell_magic_runs_once_and_stores_the_report(ip, capsys):
    r = ip.run_cell("%%sync_audit --no-plot --focus user\ny = f()\nz = f()")
    assert r.success, r.error_in_exec
    rep = ip.user_ns["_sync_audit"]
    assert r.result is rep and dict(rep.kinds) == {"shape": 2, "item": 2}
    assert ip.user_ns["calls"] == 2 and ip.user_ns["y"] == 5.0  # no warm-up, not profiled
    assert LINE in capsys.readouterr().out and len(ip.shown) == 1  # the table only


def test_options(ip, capsys):
    rep = ip.run_line_magic("sync_audit", "--warmup 0 --reps=3 --top 1 --no-plot -- f()")
    assert rep.reps == 3 and rep.count == 2 and ip.user_ns["calls"] == 3 + (DEV == "cuda")
    assert len(ip.shown) == 1 and len(ip.shown[0]) == 1 and "1 more row(s)" in capsys.readouterr().out


def test_split_options_leaves_the_expression_as_written():
    assert M.split_options("--focus user --top=3 --no-plot g('a  b', k=1)") == (
        "--focus user --top=3 --no-plot", "g('a  b', k=1)")
    assert M.split_options("  model(x)") == ("", "model(x)")


@pytest.mark.parametrize("line,names", [("--warmup x f()", "--warmup"), ("--reps 0 f()", "--reps"),
                                        ("--focus no_such_pkg_xyz f()", "--focus"), ("--bogus f()", "--bogus"),
                                        ("--top", "--top"), ("--no-plot", "needs an expression")])
def test_bad_option_is_a_usage_error_naming_it(ip, line, names):
    with pytest.raises(UsageError, match=names):
        ip.run_line_magic("sync_audit", line)
    assert ip.user_ns["calls"] == 0  # nothing ran


def test_an_error_of_the_expression_is_its_own(ip):
    with pytest.raises(KeyError, match="from g") as e:
        ip.run_line_magic("sync_audit", "--no-plot g()")
    assert traceback.extract_tb(e.value.__traceback__)[-1].name == "g"
    r = ip.run_cell("%%sync_audit --no-plot\nraise LookupError('in the cell')")
    assert type(r.error_in_exec) is LookupError
