"""The audit's rule table called directly (audit_watch.classify_aten, classify): each rule's kind, count and op name,
each of its conditions on and off, on both sides of the device test.

test_audit_rules.py runs each rule through a whole audit (what a reader sees); this file pins the table itself,
including the branches a CPU run never reaches through an audit: the rules that apply only where the audited
tensors live on CUDA (a blocking copy, a host index tensor) are fed tensors that report a CUDA device (`_on_cuda`:
the classification reads the device, the dtype and the size, never the data), so they run on a CPU.
"""
import pytest
import torch

from lora_moe_lab.instruments.recorders.audit_watch import ATEN_SYNCS, classify, classify_aten

A = torch.ops.aten
T = torch.Tensor


class _Cuda(torch.Tensor):
    """A host tensor that reports a CUDA device."""

    @property
    def device(self):
        return torch.device("cuda")


def _on_cuda(t: torch.Tensor) -> torch.Tensor:
    return torch.Tensor._make_subclass(_Cuda, t)


def _v():
    g = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    x = torch.randn(6, generator=g)
    return dict(x=x, ids=torch.randint(0, 4, (6,), generator=g), mask=x > 0, one=torch.tensor([2]),
                empty=torch.zeros(0), u8=torch.randint(0, 4, (6,), generator=g).to(torch.uint8))


# --- classify_aten ------------------------------------------------------------------------------------
def test_every_aten_sync_op_counts_on_the_device_only():
    v = _v()
    for name, (kind, n) in ATEN_SYNCS.items():
        op = getattr(A, name).default
        assert classify_aten(op, (v["ids"],), {}, "cpu") == (kind, n, name), name
        assert classify_aten(op, (v["ids"],), {}, "cuda") is None, name  # a host tensor on a GPU machine
        assert classify_aten(op, (), {}, "cpu") is None, name  # no tensor argument: nothing on the device
    assert classify_aten(A.bincount.default, (v["u8"],), {}, "cpu") == ("shape", 1, "bincount")  # no sign check
    assert classify_aten(A.bincount.default, (v["ids"].int(),), {}, "cpu") == ("shape", 2, "bincount")
    assert classify_aten(A.bincount.default, (v["u8"],), {}, "cuda") is None


def test_an_op_without_an_overload_packet_is_named_by_its_function_name():
    def bincount(*a):
        return a

    def sum(*a):  # noqa: A001 - a name no rule knows
        return a

    v = _v()
    assert classify_aten(bincount, (v["ids"],), {}, "cpu") == ("shape", 2, "bincount")
    assert classify_aten(sum, (v["ids"],), {}, "cpu") is None
    assert classify_aten(object(), (v["ids"],), {}, "cpu") is None  # no name at all


def test_repeat_interleave_counts_tensor_repeats_without_output_size():
    v = _v()
    op, shape = A.repeat_interleave.Tensor, ("shape", 1, "repeat_interleave")
    assert classify_aten(op, (v["ids"],), {}, "cpu") == shape  # the counts alone
    assert classify_aten(op, (v["x"], v["ids"]), {}, "cpu") == shape  # self and repeats
    assert classify_aten(op, (v["x"], v["ids"], None), {}, "cpu") == shape
    assert classify_aten(op, (v["x"], v["ids"], 0), {}, "cpu") is None  # a third argument given
    assert classify_aten(op, (v["x"], v["ids"]), {"output_size": 12}, "cpu") is None
    assert classify_aten(op, (v["x"], v["ids"]), {"output_size": None}, "cpu") == shape
    assert classify_aten(op, (v["x"], v["one"]), {}, "cpu") is None  # one repeat: its size is known
    assert classify_aten(op, (v["x"][:2], v["ids"][:2]), {}, "cpu") == shape  # two are a sum
    assert classify_aten(op, (v["one"],), {}, "cpu") is None
    assert classify_aten(op, (v["x"], v["ids"]), {}, "cuda") is None  # repeats on the host
    assert classify_aten(op, (_on_cuda(v["x"]), v["ids"]), {}, "cuda") is None  # self on the device, repeats not
    assert classify_aten(op, (v["x"], _on_cuda(v["ids"])), {}, "cuda") == shape


def test_histc_reads_the_range_back_only_when_it_takes_it_from_the_data():
    v = _v()
    op, two = A.histc.default, ("shape", 2, "histc")
    assert classify_aten(op, (v["x"], 4), {}, "cpu") == two
    assert classify_aten(op, (v["x"], 4, 1.0, 1.0), {}, "cpu") == two  # min == max: the data's range
    assert classify_aten(op, (v["x"], 4, -3.0, 3.0), {}, "cpu") is None
    assert classify_aten(op, (v["x"], 4, 0.0), {}, "cpu") == two  # max defaults to 0
    assert classify_aten(op, (v["x"], 4, 1.0), {}, "cpu") is None
    assert classify_aten(op, (v["x"], 4), {"min": -3.0, "max": 3.0}, "cpu") is None
    assert classify_aten(op, (v["x"], 4), {"min": 2.0, "max": 2.0}, "cpu") == two
    assert classify_aten(op, (v["x"], 4), {"max": 0}, "cpu") == two  # min defaults to 0
    assert classify_aten(op, (v["x"], 4), {"min": 0}, "cpu") == two
    assert classify_aten(op, (v["x"], 4), {"min": 1.0}, "cpu") is None
    assert classify_aten(op, (v["x"], 4), {"max": 1.0}, "cpu") is None
    assert classify_aten(op, (v["empty"], 4), {}, "cpu") is None  # nothing to read
    assert classify_aten(op, (v["x"], 4), {}, "cuda") is None


def test_grouped_mm_reads_its_offsets_back_except_in_bf16():
    v = _v()
    a = torch.randn(4, 4)
    why = "_grouped_mm (non-bf16 fallback reads its offsets)"
    assert classify_aten(A._grouped_mm.default, (a, a), {}, "cpu") == ("d2h", 1, why)
    assert classify_aten(A._grouped_mm.default, (a.half(), a), {}, "cpu") == ("d2h", 1, why)
    assert classify_aten(A._grouped_mm.default, (a.bfloat16(), a), {}, "cpu") is None
    assert classify_aten(A._grouped_mm.default, (a, a), {}, "cuda") is None
    assert v


@pytest.mark.parametrize("name", ["index", "index_put", "index_put_", "_index_put_impl_"])
def test_an_index_by_a_mask_or_a_host_tensor(name):
    v = _v()
    op = getattr(A, name).default if name != "index" else A.index.Tensor
    assert classify_aten(op, (v["x"], [v["mask"]]), {}, "cpu") == ("shape", 1, f"{name} (bool mask)")
    assert classify_aten(op, (v["x"], [None, v["u8"]]), {}, "cpu") == ("shape", 1, f"{name} (bool mask)")
    assert classify_aten(op, (v["x"], [v["ids"]]), {}, "cpu") is None  # an integer index on the device
    assert classify_aten(op, (v["x"], None), {}, "cpu") is None
    assert classify_aten(op, (v["x"],), {}, "cpu") is None
    assert classify_aten(op, (v["x"], [v["mask"]]), {}, "cuda") is None  # self on the host
    dev = _on_cuda(v["x"])
    assert classify_aten(op, (dev, [v["ids"]]), {}, "cuda") == ("upload", 1, f"{name} (host index tensor)")
    assert classify_aten(op, (dev, [None, v["ids"]]), {}, "cuda") == ("upload", 1, f"{name} (host index tensor)")
    assert classify_aten(op, (dev, [torch.tensor(1)]), {}, "cuda") is None  # a 0-d index: a scalar, no upload
    assert classify_aten(op, (dev, [_on_cuda(v["ids"])]), {}, "cuda") is None  # the index on the device


def test_a_blocking_copy_between_host_and_device_on_a_gpu():
    v = _v()
    host, dev = v["x"], _on_cuda(v["x"])
    to = A._to_copy.default
    assert classify_aten(to, (dev,), {"device": "cpu"}, "cuda") == ("d2h", 1, "_to_copy")
    assert classify_aten(to, (host,), {"device": torch.device("cuda")}, "cuda") == ("upload", 1, "_to_copy")
    assert classify_aten(to, (host,), {"device": "cuda", "non_blocking": True}, "cuda") is None  # pageable rule's
    assert classify_aten(to, (dev,), {"device": "cpu", "non_blocking": False}, "cuda") == ("d2h", 1, "_to_copy")
    assert classify_aten(to, (dev,), {"device": "cuda"}, "cuda") is None  # on the device already
    assert classify_aten(to, (host,), {"device": "cpu"}, "cuda") is None
    assert classify_aten(to, (dev,), {"dtype": torch.half}, "cuda") is None  # a dtype change only
    assert classify_aten(to, (1.0,), {"device": "cpu"}, "cuda") is None
    assert classify_aten(to, (_on_cuda(v["empty"]),), {"device": "cpu"}, "cuda") is None  # nothing to copy
    assert classify_aten(to, (dev,), {"device": "cpu"}, "cpu") is None  # a CPU machine's copies are host copies
    # (source, destination): copy_(dst, src) takes them reversed; _copy_from(src, dst), ..._and_resize in order
    for name, order in (("copy_", -1), ("_copy_from", 1), ("_copy_from_and_resize", 1)):
        op = getattr(A, name).default
        assert classify_aten(op, (dev, host.clone())[::order], {}, "cuda") == ("d2h", 1, name)
        assert classify_aten(op, (host, dev)[::order], {}, "cuda") == ("upload", 1, name)
        assert classify_aten(op, (host, dev)[::order], {"non_blocking": True}, "cuda") is None
        assert classify_aten(op, (dev, dev), {}, "cuda") is None
        assert classify_aten(op, (dev,), {}, "cuda") is None
        assert classify_aten(op, (dev, 1.0), {}, "cuda") is None and classify_aten(op, (1.0, dev), {}, "cuda") is None
        assert classify_aten(op, (_on_cuda(v["empty"]), v["empty"]), {}, "cuda") is None
    assert classify_aten(A.copy_.default, (dev, host, True), {}, "cuda") is None  # non_blocking positional
    assert classify_aten(A.copy_.default, (dev, host, False), {}, "cuda") == ("upload", 1, "copy_")
    assert classify_aten(A._copy_from.default, (host, dev, True), {}, "cuda") is None
    assert classify_aten(A._copy_from.default, (host, dev, False), {}, "cuda") == ("upload", 1, "_copy_from")


# --- classify (the Python-level calls) ------------------------------------------------------------------
def test_reading_a_value_or_copying_to_the_host():
    v = _v()
    x, s = v["x"], v["x"].sum()
    for f in (T.item, T.__bool__, T.__int__, T.__float__, T.__index__, T.__complex__):
        assert classify(f, (s,), {}, "cpu") == ("item", f.__name__)
        assert classify(f, (s,), {}, "cuda") is None
    assert classify(T.tolist, (x,), {}, "cpu") == ("tolist", "tolist")
    assert classify(T.cpu, (x,), {}, "cpu") == ("d2h", "cpu") and classify(T.numpy, (x,), {}, "cpu") == ("d2h",
                                                                                                       "numpy")
    for f in (T.tolist, T.cpu, T.numpy):
        assert classify(f, (v["empty"],), {}, "cpu") is None, f  # no bytes to copy
        assert classify(f, (x,), {}, "cuda") is None, f
    for f in (T.__repr__, T.__format__, T.__str__):
        assert classify(f, (x,), {}, "cpu") == ("d2h", f.__name__)
        assert classify(f, (x,), {}, "cuda") is None
    assert classify(T.item, ((s,),), {}, "cpu") == ("item", "item")  # the first tensor of a nested argument
    assert classify(T.item, (), {}, "cpu") is None and classify(T.item, (1.0,), {}, "cpu") is None
    assert classify(T.add, (x, x), {}, "cpu") is None
    assert classify(object(), (x,), {}, "cpu") is None  # a callable without a name: no rule
    assert classify(T.item, (1.0, s), {}, "cpu") is None  # the first argument places the call, not a later one


def test_data_dependent_shapes():
    v = _v()
    for f in (torch.nonzero, torch.argwhere, torch.masked_select, torch.unique, torch.unique_consecutive,
              torch.bincount):
        assert classify(f, (v["ids"],), {}, "cpu") == ("shape", f.__name__)
        assert classify(f, (v["ids"],), {}, "cuda") is None
    assert classify(torch.where, (v["mask"],), {}, "cpu") == ("shape", "where(cond)")
    assert classify(torch.where, (), {"condition": v["mask"]}, "cpu") is None  # no positional tensor to place it
    assert classify(torch.where, (v["mask"], v["x"], 0.0), {}, "cpu") is None
    assert classify(torch.where, (v["mask"],), {"input": v["x"]}, "cpu") is None
    assert classify(torch.where, (v["mask"], v["x"]), {"other": 0.0}, "cpu") is None  # three arguments in all
    assert classify(torch.where, (v["mask"],), {}, "cuda") is None


@pytest.mark.parametrize("f", [T.__getitem__, T.__setitem__, T.index_put, T.index_put_])
def test_an_index_by_a_mask_or_a_python_list(f):
    v = _v()
    x, name = v["x"], f.__name__
    assert classify(f, (x, v["mask"]), {}, "cpu") == ("shape", f"{name}[bool mask]")
    assert classify(f, (x, (slice(None), v["mask"])), {}, "cpu") == ("shape", f"{name}[bool mask]")
    assert classify(f, (x, ([v["mask"]],)), {}, "cpu") == ("shape", f"{name}[bool mask]")
    assert classify(f, (x, torch.tensor(True)), {}, "cpu") is None  # a 0-d bool: no data-dependent shape
    assert classify(f, (x, v["u8"]), {}, "cpu") is None  # uint8 indexes by value at the Python level
    assert classify(f, (x, [0, 2]), {}, "cpu") == ("upload", f"{name}[python list]")
    assert classify(f, (x, [True, False]), {}, "cpu") == ("upload", f"{name}[python list]")
    assert classify(f, (x, (0, [1, 2])), {}, "cpu") == ("upload", f"{name}[python list]")
    assert classify(f, (x, []), {}, "cpu") is None  # an empty list uploads nothing
    assert classify(f, (x, [0, 1.5]), {}, "cpu") is None  # not an index list
    assert classify(f, (x, [0, v["ids"]]), {}, "cpu") is None
    assert classify(f, (x, 3), {}, "cpu") is None and classify(f, (x, v["ids"]), {}, "cpu") is None
    assert classify(f, (x,), {}, "cpu") is None
    assert classify(f, (x, v["mask"]), {}, "cuda") is None and classify(f, (x, [0, 2]), {}, "cuda") is None


def test_repeat_interleave_without_output_size():
    v = _v()
    f, shape = torch.repeat_interleave, ("shape", "repeat_interleave (no output_size)")
    assert classify(f, (v["ids"],), {}, "cpu") == shape
    assert classify(f, (v["x"], v["ids"]), {}, "cpu") == shape
    assert classify(f, (v["x"],), {"repeats": v["ids"]}, "cpu") == shape
    assert classify(f, (v["x"], 2), {}, "cpu") is None
    assert classify(f, (v["x"], v["one"]), {}, "cpu") is None
    assert classify(f, (v["x"][:2], v["ids"][:2]), {}, "cpu") == shape
    assert classify(f, (v["x"], v["ids"]), {"output_size": 12}, "cpu") is None
    assert classify(f, (v["x"], v["ids"]), {"output_size": None}, "cpu") == shape
    assert classify(f, (v["x"], v["ids"]), {}, "cuda") is None
    assert classify(f, (), {"repeats": v["ids"]}, "cpu") == shape


def test_a_non_blocking_copy_from_pageable_memory():
    v = _v()
    host, dst = v["x"], torch.empty(6)
    assert classify(T.copy_, (dst, host, True), {}, "cpu") == ("pageable", "Tensor.copy_")
    assert classify(T.copy_, (dst, host), {"non_blocking": True}, "cpu") == ("pageable", "Tensor.copy_")
    assert classify(T.copy_, (dst, host), {}, "cpu") is None
    assert classify(T.copy_, (dst, host, False), {}, "cpu") is None
    assert classify(T.copy_, (dst, 1.0, True), {}, "cpu") is None
    assert classify(T.copy_, (dst,), {"non_blocking": True}, "cpu") is None
    assert classify(T.to, (host, "cpu"), {"non_blocking": True}, "cpu") is None  # a copy_ only, on a CPU machine
    # on a GPU machine the same call is a pageable upload when it lands on CUDA (sync_check.pageable_upload)
    dev = _on_cuda(torch.empty(6))
    assert classify(T.copy_, (dev, host, True), {}, "cuda") == ("pageable", "Tensor.copy_")
    assert classify(T.copy_, (dev, host), {}, "cuda") is None
    assert classify(T.to, (host, "cuda"), {"non_blocking": True}, "cuda") == ("pageable", "Tensor.to")
    assert classify(T.cuda, (host, None, True), {}, "cuda") == ("pageable", "Tensor.cuda")
    assert classify(T.to, (host, "cpu"), {"non_blocking": True}, "cuda") is None
