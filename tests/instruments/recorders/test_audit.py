"""The sync audit: exactly the guard's syncs in the lab's 48-layer forwards (none for the fixes), every
hidden-sync pattern found with its kind and its rewrite clean and equal, bad inputs named. CPU and fast;
the GPU tests (profiled run, GPU idle, replay saving) run in the GPU check."""

import inspect
import math
import os
import time
import warnings

import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import hidden_syncs as HS
from lora_moe_lab.instruments.recorders import syncs
from lora_moe_lab.audit import main
from lora_moe_lab.instruments.recorders.audit import AuditError, NoCudaWork, SpecError, audit, classify, resolve
from lora_moe_lab.model import guards


def gpu(f):
    return pytest.mark.gpu(pytest.mark.skipif(not runtime.has_cuda(), reason="needs a CUDA GPU")(f))


DEV = "cuda" if runtime.has_cuda() else "cpu"
WARM = 1 if DEV == "cuda" else 0  # on a GPU the caching allocator grows in a first call (kind "allocator")
_GUARD_LINE = next(i for i, l in enumerate(inspect.getsourcelines(guards)[0], 1) if "flag.item()" in l)
GUARD_SITE = f"lora_moe_lab/model/guards.py:{_GUARD_LINE}"


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """Tiny CPU ops on several OpenMP threads spin against each other on a loaded 2-core machine (a
    48-layer forward then takes 10 s instead of 0.1 s): one thread for this module's CPU runs."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _kinds(rep):
    """The classified kinds (on a GPU torch's debug mode may see more syncs inside one call: "other")."""
    return {k: n for k, n in rep.kinds.items() if not (DEV == "cuda" and k == "other")}


def _lab(kind):
    from lora_moe_lab.model.decoder import build_decoder_lab
    from lora_moe_lab.model.lab import build_lab

    build = build_lab if kind == "moe" else build_decoder_lab
    lab = build("tiny", num_layers=48, device=DEV, backend="torch", seed=0)
    lab.pool.load("a0", rank=4)
    batch, tensors = lab.make_batch(adapters=[None, "a0"], token_counts=[3, 5])
    return lab, batch, tensors, lab.random_input(8, seed=0)


@pytest.fixture(scope="module", params=["moe", "decoder"])
def lab48(request):
    return _lab(request.param)


@pytest.mark.parametrize("guard", ["sync", "cpu_flag", "launch_always"])
def test_lab_forward_finds_exactly_the_guards_syncs(lab48, guard):
    lab, batch, tensors, x = lab48
    with syncs.count_syncs() as ref:  # the library's own guard counter over one forward: the ground truth
        lab.model(x, batch, tensors, guard=guard)
    rep = audit(lab.model, x, batch, tensors, guard=guard, warmup=WARM, reps=1, profile=False)
    if guard == "sync":
        assert rep.count == 48 == ref.guard_count
        assert rep.sites == {GUARD_SITE: 48} and rep.kinds == {"item": 48}
        row = rep.table().iloc[0]
        assert row["function"] == "Guard.active" and row["count_per_call"] == 48
    else:
        assert rep.count == 0 and ref.guard_count == 0 and len(rep.table()) == 0


@pytest.mark.parametrize("name", HS.names())
def test_every_pattern_found_with_its_kind_and_rewrite_is_clean(name):
    case = HS.build(name, HS.Size.smoke(), DEV)
    rep = audit(case.original, warmup=WARM, profile=False)
    # on a GPU torch's debug mode may see one more sync inside a call at the same site (kind "other")
    kinds = {k: n for k, n in rep.kinds.items() if not (DEV == "cuda" and k == "other")}
    assert set(kinds) == HS.KINDS_SEEN[name], rep.summary()
    if case.per_forward is not None:
        assert sum(kinds.values()) == case.per_forward
    else:  # the allocator: at least the empty_cache call of every layer
        assert rep.count >= case.size.layers
    assert all(s.startswith("lora_moe_lab/instruments/recorders/hidden_syncs.py:") for s in rep.sites)
    assert audit(case.rewrite, warmup=WARM, profile=False).count == 0
    same, err = HS.equal(case)
    assert same, f"{name}: rewrite differs (relative error {err:.2e})"


def test_print_format_and_synchronize_are_seen(monkeypatch):
    x = torch.arange(4.0, device=DEV)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # a CPU-only torch raises in it

    def fwd():
        s = f"{x.sum():.1f}" + repr(x[:2])  # print of a tensor formats it: a device-to-host copy
        torch.cuda.synchronize()
        return s

    rep = audit(fwd, warmup=0, profile=False)
    assert _kinds(rep) == {"d2h": 2, "synchronize": 1}
    assert {r.function for r in rep.table().itertuples() if r.kind != "other"} == {
        "test_print_format_and_synchronize_are_seen.<locals>.fwd"
    }


def test_classify_rules():
    t = torch.ones(3, device=DEV)
    f = torch.Tensor.repeat_interleave
    r = torch.tensor([1, 2, 0], device=DEV)
    assert classify(f, (t, r), {}, DEV) == ("shape", "repeat_interleave (no output_size)")
    assert classify(f, (t, r), {"output_size": 3}, DEV) is None
    assert classify(f, (t, 2), {}, DEV) is None  # an int repeat: no device data
    assert classify(torch.where, (t > 0,), {}, DEV)[0] == "shape"
    assert classify(torch.where, (t > 0, t, t), {}, DEV) is None
    assert classify(torch.Tensor.__getitem__, (t, t > 0), {}, DEV)[0] == "shape"
    assert classify(torch.Tensor.__getitem__, (t, torch.tensor([0, 1], device=DEV)), {}, DEV) is None
    assert classify(torch.Tensor.item, (t[0],), {}, "cuda" if DEV == "cpu" else "cpu") is None  # other device


def test_report_on_cpu_is_marked_and_not_estimated():
    if runtime.has_cuda():
        pytest.skip("CPU-only behaviour")
    case = HS.build("offsets_item", HS.Size.smoke(), "cpu")
    rep = audit(case.original, warmup=1, reps=2)
    t = rep.table()
    assert rep.count == 3 and rep.reps == 2 and t["count_per_call"].iloc[0] == 3
    assert (
        (t["timed_on"] == "CPU").all() and t["saving_us"].isna().all() and t["gpu_idle_after_us"].isna().all()
    )
    assert t["estimate"].iloc[0].startswith("not estimated")
    assert "CPU count" in rep.summary() and rep.trace is None and math.isfinite(rep.overhead_s)  # measured, not bounded


def test_overhead_leaves_out_a_slow_first_warmup_call(monkeypatch):
    # A cold process compiles its kernels in the first call: that is the forward's time, not the audit's.
    # Judged against the same audit of a forward without the slow call, measured after a throwaway audit:
    # on a GPU machine the first audit of a process also pays the profiler's start-up (seconds of CUPTI).
    def forward(slow_first):
        calls = []

        def fn(x):
            calls.append(1)
            if slow_first and len(calls) == 1:
                clock[0] += 1000.0  # the slow call: 1000 s of the audit's clock, which only the forward advances
            return x + 1
        return fn, calls

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    audit(forward(False)[0], torch.ones(4), warmup=2, reps=2)
    base = audit(forward(False)[0], torch.ones(4), warmup=2, reps=2).overhead_s
    fn, calls = forward(True)
    rep = audit(fn, torch.ones(4), warmup=2, reps=2)
    assert len(calls) >= 4 and rep.overhead_s == base == 0.0, (rep.overhead_s, base)


def test_context_manager_form():
    x = torch.arange(4, device=DEV)
    with audit() as rep:
        x.tolist()
        int(x.max())
    assert _kinds(rep) == {"tolist": 1, "item": 1}
    with pytest.raises(AuditError, match="context manager"):
        with audit(None, 3):
            pass


# --- bad input ---------------------------------------------------------------------------------------------
class Boom(RuntimeError):
    pass


def _raises(x):
    raise Boom("inside the forward")  # THE-LINE


def test_a_raising_callable_keeps_its_own_traceback():
    with pytest.raises(Boom, match="inside the forward") as ei:
        audit(_raises, 1, warmup=0)
    assert ei.value.__traceback__ is not None
    assert ei.traceback[-1].name == "_raises"  # the innermost frame is the callable's own
    assert any("audited call 1" in n for n in getattr(ei.value, "__notes__", []))
    assert torch.overrides._get_current_function_mode() is None  # the interception is gone


@pytest.mark.parametrize(
    "bad,kw,msg",
    [
        (5, {}, "needs a callable"),
        (print, {"reps": 0}, "reps must be"),
        (print, {"warmup": -1}, "warmup must be"),
        (print, {"device": "tpu"}, "device must be"),
    ],
)
def test_bad_arguments_are_named(bad, kw, msg):
    with pytest.raises(AuditError, match=msg):
        audit(bad, **kw)


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("nocolon", "is not 'module:name'"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("os:no_such_attr", "has no attribute"),
        ("os:sep", "not a callable"),
        ("missing_file.py:f", "no file"),
    ],
)
def test_bad_spec_is_a_named_error(spec, msg):
    with pytest.raises(SpecError, match=msg):
        resolve(spec)


def test_cli(tmp_path, capsys):
    mod = tmp_path / "target_mod.py"
    mod.write_text(
        "import torch\n"
        "def forward(x):\n    return x[x > 0].sum()\n"
        "def inputs():\n    return (torch.randn(8, device='cuda' if torch.cuda.is_available() else 'cpu'),)\n"
    )
    assert (
        main(
            [f"{mod}:forward", "--inputs", f"{mod}:inputs", "--warmup", "0", "--csv", str(tmp_path / "a.csv")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "target_mod.py:3" in out and "shape" in out and (tmp_path / "a.csv").exists()
    assert main(["nonexistent_pkg_q:f"]) == 2
    assert "SpecError" in capsys.readouterr().err


def test_no_cuda_work_on_a_gpu_is_told(monkeypatch):
    """A GPU machine whose forward runs on the CPU: told so (here the profiled run is faked)."""
    from lora_moe_lab.instruments.recorders import audit as A

    class Tables:
        kernels, annotations = [], None

    monkeypatch.setattr(A._Session, "profile", lambda self, call: A._Session.analyse(self, Tables(), []))
    with pytest.warns(NoCudaWork, match="no CUDA work"):
        rep = audit(lambda: torch.ones(2) + 1, warmup=0, device="cuda")
    assert rep.count == 0 and any("no CUDA work" in n for n in rep.notes)


def test_profiled_call_analysis_on_a_recorded_shape_trace():
    """The GPU half of the audit (GPU idle after each site's syncs, the replay's saving) on a trace
    with known syncs (tests/fixtures: 4 layers, a D2H copy + cudaStreamSynchronize each): each layer
    range is marked as one audited sync of one site."""
    import pandas as pd

    from lora_moe_lab.instruments.recorders import audit as A
    from lora_moe_lab.sim.sync_savings import estimate
    from lora_moe_lab.instruments.analysers import trace as T

    t = T.load_trace(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "model_sync_L4.json.gz"))
    a = t.annotations
    f0 = t.forwards.sort_values("start_ns").iloc[0]
    layers = a[a["name"].str.startswith("moe_layer") & (a["start_ns"] < f0["end_ns"])].reset_index(drop=True)
    marks = layers.assign(name=[f"audit_sync_{i}" for i in range(len(layers))])
    t.annotations = pd.concat([a, marks], ignore_index=True)
    s = A._Session("cuda", 1, estimator=estimate)
    s.analyse(t, [("model.py:7", "item")] * 3 + [("model.py:9", "item")])
    assert s.rep.gpu_idle_ns[("model.py:7", "item")] > 0 and s.rep.ranges[("model.py:9", "item")]
    sv = s.rep.saving_ns
    assert sv[("model.py:7", "item")] > sv[("model.py:9", "item")] > 0
    assert s.rep.total_saving_ns >= sv[("model.py:7", "item")] and "replay" in s.rep.estimate_note


# --- GPU ------------------------------------------------------------------------------------------
@gpu
def test_gpu_lab_audit_profiles_and_estimates():
    from lora_moe_lab.model.lab import build_lab
    from lora_moe_lab.sim.sync_savings import estimate

    lab = build_lab("tiny", num_layers=48, device="cuda", seed=0)
    lab.pool.load("a0", rank=4)
    batch, tensors = lab.make_batch(adapters=[None, "a0"], token_counts=[3, 5])
    x = lab.random_input(8, seed=0)
    rep = audit(lab.model, x, batch, tensors, guard="sync", warmup=2, estimator=estimate)
    row = rep.table().iloc[0]
    # each check on its own line, with the report. The overhead is checked as measured, not against a wall-clock
    # bound: a bound of 10 s failed on the H200 twice, both times in the whole suite and never in this file alone
    # (74af83d; b657583 with 8 xdist workers: 14.3 s). It times the profiler's start-up and the trace's parse on a
    # shared CPU, so it tests the machine's load; the audit's cost is a measurement, not a unit test's assertion.
    assert rep.sites[GUARD_SITE] == 48, (dict(rep.sites), rep.summary())
    assert row["kind"] == "item" and row["torch_count"] >= 48, (row.to_dict(), rep.summary())
    assert row["gpu_idle_after_us"] >= 0, (row.to_dict(), rep.summary())
    assert row["estimate"] == "replay", (row.to_dict(), rep.summary())
    assert math.isfinite(rep.overhead_s) and rep.overhead_s > 0, (rep.overhead_s, rep.summary())
    fixed = audit(lab.model, x, batch, tensors, guard="cpu_flag", warmup=2)
    assert fixed.count == 0, fixed.summary()


@gpu
@pytest.mark.parametrize("name", HS.names())
def test_gpu_rewrites_pass_a_checked_region(name):
    from lora_moe_lab.instruments.recorders.sync_check import sync_check

    case = HS.build(name, HS.Size.smoke(), "cuda")
    case.rewrite()
    with syncs.checked_region(), sync_check():  # sync_check also fails a pageable non_blocking upload
        case.rewrite()
    assert HS.equal(case)[0]


@gpu
def test_gpu_forward_without_cuda_work_is_told():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rep = audit(lambda: torch.ones(4) * 2, warmup=0)
    assert any(issubclass(x.category, NoCudaWork) for x in w) and rep.notes
