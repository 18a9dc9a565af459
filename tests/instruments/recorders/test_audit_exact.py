"""The audit counts what a GPU syncs, and fails only as itself: no phantom sync from its own bookkeeping,
no sync for an empty copy, the audit's own errors named apart from the audited code's, a timeout that
stops a call and keeps what it saw, a named error for every bad input, and entry points that run or
say why. CPU and fast; what a GPU does for the same rules is checked in test_gpu_rules_match_the_debug_mode."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import audit as A
from lora_moe_lab.instruments.recorders import audit_watch as W
from lora_moe_lab.instruments.recorders.audit import (AuditError, AuditInternalError, AuditTimeout, FocusError,
                                                      NotCallableError, audit)

ROOT = Path(__file__).resolve().parents[3]
DEV = "cuda" if runtime.has_cuda() else "cpu"


def _n(fn):  # the CPU rules, on any machine (a GPU's count: test_gpu_rules_match_the_debug_mode)
    return audit(fn, warmup=0, profile=False, device="cpu").count


# --- exact counts ------------------------------------------------------------------------------------
def test_host_tensors_make_no_phantom_sync_and_no_crash():
    d = int(torch.randint(4, 12, ()).item()) * 2
    assert _n(lambda: torch.tensor(5) + 1) == 0  # a 0-d host tensor: no .item() from a membership test
    # a rotary embedding's inverse frequencies: host tensors of several elements, no crash, no sync
    assert _n(lambda: 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))) == 0
    host = torch.arange(d)  # built outside the audit: the audit takes it for a device tensor
    assert _n(lambda: (torch.arange(d) + 1).sum().item()) == 0
    assert _n(lambda: host.sum().item()) == 1


def test_empty_copies_make_no_sync():
    if DEV == "cuda":
        pytest.skip("CPU rules (the GPU's count: test_gpu_rules_match_the_debug_mode)")
    x = torch.randn(int(torch.randint(2, 9, ()).item()))
    assert _n(lambda: torch.tensor([], device=DEV)) == 0
    assert _n(lambda: torch.tensor([1.0], device=DEV)) == 1
    assert _n(lambda: x.new_tensor([])) == 0 and _n(lambda: x.new_tensor([1])) == 1
    assert _n(lambda: torch.zeros(0).to(DEV)) == 0 and _n(lambda: torch.zeros(2).to(DEV)) == 1
    assert _n(lambda: x[:0].cpu()) == 0 and _n(lambda: x[:0].tolist()) == 0 and _n(lambda: x.tolist()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.has_cuda(), reason="needs a CUDA GPU")
def test_gpu_rules_match_the_debug_mode():
    """Each CPU rule above against torch's sync debug mode on the GPU: the audit's count equals it, no
    `other` (an empty upload 0, a one-element upload 1, an empty read-back 0, fp32 _grouped_mm its own)."""
    x = torch.randn(8, device="cuda")
    cases = {
        "empty upload": lambda: torch.tensor([], device="cuda"),
        "one-element upload": lambda: torch.tensor([1.0], device="cuda"),
        "empty .to(device)": lambda: torch.zeros(0).to("cuda"),
        "empty .cpu()": lambda: x[:0].cpu(),
        "empty .tolist()": lambda: x[:0].tolist(),
        ".tolist()": lambda: x.tolist(),
    }
    a = torch.randn(16, 32, device="cuda")
    b = torch.randn(4, 32, 24, device="cuda")
    offs = torch.tensor([4, 8, 12, 16], device="cuda", dtype=torch.int32)
    cases["fp32 _grouped_mm"] = lambda: torch._grouped_mm(a, b, offs=offs)
    cases["bf16 _grouped_mm"] = lambda: torch._grouped_mm(a.bfloat16(), b.bfloat16(), offs=offs)
    for name, fn in cases.items():
        fn()
        rep = audit(fn, warmup=1, profile=False)
        assert rep.debug_mode_count == rep.torch_count and "other" not in rep.kinds and not rep.mismatch, (
            name, rep.summary())
    assert audit(cases["empty upload"], warmup=1, profile=False).torch_count == 0


def test_the_audits_own_failure_is_named_and_not_the_callables(monkeypatch):
    def broken(*a, **k):
        raise KeyError("a rule's bug")

    monkeypatch.setattr(W, "classify_aten", broken)
    x = torch.randn(3)

    def forward():
        try:
            return x + 1
        except Exception:  # a forward that swallows errors cannot hide the audit's own
            return None

    for fn in (lambda: x + 1, forward):
        with pytest.raises(AuditInternalError, match="sync audit's own aten rule failed .*KeyError") as ei:
            audit(fn, warmup=0)
        assert isinstance(ei.value.__cause__, KeyError)
        assert not any("audited callable" in n for n in getattr(ei.value, "__notes__", []))
    assert torch.overrides._get_current_function_mode() is None


def test_the_callables_own_error_passes_unchanged():
    class Mine(Exception):
        pass

    def fwd():
        torch.ones(2).sum()
        raise Mine("the forward's")

    with pytest.raises(Mine, match="the forward's") as ei:
        audit(fwd, warmup=0)
    assert ei.traceback[-1].name == "fwd" and not isinstance(ei.value, AuditError)


# --- the timeout ---------------------------------------------------------------------------------------
def test_timeout_stops_a_pure_python_loop_and_reports_what_it_saw():
    x = torch.randn(4)

    def spins():
        while True:
            x.sum().item()
            try:
                sum(range(50))
            except Exception:  # the deadline is no Exception: this does not swallow it
                pass

    with pytest.raises(AuditTimeout, match=r"audited call 1 did not return within 0\.2 s") as ei:
        audit(spins, warmup=0, timeout_s=0.2, device="cpu")  # returning at all is the stop: the loop never ends
    rep = ei.value.report
    assert rep.count > 0 and set(rep.kinds) == {"item"} and f"{len(rep.events)} sync(s) seen so far" in str(ei.value)
    assert torch.overrides._get_current_function_mode() is None
    assert audit(lambda: x.sum().item(), warmup=1, timeout_s=60, device="cpu").count == 1  # returns: no effect
    with pytest.raises(AuditTimeout, match="warm-up call 1 .* not watched"):
        audit(lambda: [None for _ in iter(int, 1)], warmup=1, timeout_s=0.1)


# --- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,err,msg", [
    (dict(fn=5), NotCallableError, "needs a callable"),
    (dict(fn=print, timeout_s=-1), AuditError, "timeout_s must be a positive"),
    (dict(fn=print, timeout_s=float("nan")), AuditError, "timeout_s must be a positive"),
    (dict(fn=print, focus="no_such_pkg_zz"), FocusError, "no_such_pkg_zz"),
    (dict(fn=None, timeout_s=1), AuditError, "timeout_s needs a callable"),
])
def test_bad_input_is_a_named_error(kw, err, msg):
    with pytest.raises(err, match=msg):
        r = audit(kw.pop("fn"), **kw)
        with r:  # the block form raises on entry
            pass


# --- entry points ------------------------------------------------------------------------------------------
def _run(*argv):
    """`python -m MODULE ARGS` in a child process, as a reader runs it (runpy inside pytest meets pytest's import
    hook, which a plain interpreter never has): (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_module_cli_runs_or_names_its_error(tmp_path):
    mod = tmp_path / "target67.py"
    mod.write_text("import torch\nx = torch.arange(4.)\ndef f():\n    return x[x > 1].sum().item()\n"
                   "def hang():\n    while True:\n        x.sum().item()\n")
    code, out, err = _run("lora_moe_lab.instruments.recorders.audit", f"{mod}:f", "--warmup", "0",
                          "--timeout", "60", "--device", "cpu")
    assert code == 0 and "2 host-device sync(s) per call" in out, err
    code, out, err = _run("lora_moe_lab.audit", f"{mod}:hang", "--warmup", "0", "--timeout", "0.3",
                          "--device", "cpu")
    assert code == 3 and "AuditTimeout" in err and "sync(s) per call" in out, err


def test_cli_bad_input_exit_codes(capsys):
    with pytest.raises(SystemExit) as ei:  # no callable: argparse's usage error, never a silent exit 0
        A.main([])
    assert ei.value.code == 2 and "callable" in capsys.readouterr().err
    for argv, err in ([["no_such_mod_zz:f"], "SpecError"], [["os:sep"], "SpecError"],
                      [["os:getcwd", "--timeout", "-1"], "AuditError"],
                      [["os:getcwd", "--focus", "nope_zz"], "FocusError"]):
        assert A.main(argv) == 2, argv
        assert err in capsys.readouterr().err


def _documented_modules() -> set[str]:
    text = "".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md"),
                                           *ROOT.glob("lora_moe_lab/**/*.py")])
    return set(re.findall(r"python -m (lora_moe_lab(?:\.\w+)*)", text))


def test_every_documented_module_path_has_a_cli():
    """Every `python -m lora_moe_lab...` the docs name is a module with a `__main__` block that calls a
    main: running it can never exit 0 silently (what `-m` of a module without one does)."""
    mods = _documented_modules()
    assert "lora_moe_lab.audit" in mods and len(mods) >= 4
    for m in mods:
        path = ROOT / (m.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / m.replace(".", "/") / "__main__.py"
        assert path.exists(), f"documented `python -m {m}` names no module"
        tree = ast.parse(path.read_text())
        mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert path.name == "__main__.py" or mains, f"`python -m {m}` has no __main__ block: it would exit 0 silently"


# --- the graph-break view ----------------------------------------------------------------------------------
def _masked_sum(x):
    y = x * 2  # sync-free
    z = y[y > 0]  # a data-dependent shape: a sync and a graph break
    return z.sum().item()  # a host read: a sync and a graph break


def test_graph_break_view_maps_breaks_to_sync_sites(monkeypatch):
    """dynamo's explain faked (its first trace costs seconds on a CPU; the real one: the GPU check's test
    below): a break whose user stack passes through a sync site marks that site."""
    import types

    import torch._dynamo as dynamo

    code = _masked_sum.__code__
    mask, item = code.co_firstlineno + 2, code.co_firstlineno + 3
    frame = lambda line: types.SimpleNamespace(filename=code.co_filename, lineno=line)
    fake = types.SimpleNamespace(graph_break_count=3, graph_count=2, break_reasons=[
        types.SimpleNamespace(reason="Dynamic shape operator\n  more", user_stack=[frame(mask)])])
    monkeypatch.setattr(dynamo, "explain", lambda fn: lambda *a, **k: fake)
    rep = audit(_masked_sum, torch.randn(8), warmup=0, graph_breaks=True, device="cpu")
    t = rep.graph_break_table().set_index("site")
    site = next(s for s in t.index if s.endswith(f":{mask}"))
    assert t.loc[site, "breaks_graph"] and t.loc[site, "reason"] == "Dynamic shape operator"
    other = next(s for s in t.index if s.endswith(f":{item}"))
    assert t.loc[other, "breaks_graph"] is None and "unknown: dynamo counted 3" in t.loc[other, "reason"]
    assert "dynamo counted 3 in 2 graph(s) and listed 1, 1 of them at a sync site" in rep.summary()
    fake.graph_break_count = 1  # every break listed: a site on none of their stacks breaks nothing
    rep = audit(_masked_sum, torch.randn(8), warmup=0, graph_breaks=True, device="cpu")
    assert rep.graph_break_table().set_index("site").loc[other, "breaks_graph"] == False  # noqa: E712 (numpy bool)
    with pytest.raises(ValueError, match="graph_breaks=True"):
        audit(_masked_sum, torch.randn(8), warmup=0, device="cpu").graph_break_table()


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.has_cuda(), reason="the GPU check's machine: dynamo's first trace costs seconds")
def test_graph_break_view_with_dynamo():
    rep = audit(_masked_sum, torch.randn(8, device=DEV), warmup=0, profile=False, graph_breaks=True)
    t = rep.graph_break_table()
    assert len(t) == 2 and t["breaks_graph"].all(), rep.summary()
    assert rep.graph_breaks.from_syncs(rep.sites) == len(rep.graph_breaks.breaks) >= 2
