"""An independent count of the syncs a forward would make on a GPU, for checking the audit on a CPU.

Written apart from the audit (instruments/recorders/audit_watch.py) and sharing none of its code: a
TorchDispatchMode sees every aten op and keeps a set of "device" tensors by identity: the model's
parameters and buffers and its inputs, what any op computes from one, and what a factory makes with
an explicit `device=`. A factory without one (`torch.arange(n)`, `torch.tensor(5)`) makes a host
tensor, as it would on a GPU machine. It counts, on device tensors only:
  * `aten._local_scalar_dense` (`.item()`, `bool()`, `int()`, a 0-d tensor as an index): 1;
  * `nonzero`, `masked_select`, `unique*`, `equal`: 1; `bincount`: 2 (min and max read back);
    `index` / `index_put_` with a boolean mask: 1 (the mask's nonzero);
  * a non-bf16 `_grouped_mm`: 1 (ATen's fallback reads the group offsets back);
  * Python-level (no aten op on a CPU): `.tolist()`, `.cpu()`, `.numpy()` of a non-empty device tensor: 1;
    `torch.tensor(data, device=...)` with data, and `.to(device)` / `.cuda()` of a non-empty host tensor
    without non_blocking: 1 (an upload; the result is a device tensor).
`F.one_hot` on a CPU reads its input's min and max (CUDA uses a device assert): those are `cpu_only`,
except the max it reads without `num_classes` (CUDA reads it too). Each sync is sited at the innermost
frame inside transformers (or peft), else the innermost frame outside torch and this file."""

from __future__ import annotations

import os
import sys
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

_SHAPE = {"nonzero": 1, "masked_select": 1, "_unique": 1, "_unique2": 1, "unique_dim": 1, "unique_consecutive": 1,
          "unique_dim_consecutive": 1, "equal": 1}
_FACTORY = {"tensor", "as_tensor", "asarray", "arange", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
            "linspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "tril_indices", "triu_indices"}
_SKIP = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, os)) + (os.path.abspath(__file__),)


def _libs() -> tuple[str, ...]:
    out = []
    for name in ("transformers", "peft"):
        m = sys.modules.get(name)
        if m is not None:
            out.append(os.path.dirname(m.__file__) + os.sep)
    return tuple(out)


class Oracle:
    """`with Oracle(model, ids) as o: forward()`, then `o.syncs` {(site, kind): n} (kind: item, shape,
    d2h, tolist, upload) and `o.cpu_only` {site: n}."""

    def __init__(self, *device_things):
        self.dev = WeakIdKeyDictionary()
        for t in device_things:
            for x in (list(t.parameters()) + list(t.buffers()) if isinstance(t, torch.nn.Module) else [t]):
                self.dev[x] = True
        self.syncs, self.cpu_only = Counter(), Counter()
        self.one_hot = []  # num_classes of the F.one_hot calls in flight
        self._dm, self._fm = _Dispatch(self), _Function(self)

    def is_dev(self, t) -> bool:
        return isinstance(t, torch.Tensor) and (t in self.dev or (t._base is not None and t._base in self.dev))

    def site(self) -> str:
        libs = _libs()
        f, fallback = sys._getframe(1), None
        while f is not None:
            fn = os.path.abspath(f.f_code.co_filename)
            for root in libs:
                if fn.startswith(root):
                    return f"{os.path.relpath(fn, os.path.dirname(root.rstrip(os.sep)))}:{f.f_lineno}"
            if fallback is None and not fn.startswith(_SKIP) and not fn.startswith("<"):
                fallback = f"{os.path.basename(fn)}:{f.f_lineno}"
            f = f.f_back
        return fallback or "?"

    def count(self, kind: str, n: int = 1) -> None:
        self.syncs[(self.site(), kind)] += n

    def __enter__(self):
        self._orig_one_hot = F.one_hot

        def one_hot(t, num_classes=-1):
            self.one_hot.append(num_classes)
            try:
                return self._orig_one_hot(t, num_classes)
            finally:
                self.one_hot.pop()

        F.one_hot = one_hot
        self._fm.__enter__()
        self._dm.__enter__()
        return self

    def __exit__(self, *exc):
        self._dm.__exit__(*exc)
        self._fm.__exit__(*exc)
        F.one_hot = self._orig_one_hot
        return False


class _Dispatch(TorchDispatchMode):
    def __init__(self, o: Oracle):
        super().__init__()
        self.o = o
        self.item_in_one_hot = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        o = self.o
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        first = args[0] if args else None
        dev = o.is_dev(first)
        if name == "_local_scalar_dense" and dev:
            if o.one_hot and not (o.one_hot[-1] == -1 and self._last_of_one_hot()):
                o.cpu_only[o.site()] += 1
            else:
                o.count("item")
        elif name in _SHAPE and dev:
            o.count("shape", _SHAPE[name])
        elif name == "bincount" and dev:
            o.count("shape", 1 if first.dtype == torch.uint8 else 2)
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and dev and len(args) > 1:
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
                o.count("shape")
        elif name == "_grouped_mm" and dev and first.dtype != torch.bfloat16:
            o.count("d2h")
        if any(o.is_dev(t) for t in tree_leaves((args, kwargs))):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    o.dev[t] = True
        return out

    def _last_of_one_hot(self) -> bool:
        # without num_classes the CPU kernel reads min then max; CUDA reads only the max (the second)
        self.item_in_one_hot ^= 1
        return self.item_in_one_hot == 0


class _Function(TorchFunctionMode):
    def __init__(self, o: Oracle):
        super().__init__()
        self.o = o

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        o = self.o
        name = getattr(func, "__name__", "")
        if name in ("tolist", "cpu", "numpy") and args and o.is_dev(args[0]) and args[0].numel():
            o.count("tolist" if name == "tolist" else "d2h")
        up = name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor) and not o.is_dev(args[0]) and (
            name == "cuda" or kwargs.get("device") is not None
            or any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:]))
        if up and args[0].numel() and not kwargs.get("non_blocking", False) and True not in args[2:]:
            o.count("upload")  # a host tensor moved to the device: a blocking copy
        out = func(*args, **kwargs)
        if up:
            o.dev[out] = True
        if name in _FACTORY and kwargs.get("device") is not None:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    o.dev[t] = True
            if name in ("tensor", "as_tensor", "asarray") and not isinstance(args[0] if args else None,
                                                                            torch.Tensor) and out.numel():
                o.count("upload")
        return out
