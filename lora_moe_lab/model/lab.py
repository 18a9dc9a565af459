"""The one-call set-up (`build_lab`: model + adapter pool with seeded random weights), and the
one model cache that sweeps, widgets and scripts share.

    lab = build_lab("tiny", num_layers=2)            # CPU: torch backend, float32
    lab.pool.load("a", rank=8)
    batch, tensors = lab.make_batch(["a", None], [3, 5])
    y = lab.model(lab.random_input(8), batch, tensors, guard="cpu_flag")
    y = lab.forward(lab.random_input(8), batch, tensors, check_finite=True)  # the same; NaN or inf: a named error
"""
from __future__ import annotations

import gc
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from .. import runtime
from ..config import LoRAConfig, MoEShape, check_dtype, check_int, get_shape
from .lora import AdapterPool, LoRABatchInfo, LoRABatchTensors
from .moe import MiniMoEModel, check_skew
from .sizing import FIT_TOKENS, BuildPlan, fit_layers


@dataclass
class Lab:
    shape: MoEShape
    model: torch.nn.Module  # MiniMoEModel or model.decoder.DecoderModel: the same forward(x, batch, tensors, guard)
    pool: AdapterPool
    device: torch.device
    dtype: torch.dtype
    sizing: BuildPlan | None = None  # the layer count the card allowed, and why (model/sizing.py)

    def make_batch(self, adapters: list, token_counts: list[int], out: LoRABatchTensors | None = None):
        batch = LoRABatchInfo.build(self.pool, adapters, token_counts)
        return batch, LoRABatchTensors.from_batch(batch, self.device, out=out)

    def random_input(self, num_tokens: int, seed: int = 0) -> torch.Tensor:
        check_int("num_tokens", num_tokens, 1)  # a bool is refused: True would be one token
        check_int("seed", seed)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randn(num_tokens, self.shape.hidden, generator=gen, device=self.device).to(self.dtype)

    def forward(self, x, batch: LoRABatchInfo, tensors: LoRABatchTensors, guard="cpu_flag", *,
                check_finite: bool = False) -> torch.Tensor:
        """`self.model(x, batch, tensors, guard)`; with check_finite=True every layer's output is checked as it
        is made, and the first NaN or inf is a NonFiniteOutputError naming the layer and row (see finite_check)."""
        with finite_check(self.model, x) if check_finite_flag(check_finite) else nullcontext():
            return self.model(x, batch, tensors, guard=guard)


class NonFiniteOutputError(FloatingPointError):
    """A forward made NaN or inf: names the first layer whose output holds one, and its first bad row (token)."""


def check_finite_flag(check_finite) -> bool:
    """check_finite as given, refused by name unless a bool (a string such as "no" would be truthy)."""
    if not isinstance(check_finite, bool):
        raise ValueError(f"check_finite must be True or False, got {check_finite!r}")
    return check_finite


def _first_bad_row(t: torch.Tensor) -> int | None:
    bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(dim=1)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None  # bool(): the host-device sync


@contextmanager
def finite_check(model: torch.nn.Module, x: torch.Tensor):
    """Check the input x and each of `model.layers`' outputs for NaN/inf as the forward makes them. Opt-in: each
    check copies a flag to the host, one host-device sync per layer, so the default forward never runs it (and
    a CUDA graph cannot capture it)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError("check_finite=True syncs once per layer and cannot run under CUDA graph capture: "
                         "check an eager forward instead")
    row = _first_bad_row(x) if isinstance(x, torch.Tensor) and x.dim() > 0 else None  # the model's _check names a bad x
    if row is not None:
        raise NonFiniteOutputError(f"the forward's input x is not finite at row {row} (of {x.shape[0]}): NaN or inf "
                                   "before layer 0")

    def check_layer(i: int):
        def hook(mod, args, out):
            row = _first_bad_row(out)
            if row is not None:
                n = int((~torch.isfinite(out)).sum())
                raise NonFiniteOutputError(f"layer {i} ({type(mod).__name__}) made NaN or inf: first at row {row} "
                                           f"(token {row} of {out.shape[0]}), {n} non-finite values in its output "
                                           f"(an adapter's scaling or weights, or the input, may overflow "
                                           f"{out.dtype})")
        return hook

    handles = [layer.register_forward_hook(check_layer(i)) for i, layer in enumerate(model.layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def build_lab(preset: str | MoEShape = "tiny", num_layers: int | None = None, max_loras: int = 4,
              max_rank: int = 16, dtype: str | torch.dtype = "float32", device: str = "auto",
              backend: str = "auto", seed: int = 0, skew: float = 0.0, fit_tokens: int = FIT_TOKENS) -> Lab:
    """Model + adapter pool with seeded random weights (nothing is downloaded). `skew` > 0 biases
    the router towards a seeded set of hot experts (model/moe.py: SERVING_SKEW); 0 is uniform.
    On a GPU the build is sized to the card before anything is allocated (model/sizing.py): num_layers=None
    takes the preset's layers, or as many as fit beside a forward of `fit_tokens` tokens (one line says so); an
    explicit num_layers that cannot fit is a named error."""
    skew = check_skew(skew)  # before any allocation
    check_int("seed", seed)
    dev = runtime.resolve_device(device)
    dt = check_dtype(runtime.resolve_dtype(dtype, dev), dev, runtime.resolve_backend(backend, dev))
    plan = size_build(get_shape(preset), num_layers, LoRAConfig(max_loras, max_rank), dt, dev, backend,
                      decoder=False, tokens=fit_tokens)
    shape = get_shape(preset, num_layers=plan.num_layers)
    pool = AdapterPool(shape, LoRAConfig(max_loras, max_rank), dtype=dt, device=dev)
    model = MiniMoEModel(shape, pool, dt, dev, backend=backend, seed=seed, skew=skew)
    return Lab(shape, model, pool, dev, dt, plan)


def size_build(shape: MoEShape, num_layers, lora: LoRAConfig, dtype, device, backend: str, *, decoder: bool,
               tokens: int = FIT_TOKENS, log=print) -> BuildPlan:
    """The layer count a build takes on `device` (model/sizing.py: fit_layers); prints one line when the card
    holds fewer layers than the preset has."""
    plan = fit_layers(shape, lora, dtype, runtime.resolve_backend(backend, device), decoder=decoder,
                      requested=num_layers, device=device, tokens=tokens)
    if plan.reduced:
        log(f"[sizing] {plan.describe()}")
    return plan


def split_tokens(tokens: int, requests: int) -> list[int]:
    """`tokens` spread over `requests` as evenly as possible (the first ones get the remainder)."""
    base, extra = divmod(tokens, requests)
    return [base + (1 if i < extra else 0) for i in range(requests)]


class LabCache:
    """One lab at a time (48 layers of qwen3-30b-a3b weights are ~60 GB): the old one is freed
    before a new one is built. `get(**build_lab kwargs)` returns the cached lab when the
    arguments are the same; `adapter=(name, rank)` makes sure that adapter is loaded."""

    def __init__(self, build=None):
        self.build = build or build_lab
        self.key, self.lab = None, None

    def get(self, adapter: tuple[str, int] | None = None, **kw) -> Lab:
        key = tuple(sorted(kw.items()))
        if key != self.key:
            self.free()
            self.lab = self.build(**kw)
            self.key = key
        if adapter is not None and adapter[0] not in self.lab.pool.loaded():
            self.lab.pool.load(adapter[0], rank=adapter[1])
        return self.lab

    def free(self) -> None:
        self.key, self.lab = None, None
        gc.collect()
        if runtime.has_cuda():
            torch.cuda.empty_cache()
