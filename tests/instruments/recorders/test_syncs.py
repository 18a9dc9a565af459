"""Sync tooling: the guard-counter path and the API everywhere; the real device path on a GPU.

The CUDA path is also exercised on CPU with a fake sync debug mode: torch emits its sync warning
(or error) from C++ straight into the caller's Python frame, which `warnings.warn` / `raise` at
the call site reproduce faithfully.
"""
import inspect
import os
import warnings

import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import syncs
from lora_moe_lab.instruments.recorders.syncs import HostSyncError, allow_sync, checked_region, count_syncs, no_syncs
from helpers import SYNC_MSG, fake_cuda_debug_mode, fake_sync_op

def gpu(f):
    return pytest.mark.gpu(pytest.mark.skipif(not runtime.has_cuda(), reason="needs a CUDA GPU")(f))



cpu_only = pytest.mark.skipif(runtime.has_cuda(), reason="CPU-only behaviour")
MSG = SYNC_MSG


def _line_of(marker: str) -> str:
    src, start = inspect.getsourcelines(inspect.getmodule(_line_of))
    for i, line in enumerate(src):
        if marker in line and "_line_of(" not in line:
            return f"test_syncs.py:{start + i if start else i + 1}"
    raise AssertionError(marker)


@pytest.fixture
def tiny_lab():
    moe = pytest.importorskip("lora_moe_lab.model.lab")
    lab = moe.build_lab(preset="tiny", num_layers=3, device="cpu", backend="torch", seed=0)
    lab.pool.load("a0", rank=4)
    batch, tensors = lab.make_batch(adapters=[None, "a0"], token_counts=[3, 5])
    return lab, batch, tensors, lab.random_input(8, seed=0)


# --- CPU: the library guard counter -------------------------------------------------------
@cpu_only
@pytest.mark.parametrize("guard,expected", [("sync", 3), ("cpu_flag", 0), ("launch_always", 0)])
def test_guard_syncs_counted_on_cpu(tiny_lab, guard, expected):
    lab, batch, tensors, x = tiny_lab
    with count_syncs() as rep:
        lab.model(x, batch, tensors, guard=guard)
    assert rep.count == expected == rep.guard_count
    assert rep.device_observable is False
    if expected:
        (site, n), = rep.sites.items()
        assert site.startswith("guards.py:") and n == expected
    s = rep.summary()
    assert "cannot be observed" in s and f"{expected} library guard" in s


@cpu_only
def test_checked_region_cpu_guard(tiny_lab):
    lab, batch, tensors, x = tiny_lab
    with checked_region():
        lab.model(x, batch, tensors, guard="cpu_flag")
    with pytest.raises(HostSyncError, match=r"guards\.py:\d+.*3 such sync") as ei:
        with no_syncs():
            lab.model(x, batch, tensors, guard="sync")
    assert ei.value.site.startswith("guards.py:")
    with checked_region():  # the escape hatch
        with allow_sync():
            lab.model(x, batch, tensors, guard="sync")


@cpu_only
def test_allowed_syncs_not_counted(tiny_lab):
    lab, batch, tensors, x = tiny_lab
    with count_syncs() as rep:
        with allow_sync():
            lab.model(x, batch, tensors, guard="sync")
        lab.model(x, batch, tensors, guard="sync")
        with allow_sync():
            lab.model(x, batch, tensors, guard="sync")
    assert rep.count == 3 and rep.allowed == 6
    assert "6 sync(s) inside allow_sync()" in rep.summary()
    assert syncs._spans() == []  # bookkeeping dropped once the last region closes


def test_clean_region_and_api_shape():
    with count_syncs() as rep:
        torch.ones(4) + 1
    assert rep.count == 0 and len(rep.sites) == 0
    assert rep.device_observable == runtime.has_cuda()
    assert isinstance(rep.summary(), str) and "0 " in rep.summary()
    with checked_region():
        torch.ones(4) * 2
    with allow_sync():  # outside any region: harmless
        pass
    assert no_syncs is checked_region


def test_error_message_names_site_and_fix():
    e = HostSyncError("model.py:12", "detail")
    assert isinstance(e, RuntimeError)
    assert "model.py:12" in str(e) and "allow_sync()" in str(e) and "[detail]" in str(e)


def test_user_site_skips_library_frames():
    site = syncs.user_site()
    assert site == _line_of("site = syncs.user_site()")


def test_profiler_event_filter():
    class E:
        def __init__(self, name, stack=(), parent=None):
            self.name, self.stack, self.cpu_parent = name, list(stack), parent

    item = E("aten::item", stack=[os.path.join(os.path.dirname(torch.__file__), "_tensor.py(10): f"),
                                  "/home/me/model.py(42): forward"])
    evs = [E("cudaLaunchKernel"), E("cudaStreamSynchronize", parent=item),
           E("cudaDeviceSynchronize"), E("cudaMemcpyAsync", parent=item)]
    recs = syncs._profiler_syncs(evs + [E("Memcpy DtoH (Device -> Pinned)", parent=item)])
    assert [(r.what, r.site) for r in recs] == [("cudaStreamSynchronize", "model.py:42"),
                                                ("cudaDeviceSynchronize", "?")]
    d = syncs._profiler_dtoh(evs + [E("Memcpy DtoH (Device -> Pinned)", parent=item),
                                    E("Memcpy HtoD (Pinned -> Device)")])
    assert [(r.what, r.site) for r in d] == [("Memcpy DtoH (Device -> Pinned)", "model.py:42")]
    rep = syncs.SyncReport(device_observable=True, profiler_records=recs, dtoh_records=d)
    assert rep.profiler_count == 2 and "1 device-to-host" in rep.summary()
    assert rep.profiler_sites["cudaStreamSynchronize @ model.py:42"] == 1


# --- the CUDA path with a fake sync debug mode (runs everywhere) ---------------------------
@pytest.fixture
def fake_cuda(monkeypatch):
    state = fake_cuda_debug_mode(monkeypatch)
    modes = state["modes"]
    return state, modes, fake_sync_op(state)  # warns or raises inside a torch frame, as torch does


def test_fake_cuda_counting_and_sites(fake_cuda):
    state, modes, op = fake_cuda
    with count_syncs() as rep:
        for _ in range(2):
            op()  # SYNC-A
        with allow_sync():
            op()
    assert rep.device_observable and rep.count == 2 and rep.allowed == 1
    assert rep.sites == {_line_of("op()  # SYNC-A"): 2}
    assert state["mode"] == 0 and modes[0] == "warn"
    assert "2 host-device sync(s) seen" in rep.summary()


def test_fake_cuda_checked_region(fake_cuda):
    state, modes, op = fake_cuda
    with pytest.raises(HostSyncError) as ei:
        with checked_region():
            assert state["mode"] == "error"
            with allow_sync():
                assert state["mode"] == 0
                op()
            op()  # SYNC-B
    assert ei.value.site == _line_of("op()  # SYNC-B")
    assert ei.value.callers == []  # the sync is in the with-block itself


def _layer(op):
    op()  # SYNC-C


def test_fake_cuda_checked_region_callers(fake_cuda):
    state, modes, op = fake_cuda
    with pytest.raises(HostSyncError) as ei:
        with checked_region():
            _layer(op)  # CALLER
    assert ei.value.site == _line_of("op()  # SYNC-C")
    assert ei.value.callers == [_line_of("_layer(op)  # CALLER")]
    assert "Called from " + _line_of("_layer(op)  # CALLER") in str(ei.value)
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert state["mode"] == 0


def test_fake_cuda_nesting(fake_cuda):
    state, modes, op = fake_cuda
    with count_syncs() as rep:
        with checked_region():
            with count_syncs():  # a counter inside a checked region keeps it checked
                assert state["mode"] == "error"
            with allow_sync():
                assert state["mode"] == "warn"  # still counted by the outer counter
                op()
        assert state["mode"] == "warn"
    assert state["mode"] == 0 and rep.count == 0 and rep.allowed == 1


def test_fake_cuda_nested_counters(fake_cuda):
    state, modes, op = fake_cuda
    with count_syncs() as outer:
        op()
        with count_syncs() as inner:
            op()  # SYNC-D
    assert inner.count == 1 and outer.count == 2
    assert outer.sites[_line_of("op()  # SYNC-D")] == 1


def test_other_warnings_pass_through(fake_cuda):
    with pytest.warns(DeprecationWarning):
        with count_syncs() as rep:
            warnings.warn("unrelated", DeprecationWarning)
    assert rep.count == 0


# --- real GPU ------------------------------------------------------------------------------
@gpu
def test_gpu_item_in_checked_region_names_line():
    x = torch.randn(1024, device="cuda")
    with pytest.raises(HostSyncError) as ei:
        with checked_region():
            y = (x * 2).sum()
            y.item()  # GPU-SYNC
    assert ei.value.site == _line_of("y.item()  # GPU-SYNC")
    assert torch.cuda.get_sync_debug_mode() == 0


@gpu
def test_gpu_allow_sync_and_clean_region():
    x = torch.randn(256, 256, device="cuda")
    with checked_region():
        y = torch.relu(x @ x) + 1  # pure device work: no sync
        z = torch.softmax(y, dim=-1)
        with allow_sync():
            v = z.sum().item()
    assert v == pytest.approx(256.0, rel=1e-3)


@gpu
def test_gpu_count_syncs_and_profiler():
    x = torch.randn(1024, device="cuda")
    with count_syncs(profiler=True) as rep:
        for _ in range(3):
            x.sum().item()  # GPU-COUNT
        torch.cuda.synchronize()
    # torch.cuda.synchronize() is an explicit device sync: sync debug mode may or may not report
    # it (torch versions differ); the profiler always sees cudaDeviceSynchronize.
    assert rep.sites[_line_of("x.sum().item()  # GPU-COUNT")] == 3 and rep.count in (3, 4)
    names = [r.what for r in rep.profiler_records]
    assert names.count("cudaStreamSynchronize") >= 3 and "cudaDeviceSynchronize" in names
    assert len(rep.dtoh_records) >= 3


@gpu
def test_gpu_guard_sync_model():
    moe = pytest.importorskip("lora_moe_lab.model.lab")
    lab = moe.build_lab(preset="tiny", num_layers=3, device="cuda", seed=0)
    lab.pool.load("a0", rank=4)
    batch, tensors = lab.make_batch(adapters=[None, "a0"], token_counts=[3, 5])
    x = lab.random_input(8, seed=0)
    lab.model(x, batch, tensors, guard="sync")  # warm-up (allocations, autotune)
    with count_syncs() as rep:
        lab.model(x, batch, tensors, guard="sync")
    assert rep.count >= 3 and rep.guard_count == 3
    with checked_region():
        lab.model(x, batch, tensors, guard="cpu_flag")
        lab.model(x, batch, tensors, guard="launch_always")
    with pytest.raises(HostSyncError, match="guards.py"):
        with checked_region():
            lab.model(x, batch, tensors, guard="sync")
