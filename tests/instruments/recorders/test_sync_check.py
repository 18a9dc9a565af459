"""sync_check: the allowlist, its named errors, and pageable non_blocking uploads.

The pageable-copy check decides from the call's arguments before the copy runs, so it is tested on
CPU too (torch.zeros(4).to("cuda", non_blocking=True) never reaches a device). The model tests run
on whatever device "auto" picks: the guard counter on CPU, torch's sync debug mode on a GPU.
"""
import inspect
from collections import Counter

import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import sync_check as sc
from lora_moe_lab.instruments.recorders.syncs import HostSyncError, allow_sync
from lora_moe_lab.model import LoRABatchTensors, build_lab
from helpers import audit_forwards, fake_cuda_debug_mode, fake_sync_op, syncs_beyond_guards

gpu = pytest.mark.skipif(not runtime.has_cuda(), reason="needs a CUDA GPU")


def _site(marker: str) -> str:
    """test_sync_check.py:LINE of the line of this file that carries `marker`."""
    lines, _ = inspect.getsourcelines(inspect.getmodule(_site))
    (i,) = [i for i, s in enumerate(lines) if marker in s and "_site(" not in s]
    return f"test_sync_check.py:{i + 1}"


@pytest.fixture(scope="module")
def lab():
    lab = build_lab("tiny", num_layers=2)
    lab.pool.load("a0", rank=4)
    batch, tensors = lab.make_batch(adapters=[None, "a0"], token_counts=[3, 5])
    x = lab.random_input(8, seed=0)
    lab.model(x, batch, tensors, guard="sync")  # warm-up outside any region (GPU: compile, allocate)
    return lab, batch, tensors, x


# --- pageable non_blocking uploads (the done-when: caught on CPU) ---------------------
def test_pageable_non_blocking_upload_is_caught(sync_check):
    with pytest.raises(sc.PageableCopyError) as ei:
        with sync_check():
            torch.zeros(4).to("cuda", non_blocking=True)  # PAGEABLE-TO
    assert isinstance(ei.value, HostSyncError) and ei.value.site == _site("# PAGEABLE-TO")
    assert "pageable" in str(ei.value) and "pin_memory()" in str(ei.value) and "(4,)" in str(ei.value)
    with pytest.raises(sc.PageableCopyError, match="Tensor.cuda"):
        with sync_check():
            torch.zeros(2).cuda(non_blocking=True)
    with pytest.raises(sc.PageableCopyError):
        with sync_check():
            torch.zeros(2).to("cuda:0", torch.float16, True)  # positional non_blocking


def test_uploads_that_are_not_flagged(sync_check, lab):
    _, batch, _, _ = lab
    with sync_check():
        torch.zeros(4).to("cpu", non_blocking=True)  # host to host
        torch.zeros(4).to(torch.float16, non_blocking=True)  # a cast, no device
        torch.zeros(4).copy_(torch.ones(4), non_blocking=True)
        torch.zeros(4).to("cpu", torch.float16, True, True)  # non_blocking and copy, positional
        LoRABatchTensors.from_batch(batch, runtime.default_device())  # pinned on CUDA, host on CPU


# --- the allowlist ------------------------------------------------------------------------
def test_guard_sync_fails_with_its_site_then_allowlisted(sync_check, lab):
    lab, batch, tensors, x = lab
    with pytest.raises(sc.SyncCheckError) as ei:
        with sync_check():
            lab.model(x, batch, tensors, guard="sync")
    site = ei.value.site
    assert site.startswith("guards.py:") and ei.value.sites == Counter({site: 2})  # one per layer
    assert site in str(ei.value) and "allow=[...]" in str(ei.value)
    for entry in (site, "guards.py:active", "guards.py:Guard.active"):
        with sync_check(allow=[entry]) as chk:
            lab.model(x, batch, tensors, guard="sync")
        assert chk.allowed == Counter({entry: 2})
    with sync_check():  # allow_sync() still works inside the region
        with allow_sync():
            lab.model(x, batch, tensors, guard="sync")


def test_cpu_flag_passes(sync_check, lab, monkeypatch):
    lab, batch, tensors, x = lab
    with sync_check() as chk:
        batch, tensors = lab.make_batch(adapters=["a0", None], token_counts=[5, 3])  # the warmed shape
        lab.model(lab.random_input(8, seed=1), batch, tensors, guard="cpu_flag")
    assert chk.report.count == 0 and not chk.allowed
    # On a CPU the check above sees the guards' own syncs only; the audit sees every call of the forward that would
    # sync on a GPU (.item(), .tolist(), nonzero, a mask index, ...)
    reports = audit_forwards(monkeypatch, lab.model)
    lab.model(lab.random_input(8, seed=2), batch, tensors, guard="cpu_flag")
    assert syncs_beyond_guards(reports, guard_syncs=0) == []


def test_the_audit_sees_the_sync_guard_and_nothing_else(lab, monkeypatch):
    lab, batch, tensors, x = lab
    reports = audit_forwards(monkeypatch, lab.model)
    lab.model(x, batch, tensors, guard="sync")
    assert syncs_beyond_guards(reports, guard_syncs=lab.shape.num_layers) == []


def test_a_hidden_item_in_the_forward_fails_the_audit(sync_check, lab, monkeypatch):
    """The negative control: a `.item()` planted in the layer's routing is invisible to the guard counter (the
    region passes on a CPU) but the audit names it, once per layer."""
    from lora_moe_lab.model.moe import MoELayer

    lab, batch, tensors, x = lab
    route = MoELayer.route

    def route_and_read(self, *a, **k):
        topk_w, topk_ids = route(self, *a, **k)
        topk_ids.max().item()  # HIDDEN-ITEM
        return topk_w, topk_ids

    monkeypatch.setattr(MoELayer, "route", route_and_read)
    if not runtime.has_cuda():
        with sync_check():  # what "sync-free" meant on a CPU before the audit
            lab.model(x, batch, tensors, guard="cpu_flag")
    reports = audit_forwards(monkeypatch, lab.model)
    lab.model(x, batch, tensors, guard="cpu_flag")
    extra = syncs_beyond_guards(reports, guard_syncs=0)
    assert len(extra) == lab.shape.num_layers and all(_site("# HIDDEN-ITEM") in e for e in extra), extra


def test_unused_entry_is_an_error(sync_check, lab):
    msg = r"allowlist entry 'x\.py:12' matched no sync in the region"
    with pytest.raises(sc.UnusedAllowError, match=msg) as ei:
        with sync_check(allow=["x.py:12"]):
            pass
    assert ei.value.entries == ["x.py:12"]
    with sync_check(allow=["x.py:12"], strict=False):
        pass
    lab, batch, tensors, x = lab
    with pytest.raises(sc.SyncCheckError, match="Unused allowlist entries: 'model.py:forward'"):
        with sync_check(allow=["model.py:forward"]):
            lab.model(x, batch, tensors, guard="sync")


def test_body_errors_pass_through(sync_check):
    with pytest.raises(KeyError):  # not masked by the unused entry
        with sync_check(allow=["x.py:1"]):
            raise KeyError("mine")


@pytest.mark.parametrize("bad", ["guards.py", "guards:12", "guards.py:0", "a/guards.py:3", "x.py:1-2",
                                 "x.py:", " x.py:1", "x.py:fn()", 12, None])
def test_bad_entries_are_named_errors(sync_check, bad):
    with pytest.raises(sc.AllowlistError, match="is not a site"):
        with sync_check(allow=[bad]):
            pass


def test_single_string_is_an_error(sync_check):
    with pytest.raises(sc.AllowlistError, match=r"allow=\['x.py:1'\]"):
        with sync_check(allow="x.py:1"):
            pass


def test_function_of_a_site():
    def inner():
        return 1  # INNER-LINE
    _here = 0  # OUTER-LINE
    assert {"inner", "test_function_of_a_site.inner"} == sc._functions_at(_site("# INNER-LINE"))
    assert {"test_function_of_a_site"} == sc._functions_at(_site("# OUTER-LINE"))
    assert sc._functions_at("no_such_file.py:3") == set() and sc._functions_at("?") == set()


def test_error_lists_every_site():
    e = sc.SyncCheckError(Counter({"a.py:1": 2, "b.py:7": 1}))
    assert isinstance(e, HostSyncError) and e.site == "a.py:1"
    assert "a.py:1 (x2), b.py:7 (x1)" in str(e)


# --- GPU only -----------------------------------------------------------------------------
@gpu
def test_gpu_item_site_and_pinned_uploads(sync_check):
    x = torch.randn(64, device="cuda")
    with pytest.raises(sc.SyncCheckError) as ei:
        with sync_check():
            x.sum().item()  # GPU-ITEM1
    assert ei.value.sites == Counter({_site("# GPU-ITEM1"): 1})
    with sync_check(allow=[_site("# GPU-ITEM2"), "test_sync_check.py:test_gpu_item_site_and_pinned_uploads"]):
        x.sum().item()  # GPU-ITEM2
    pinned, buf = torch.zeros(64).pin_memory(), torch.empty(64, device="cuda")
    with sync_check():
        pinned.to("cuda", non_blocking=True)
        pinned.cuda(non_blocking=True)
        buf.copy_(pinned, non_blocking=True)
        buf.copy_(x, non_blocking=True)  # device to device
    with pytest.raises(sc.PageableCopyError, match="Tensor.copy_"):
        with sync_check():
            buf.copy_(torch.zeros(64), non_blocking=True)  # PAGEABLE-COPY
    with sync_check(allow=[_site("# PAGEABLE-COPY2")]) as chk:
        buf.copy_(torch.zeros(64), non_blocking=True)  # PAGEABLE-COPY2
    assert chk.allowed[_site("# PAGEABLE-COPY2")] == 1


# --- the CUDA path with a fake sync debug mode (runs everywhere; see test_syncs.py) ----------
def test_fake_cuda_site_skips_the_check_frame(sync_check, monkeypatch):
    # a torch function that syncs, dispatched through the check's TorchFunctionMode (so the warning
    # is raised with the check's own frame on the stack, as torch's C++ warning is)
    sync_op = fake_sync_op(fake_cuda_debug_mode(monkeypatch), dispatch=True, raise_on_error=False,
                           file="_fake_sync2.py")
    with pytest.raises(sc.SyncCheckError) as ei:
        with sync_check():
            sync_op(torch.zeros(1))  # FAKE-SYNC
    assert ei.value.sites == Counter({_site("# FAKE-SYNC"): 1})
