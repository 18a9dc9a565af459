"""The guard registry: one place to add a guard. A fourth guard registered in a test appears in
the benchmark CLI's choices, the simulator, the widget's options and the figure colours with no
other edit; the model runs it and it gives the same output as the other three."""
import os
import re
import time

import pytest
import torch

from lora_moe_lab import sim
from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.recorders import bench
from lora_moe_lab.model.guards import (Guard, count_guard_syncs, get_guard, guard_color, guard_names,
                                       register_guard, unregister_guard)
from lora_moe_lab.model.lab import build_lab


@pytest.fixture
def fourth_guard():
    @register_guard
    class AskTwiceGuard(Guard):
        """Asks the device like `sync` but always launches: a sync for nothing."""
        name, color, device_check = "ask_then_launch", "#9467bd", True

        def decide(self, any_active: bool) -> bool:
            return True

    yield AskTwiceGuard
    unregister_guard(AskTwiceGuard.name)


def test_builtin_guards_are_registered_in_order():
    assert guard_names()[:3] == ("sync", "cpu_flag", "launch_always")
    assert get_guard("sync").device_check and not get_guard("cpu_flag").device_check
    with pytest.raises(ValueError, match="unknown guard 'nope'"):
        get_guard("nope")
    with pytest.raises(TypeError):
        register_guard(int)


def test_a_fourth_guard_appears_everywhere(fourth_guard):
    name = fourth_guard.name
    assert name in guard_names() and guard_color(name) == "#9467bd"
    # benchmark CLI: the --guards choices and the sweep validation
    args = bench.build_parser().parse_args(["sweep", "--guards", name, "--out", "x.csv"])
    assert args.guards == [name]
    bench.SweepSpec(presets=["tiny"], guards=[name], device="cpu").resolved()
    # simulator: one reduction + one sync per site, and the LoRA steps always (decide -> True)
    spec = sim.layer_spec(get_shape("tiny"), 16, name, active=0.0)
    names = [s[0] for s in spec]
    assert names.count("lora_any.item") == 1 and "lora_gate_up" in names
    r = sim.simulate_forward("tiny", 16, name, layers=3, active=0.0)
    assert r.syncs == 3
    assert name in set(sim.what_if(values=[5.0], layers=2, tokens=16).guard)
    # widgets: the guard dropdown and the simulated curve
    pytest.importorskip("ipywidgets")
    from lora_moe_lab.ui import widgets

    p = widgets.BenchPanel(live=False, defaults=dict(preset="tiny", layers=2, tokens=16))
    assert name in p.controls["guard"].options
    assert name in set(widgets.simulated_curve(sim.CostModel(), "tiny", 2, 0.0, 16, "eager", tokens=(16,)).guard)


def test_the_model_runs_a_fourth_guard_with_the_same_output(fourth_guard):
    lab = build_lab("tiny", num_layers=2)
    lab.pool.load("a", rank=8)
    x = lab.random_input(8)
    batch, tensors = lab.make_batch(["a", None], [3, 5])
    ref = lab.model(x, batch, tensors, guard="cpu_flag")
    with count_guard_syncs() as c:
        y = lab.model(x, batch, tensors, guard=fourth_guard.name)
    assert c.count == 2 and torch.equal(y, ref)


def test_each_sync_guard_sync_is_recorded_with_its_guard_site_and_time():
    """One SyncEvent per `.item()` of the sync guard: the guard's name, the line of the `.item()` in guards.py, the
    host time blocked (>= 0), and the process-wide total counts each once. The site is the line that records it,
    next to the `.item()`."""
    import inspect

    from lora_moe_lab.model import guards

    line = next(i for i, s in enumerate(inspect.getsourcelines(guards)[0], 1) if "_record(self.name" in s)
    lab = build_lab("tiny", num_layers=3)
    lab.pool.load("a", rank=4)
    batch, tensors = lab.make_batch(["a"], [2])
    before = guards.total_guard_syncs()
    x = lab.random_input(2)
    t0 = time.perf_counter_ns()
    with guards.guard_sync_events() as events, count_guard_syncs() as c:
        lab.model(x, batch, tensors, guard="sync")
    elapsed = time.perf_counter_ns() - t0
    assert c.count == len(events) == 3 and guards.total_guard_syncs() - before == 3
    sites = {f"guards.py:{line}"}
    if "MUTANT_UNDER_TEST" in os.environ:  # mutmut calls each function through its trampoline: its caller is there
        from mutmut.mutation import trampoline

        src = inspect.getsourcelines(trampoline)[0]
        sites = {f"trampoline.py:{i}" for i, s in enumerate(src, 1) if re.search(r"return (orig|mutated)_func\(", s)}
    assert len({e.site for e in events}) == 1 and {e.guard for e in events} == {"sync"}
    assert events[0].site in sites, (events[0].site, sites)
    assert all(isinstance(e.blocked_ns, int) and 0 <= e.blocked_ns <= elapsed for e in events)  # inside the forward


def test_unregister_removes_only_that_guard_and_ignores_an_unknown_name(fourth_guard):
    before = guard_names()
    unregister_guard("no_such_guard")  # nothing to remove: no error
    assert guard_names() == before
    unregister_guard(fourth_guard.name)
    assert guard_names() == tuple(n for n in before if n != fourth_guard.name)
    with pytest.raises(ValueError, match="unknown guard"):
        get_guard(fourth_guard.name)


def test_registration_refuses_what_is_not_a_named_guard():
    from lora_moe_lab.model.guards import CpuFlagGuard, SyncGuard

    for name in ("", "base"):  # a guard needs a name of its own
        cls = type("Nameless", (Guard,), {"name": name})
        with pytest.raises(TypeError, match="register_guard takes a Guard subclass with its own name"):
            register_guard(cls)
        assert name not in guard_names()
    assert register_guard(SyncGuard) is SyncGuard and guard_names()[:3] == ("sync", "cpu_flag", "launch_always")
    impostor = type("Impostor", (Guard,), {"name": "cpu_flag"})
    with pytest.raises(ValueError, match=r"a guard named 'cpu_flag' is already registered \(CpuFlagGuard\)"):
        register_guard(impostor)
    assert isinstance(get_guard("cpu_flag"), CpuFlagGuard)
    assert guard_color("no_such_guard") == Guard.color == "#7f7f7f" and guard_color("sync") == "#d62728"
