"""The sync budget plugin (instruments/recorders/audit_pytest.py) driven through pytester: a test over
its budget fails with SyncBudgetExceeded, a sync outside the allowlist too, a stale allow entry with
StaleAllowEntry, a bad budget is a BudgetSpecError; the fixture form counts only its block. The plugin
is loaded with -p (the pytest11 entry point registers it only once the package is installed)."""

import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

MOD = "lora_moe_lab.instruments.recorders.audit_pytest"
ROOT = Path(__file__).resolve().parents[3]

TESTS = '''
import pytest, torch

W = torch.randn(4)  # made outside the test: a device tensor to the CPU count (device="cpu" on any machine)

def forward(x):
    return (W * x).sum()

def guard(x):
    return bool((W > 0).any())  # one sync, intended

@pytest.mark.sync_budget(max_syncs=0, device="cpu")
def test_sync_free():
    forward(W)

@pytest.mark.sync_budget(max_syncs=0, device="cpu")
def test_over_budget():
    forward(W).item()

@pytest.mark.sync_budget(max_syncs=1, device="cpu")
def test_within_budget():
    forward(W).item()

@pytest.mark.sync_budget(max_syncs=0, allow=["test_gate.py:guard"], device="cpu")
def test_allowed_site():
    forward(W)
    guard(W)

@pytest.mark.sync_budget(max_syncs=0, allow=["test_gate.py:guard"], device="cpu")
def test_outside_allowlist():
    guard(W)
    W.tolist()

@pytest.mark.sync_budget(allow=["test_gate.py:guard", "test_gate.py:forward"], device="cpu")
def test_stale_entry():
    guard(W)

@pytest.mark.sync_budget(max_syncs=-1, device="cpu")
def test_negative_budget():
    pass

@pytest.mark.sync_budget(allow=["guard"], device="cpu")
def test_not_a_site():
    pass

def test_fixture(sync_budget):
    W.sum().item()  # outside the block: not counted
    with sync_budget(max_syncs=1, device="cpu"):
        forward(W).item()
    with pytest.raises(AssertionError, match="2 host-device sync"):
        with sync_budget(max_syncs=1, device="cpu"):
            forward(W).item()
            W.tolist()
'''


def test_the_gate_fails_over_budget_outside_the_allowlist_and_on_stale_entries(pytester):
    lines = pytester.makepyfile(test_gate=TESTS).read_text().splitlines()
    item, tolist = lines.index("    forward(W).item()") + 1, lines.index("    W.tolist()") + 1
    r = pytester.runpytest("-p", MOD, "-q", "--tb=line", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=4, failed=5)
    out = r.stdout.str()
    for err in [f"SyncBudgetExceeded: 1 host-device sync(s) outside the allowlist, budget 0: test_gate.py:{item} x1",
                f"SyncBudgetExceeded: 1 host-device sync(s) outside the allowlist, budget 0: test_gate.py:{tolist} x1",
                "StaleAllowEntry: allow entry ['test_gate.py:forward'] matched no sync",
                "BudgetSpecError: sync_budget max_syncs must be an int >= 0, got -1",
                "BudgetSpecError: sync_budget allow: allowlist entry 'guard' is not a site"]:
        assert err in out, (err, out[-3000:])


def test_the_entry_point_names_the_plugin():
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert eps == {MOD: MOD}
    assert (ROOT / (MOD.replace(".", "/") + ".py")).exists()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_budget_counts_with_the_debug_mode():
    import torch

    from lora_moe_lab.instruments.recorders.audit_pytest import SyncBudgetExceeded, budget

    x = torch.randn(4, device="cuda")
    with budget(max_syncs=1) as b:
        x.sum().item()
    assert "debug mode" in b.counted_by and len(b.syncs) == 1, b
    with pytest.raises(SyncBudgetExceeded, match="debug mode"):
        with budget(max_syncs=0):
            x.sum().item()
    with budget(max_syncs=0, allow=["test_audit_pytest.py:test_gpu_budget_counts_with_the_debug_mode"]):
        x.max().item()
